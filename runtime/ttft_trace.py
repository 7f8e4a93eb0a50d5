"""Where one request's time to first token goes, across the processes that serve it: a test and bench switch only.

With `TEST_TTFT_TRACE=DIR` in its environment, each process that serves a request (the gateway's workers, the
reference server's HTTP process and its engine process) and the fairness bench's quiet client append JSON lines to
DIR/<role>-<pid>.jsonl: the stamps of each request that carries the `x-request-id` header (`HEADER`), on
CLOCK_MONOTONIC, which is one clock for every process of a Linux machine (clock_gettime(2)), so a stamp of one
process compares with another's; once a second, each asyncio loop's most late-by of a 1 ms ticker (`lag`); and
each process's garbage collections, a line each for one of `GC_LINE_MS` or more and a summary a second (`gc`);
in each gateway worker, its waits for and holds of the workers' shared lock (`TimedLock`: `lock`, `lock_second`);
in the reference engine's process, where its long iterations went (`IterationWatch`: `iteration`, `iteration_second`;
scripts/trace_iterations.py attributes them).
`scripts/bench_fairness.py` joins them by the request id (and the engine's own id, which the HTTP process's line
names). Without the variable, `TRACE` is None: every hook in the serving code is one `if TRACE` (nothing is stamped,
no ticker or collector callback runs, no file is opened).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import time
from typing import Any

ENV = "TEST_TTFT_TRACE"
# The request header that names a traced request (the client's id for it). Only read while the switch is on; the
# gateway forwards it upstream as any end-to-end header (RFC 9110 7.6.1: only hop-by-hop fields are dropped).
HEADER = "x-request-id"
TICK_S = 0.001
LAG_LINE_MS = 5.0  # a late-by at least this long gets a line of its own (when, how long), besides the second's max
GC_LINE_MS = 1.0  # likewise a collection
LOCK_LINE_MS = 1.0  # likewise a wait for, or a hold of, the gateway workers' shared lock (TimedLock)
# One collection a second has what it frees named (`cycles` lines: the types and, for frames, the code that made
# them): a process that frees thousands of objects a collection makes cycles on its hot path, each one a cost the
# collector pays again. Sampled (gc.DEBUG_SAVEALL for that one collection: "all unreachable objects found will be
# appended to garbage rather than being freed", docs.python.org/3/library/gc.html#gc.DEBUG_SAVEALL); once named,
# they are dropped from gc.garbage and freed by a later full collection.
CYCLES_EVERY_S = 1.0
CYCLES_TOP = 8
# The reference engine's iterations (IterationWatch): one this long or longer gets a line of its own (as does one
# that ran a prefill shape for the first time), every iteration counts in its second's summary.
ITER_LINE_MS = 5.0
SCHEDSTAT = "/proc/thread-self/schedstat"  # the calling thread's on-CPU and run-queue ns (proc(5), sched_info)

monotonic = time.monotonic


class Trace:
    """One process's trace file and its stall watchers."""

    def __init__(self, directory: str, role: str) -> None:
        self.directory, self.role = directory, role
        self._pid = -1
        self._file: Any = None
        self._gc_started = 0.0
        self._gc_second: dict[int, list[float]] = {}  # generation -> [count, total ms, max ms] this second
        self._gc_walked: dict[int, int] = {}  # generation -> the most objects one of its collections walked, this second
        self._walking = 0
        self._sampled_at = -1  # the second whose cyclic garbage was last sampled (CYCLES_EVERY_S)
        self._gc_at = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._lock_at = 0
        self._lock_second = [0, 0.0, 0.0, 0.0, 0.0]  # this second's takings: count, wait total, max, hold total, max

    def write(self, record: dict[str, Any]) -> None:
        if self._pid != os.getpid():  # a forked gateway worker writes a file of its own
            self._pid = os.getpid()
            os.makedirs(self.directory, exist_ok=True)
            self._file = open(os.path.join(self.directory, f"{self.role}-{self._pid}.jsonl"), "a", buffering=1)  # noqa: SIM115 - open for the process's life
        record["role"] = self.role
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    # ---- stalls ---------------------------------------------------------------------------------

    def watch_loop(self) -> None:
        """Tick every TICK_S on the running loop; each second, the most a tick came late (ms)."""
        self._tasks.append(asyncio.get_running_loop().create_task(self._tick()))

    async def _tick(self) -> None:
        second, worst, ticks = int(monotonic()), 0.0, 0
        while True:
            due = monotonic() + TICK_S
            await asyncio.sleep(TICK_S)
            now = monotonic()
            late = (now - due) * 1000
            ticks += 1
            worst = max(worst, late)
            if late >= LAG_LINE_MS:
                self.write({"kind": "lag", "at": due, "ms": round(late, 3)})
            if int(now) != second:
                self.write({"kind": "lag_second", "at": float(second), "max_ms": round(worst, 3), "ticks": ticks})
                second, worst, ticks = int(now), 0.0, 0

    def watch_gc(self) -> None:
        """Time every garbage collection of this process (gc.callbacks: "start" and "stop" around each)."""
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        generation = info.get("generation", 0)
        if phase == "start":
            # What the collection walks: the tracked objects of the generations it collects (gc.get_objects), the
            # pause's size whatever the machine's load; counted before its clock starts.
            try:
                self._walking = sum(len(gc.get_objects(generation=g)) for g in range(generation + 1))
            except RuntimeError:
                self._walking = -1
            if int(monotonic() / CYCLES_EVERY_S) != self._sampled_at:
                gc.set_debug(gc.get_debug() | gc.DEBUG_SAVEALL)
            self._gc_started = monotonic()
            return
        now = monotonic()
        if gc.get_debug() & gc.DEBUG_SAVEALL:
            self._name_cycles(now, generation)
        ms = (now - self._gc_started) * 1000
        if ms >= GC_LINE_MS:
            self.write({"kind": "gc", "at": self._gc_started, "ms": round(ms, 3), "generation": generation,
                        "collected": info.get("collected", 0), "walked": self._walking})
        if int(now) != self._gc_at and self._gc_second:
            self.write({"kind": "gc_second", "at": float(self._gc_at),
                        "by_generation": {str(g): [int(c), round(t, 3), round(m, 3)]
                                          for g, (c, t, m) in self._gc_second.items()},
                        "walked_max": {str(g): n for g, n in self._gc_walked.items()}})
            self._gc_second, self._gc_walked = {}, {}
        self._gc_walked[generation] = max(self._gc_walked.get(generation, 0), self._walking)
        self._gc_at = int(now)
        entry = self._gc_second.setdefault(generation, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += ms
        entry[2] = max(entry[2], ms)

    def _name_cycles(self, now: float, generation: int) -> None:
        gc.set_debug(gc.get_debug() & ~gc.DEBUG_SAVEALL)
        self._sampled_at = int(now / CYCLES_EVERY_S)
        freed, gc.garbage[:] = list(gc.garbage), []  # a sample that freed nothing is written too: it counts
        types: dict[str, int] = {}
        code: dict[str, int] = {}
        for obj in freed:
            name = type(obj).__qualname__
            types[name] = types.get(name, 0) + 1
            if name == "frame":
                where = f"{obj.f_code.co_filename.rsplit('/', 2)[-1]}:{obj.f_code.co_name}"
                code[where] = code.get(where, 0) + 1
        del freed
        top = sorted(types.items(), key=lambda kv: -kv[1])[:CYCLES_TOP]
        self.write({"kind": "cycles", "at": now, "generation": generation, "freed": sum(types.values()),
                    "types": top, "frames": sorted(code.items(), key=lambda kv: -kv[1])[:CYCLES_TOP]})

    # ---- the gateway workers' shared lock -------------------------------------------------------------------

    def timed_lock(self, lock: Any) -> TimedLock:
        return lock if isinstance(lock, TimedLock) else TimedLock(lock, self)

    def lock_taken(self, asked: float, got: float, released: float, where: str) -> None:
        wait_ms, hold_ms = (got - asked) * 1000, (released - got) * 1000
        if wait_ms >= LOCK_LINE_MS or hold_ms >= LOCK_LINE_MS:
            self.write({"kind": "lock", "at": asked, "wait_ms": round(wait_ms, 3), "hold_ms": round(hold_ms, 3),
                        "where": where})
        second = int(released)
        if second != self._lock_at and self._lock_second[0]:
            count, waited, wait_max, held, hold_max = self._lock_second
            self.write({"kind": "lock_second", "at": float(self._lock_at), "count": int(count),
                        "wait_ms": round(waited, 3), "wait_max_ms": round(wait_max, 3), "hold_ms": round(held, 3),
                        "hold_max_ms": round(hold_max, 3)})
            self._lock_second = [0, 0.0, 0.0, 0.0, 0.0]
        self._lock_at = second
        acc = self._lock_second
        acc[0] += 1
        acc[1] += wait_ms
        acc[2] = max(acc[2], wait_ms)
        acc[3] += hold_ms
        acc[4] = max(acc[4], hold_ms)

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)


