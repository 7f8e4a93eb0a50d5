"""When the gateway's cyclic garbage collector runs: the young generation as CPython schedules it, the
older generations on a timer.

A collection stops the event loop, so every stream of the process waits for it. On CPython's default
schedule (thresholds 700, 10, 10) a collection of the older generations comes every second or so under
load, and each walks every live request's objects (transports, streams, coroutines, buffers): at 64
streams a worker, a pause that lands on every one of its streams' next token, often enough to show in
the ITL P99. Those collections free next to nothing (a request's objects die by reference count when it
ends: docs/gateway.md has the measurement), so the gateway runs them whole every `period_s` instead,
where one pause touches a fraction of a percent of token gaps. The young generation keeps CPython's
threshold: its collections are short (at most a few hundred fresh objects) and free what cycles a
request drops while it runs.
"""

from __future__ import annotations

import asyncio
import gc

GC_PERIOD_S = 10.0  # default: the older generations are collected this often (python -m runtime.gateway --gc-period-s)
_NEVER = 1 << 30  # a threshold the generation counters never reach: no automatic older-generation collection


class Collector:
    """Owns the collector's schedule for one gateway process; `period_s` 0 leaves CPython's own."""

    def __init__(self, period_s: float = GC_PERIOD_S):
        self.period_s = period_s
        self.collections = 0
        self._handle: asyncio.TimerHandle | None = None
        self._saved: tuple[int, int, int] | None = None

    def start(self) -> None:
        if not self.period_s:
            return
        self._saved = gc.get_threshold()
        gc.set_threshold(self._saved[0], _NEVER, _NEVER)
        self._handle = asyncio.get_running_loop().call_later(self.period_s, self._collect)

    def _collect(self) -> None:
        gc.collect()
        self.collections += 1
        self._handle = asyncio.get_running_loop().call_later(self.period_s, self._collect)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._saved is not None:
            gc.set_threshold(*self._saved)
            self._saved = None
