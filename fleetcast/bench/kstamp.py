"""Kernel receive timestamps for TCP reads (Linux SO_TIMESTAMPNS).

With SO_TIMESTAMPNS set, every `recvmsg` carries the time the kernel took in
the data. A process that was busy or descheduled when bytes arrived still
learns when they arrived, so neither the client's event-loop lag nor CPU
contention leaks into the latencies it reports; and the test server stamps a
request's arrival the same way, so its truth log starts where the client's
request really reached it.

`StampedTransport` is a minimal asyncio transport over a non-blocking socket
that reads with `recvmsg` and hands each read's kernel time to the protocol
(`protocol.rx_time`) before calling `data_received`. Plain TCP only: TLS needs
asyncio's SSL transport, which reads with `recv` (the client then stamps reads
with the clock, as documented).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

# Linux values (asm-generic/socket.h); Python's socket module does not name them.
SO_TIMESTAMPNS = 35
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
_TIMESPEC = struct.Struct("@ll")
_READ_SIZE = 256 * 1024


def _realtime_minus_perf() -> float:
    """Offset from CLOCK_REALTIME (kernel stamps) to time.perf_counter(), best of 50 samples."""
    best_gap, offset = float("inf"), 0.0
    for _ in range(50):
        a = time.perf_counter()
        r = time.clock_gettime_ns(time.CLOCK_REALTIME)
        b = time.perf_counter()
        if b - a < best_gap:
            best_gap, offset = b - a, r / 1e9 - (a + b) / 2
    return offset


_OFFSET = _realtime_minus_perf() if sys.platform.startswith("linux") else 0.0


def supported() -> bool:
    return sys.platform.startswith("linux")


def enable(sock: socket.socket) -> bool:
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return True
    except OSError:
        return False


class StampedProtocol(asyncio.Protocol):
    """A protocol that reads each read's kernel receive time from `rx_time` in data_received."""

    rx_time: float | None = None


_P = TypeVar("_P", bound=StampedProtocol)


def kernel_time(ancdata: Iterable[tuple[int, int, bytes]]) -> float | None:
    """The read's kernel receive time on the time.perf_counter() scale, or None."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            stamp: float = sec + nsec / 1e9 - _OFFSET
            return stamp
    return None


class StampedTransport(asyncio.Transport):
    """Non-blocking socket transport that reports kernel receive times."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: StampedProtocol) -> None:
        super().__init__()
        self._loop = loop
        self._sock = sock
        self._protocol = protocol
        self._fd = sock.fileno()
        self._out = bytearray()
        self._closing = False
        self._closed = False
        self._anc = socket.CMSG_SPACE(_TIMESPEC.size)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.stamped = enable(sock)
        protocol.connection_made(self)
        loop.add_reader(self._fd, self._on_readable)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"socket": self._sock, "peername": self._peer()}.get(name, default)

    def _peer(self) -> Any:  # an address tuple of the socket's family
        try:
            return self._sock.getpeername()
        except OSError:
            return None

    def is_closing(self) -> bool:
        return self._closing or self._closed

    def _on_readable(self) -> None:
        try:
            data, anc, _, _ = self._sock.recvmsg(_READ_SIZE, self._anc)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._finish(exc)
            return
        if not data:
            self._finish(None)
            return
        self._protocol.rx_time = kernel_time(anc)
        self._protocol.data_received(data)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed or self._closing:
            return
        if self._out:
            self._out += data
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._finish(exc)
            return
        if sent < len(data):
            self._out += data[sent:]
            self._loop.add_writer(self._fd, self._on_writable)

    def _on_writable(self) -> None:
        try:
            sent = self._sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._finish(exc)
            return
        del self._out[:sent]
        if not self._out:
            self._loop.remove_writer(self._fd)
            if self._closing:
                self._finish(None)

    def close(self) -> None:
        if self._closed:
            return
        if self._out:
            self._closing = True
            self._loop.remove_reader(self._fd)
        else:
            self._finish(None)

    def abort(self) -> None:
        self._finish(None)

    def _finish(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        self._sock.close()
        self._protocol.connection_lost(exc)


async def connect(loop: asyncio.AbstractEventLoop, host: str, port: int,
                  protocol_factory: Callable[[], _P]) -> tuple[StampedTransport, _P]:
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    last: OSError | None = None
    for family, stype, proto, _, addr in infos:
        sock = socket.socket(family, stype, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, addr)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        protocol = protocol_factory()
        return StampedTransport(loop, sock, protocol), protocol
    raise last or OSError(f"cannot connect to {host}:{port}")


async def serve(loop: asyncio.AbstractEventLoop, host: str, port: int, protocol_factory: Callable[[], StampedProtocol],
                backlog: int = 1024) -> socket.socket:
    """Accept connections and wrap each in a StampedTransport. Returns the listening socket."""
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((host, port))
    lsock.listen(backlog)
    lsock.setblocking(False)

    def on_accept() -> None:
        while True:
            try:
                conn, _ = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            StampedTransport(loop, conn, protocol_factory())

    loop.add_reader(lsock.fileno(), on_accept)
    return lsock