class TimedLock:
    """A process-shared lock (the gateway workers' SharedState.lock), timed in this process: how long each taking of
    it waited for another worker and how long this one then held it (`lock` lines for either at LOCK_LINE_MS or more,
    naming the function that took it; a `lock_second` summary a second). Not reentrant, as the lock it wraps."""

    def __init__(self, lock: Any, trace: Trace) -> None:
        self.lock, self.trace = lock, trace
        self._asked = self._got = 0.0
        self._where = ""

    def __enter__(self) -> TimedLock:
        asked = monotonic()
        self.lock.__enter__()  # the wrapped lock's own entry (the gateway's QuietLock defers collections)
        self._asked, self._got = asked, monotonic()
        self._where = sys._getframe(1).f_code.co_name
        return self

    def __exit__(self, *exc: object) -> None:
        released = monotonic()
        self.lock.__exit__(*exc)
        self.trace.lock_taken(self._asked, self._got, released, self._where)

    def acquire(self, *args: Any) -> bool:
        return bool(self.lock.acquire(*args))

    def release(self) -> None:
        self.lock.release()


# Linux's CPU clock of a whole process, as glibc's clock_getcpuclockid(3) makes it for another process's pid: the
# pid inverted, shifted past the clock's 3 type bits, type CPUCLOCK_SCHED (2: the scheduler's runtime, in ns)
# (the kernel's include/linux/posix-timers.h, MAKE_PROCESS_CPUCLOCK; glibc's copy of it in
# sysdeps/unix/sysv/linux/kernel-posix-cpu-timers.h, which its clock_getcpuclockid uses). Read with
# clock_gettime, it is the process's total CPU time brought up to date, running and exited threads included, in
# ns where proc(5)'s utime and stime count clock ticks (10 ms: a short run's CPU reads 0 or one tick).
_CPUCLOCK_SCHED = 2


