"""A serving process's garbage-collection policy: one home, used by the gateway and both reference processes.

CPython's collector walks every tracked object of the generations it collects, in whichever thread allocates when
the counts say so, holding the interpreter lock throughout: every other thread of the process stops with it, and in
an asyncio process so does every stream it serves. Two kinds of object make a full (generation 2) collection long:

- What a process loads at startup (PyTorch and the model in the reference engine's process, aiohttp in its HTTP
  process, botocore's service models in the gateway) lives as long as the process: 167k objects in the reference
  engine's process, 35k in its HTTP process, whose full collections took 185-590 ms and 26-70 ms on the development
  VM. gc.freeze() (docs.python.org/3/library/gc.html#gc.freeze: "Freeze all the objects tracked by the garbage
  collector; move them to a permanent generation and ignore them in all the future collections") takes them out.
- What serving holds: a request waiting for an engine slot keeps its connection, its coroutines, futures and
  buffers alive (about 50 tracked objects in the gateway), so they outlive two young collections and reach the
  oldest generation. A gateway holding thousands of a flooding neighbour's requests then holds hundreds of
  thousands of objects there, and each automatic full collection walks them all: 80-135 ms, nine times in a
  16 s phase of the fairness bench on an H100 host, every one finding nothing to free (bench/FAIRNESS_DEVICE.md,
  call 4). Those objects are alive, not garbage: no threshold makes walking them short, only not walking them.

So a serving process (`serve_gc_policy`): freezes its startup heap; keeps the automatic young collections
(generation 1 every YOUNG_PERIODS of generation 0), which walk at most what survived since the last of them
(`young_scan_bound`); turns off the automatic full collections, by a threshold2 no count reaches; and runs the
full collection itself, from a thread of its own, when the process holds no request (`busy()` false), so that it
walks only what is left when nothing is served and stalls nobody. The docs (gc.set_threshold) define the trigger
this relies on: generation 2 is examined when the number of generation-1 collections since the last full one
exceeds threshold2, and (CPython 3.12 and 3.13, gcmodule.c / gc.c, `long_lived_pending`) only once the objects
that survived into it since exceed a quarter of those there before: both counts gate it, so a threshold2 never
reached means no automatic full collection. A process never idle for MAX_DEFER_S still gets a full collection
then: a bounded pause every ten minutes against cyclic garbage growing without bound. Serving is meant to leave
no cyclic garbage (tests/runtime/test_heap.py and tests/gateway/test_heap_under_flood.py check the gateway's
bursts), so that deferred collection finds ~nothing.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

# gc.set_threshold's threshold2: more generation-1 collections than a process makes between two idle moments (one
# per `threshold1` young collections, each per `threshold0` allocations: 10**9 of them is days of serving at any
# rate, and MAX_DEFER_S comes first). A C int, as set_threshold parses it.
NO_AUTOMATIC_FULL = 10**9
# gc.set_threshold's threshold1: generation 1 is collected every this many generation-0 collections, and walks
# what survived them all. CPython's 10 let a gateway holding a flood walk ~9k objects at once (7-10 ms on the VM and
# on an H100 host); 2 keeps a walk to about three young periods, and what survives goes to the oldest generation,
# which only the idle collection walks.
YOUNG_PERIODS = 2
IDLE_CHECK_S = 1.0  # how often the policy's thread looks whether the process holds a request
MAX_DEFER_S = 600.0  # the longest a full collection waits for an idle moment


def freeze_startup_heap() -> int:
    """Collect what startup left as garbage (so it is not frozen for ever), then freeze every object still tracked;
    the number frozen. Call once startup is done, before serving."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def young_scan_bound(thresholds: tuple[int, ...] | None = None) -> int:
    """About the most objects an automatic collection walks under this policy: a generation-1 collection walks
    generations 0 and 1, which hold what survived of threshold1 + 1 young periods, each of threshold0 allocations
    less deallocations (gc.set_threshold). Twice that: a deallocation of an older object (a finished request's)
    also counts against the period, so a period can hold more young objects than threshold0 (measured: 1.1x under
    a flood, tests/runtime/test_heap.py)."""
    t0, t1, _ = thresholds or gc.get_threshold()
    return 2 * t0 * (t1 + 1)


class GcPolicy:
    """The process's full collections, run off the request path (module docstring)."""

    def __init__(self, busy: Callable[[], bool], check_s: float = IDLE_CHECK_S, max_defer_s: float = MAX_DEFER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.busy, self.check_s, self.max_defer_s, self.clock = busy, check_s, max_defer_s, clock
        self.frozen = 0  # objects the startup freeze moved out of every collection
        self.full_collections = 0  # run by this policy (idle or deferred past max_defer_s)
        self.deferred = 0  # of those, run while busy because max_defer_s ran out
        self._last = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def apply(self) -> int:
        """Freeze the startup heap, turn the automatic full collections off and start the idle collector; the number
        of objects frozen."""
        frozen = self.frozen = freeze_startup_heap()
        gc.set_threshold(gc.get_threshold()[0], YOUNG_PERIODS, NO_AUTOMATIC_FULL)
        self._thread = threading.Thread(target=self._run, name="gc-idle", daemon=True)
        self._thread.start()
        return frozen

    def tick(self) -> bool:
        """One look: a full collection when something reached the oldest generation since the last one (its count,
        gc.get_count()[2], is the generation-1 collections since) and the process is idle, or it waited
        max_defer_s. Whether it collected."""
        if gc.get_count()[2] == 0:
            self._last = self.clock()
            return False
        overdue = self.clock() - self._last >= self.max_defer_s
        if self.busy() and not overdue:
            return False
        gc.collect()
        self.full_collections += 1
        self.deferred += overdue and self.busy()
        self._last = self.clock()
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.check_s):
            self.tick()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


_running: GcPolicy | None = None  # the process's policy: one collector thread, whoever calls again


def serve_gc_policy(busy: Callable[[], bool]) -> GcPolicy:
    """Apply the serving policy (module docstring) once startup is done, before serving; `busy()` says whether the
    process holds a request (read from the policy's thread: a length or a counter, no lock). A second call (a
    process that loads again) freezes what it loaded since and keeps the one policy, reading the new `busy`."""
    global _running
    if _running is not None:
        _running.busy = busy
        _running.frozen = freeze_startup_heap()
        return _running
    _running = GcPolicy(busy)
    _running.apply()
    return _running
