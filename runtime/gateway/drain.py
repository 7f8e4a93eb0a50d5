"""Drain: from SIGTERM on, health says 503 and new requests are refused while in-flight ones finish.

`Drain` counts the admitted requests in flight (what a drain waits for), the
writers whose request went upstream but got no response head yet, and the
responses being relayed. When the drain timeout (or a Spot notice's deadline)
cuts them, none ends in a bare reset: a request without a response head gets a
retryable 503, and so does one whose head the gateway still holds back (a
streaming request queued in the engine: the gateway sends the head with the first
bytes); a stream cut mid-body ends with an OpenAI-style error event (proxy.py).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .http import openai_error
from .identity import log

if TYPE_CHECKING:  # annotations only
    from .shared import SharedState
    from .upstream import UpstreamConn

DRAINING_MESSAGE = "this instance is draining; retry and the load balancer will pick another"
_CUT_BEFORE_START = openai_error(503, "this instance is shutting down and the request did not start in time; "
                                      "retry it", "service_unavailable", "draining", close=True)
CUT_BEFORE_START = _CUT_BEFORE_START  # proxy.py answers a queued stream whose head it still holds the same way


class Drain:
    """In-flight accounting and the draining flag of one gateway."""

    def __init__(self, timeout_s: float, instance: SharedState | None = None):
        """`instance`: the count shared by every worker process (shared.SharedState), if there are several."""
        self.timeout_s = timeout_s
        self._instance = instance
        self.draining = False
        self.active = 0  # admitted requests being served (health checks excluded)
        self._idle = asyncio.Event()
        self._idle.set()
        self._unstarted: set[asyncio.StreamWriter] = set()  # sent upstream, no response head yet
        self._relaying: dict[int, UpstreamConn] = {}  # id -> upstream connection whose response is being relayed (proxy._pump)
        self._relayed = asyncio.Event()
        self._relayed.set()
        self.cutting = False  # close() is cutting what is still in flight: endings say so

    def enter(self) -> int:
        """Count one admitted request; returns the instance's in-flight count including it."""
        self.active += 1
        self._idle.clear()
        return self._instance.enter() if self._instance is not None else self.active

    def leave(self) -> None:
        if self._instance is not None:
            self._instance.leave()
        self.active -= 1
        if self.active == 0:
            self._idle.set()

    def begin(self) -> None:
        """SIGTERM: health turns 503 now; new requests are refused; in-flight ones carry on."""
        if not self.draining:
            self.draining = True
            log("drain_started", active=self.active, timeout_s=self.timeout_s)

    async def wait(self) -> bool:
        """Wait for in-flight requests (bounded by the timeout); True if all finished."""
        self.begin()
        try:
            await asyncio.wait_for(self._idle.wait(), self.timeout_s)
            finished = True
        except TimeoutError:
            finished = False
        log("drain_finished", all_finished=finished, cut=self.active)
        return finished

    # A request between "sent upstream" and "response head arrived": the one window where a cut
    # can still be answered with a clean status instead of a reset.
    def started_upstream(self, writer: asyncio.StreamWriter) -> None:
        self._unstarted.add(writer)

    def head_arrived(self, writer: asyncio.StreamWriter) -> bool:
        """The response head came; False when the writer was already answered 503 by `cut_unstarted`."""
        if writer not in self._unstarted:
            return False
        self._unstarted.discard(writer)
        return True

    def forget(self, writer: asyncio.StreamWriter) -> None:
        """Nobody will answer this writer (client gone, cancelled): it must not be kept or written to."""
        self._unstarted.discard(writer)

    @property
    def unstarted(self) -> int:
        return len(self._unstarted)

    def cut_unstarted(self) -> None:
        """At close: every request still waiting for its response head gets a retryable 503."""
        for writer in list(self._unstarted):
            self._unstarted.discard(writer)
            writer.write(_CUT_BEFORE_START)

    # Responses being relayed: close() cuts their upstream connections and lets each pump write its own ending.
    def relaying(self, conn: UpstreamConn) -> None:
        self._relaying[id(conn)] = conn
        self._relayed.clear()

    def relayed(self, conn: UpstreamConn) -> None:
        self._relaying.pop(id(conn), None)
        if not self._relaying:
            self._relayed.set()

    async def cut_relaying(self, wait_s: float) -> None:
        """At close: end every relayed response from its upstream side, so the pump sees the cut and writes the
        client a 503 (head not sent yet) or an error event (mid-stream); wait for them at most `wait_s`."""
        self.cutting = True
        for conn in list(self._relaying.values()):
            conn.writer.transport.abort()
        try:
            await asyncio.wait_for(self._relayed.wait(), wait_s)
        except TimeoutError:
            log("drain_cut_unfinished", relaying=len(self._relaying))
