"""The consumer gateway: PROXY v2 -> identity -> limits -> streaming proxy -> metering.

One asyncio process in front of trtllm-serve on the same instance. The NLB
(proxy protocol v2 on) connects to it; it forwards to the server on loopback
over pooled keep-alive connections, copying each upstream read to the client
at once (no buffering of SSE), and writes one EMF record per inference
request. It is also the health-check path: /health mirrors the server's
/health and turns 503 the moment a drain starts (SIGTERM), so the NLB stops
sending new connections while in-flight streams finish.

Why raw asyncio streams rather than a web framework: the gateway adds the
least latency when an upstream read turns into one client write with no
framework between them; scripts/bench_gateway.py measures this against an
aiohttp proxy and against no gateway at all.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from fleetcast import telemetry as t

from . import ppv2
from .http import (
    BODY_TIMEOUT_S, HOP_BY_HOP, LAST_CHUNK, MAX_BODY_BYTES, BadBody, ChunkedDecoder, ChunkedError, HttpError,
    Request, body_length, chunk, openai_error, parse_head, parse_json_body, response_head,
)
from .identity import Identity, log
from .limits import ConsumerLimiter
from .meter import INFERENCE_PATHS, SseMeter, prepare_body, tokens, usage_from_body
from .metrics import MetricsSink

READ_SIZE = 64 * 1024
MAX_METERED_BODY = 8 * 1024 * 1024  # non-streaming responses larger than this are forwarded unmetered
INTERNAL_PATHS = frozenset({"/metrics", "/prometheus/metrics"})  # server stats: dequeued on read, not for consumers
MAX_HEALTH_BODY = 64 * 1024  # a /health answer longer than this is not read to the end: the connection is dropped
# A deadline around a wait without a task per request (asyncio.timeout reschedules one timer).
_deadline = asyncio.timeout if sys.version_info >= (3, 11) else None


_STREAM_CUT_EVENT = b"data: " + json.dumps({"error": {
    "message": "the model server stopped while streaming this response; the output is incomplete, retry the request",
    "type": "server_error", "param": None, "code": "upstream_stream_cut"}}).encode() + b"\n\n"


class UpstreamError(Exception):
    """The local server could not be reached or broke the protocol."""


class ClientGone(Exception):
    """The client left while its request waited upstream; the upstream connection was cut."""


@dataclass
class UpstreamConn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False


class ClientWatch:
    """Notices a client that leaves while its request is upstream, and cuts the upstream connection.

    The gateway reads nothing from the client while the server works on a non-streaming
    request, so without this nobody notices the client left: trtllm-serve aborts a request
    when its own connection closes (OpenAIServer.await_disconnected polls is_disconnected()
    once a second), so cutting ours is what stops the generation. A repeating timer, not a
    read: reading the client would consume a pipelined next request. EOF counts as gone,
    as in nginx's default (proxy_ignore_client_abort off).
    """

    __slots__ = ("reader", "writer", "period", "gone", "conn", "_handle")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, period: float):
        self.reader, self.writer, self.period = reader, writer, period
        self.gone = False
        self.conn: UpstreamConn | None = None
        self._handle = asyncio.get_running_loop().call_later(period, self._check)

    def _check(self) -> None:
        if self.reader.at_eof() or self.reader.exception() is not None or self.writer.is_closing():
            self.gone = True
            if self.conn is not None:
                self.conn.writer.transport.abort()
            return
        self._handle = asyncio.get_running_loop().call_later(self.period, self._check)

    def stop(self) -> None:
        self._handle.cancel()


@dataclass
class Exchange:
    """One request's bookkeeping, for the metric record."""

    started: float
    consumer: str | None = None
    arrived_ms: int | None = None  # wall clock at arrival: the record's timestamp (its own minute); None: now
    in_flight: int = 0  # requests in flight on this instance at admission, this one included; 0: not admitted
    status: int = 0
    error: bool = False
    client_gone: bool = False
    meter: SseMeter | None = None
    usage: dict[str, Any] | None = None
    ended: float | None = None
    props: dict[str, Any] = field(default_factory=dict)


