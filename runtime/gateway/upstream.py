"""Connections to one local model server: a keep-alive pool, the send with its one safe retry,
the watch that notices a client that left, and the watchdog that aborts a hung stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import SupportsIndex, cast

from .http import parse_response_head
from .identity import log

UPSTREAM_READ_LIMIT = 64 * 1024


class UpstreamReader(asyncio.StreamReader):
    """The StreamReader of a connection to the model server. While a response body is relayed, what
    arrives goes to `sink` from the transport's callback, not into the buffer (proxy.py: no future and
    no task wake-up per SSE event); EOF and errors reach `sink` as None after the reader records them."""

    sink: Callable[[bytes | None], None] | None = None

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        if self.sink is None:
            super().feed_data(data)
        else:
            self.sink(cast(bytes, data))  # a transport's data_received: always bytes

    def feed_eof(self) -> None:
        super().feed_eof()
        if self.sink is not None:
            self.sink(None)

    def set_exception(self, exc: Exception) -> None:
        super().set_exception(exc)
        if self.sink is not None:
            self.sink(None)


async def open_upstream(address: tuple[str, int]) -> tuple[UpstreamReader, asyncio.StreamWriter]:
    """asyncio.open_connection (CPython Lib/asyncio/streams.py) with an UpstreamReader."""
    loop = asyncio.get_running_loop()
    reader = UpstreamReader(limit=UPSTREAM_READ_LIMIT, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.create_connection(lambda: protocol, *address)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


# What a client is told to wait before it retries a request that found its model's process down or restarting
# (a crash, a frozen process killed by its liveness probe, a GPU's processes restarted together after an MPS fault:
# runtime/supervisor.py): a restart takes seconds (7.1 s for two processes on the H200, docs/runtime.md).
RESTART_RETRY_AFTER_S = 5


class UpstreamError(Exception):
    """The local server could not be reached or broke the protocol. `retryable`: it was not there to answer
    (nothing listening, or the connection closed before any response): the process is down or restarting, and
    the request, which no response began, can be sent again."""

    def __init__(self, message: str, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


class ClientGone(Exception):
    """The client left while its request waited upstream; the upstream connection was cut."""


@dataclass
class UpstreamConn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False
    stalled: bool = False  # aborted by the StreamWatchdog: the server had the request and sent nothing


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


class UpstreamPool:
    """Kept-alive connections to one loopback server (host, port)."""

    def __init__(self, address: tuple[str, int], max_idle: int = 256, preamble: bytes = b""):
        """`preamble`: bytes each new connection starts with (a peer gateway expects a PROXY v2 header)."""
        self.address = address
        self.preamble = preamble
        self.max_idle = max_idle
        self.in_flight = 0  # requests of this gateway on this server now (routing's least-in-flight choice)
        self._idle: list[UpstreamConn] = []
        self.warm = 0  # idle connections kept open ahead of demand
        self._opening = 0
        self._retry_at = 0.0  # after a failed warm-up connect, none before this (monotonic)

    def keep_warm(self, count: int) -> None:
        """Keep `count` connections open and idle ahead of demand, so a burst of requests finds them ready
        instead of each paying a connect (and the server an accept) before its first byte goes out."""
        self.warm = min(count, self.max_idle)
        self.tidy()

    def tidy(self) -> None:
        """Drop idle connections the server closed (trtllm-serve's uvicorn closes idle ones after 5 s), then top up."""
        if any(c.reader.at_eof() or c.writer.is_closing() for c in self._idle):
            for conn in self._idle:
                if conn.reader.at_eof() or conn.writer.is_closing():
                    conn.writer.close()
            self._idle = [c for c in self._idle if not (c.reader.at_eof() or c.writer.is_closing())]
        missing = self.warm - len(self._idle) - self._opening
        if missing > 0 and time.monotonic() >= self._retry_at:
            self._opening += missing
            for _ in range(missing):
                asyncio.ensure_future(self._open_spare())

    async def _open_spare(self) -> None:
        try:
            reader, writer = await open_upstream(self.address)
        except OSError:
            self._retry_at = time.monotonic() + 1.0  # the server is down or starting: no connect storm
            return
        finally:
            self._opening -= 1
        if self.preamble:
            writer.write(self.preamble)
        self.release(UpstreamConn(reader, writer, reused=True), True)

    @property
    def host_header(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    async def get(self) -> UpstreamConn:
        while self._idle:
            conn = self._idle.pop()
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                conn.reused = True
                if self.warm and len(self._idle) + self._opening < self.warm:
                    self.tidy()  # replace it before the next burst needs it
                return conn
            conn.writer.close()
        try:
            reader, writer = await open_upstream(self.address)
        except OSError as exc:
            raise UpstreamError(f"cannot connect to the model server at {self.host_header}: "
                                f"{exc.strerror or exc}", retryable=True) from None
        if self.preamble:
            writer.write(self.preamble)
        return UpstreamConn(reader, writer)

    def release(self, conn: UpstreamConn, reusable: bool) -> None:
        if reusable and len(self._idle) < self.max_idle and not conn.writer.is_closing():
            self._idle.append(conn)
        else:
            conn.writer.close()

    def close(self) -> None:
        for conn in self._idle:
            conn.writer.close()
        self._idle.clear()

    async def send(self, head: bytes, body: bytes, watch: ClientWatch | None = None,
                   watchdog: StreamWatchdog | None = None) -> tuple[UpstreamConn, int, list[tuple[str, str]]]:
        """Send the request and read the response head; one retry when a pooled connection had gone stale.

        `watchdog` covers the wait for the head too: a server that accepts the request and never answers is
        cut after the same inactivity timeout as one that stops mid-stream."""
        for attempt in (0, 1):
            conn = await self.get()
            if watch is not None:
                if watch.gone:
                    conn.writer.close()
                    raise ClientGone()
                watch.conn = conn
            if watchdog is not None:
                watchdog.watch(conn)
            try:
                conn.writer.write(head + body)
                raw = await conn.reader.readuntil(b"\r\n\r\n")
                status, headers = parse_response_head(raw)
                while 100 <= status < 200:  # interim responses: skip
                    raw = await conn.reader.readuntil(b"\r\n\r\n")
                    status, headers = parse_response_head(raw)
                return conn, status, headers
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                conn.writer.close()
                if watch is not None and watch.gone:
                    raise ClientGone() from None  # cut by the watch: never resend
                if conn.stalled:  # it had the request: never resend
                    raise UpstreamError(f"model server sent no response head for {watchdog.idle_timeout_s:g} s "  # type: ignore[union-attr]  # only a watchdog marks a connection stalled
                                        "(upstream inactivity timeout)") from None
                if conn.reused and attempt == 0 and not getattr(exc, "partial", b""):
                    continue  # the server closed an idle keep-alive connection; it never saw this request
                raise UpstreamError(f"model server closed the connection: {type(exc).__name__}",
                                    retryable=True) from None
            except (asyncio.LimitOverrunError, ValueError) as exc:
                conn.writer.close()
                raise UpstreamError(f"model server sent a malformed response head: {exc}") from None
            finally:
                if watchdog is not None:
                    watchdog.unwatch(conn)
        raise UpstreamError("unreachable")  # pragma: no cover


class StreamWatchdog:
    """Aborts upstream responses that made no progress for `idle_timeout_s` (a hung server)."""

    def __init__(self, idle_timeout_s: float):
        self.idle_timeout_s = idle_timeout_s
        self._streams: dict[int, tuple[UpstreamConn, list[float]]] = {}  # last upstream progress, monotonic
        self._task: asyncio.Future[None] | None = None
        self._pools: tuple[UpstreamPool, ...] = ()

    def watch(self, conn: UpstreamConn) -> list[float]:
        """Start watching `conn`; the caller stores time.monotonic() in the returned cell on each read."""
        progress = [time.monotonic()]
        self._streams[id(conn)] = (conn, progress)
        return progress

    def unwatch(self, conn: UpstreamConn) -> None:
        self._streams.pop(id(conn), None)

    def start(self, pools: Iterable[UpstreamPool] = ()) -> None:
        self._pools = tuple(pools)  # kept warm from here between requests
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task:
            self._task.cancel()

    async def _run(self) -> None:
        period = max(0.05, min(1.0, self.idle_timeout_s / 4))
        while True:
            await asyncio.sleep(period)
            for pool in self._pools:
                if pool.warm:
                    pool.tidy()
            now = time.monotonic()
            for conn, progress in list(self._streams.values()):
                if now - progress[0] > self.idle_timeout_s:
                    log("upstream_stalled", idle_s=round(now - progress[0], 1))
                    conn.stalled = True
                    conn.writer.transport.abort()
