"""Proxying one request to a local model server and its response back, byte for byte as it arrives.

Each upstream read turns into one client write with nothing between them; SSE
events pass the meter whole, as soon as they are complete. A response the
server cuts mid-stream ends with an OpenAI-style error event, never with
something a client would read as a finish.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import cast

from .drain import CUT_BEFORE_START, Drain
from .http import (
    HOP_BY_HOP,
    LAST_CHUNK,
    READ_SIZE,
    ChunkedDecoder,
    ChunkedError,
    Request,
    chunk,
    openai_error,
    parse_response_head,
    response_head,
)
from .meter import Exchange, Prepared, SseMeter, usage_from_body
from .peer import PEER_HEADER_LOWER
from .reply import ModelName
from .upstream import (
    RESTART_RETRY_AFTER_S,
    ClientGone,
    ClientWatch,
    StreamWatchdog,
    UpstreamConn,
    UpstreamError,
    UpstreamPool,
    UpstreamReader,
)

MAX_METERED_BODY = 8 * 1024 * 1024  # non-streaming responses larger than this are forwarded unmetered
CLIENT_BUFFER_HIGH = 256 * 1024  # wait for the client to drain past this many unsent bytes

STREAM_CUT_EVENT = b"data: " + json.dumps({"error": {
    "message": "the model server stopped while streaming this response; the output is incomplete, retry the request",
    "type": "server_error", "param": None, "code": "upstream_stream_cut"}}).encode() + b"\n\n"
# The drain's deadline (drain timeout, Spot notice) cut the stream: the same shape, the drain's code.
DRAIN_CUT_EVENT = b"data: " + json.dumps({"error": {
    "message": "this instance is shutting down and stopped this response; the output is incomplete, retry the request",
    "type": "server_error", "param": None, "code": "draining"}}).encode() + b"\n\n"


def upstream_head(request: Request, host: str, body: bytes, extra: list[tuple[str, str]] | None = None) -> bytes:
    """The request head as the model server (or a peer gateway, with `extra`: its peer claim) gets it: hop-by-hop
    headers, Host, the API key and any peer claim the caller sent replaced."""
    lines = [f"{request.method} {request.target} HTTP/1.1", f"Host: {host}"]
    names_and_values = iter(request.headers)  # name, value, name, value, ... (http.Request)
    for name in names_and_values:
        value = next(names_and_values)
        lower = name.lower()
        if lower not in HOP_BY_HOP and lower not in ("host", "authorization", PEER_HEADER_LOWER):
            lines.append(f"{name}: {value}")
    lines += [f"{k}: {v}" for k, v in extra or ()]
    if body or request.method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Proxy:
    """Forwards requests to an `UpstreamPool` and relays the responses."""

    def __init__(self, drain: Drain, watchdog: StreamWatchdog, disconnect_poll_s: float):
        self.drain = drain
        self.watchdog = watchdog
        self.disconnect_poll_s = disconnect_poll_s

    async def forward(self, pool: UpstreamPool, request: Request, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter, keep: bool, body: bytes, exchange: Exchange | None = None,
                      prepared: Prepared | None = None) -> bool:
        """Serve `request` from `pool`; True to keep the client connection open for the next request."""
        watch = ClientWatch(reader, writer, self.disconnect_poll_s)
        pool.in_flight += 1
        try:
            return await self._proxy(pool, request, writer, keep, exchange, body, prepared, watch)
        except ClientGone:
            return False
        finally:
            pool.in_flight -= 1
            watch.stop()
            if watch.gone and exchange:
                exchange.client_gone = True
                exchange.error = False  # the client left; nothing failed
                exchange.props["upstream_cancelled"] = True

    async def _proxy(self, pool: UpstreamPool, request: Request, writer: asyncio.StreamWriter, keep: bool,
                     exchange: Exchange | None, body: bytes, prepared: Prepared | None, watch: ClientWatch) -> bool:
        if prepared:
            body = prepared.body
        head = upstream_head(request, pool.host_header, body)
        self.drain.started_upstream(writer)
        stamps = exchange.trace if exchange is not None else None
        if stamps is not None:
            stamps["sent"] = time.monotonic()
        try:
            conn, status, up_headers = await pool.send(head, body, watch, self.watchdog)
        except UpstreamError as exc:
            if not self.drain.head_arrived(writer):
                return False  # already answered 503 by the drain's close
            # Down or restarting (it will be back): a retryable 503 with when to retry, as OpenAI's SDKs retry
            # a 503 and honour Retry-After. A server that broke the protocol: 502.
            status = 503 if exc.retryable else 502
            if exchange:
                exchange.status, exchange.error = status, True
                exchange.props["upstream_error"] = str(exc)
            retry = [("Retry-After", str(RESTART_RETRY_AFTER_S))] if exc.retryable else None
            writer.write(openai_error(status, str(exc), "upstream_error", "upstream_unavailable", extra_headers=retry,
                                      close=not keep))
            await writer.drain()
            return keep
        except BaseException:
            # ClientGone (the client left before the head), cancellation or a bug: nobody will
            # answer this writer, and left here it (its transport, socket, buffers) would be kept
            # for the life of the process and written to by close().
            self.drain.forget(writer)
            raise
        if stamps is not None:
            stamps["upstream_head"] = time.monotonic()
        if not self.drain.head_arrived(writer):
            conn.writer.close()
            return False  # close() answered 503 while the head was on its way
        return await self._respond(pool, conn, status, up_headers, request, writer, keep, exchange, prepared, watch)

    async def forward_peer(self, pool: UpstreamPool, request: Request, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter, keep: bool, body: bytes, exchange: Exchange,
                           peer_headers: list[tuple[str, str]], head_timeout_s: float) -> bool | None:
        """Forward `request` once to another gateway (`pool`: a remote region's spill endpoint or a peer) and relay
        its answer; True/False as `forward`, or None when nothing reached the client and the caller may still
        serve it at home: no connection, no response head within `head_timeout_s`, or a 5xx/429 head (the peer
        has no room, drains, or refused). Past the response head there is no retry: the bytes pass through as
        they arrive, SSE events intact (the peer metered them and renamed the model)."""
        watch = ClientWatch(reader, writer, self.disconnect_poll_s)
        pool.in_flight += 1
        head = upstream_head(request, pool.host_header, body, peer_headers)
        self.drain.started_upstream(writer)
        try:
            try:
                sent = await _send_within(pool, head, body, watch, head_timeout_s)
            except BaseException:
                self.drain.forget(writer)
                raise
            if isinstance(sent, str):
                self.drain.forget(writer)
                exchange.props["peer_error"] = sent
                return None
            conn, status, up_headers = sent
            if status >= 500 or status == 429:
                self.drain.forget(writer)
                conn.writer.close()  # its body is not wanted; the connection is not reused
                exchange.props["peer_error"] = f"peer answered {status}"
                exchange.status = status
                return None
            if not self.drain.head_arrived(writer):
                conn.writer.close()
                return False
            return await self._respond(pool, conn, status, up_headers, request, writer, keep, exchange, None, watch)
        except ClientGone:
            return False
        finally:
            pool.in_flight -= 1
            watch.stop()
            if watch.gone:
                exchange.client_gone = True
                exchange.error = False

    async def _respond(self, pool: UpstreamPool, conn: UpstreamConn, status: int, up_headers: list[tuple[str, str]],
                       request: Request, writer: asyncio.StreamWriter, keep: bool, exchange: Exchange | None,
                       prepared: Prepared | None, watch: ClientWatch) -> bool:
        """Relay the response whose head (`status`, `up_headers`) arrived on `conn`."""
        if exchange:
            exchange.status = status
            exchange.error = status >= 500
        lower = {k.lower(): v for k, v in up_headers}
        no_body = request.method == "HEAD" or status in (204, 304)
        up_chunked = "chunked" in lower.get("transfer-encoding", "").lower()
        up_length = None if up_chunked or "content-length" not in lower else int(lower["content-length"])
        up_keep = "close" not in lower.get("connection", "").lower() and (up_chunked or up_length is not None
                                                                          or no_body)
        http10 = request.version == "HTTP/1.0"
        out_headers = [(k, v) for k, v in up_headers if k.lower() not in HOP_BY_HOP]
        streaming = exchange is not None and prepared is not None and prepared.stream \
            and "text/event-stream" in lower.get("content-type", "")
        if streaming and exchange is not None and prepared is not None:  # streaming implies both: restated for mypy
            exchange.meter = SseMeter(prepared.strip_usage)
        rename = _model_name(exchange, status, lower.get("content-type", ""), streaming)
        # Re-frame as chunked whenever the length may change (stripped usage, renamed model) or is unknown.
        out_chunked = not no_body and not http10 and (up_chunked or up_length is None or streaming
                                                      or rename is not None)
        keep = keep and not http10 and (out_chunked or up_length is not None or no_body)
        length = None if out_chunked or no_body or rename is not None else up_length
        head = response_head(status, out_headers, length=0 if no_body and length is None else length,
                             chunked=out_chunked, close=not keep)
        if no_body:
            writer.write(head)
            await writer.drain()
            pool.release(conn, up_keep)
            return keep
        complete = await self._pump(conn, writer, head, up_chunked, up_length, out_chunked, exchange, rename)
        pool.release(conn, up_keep and complete)
        if exchange and not complete and not exchange.client_gone and not watch.gone:
            exchange.error = True
            exchange.props["cut_short"] = True
        return keep and complete and not (exchange and exchange.client_gone)

    async def _pump(self, conn: UpstreamConn, writer: asyncio.StreamWriter, head: bytes, up_chunked: bool,
                    up_length: int | None, out_chunked: bool, exchange: Exchange | None,
                    rename: ModelName | None = None) -> bool:
        """Copy the response body; True when it arrived complete and reached the client.

        The response head goes out with the first body bytes, and the last chunk with the last
        bytes: every send on loopback costs a syscall that wakes the other side (measured as the
        largest CPU item per request), and a client gains nothing from headers before its first
        token. What is left in the upstream reader's buffer is read first; from the first read that
        empties it, each arrival is relayed from the transport's own callback (`UpstreamReader.sink`)
        instead of through the buffer, a future and this task's wake-up.
        """
        body = _Body(writer, head, ChunkedDecoder() if up_chunked else None, up_length, out_chunked, exchange,
                     self.watchdog.watch(conn), self.drain, rename)
        self.drain.relaying(conn)
        reader = conn.reader
        try:
            outcome = _MORE
            while outcome == _MORE:
                want = body.want()
                if want == 0:
                    body.complete = True
                    break
                try:
                    data = await reader.read(want)
                except ConnectionError:
                    data = b""  # the server died under us (reset): the same cut as an early EOF
                outcome = body.take(data)
                if outcome == _FULL:
                    await writer.drain()
                    outcome = _MORE
                elif outcome == _MORE and len(data) < want and isinstance(reader, UpstreamReader):
                    # A short read emptied the buffer: from here each arrival is relayed as it comes.
                    await self._relay_arrivals(reader, conn, writer, body)
                    break
            await body.finish()
        except (ConnectionError, RuntimeError):
            if exchange:
                exchange.client_gone = True
            body.complete = False
        finally:
            self.watchdog.unwatch(conn)
            self.drain.relayed(conn)
            body.close()
        complete = body.complete
        if not complete:
            conn.writer.close()  # stop the generation: nobody will read it
        return complete

    async def _relay_arrivals(self, reader: UpstreamReader, conn: UpstreamConn, writer: asyncio.StreamWriter,
                              body: _Body) -> None:
        """Relay the rest of `body` from the upstream transport's callbacks; return when it ended."""
        loop = asyncio.get_running_loop()
        transport = cast(asyncio.Transport, conn.writer.transport)  # a socket transport: it reads too
        arrivals = _Arrivals(body, loop.create_future(), transport)
        reader.sink = arrivals
        try:
            if reader.at_eof() or reader.exception() is not None:
                arrivals(None)  # it ended before the sink was in place
            while await arrivals.wake == _FULL:
                # The client reads slower than the server writes: upstream reading is paused (by the
                # sink, before another arrival) until the client has taken what is buffered for it.
                await writer.drain()
                arrivals.wake = loop.create_future()
                if arrivals.ended:
                    arrivals(None)  # the upstream ended while paused
                elif not transport.is_closing():  # closing: its end is on its way to the sink
                    transport.resume_reading()
        finally:
            reader.sink = None
            if arrivals.extra:
                conn.writer.close()  # bytes past the response: the connection is out of step


async def _send_within(pool: UpstreamPool, head: bytes, body: bytes, watch: ClientWatch,
                       timeout_s: float) -> tuple[UpstreamConn, int, list[tuple[str, str]]] | str:
    """Send to a peer and read its response head within `timeout_s`; what went wrong otherwise (nothing reached
    the client, so the caller may serve the request at home). A kept-alive connection the peer had closed is
    replaced once, as UpstreamPool.send does; the connection of a late head is closed, which cancels the work."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    for attempt in (0, 1):
        try:
            conn = await asyncio.wait_for(pool.get(), max(0.0, deadline - asyncio.get_running_loop().time()))
        except UpstreamError as exc:
            return str(exc)
        except TimeoutError:
            return f"no connection to the peer within {timeout_s:g} s"
        if watch.gone:
            conn.writer.close()
            raise ClientGone()
        watch.conn = conn
        try:
            conn.writer.write(head + body)
            async with asyncio.timeout_at(deadline):
                raw = await conn.reader.readuntil(b"\r\n\r\n")
                status, headers = parse_response_head(raw)
                while 100 <= status < 200:
                    raw = await conn.reader.readuntil(b"\r\n\r\n")
                    status, headers = parse_response_head(raw)
            return conn, status, headers
        except TimeoutError:
            conn.writer.close()
            return f"no response head from the peer within {timeout_s:g} s"
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            conn.writer.close()
            if watch.gone:
                raise ClientGone() from None
            if conn.reused and attempt == 0 and not getattr(exc, "partial", b""):
                continue
            return f"the peer closed the connection: {type(exc).__name__}"
        except (asyncio.LimitOverrunError, ValueError) as exc:
            conn.writer.close()
            return f"the peer sent a malformed response head: {exc}"
    return "unreachable"  # pragma: no cover


def _model_name(exchange: Exchange | None, status: int, content_type: str, streaming: bool) -> ModelName | None:
    """The rewriting of an inference reply's `model` to the id the consumer sent (runtime/gateway/reply.py)."""
    if exchange is None or exchange.model is None or not 200 <= status < 300:
        return None
    if streaming:
        return ModelName(exchange.model, events=True)
    return ModelName(exchange.model, events=False) if "json" in content_type.lower() else None


_MORE, _DONE, _FULL = range(3)  # _Body.take: keep reading; the body ended (complete or cut); client buffer full


class _Arrivals:
    """Hands what the upstream transport delivers to a `_Body`; wakes the pump only when it must act."""

    __slots__ = ("body", "wake", "transport", "ended", "extra")

    def __init__(self, body: _Body, wake: asyncio.Future[int], transport: asyncio.Transport):
        self.body, self.wake, self.transport = body, wake, transport
        self.ended = False  # EOF or an error while the pump was busy (draining the client)
        self.extra = False  # bytes after the body ended

    def __call__(self, data: bytes | None) -> None:
        """`data` None: EOF or an error, which ends the body as an early EOF does."""
        if self.wake.done():
            if data is None:
                self.ended = True
            else:
                self.extra = True
            return
        try:
            outcome = self.body.take(data or b"")
        except Exception as exc:  # noqa: BLE001 - the client went away mid-write: the pump handles it
            self.wake.set_exception(exc)
            return
        if outcome == _FULL and not self.transport.is_closing():
            self.transport.pause_reading()  # before the next arrival: the pump drains the client first
        if outcome != _MORE:
            self.wake.set_result(outcome)


class _Body:
    """One response body on its way to the client: decoding, metering, framing; fed by reads or arrivals."""

    def __init__(self, writer: asyncio.StreamWriter, head: bytes, decoder: ChunkedDecoder | None,
                 remaining: int | None, out_chunked: bool, exchange: Exchange | None, progress: list[float],
                 drain: Drain, rename: ModelName | None = None):
        self.writer, self.decoder, self.remaining, self.out_chunked = writer, decoder, remaining, out_chunked
        self.exchange, self.progress, self.drain = exchange, progress, drain
        self.meter = exchange.meter if exchange else None
        self.trace = exchange.trace if exchange else None  # TTFT stamps, the test switch on only (ttft_trace.py)
        self.rename = rename
        self.keep_copy = exchange is not None and self.meter is None
        self.copy: list[bytes] = []
        self.copied = 0
        self.pending = head  # not yet sent
        self.last = b""  # the decoded bytes that ended a chunked body: sent with the ending
        self.complete = False
        self.upstream_cut = False

    def want(self) -> int:
        return READ_SIZE if self.remaining is None else min(READ_SIZE, self.remaining)

    def take(self, data: bytes) -> int:
        """Relay `data` (b"": EOF); _DONE when the body ended, _FULL when the client must drain first."""
        if not data:
            # Close-delimited: EOF is the end, unless the drain cut it (close(): Drain.cut_relaying).
            self.complete = self.decoder is None and self.remaining is None and not self.drain.cutting
            self.upstream_cut = not self.complete
            return _DONE
        now = time.perf_counter()
        self.progress[0] = time.monotonic()
        if self.remaining is not None:
            if len(data) > self.remaining:
                data = data[:self.remaining]  # bytes past the body: not this response's
            self.remaining -= len(data)
        if self.decoder:
            try:
                data = self.decoder.feed(data)
            except ChunkedError as exc:
                if self.exchange:
                    self.exchange.props["upstream_error"] = f"malformed chunked response: {exc}"
                self.upstream_cut = True
                return _DONE
        if self.meter:
            data = self.meter.feed(data, now)
        elif self.keep_copy and self.copied <= MAX_METERED_BODY:
            self.copy.append(data)
            self.copied += len(data)
        if self.rename and data:
            data = self.rename.feed(data)
        if self.decoder and self.decoder.done:
            self.complete = True
            self.last = data
            return _DONE
        if data:
            if self.pending:  # the first body bytes (the head goes with them)
                self._stamp_first(now)
                self.writer.write(self.pending + (chunk(data) if self.out_chunked else data))
                self.pending = b""
            else:
                self.writer.write(chunk(data) if self.out_chunked else data)
            if self.writer.transport.get_write_buffer_size() > CLIENT_BUFFER_HIGH:
                return _FULL
            if self.writer.is_closing():
                raise ConnectionResetError("client went away")
        if self.remaining == 0:
            self.complete = True
            return _DONE
        return _MORE

    async def finish(self) -> None:
        """The body's ending: the last bytes, the last chunk, or what says the stream was cut."""
        exchange, meter, out_chunked = self.exchange, self.meter, self.out_chunked
        if meter:
            tail = meter.flush()  # an event the server began and did not end with its blank line
            # Cut: that event is incomplete, and SSE discards it (WHATWG HTML 9.2.6, interpreting an event
            # stream: "Once the end of the file is reached, any pending data must be discarded"); written
            # out, it would run into the error event after it and make both unreadable.
            if tail and self.rename:
                tail = self.rename.feed(tail)
            data = (self.last if self.complete and self.decoder else b"") + (b"" if self.upstream_cut else tail)
        else:
            data = self.last if self.complete and self.decoder else b""
            if self.rename:
                data += self.rename.flush()  # a body without a model member, held back to its end
        drain_cut = self.upstream_cut and self.drain.cutting
        out = self.pending + ((chunk(data) if out_chunked else data) if data else b"")
        if drain_cut and self.pending and not data:
            # Queued in the engine: nothing of the response went out, so it can still be a retryable 503.
            out = CUT_BEFORE_START
            if exchange:
                exchange.status = 503
                exchange.props["drain_cut"] = True
        elif out_chunked and self.complete:
            out += LAST_CHUNK
        elif self.upstream_cut and meter and out_chunked:
            # A cut must not read as a finish: end the SSE stream with an OpenAI-style error event,
            # which clients raise as an error (openai-python src/openai/_streaming.py raises
            # APIError for a data event carrying "error"), then end the body.
            out += chunk(DRAIN_CUT_EVENT if drain_cut else STREAM_CUT_EVENT) + LAST_CHUNK
            if exchange:
                exchange.props["drain_cut" if drain_cut else "stream_cut"] = True
        if self.pending and data:
            # The whole body came in the read that ended it (the gateway's loop was away while the server sent it
            # all): its first bytes leave here, with the head.
            self._stamp_first(time.perf_counter())
        if out:
            self.writer.write(out)
        await self.writer.drain()

    def _stamp_first(self, now: float) -> None:
        """The TTFT trace's gateway stamp: the response's first body bytes leave now (take or finish)."""
        if self.trace is not None:
            self.trace["first"] = now

    def close(self) -> None:
        if self.exchange:
            self.exchange.ended = time.perf_counter()
            if self.keep_copy and self.copied <= MAX_METERED_BODY:
                self.exchange.usage = usage_from_body(b"".join(self.copy))