class Gateway:
    """Serve consumers on `listen`, forward to `upstream` (loopback trtllm-serve)."""

    def __init__(self, *, upstream: tuple[str, int], identity: Identity, limiters: dict[str, ConsumerLimiter],
                 metrics: MetricsSink, proxy_protocol: bool = True, drain_timeout_s: float = 300.0,
                 header_timeout_s: float = 5.0, idle_timeout_s: float = 75.0, upstream_idle_timeout_s: float = 600.0,
                 health_timeout_s: float = 2.0, max_idle_upstream: int = 256, body_timeout_s: float = BODY_TIMEOUT_S,
                 disconnect_poll_s: float = 0.5, clock: Callable[[], float] = time.time):
        self.upstream = upstream
        self.identity = identity
        self.limiters = limiters
        self.metrics = metrics
        self.proxy_protocol = proxy_protocol
        self.drain_timeout_s = drain_timeout_s
        self.header_timeout_s = header_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.upstream_idle_timeout_s = upstream_idle_timeout_s
        self.health_timeout_s = health_timeout_s
        self.max_idle_upstream = max_idle_upstream
        self.body_timeout_s = body_timeout_s
        self.disconnect_poll_s = disconnect_poll_s
        self.clock = clock  # wall clock for record timestamps (tests compress a week by injecting it)
        self.draining = False
        self.active = 0  # requests being served (health checks excluded)
        self._idle_upstream: list[UpstreamConn] = []
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self._streams: dict[int, tuple[UpstreamConn, list[float]]] = {}  # watchdog: last upstream progress
        self._unstarted: set[asyncio.StreamWriter] = set()  # requests sent upstream, no response head yet
        self._idle_event = asyncio.Event()
        self._idle_event.set()
        self._watchdog: asyncio.Task | None = None
        self._health_conn: UpstreamConn | None = None  # one kept-alive connection for /health checks
        self._health_probe: asyncio.Future | None = None  # the check in flight; concurrent ones share it

    def set_consumers(self, consumers: tuple) -> None:
        """Swap in a refreshed consumer list; a kept consumer keeps its limiter (in-flight count, tokens)."""
        limiters = {}
        for consumer in consumers:
            limiter = self.limiters.get(consumer.name)
            if limiter is None:
                limiter = ConsumerLimiter(consumer.limits)
            else:
                limiter.update(consumer.limits)
            limiters[consumer.name] = limiter
        # Limiters first: a request resolved to a new consumer must find its limiter.
        self.limiters = limiters
        self.identity.consumers = tuple(consumers)

    # ------------------------------------------------------------ lifecycle

    async def start(self, host: str, port: int) -> asyncio.AbstractServer:
        self._server = await asyncio.start_server(self._connection, host, port, limit=64 * 1024, backlog=1024)
        self._watchdog = asyncio.ensure_future(self._watch_streams())
        return self._server

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    def begin_drain(self) -> None:
        """SIGTERM: health turns 503 now; new requests are refused; in-flight ones carry on."""
        if not self.draining:
            self.draining = True
            log("drain_started", active=self.active, timeout_s=self.drain_timeout_s)

    async def drain(self) -> bool:
        """Wait for in-flight requests (bounded by the drain timeout); True if all finished."""
        self.begin_drain()
        try:
            await asyncio.wait_for(self._idle_event.wait(), self.drain_timeout_s)
            finished = True
        except asyncio.TimeoutError:
            finished = False
        log("drain_finished", all_finished=finished, cut=self.active)
        return finished

    async def close(self) -> None:
        if self._watchdog:
            self._watchdog.cancel()
        if self._server:
            self._server.close()
        for writer in list(self._unstarted):
            # Cut by the drain timeout before the server answered: a retryable 503, not a reset.
            self._unstarted.discard(writer)
            writer.write(openai_error(503, "this instance is shutting down and the request did not start in "
                                           "time; retry it", "service_unavailable", "draining", close=True))
        for writer in list(self._connections):
            writer.close()
        for conn in self._idle_upstream:
            conn.writer.close()
        self._idle_upstream.clear()
        if self._health_conn is not None:
            self._health_conn.writer.close()
            self._health_conn = None
        if self._server:
            await self._server.wait_closed()

    def _enter(self) -> None:
        self.active += 1
        self._idle_event.clear()

    def _leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            self._idle_event.set()

    # ------------------------------------------------------------ connections

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            header = await self._proxy_header(reader, writer)
            if header is False:
                return
            vpce_id = header.vpce_id if header else None
            source = header.source if header and header.source else writer.get_extra_info("peername")
            loop = asyncio.get_running_loop()
            while True:
                # An idle keep-alive connection is closed by a timer rather than wait_for(), which
                # would cost a task per request on the hot path.
                idle = loop.call_later(self.idle_timeout_s, writer.transport.abort)
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except asyncio.LimitOverrunError:
                    writer.write(openai_error(431, "request head too large", "invalid_request_error", None, close=True))
                    return
                finally:
                    idle.cancel()
                try:
                    request = parse_head(head)
                except HttpError as exc:
                    writer.write(openai_error(exc.status, str(exc), "invalid_request_error", None, close=True))
                    return
                if not await self._request(request, reader, writer, vpce_id, source):
                    return
        except HttpError as exc:  # an unreadable request body: answer, then close (the stream is out of sync)
            writer.write(openai_error(exc.status, str(exc), "invalid_request_error", None, close=True))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception as exc:  # noqa: BLE001 - one broken connection must never stop the gateway
            log("connection_error", error=f"{type(exc).__name__}: {exc}")
        finally:
            self._connections.discard(writer)
            writer.close()  # flushes what is buffered, then closes

    async def _proxy_header(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        """The connection's PROXY v2 header; None when the gateway runs without one; False: refused."""
        if not self.proxy_protocol:
            return None
        try:
            prefix = await asyncio.wait_for(reader.readexactly(ppv2.HEADER_PREFIX_LEN), self.header_timeout_s)
            total = ppv2.header_length(prefix)
            rest = await asyncio.wait_for(reader.readexactly(total - ppv2.HEADER_PREFIX_LEN), self.header_timeout_s)
            return ppv2.parse(prefix + rest)
        except ppv2.ProxyHeaderError as exc:
            reason = str(exc)
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                return False  # connected and left without a byte (port probe): nothing to count
            reason = "truncated PROXY v2 header"
        except asyncio.TimeoutError:
            reason = f"no PROXY v2 header within {self.header_timeout_s:g} s"
        self.metrics.emit(None, {t.PROXY_PROTOCOL_ERRORS: 1}, {"reason": reason,
                                                              "peer": str(writer.get_extra_info("peername"))})
        log("proxy_protocol_refused", reason=reason, peer=writer.get_extra_info("peername"))
        writer.write(openai_error(400, f"{reason}; this port expects the NLB's PROXY protocol v2 header",
                                  "invalid_request_error", "proxy_protocol_required", close=True))
        return False

    # ------------------------------------------------------------ requests

    async def _read_body(self, request: Request, reader: asyncio.StreamReader) -> bytes:
        """The whole request body, within `body_timeout_s`: a head that promises a body and then
        stalls gets 408 and the connection closed, instead of holding it (and whatever it waits for)."""
        if not request.chunked and not body_length(request.lower):
            return b""
        try:
            if _deadline is not None:
                async with _deadline(self.body_timeout_s):
                    return await self._receive_body(request, reader)
            return await asyncio.wait_for(self._receive_body(request, reader), self.body_timeout_s)
        except asyncio.TimeoutError:
            raise HttpError(408, f"the request body did not arrive within {self.body_timeout_s:g} s") from None

    async def _receive_body(self, request: Request, reader: asyncio.StreamReader) -> bytes:
        if request.chunked:
            decoder, parts, size = ChunkedDecoder(), [], 0
            while not decoder.done:
                data = await reader.read(READ_SIZE)
                if not data:
                    raise HttpError(400, "request body ended early")
                try:
                    piece = decoder.feed(data)
                except ChunkedError as exc:
                    raise HttpError(400, f"malformed chunked body: {exc}") from None
                size += len(piece)
                if size > MAX_BODY_BYTES:
                    raise HttpError(413, f"request body over {MAX_BODY_BYTES} bytes")
                parts.append(piece)
            return b"".join(parts)
        length = body_length(request.lower)
        return await reader.readexactly(length) if length else b""

    async def _request(self, request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       vpce_id: str | None, source: Any) -> bool:
        """Serve one request; True to keep the connection open for the next."""
        started = time.perf_counter()
        path = request.path
        keep = request.keep_alive and not self.draining
        expects_continue = "100-continue" in request.lower.get("expect", "").lower()
        body: bytes | None = None  # read yet?

        async def refuse(status: int, message: str, error_type: str, code: str | None,
                         headers: list[tuple[str, str]] | None = None) -> bool:
            nonlocal keep
            if body is not None:
                pass  # already read: the connection is in step
            elif expects_continue:
                keep = False  # the client holds the body back; do not wait for it
            else:
                try:
                    await self._read_body(request, reader)
                except HttpError:
                    keep = False
            writer.write(openai_error(status, message, error_type, code, headers, close=not keep))
            await writer.drain()
            return keep

        if path == "/health" and request.method in ("GET", "HEAD"):
            await self._read_body(request, reader)
            writer.write(await self._health(request.method == "HEAD", keep))
            await writer.drain()
            return keep
        if self.draining:
            return await refuse(503, "this instance is draining; retry and the load balancer will pick another",
                                "service_unavailable", "draining")
        if path in INTERNAL_PATHS:
            return await refuse(404, f"{path} is not served through the gateway", "invalid_request_error",
                                "not_found")

        api_key = None
        auth = request.lower.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            api_key = auth[7:].strip()
        caller = await self.identity.resolve(vpce_id, api_key)
        if caller.refusal:
            r = caller.refusal
            if r.code in ("unknown_endpoint", "ambiguous_consumer"):
                self.metrics.emit(None, {t.UNKNOWN_ENDPOINT: 1}, {"vpce_id": vpce_id, "path": path,
                                                                 "reason": r.code, "source": str(source)})
            return await refuse(r.status, r.message, r.error_type, r.code)
        consumer = caller.consumer
        assert consumer is not None
        metered = request.method == "POST" and path in INFERENCE_PATHS
        if not metered:
            return await self._forward(request, reader, writer, keep, None, expects_continue=expects_continue)

        # The body first, then the slot: a client that stalls mid-body holds no concurrency slot
        # and is no request in flight for a drain to wait for.
        exchange = Exchange(started, consumer.name)
        if expects_continue:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            body = await self._read_body(request, reader)
            data = parse_json_body(body)
        except (HttpError, BadBody) as exc:
            exchange.status = exc.status if isinstance(exc, HttpError) else 400
            exchange.props["invalid_request"] = str(exc)
            self._record(exchange, path)
            if isinstance(exc, HttpError):
                raise  # unreadable: answered, then the connection closed (the stream is out of sync)
            return await refuse(400, str(exc), "invalid_request_error", exc.code)
        if self.draining:  # the drain began while the body was arriving
            return await refuse(503, "this instance is draining; retry and the load balancer will pick another",
                                "service_unavailable", "draining")

        limiter = self.limiters[consumer.name]
        throttle = limiter.admit()
        arrived_ms = int(self.clock() * 1000)
        if throttle:
            self.metrics.emit(consumer.name, {t.REQUESTS: 1, t.THROTTLED: 1, t.ERRORS: 0},
                              {"throttle_reason": throttle.reason, "path": path,
                               "max_concurrency": limiter.max_concurrency,
                               "requests_per_minute": limiter.requests_per_minute}, arrived_ms)
            return await refuse(429, throttle.message, "requests",
                                "rate_limit_exceeded" if throttle.reason == "rate" else "concurrency_limit_exceeded",
                                [("Retry-After", str(throttle.retry_after_s)),
                                 ("x-ratelimit-limit-requests", str(limiter.requests_per_minute))])
        exchange.arrived_ms, exchange.in_flight = arrived_ms, self.active + 1  # admitted: counts toward in-flight
        self._enter()
        try:
            return await self._forward(request, reader, writer, keep, exchange, body, data)
        finally:
            limiter.release()
            self._leave()
            self._record(exchange, path)

    # ------------------------------------------------------------ forwarding

    async def _upstream_conn(self) -> UpstreamConn:
        while self._idle_upstream:
            conn = self._idle_upstream.pop()
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                conn.reused = True
                return conn
            conn.writer.close()
        try:
            reader, writer = await asyncio.open_connection(*self.upstream, limit=64 * 1024)
        except OSError as exc:
            raise UpstreamError(f"cannot connect to the model server at {self.upstream[0]}:{self.upstream[1]}: "
                                f"{exc.strerror or exc}") from None
        return UpstreamConn(reader, writer)

    def _release_upstream(self, conn: UpstreamConn, reusable: bool) -> None:
        if reusable and len(self._idle_upstream) < self.max_idle_upstream and not conn.writer.is_closing():
            self._idle_upstream.append(conn)
        else:
            conn.writer.close()

    async def _send_upstream(self, head: bytes, body: bytes, watch: ClientWatch | None = None
                             ) -> tuple[UpstreamConn, int, list[tuple[str, str]], bytes]:
        """Send the request and read the response head; one retry when a pooled connection had gone stale."""
        for attempt in (0, 1):
            conn = await self._upstream_conn()
            if watch is not None:
                if watch.gone:
                    conn.writer.close()
                    raise ClientGone()
                watch.conn = conn
            try:
                conn.writer.write(head + body)
                raw = await conn.reader.readuntil(b"\r\n\r\n")
                status, headers = _parse_response_head(raw)
                while 100 <= status < 200:  # interim responses: skip
                    raw = await conn.reader.readuntil(b"\r\n\r\n")
                    status, headers = _parse_response_head(raw)
                return conn, status, headers, raw
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                conn.writer.close()
                if watch is not None and watch.gone:
                    raise ClientGone() from None  # cut by the watch: never resend
                if conn.reused and attempt == 0 and not getattr(exc, "partial", b""):
                    continue  # the server closed an idle keep-alive connection; it never saw this request
                raise UpstreamError(f"model server closed the connection: {type(exc).__name__}") from None
            except (asyncio.LimitOverrunError, ValueError) as exc:
                conn.writer.close()
                raise UpstreamError(f"model server sent a malformed response head: {exc}") from None
        raise UpstreamError("unreachable")  # pragma: no cover

    async def _forward(self, request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       keep: bool, exchange: Exchange | None, body: bytes | None = None,
                       data: dict[str, Any] | None = None, expects_continue: bool = False) -> bool:
        if body is None:
            if expects_continue:
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = await self._read_body(request, reader)
        watch = ClientWatch(reader, writer, self.disconnect_poll_s)
        try:
            return await self._proxy(request, writer, keep, exchange, body, data, watch)
        except ClientGone:
            return False
        finally:
            watch.stop()
            if watch.gone and exchange:
                exchange.client_gone = True
                exchange.error = False  # the client left; nothing failed
                exchange.props["upstream_cancelled"] = True

    async def _proxy(self, request: Request, writer: asyncio.StreamWriter, keep: bool, exchange: Exchange | None,
                     body: bytes, data: dict[str, Any] | None, watch: ClientWatch) -> bool:
        prepared = prepare_body(body, data) if exchange and data is not None else None
        if prepared:
            body = prepared.body
        lines = [f"{request.method} {request.target} HTTP/1.1", f"Host: {self.upstream[0]}:{self.upstream[1]}"]
        lines += [f"{k}: {v}" for k, v in request.headers
                  if k.lower() not in HOP_BY_HOP and k.lower() not in ("host", "authorization")]
        if body or request.method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self._unstarted.add(writer)
        try:
            conn, status, up_headers, _ = await self._send_upstream(head, body, watch)
        except UpstreamError as exc:
            if writer not in self._unstarted:
                return False  # already answered 503 by close()
            self._unstarted.discard(writer)
            if exchange:
                exchange.status, exchange.error = 502, True
                exchange.props["upstream_error"] = str(exc)
            writer.write(openai_error(502, str(exc), "upstream_error", "upstream_unavailable", close=not keep))
            await writer.drain()
            return keep
        except BaseException:
            # ClientGone (the client left before the head), cancellation or a bug: nobody will
            # answer this writer, and left here it (its transport, socket, buffers) would be kept
            # for the life of the process and written to by close().
            self._unstarted.discard(writer)
            raise
        if writer not in self._unstarted:
            conn.writer.close()
            return False  # close() answered 503 while the head was on its way
        self._unstarted.discard(writer)
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
        if streaming:
            exchange.meter = SseMeter(prepared.strip_usage)
        # Re-frame as chunked whenever the length may change (stripped usage) or is unknown.
        out_chunked = not no_body and not http10 and (up_chunked or up_length is None or streaming)
        keep = keep and not http10 and (out_chunked or up_length is not None or no_body)
        length = None if out_chunked or no_body else up_length
        head = response_head(status, out_headers, length=0 if no_body and length is None else length,
                             chunked=out_chunked, close=not keep)
        if no_body:
            writer.write(head)
            await writer.drain()
            self._release_upstream(conn, up_keep)
            return keep
        complete = await self._pump(conn, writer, head, up_chunked, up_length, out_chunked, exchange)
        self._release_upstream(conn, up_keep and complete)
        if exchange and not complete and not exchange.client_gone and not watch.gone:
            exchange.error = True
            exchange.props["cut_short"] = True
        return keep and complete and not (exchange and exchange.client_gone)

    async def _pump(self, conn: UpstreamConn, writer: asyncio.StreamWriter, head: bytes, up_chunked: bool,
                    up_length: int | None, out_chunked: bool, exchange: Exchange | None) -> bool:
        """Copy the response body; True when it arrived complete and reached the client.

        The response head goes out with the first body bytes, and the last chunk with the last
        bytes: every send on loopback costs a syscall that wakes the other side (measured as the
        largest CPU item per request), and a client gains nothing from headers before its first
        token.
        """
        decoder = ChunkedDecoder() if up_chunked else None
        meter = exchange.meter if exchange else None
        keep_copy = exchange is not None and meter is None
        copy: list[bytes] = []
        copied = 0
        remaining = up_length
        progress = [time.monotonic()]
        key = id(conn)
        self._streams[key] = (conn, progress)
        complete = False
        upstream_cut = False
        pending = head  # not yet sent
        try:
            while True:
                want = READ_SIZE if remaining is None else min(READ_SIZE, remaining)
                if want == 0:
                    complete = True
                    break
                try:
                    data = await conn.reader.read(want)
                except ConnectionError:
                    data = b""  # the server died under us (reset): the same cut as an early EOF
                if not data:
                    complete = decoder is None and remaining is None  # close-delimited: EOF is the end
                    upstream_cut = not complete
                    break
                now = time.perf_counter()
                progress[0] = time.monotonic()
                if remaining is not None:
                    remaining -= len(data)
                if decoder:
                    try:
                        data = decoder.feed(data)
                    except ChunkedError as exc:
                        if exchange:
                            exchange.props["upstream_error"] = f"malformed chunked response: {exc}"
                        upstream_cut = True
                        break
                if meter:
                    data = meter.feed(data, now)
                elif keep_copy and copied <= MAX_METERED_BODY:
                    copy.append(data)
                    copied += len(data)
                if decoder and decoder.done:
                    complete = True
                    break
                if data:
                    writer.write(pending + (chunk(data) if out_chunked else data))
                    pending = b""
                    if writer.transport.get_write_buffer_size() > 256 * 1024:
                        await writer.drain()
                    elif writer.is_closing():
                        raise ConnectionResetError("client went away")
            if meter:
                data = (data if complete and decoder else b"") + meter.flush()
            elif not (complete and decoder):
                data = b""
            out = pending + ((chunk(data) if out_chunked else data) if data else b"")
            if out_chunked and complete:
                out += LAST_CHUNK
            elif upstream_cut and meter and out_chunked:
                # A cut must not read as a finish: end the SSE stream with an OpenAI-style error event,
                # which clients raise as an error (openai-python src/openai/_streaming.py raises
                # APIError for a data event carrying "error"), then end the body.
                out += chunk(_STREAM_CUT_EVENT) + LAST_CHUNK
                if exchange:
                    exchange.props["stream_cut"] = True
            if out:
                writer.write(out)
            await writer.drain()
        except (ConnectionError, RuntimeError):
            if exchange:
                exchange.client_gone = True
            complete = False
        finally:
            self._streams.pop(key, None)
            if exchange:
                exchange.ended = time.perf_counter()
                if keep_copy and copied <= MAX_METERED_BODY:
                    exchange.usage = usage_from_body(b"".join(copy))
        if not complete:
            conn.writer.close()  # stop the generation: nobody will read it
        return complete

    async def _watch_streams(self) -> None:
        """Abort upstream streams that made no progress for `upstream_idle_timeout_s` (hung server)."""
        period = max(0.05, min(5.0, self.upstream_idle_timeout_s / 4))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for conn, progress in list(self._streams.values()):
                if now - progress[0] > self.upstream_idle_timeout_s:
                    log("upstream_stalled", idle_s=round(now - progress[0], 1))
                    conn.writer.transport.abort()

    # ------------------------------------------------------------ health

    async def _health(self, head_only: bool, keep: bool) -> bytes:
        if self.draining:
            status, body = 503, {"status": "draining"}
        else:
            status, body = await self._upstream_health()
        payload = json.dumps(body).encode()
        out = response_head(status, [("Content-Type", "application/json")], length=len(payload), close=not keep)
        return out if head_only else out + payload

    async def _upstream_health(self) -> tuple[int, dict[str, Any]]:
        """The model server's /health; checks that arrive while one is in flight share its answer."""
        if self._health_probe is None or self._health_probe.done():
            self._health_probe = asyncio.ensure_future(self._probe_health())
        # Shielded: a caller that goes away must not cancel the probe the others wait for.
        return await asyncio.shield(self._health_probe)

    async def _probe_health(self) -> tuple[int, dict[str, Any]]:
        """One GET /health over a kept-alive connection (a connection per check left thousands of
        sockets in TIME_WAIT); a fresh one when the server had closed it (trtllm-serve closes idle
        connections after a few seconds), retried once when that happens mid-send."""
        conn, self._health_conn = self._health_conn, None
        for attempt in (0, 1):
            if conn is None or conn.reader.at_eof() or conn.writer.is_closing():
                if conn is not None:
                    conn.writer.close()
                try:
                    reader, writer = await asyncio.wait_for(asyncio.open_connection(*self.upstream),
                                                            self.health_timeout_s)
                except (OSError, asyncio.TimeoutError) as exc:
                    return 503, {"status": "unhealthy", "reason": f"model server unreachable: {type(exc).__name__}"}
                conn = UpstreamConn(reader, writer)
            else:
                conn.reused = True
            try:
                conn.writer.write(f"GET /health HTTP/1.1\r\nHost: {self.upstream[0]}:{self.upstream[1]}\r\n\r\n"
                                  .encode())
                status, reusable = await asyncio.wait_for(self._health_answer(conn), self.health_timeout_s)
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                conn.writer.close()
                if conn.reused and attempt == 0 and not getattr(exc, "partial", b""):
                    conn = None
                    continue  # the server had closed the idle connection: once more on a new one
                return 503, {"status": "unhealthy", "reason": f"model server health check failed: {type(exc).__name__}"}
            except (OSError, asyncio.TimeoutError, asyncio.LimitOverrunError, ValueError) as exc:
                conn.writer.close()
                return 503, {"status": "unhealthy", "reason": f"model server health check failed: {type(exc).__name__}"}
            if reusable and not self.draining:
                self._health_conn = conn
            else:
                conn.writer.close()
            if status == 200:
                return 200, {"status": "ok"}
            return 503, {"status": "unhealthy", "reason": f"model server /health answered {status}"}
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    async def _health_answer(conn: UpstreamConn) -> tuple[int, bool]:
        """Status of the /health answer, its body read to the end; True when the connection can be reused."""
        raw = await conn.reader.readuntil(b"\r\n\r\n")
        status, headers = _parse_response_head(raw)
        lower = {k.lower(): v for k, v in headers}
        reusable = "close" not in lower.get("connection", "").lower()
        if "chunked" in lower.get("transfer-encoding", "").lower():
            decoder, size = ChunkedDecoder(), 0
            while not decoder.done:
                data = await conn.reader.read(READ_SIZE)
                if not data:
                    raise asyncio.IncompleteReadError(b"", None)
                size += len(decoder.feed(data))
                if size > MAX_HEALTH_BODY:
                    return status, False
        elif "content-length" in lower:
            length = int(lower["content-length"])
            if length > MAX_HEALTH_BODY:
                return status, False
            await conn.reader.readexactly(length)
        else:
            reusable = False  # the body ends when the server closes
        return status, reusable

    # ------------------------------------------------------------ metrics

    def _record(self, ex: Exchange, path: str) -> None:
        end = ex.ended or time.perf_counter()
        meter = ex.meter
        usage = meter.usage if meter else ex.usage
        input_tokens, output_tokens = tokens(usage)
        props: dict[str, Any] = {"path": path, "status": ex.status, **ex.props}
        if usage is None and meter and meter.content_events:
            output_tokens = meter.content_events  # stream ended before its usage event: count what was sent
            props["usage_source"] = "content_events"
        if ex.client_gone:
            props["client_disconnected"] = True
        values: dict[str, float] = {t.REQUESTS: 1, t.THROTTLED: 0, t.ERRORS: 1 if ex.error else 0,
                                    t.INPUT_TOKENS: input_tokens, t.OUTPUT_TOKENS: output_tokens}
        if ex.props.get("stream_cut"):
            values[t.STREAMS_CUT] = 1
        if meter and meter.first_content_at is not None:
            values[t.TTFT_MS] = round((meter.first_content_at - ex.started) * 1000, 3)
            values[t.E2E_MS] = round((meter.last_content_at - ex.started) * 1000, 3)
            if output_tokens > 1:
                values[t.ITL_MS] = round((meter.last_content_at - meter.first_content_at) * 1000
                                         / (output_tokens - 1), 3)
        elif not meter and ex.status and ex.status < 400:
            values[t.E2E_MS] = round((end - ex.started) * 1000, 3)
        # Traffic shape of an admitted request: three bucket labels, each a bisect over a dozen bounds
        # (docs/gateway.md, Traffic shape).
        shape = None
        if ex.in_flight:
            shape = {t.DIM_IN_FLIGHT: t.in_flight_label(ex.in_flight), t.DIM_INPUT_BUCKET: t.token_label(input_tokens),
                     t.DIM_OUTPUT_BUCKET: t.token_label(output_tokens)}
        self.metrics.emit(ex.consumer, values, props, ex.arrived_ms, shape)


def _parse_response_head(raw: bytes) -> tuple[int, list[tuple[str, str]]]:
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"bad status line {lines[0][:60]!r}")
    headers = []
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise ValueError("bad header line")
            headers.append((name.strip(), value.strip()))
    return int(parts[1]), headers