def process_cpu_s(pid: int) -> float:
    """Seconds of CPU the process `pid` (all its threads) has used, up to now (its CPU clock, above)."""
    return time.clock_gettime(((~pid) << 3) | _CPUCLOCK_SCHED)


def thread_clock() -> tuple[float, float]:
    """The calling thread's time on a CPU and its time waiting in a run queue for one (s; 0 where the kernel does not
    say). The CPU time is the thread's clock (CLOCK_THREAD_CPUTIME_ID, brought up to date when read), not schedstat's
    first field, which lags by up to a scheduler tick while the thread runs; schedstat's run-queue wait is whole
    whenever the thread reads it (a wait is added when it ends, as the thread gets a CPU)."""
    try:
        with open(SCHEDSTAT) as f:
            waiting = int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        waiting = 0.0
    return time.thread_time(), waiting


def iteration_split(begun: tuple[float, float], ended: tuple[float, float], wall_ms: float) -> tuple[float, float, float]:
    """An iteration's wall time (ms) split by the thread clock read at its start and end: on a CPU, waiting for one,
    blocked. The wait is held to what the wall time leaves: now and then the kernel adds a run-queue wait that began
    before the iteration (seen on this VM: 107 ms in a 13 ms iteration)."""
    cpu_ms = (ended[0] - begun[0]) * 1000
    runq_ms = min((ended[1] - begun[1]) * 1000, max(0.0, wall_ms - cpu_ms))
    return cpu_ms, runq_ms, max(0.0, wall_ms - cpu_ms - runq_ms)


