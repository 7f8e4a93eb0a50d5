"""The HTTP process's end of the engine process (worker.py): trtllm-serve's GenerationExecutorProxy, for the reference.

The HTTP process keeps everything per stream (parsing, the SSE encoding, the socket writes); the engine process
steps the model. A request goes over as one SUBMIT, a client that left as one CANCEL; each delivery point of the
engine comes back as one EVENTS message with every sequence's token, read by the event loop itself (add_reader on
the channel: one wake-up per message, no thread) and put into each request's queue (protocol.py).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import socket
import subprocess
import sys
from typing import Any

from . import protocol as p

log = logging.getLogger("fleetcast.reference.proxy")


class EngineLoadFailed(RuntimeError):
    """The engine process could not load the artifact (its message), or ended before it said."""


class RemoteSequence:
    """The HTTP process's handle of one request in the engine process: where its events go."""

    __slots__ = ("id", "sink", "cached_tokens")

    def __init__(self, rid: int, sink: Any) -> None:
        self.id, self.sink, self.cached_tokens = rid, sink, 0


def worker_command() -> list[str]:
    """The engine process's argv: this interpreter."""
    return [sys.executable, "-m", p.WORKER_MODULE]


class EngineProxy:
    """Starts the engine process and speaks to it; the Engine's surface as the server uses it (submit, cancel,
    failed, stats), from the event loop's thread only."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.failed: BaseException | None = None
        self.info: dict[str, Any] = {}
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._frames = p.Frames()
        self._out = bytearray()  # what the channel did not take yet
        self._sinks: dict[int, RemoteSequence] = {}
        self._ids = itertools.count(1)
        self._asks: dict[int, asyncio.Future[Any]] = {}
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._closed = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def holds_streams(self) -> bool:
        """Whether a request's stream is open here (runtime/heap.py's policy reads it from its own thread)."""
        return len(self._sinks) > 0

    async def start(self) -> None:
        """Start the engine process and wait until it has loaded (EngineLoadFailed if it cannot). Called from the
        event loop's thread, which lives as long as the process: PR_SET_PDEATHSIG follows the thread that started
        the child (prctl(2)), not the process."""
        loop = self._loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Same session and process group as this one (no start_new_session): the supervisor's view of a
            # starting server is its session's CPU, and a frozen server's group is what it kills.
            self.proc = subprocess.Popen(worker_command(), stdin=theirs.fileno())
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        self._ready = loop.create_future()
        self._stopped = loop.create_future()
        loop.add_reader(ours.fileno(), self._readable)
        self._send((p.START, self.args))
        self.info = await self._ready

    # ---- the channel -------------------------------------------------------------------------

    def _send(self, message: tuple[Any, ...]) -> None:
        if self._closed or self._sock is None:
            return
        data = p.frame(message)
        if not self._out:
            try:
                sent = self._sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                return  # the engine process is gone: _readable has seen or will see the end
            data = data[sent:]
            if not data:
                return
            assert self._loop is not None
            self._loop.add_writer(self._sock.fileno(), self._writable)
        self._out += data

    def _writable(self) -> None:
        assert self._sock is not None and self._loop is not None
        try:
            sent = self._sock.send(self._out)
        except BlockingIOError:
            return
        except OSError:
            sent = len(self._out)
        del self._out[:sent]
        if not self._out:
            self._loop.remove_writer(self._sock.fileno())

    def _readable(self) -> None:
        assert self._sock is not None
        try:
            data = self._sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._ended()
            return
        for message in self._frames.feed(data):
            kind = message[0]
            if kind == p.EVENTS:
                self._dispatch(message[1], message[2])
            elif kind == p.REPLY:
                ask = self._asks.pop(message[1], None)
                if ask is not None and not ask.done():
                    ask.set_result(message[2])
            elif kind == p.READY:
                assert self._ready is not None
                if not self._ready.done():
                    self._ready.set_result(message[1])
            elif kind == p.LOAD_FAILED:
                assert self._ready is not None
                if not self._ready.done():
                    self._ready.set_exception(EngineLoadFailed(message[1]))
            elif kind == p.FAILED:
                self.failed = RuntimeError(f"engine thread failed: {message[1]}")
            elif kind == p.STOPPED:
                assert self._stopped is not None
                if not self._stopped.done():
                    self._stopped.set_result(None)

    def _dispatch(self, at: float, events: list[tuple[int, int | None, str | None, int]]) -> None:
        sinks = self._sinks
        for rid, token, reason, cached in events:
            seq = sinks.get(rid)
            if seq is None:
                continue
            seq.cached_tokens = cached
            if reason is not None:
                del sinks[rid]
            seq.sink.put_nowait((token, reason, at))

    def _ended(self) -> None:
        """The channel's end: the engine process is gone. Whatever waited on it ends now."""
        assert self._sock is not None and self._loop is not None
        self._loop.remove_reader(self._sock.fileno())
        if self._out:
            self._loop.remove_writer(self._sock.fileno())
            self._out.clear()
        self._closed = True
        stopped = self._stopped is not None and self._stopped.done()
        if not stopped and self.failed is None:
            self.failed = RuntimeError("the engine process exited")
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(EngineLoadFailed("the engine process exited before it loaded"))
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)
        for ask in self._asks.values():
            if not ask.done():
                ask.set_result(None)
        self._asks.clear()
        at = self._loop.time()
        for rid in list(self._sinks):
            self._dispatch(at, [(rid, None, "error", self._sinks[rid].cached_tokens)])

    # ---- the Engine's surface ---------------------------------------------------------------------

    def validate(self, prompt: list[int], params: p.SamplingParams) -> None:
        """Raise ValueError (naming the field) if the engine cannot serve it, before anything is sent."""
        p.check_request(prompt, params, self.info["vocab_size"], self.info["max_seq_len"])

    def submit(self, prompt: list[int], params: p.SamplingParams, salt: str | None, sink: Any,
               traced: bool = False) -> RemoteSequence:
        """Send a request; its events go to `sink.put_nowait((token, reason, at))`. ValueError: it cannot be served;
        RuntimeError: the engine is gone. `traced` (the TTFT trace's test switch only): the engine process stamps it."""
        self.validate(prompt, params)
        if self.failed is not None or self._closed:
            raise RuntimeError("engine is stopped")
        seq = RemoteSequence(next(self._ids), sink)
        self._sinks[seq.id] = seq
        if traced:
            self._send((p.TRACE, seq.id))
        self._send((p.SUBMIT, seq.id, prompt, params, salt))
        return seq

    def cancel(self, seq: RemoteSequence) -> None:
        if seq.id in self._sinks:
            self._send((p.CANCEL, seq.id))

    async def _ask(self, kind: str, default: Any, timeout: float = 10.0) -> Any:
        if self._closed or self._loop is None:
            return default
        ask_id = next(self._ids)
        future = self._asks[ask_id] = self._loop.create_future()
        self._send((kind, ask_id))
        try:
            value = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            self._asks.pop(ask_id, None)
            return default
        return default if value is None else value

    async def pop_stats(self) -> list[dict[str, Any]]:
        """Iteration stats gathered since the last call (dequeued in the engine process)."""
        stats: list[dict[str, Any]] = await self._ask(p.STATS, [])
        return stats

    async def memory(self) -> dict[str, Any]:
        report: dict[str, Any] = await self._ask(p.MEMORY, {})
        return report

    async def stop(self, timeout: float = 15.0) -> None:
        """Stop the engine (what is left ends "cancelled", its events first), then its process."""
        if self.proc is None:
            return
        if not self._closed and self._stopped is not None:
            self._send((p.STOP,))
            try:
                await asyncio.wait_for(asyncio.shield(self._stopped), timeout)
            except TimeoutError:
                log.warning("the engine process did not stop within %.0fs; killing it", timeout)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.proc.wait, timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            await loop.run_in_executor(None, self.proc.wait)
        if self._sock is not None:
            if not self._closed and self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())
                if self._out:
                    self._loop.remove_writer(self._sock.fileno())
            self._closed = True
            self._sock.close()