class IterationWatch:
    """The reference engine's IterationObserver (runtime/reference/engine.py) while the trace is on: where each
    iteration's time went. Its wall time splits into the engine thread's time on a CPU (its Python, the launches and
    a CUDA synchronisation's spin), its wait for a CPU (run queue: another thread or process had the core) and the
    rest, off both (blocked: the interpreter lock another thread of the process held, a socket write, a sleeping
    synchronisation); `gc` counts the process's collections inside it (any thread's: a collection holds the
    interpreter lock). An `iteration` line for each one of ITER_LINE_MS or more or that ran a prefill shape first
    (its groups: shape, whether new, ms), an `iteration_second` summary a second."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self._second = -1
        self._acc = [0, 0, 0.0, 0.0, 0, 0.0]  # iterations, long ones, ms, max ms, admitting ones, their ms

    def begin(self) -> tuple[float, float, int]:
        on_cpu, waiting = thread_clock()
        return on_cpu, waiting, sum(s["collections"] for s in gc.get_stats())

    def end(self, token: tuple[float, float, int], record: dict[str, Any]) -> None:
        clock = thread_clock()
        collections = sum(s["collections"] for s in gc.get_stats())
        wall = (record["end"] - record["start"]) * 1000
        cpu_ms, runq_ms, blocked_ms = iteration_split(token[:2], clock, wall)
        groups = record["groups"] or []
        if wall >= ITER_LINE_MS or any(g["new"] for g in groups):
            self.trace.write({"kind": "iteration", "at": record["start"], "ms": round(wall, 3),
                              "admitted": record["admitted"], "active": record["active"], "groups": groups,
                              "decode_ms": round((record["end"] - record["decode_at"]) * 1000, 3),
                              "cpu_ms": round(cpu_ms, 3), "runq_ms": round(runq_ms, 3),
                              "blocked_ms": round(blocked_ms, 3), "gc": collections - token[2]})
        second = int(record["start"])
        if second != self._second:
            if self._acc[0]:
                n, long, total, most, admitting, admitting_ms = self._acc
                self.trace.write({"kind": "iteration_second", "at": float(self._second), "count": n, "long": long,
                                  "ms": round(total, 3), "max_ms": round(most, 3), "admitting": admitting,
                                  "admitting_ms": round(admitting_ms, 3)})
            self._second, self._acc = second, [0, 0, 0.0, 0.0, 0, 0.0]
        acc = self._acc
        acc[0] += 1
        acc[1] += wall >= ITER_LINE_MS
        acc[2] += wall
        acc[3] = max(acc[3], wall)
        if record["admitted"]:
            acc[4] += 1
            acc[5] += wall


def tracer(role: str, environ: Any = None) -> Trace | None:
    """The process's Trace when the switch is on (in `environ`, the process's environment by default), else None.
    Refuses a platform whose perf_counter is not CLOCK_MONOTONIC: the gateway's relay stamps its first body bytes
    with its perf_counter reading."""
    directory = (os.environ if environ is None else environ).get(ENV)
    if not directory:
        return None
    if time.get_clock_info("perf_counter").implementation != time.get_clock_info("monotonic").implementation:
        raise SystemExit(f"{ENV}: perf_counter and monotonic are different clocks here; the trace needs one")
    return Trace(directory, role)
