"""runtime/ttft_trace.py: the TTFT trace's switch, its file per process, and its stall watchers."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from pathlib import Path

from runtime.ttft_trace import ENV, Trace, process_cpu_s, tracer


def _lines(directory: Path) -> list[dict]:
    return [json.loads(line) for path in directory.glob("*.jsonl") for line in path.read_text().splitlines()]


def test_without_the_switch_there_is_no_trace_and_the_serving_processes_hold_none():
    assert tracer("gateway", {}) is None and tracer("gateway", {ENV: ""}) is None
    import runtime.gateway.server as gateway
    import runtime.reference.server as http

    assert ENV not in os.environ and gateway.TRACE is None and http.TRACE is None


def test_with_the_switch_each_process_writes_its_own_file_named_by_role_and_pid(tmp_path: Path):
    trace = tracer("http", {ENV: str(tmp_path / "t")})
    assert trace is not None
    trace.write({"kind": "http", "id": "q-1", "received": 1.5})
    assert (tmp_path / "t" / f"http-{os.getpid()}.jsonl").exists()
    assert _lines(tmp_path / "t") == [{"kind": "http", "id": "q-1", "received": 1.5, "role": "http"}]


def test_a_loop_stalled_past_the_line_threshold_gets_a_line_with_its_lateness(tmp_path: Path):
    import time

    trace = Trace(str(tmp_path), "client")

    async def main() -> None:
        trace.watch_loop()
        await asyncio.sleep(0.01)
        time.sleep(0.03)  # the loop blocked: the ticker's next wake-up comes at least 20 ms late
        await asyncio.sleep(0.01)
        trace.stop()

    asyncio.run(main())
    lags = [r for r in _lines(tmp_path) if r["kind"] == "lag"]
    assert lags and max(r["ms"] for r in lags) >= 20.0


def test_collections_are_timed_through_gc_callbacks_and_the_long_ones_get_a_line(tmp_path: Path, monkeypatch):
    trace = Trace(str(tmp_path), "engine")
    monkeypatch.setattr("runtime.ttft_trace.GC_LINE_MS", 0.0)  # every collection is long enough here
    trace.watch_gc()
    try:
        gc.collect(2)
    finally:
        trace.stop()
    assert trace._gc not in gc.callbacks
    pauses = [r for r in _lines(tmp_path) if r["kind"] == "gc"]
    assert pauses and pauses[-1]["generation"] == 2 and pauses[-1]["ms"] >= 0.0


def test_the_gateway_workers_shared_lock_is_timed_and_a_long_wait_or_hold_gets_a_line_naming_its_taker(
        tmp_path: Path, monkeypatch):
    """The shared lock of the gateway's workers, wrapped while the trace is on: each taking's wait (another worker
    held it) and hold, a line for either at LOCK_LINE_MS or more naming the function that took it, and a summary a
    second. The clock is the test's: a hold is what the test says, not the machine's."""
    import threading

    from runtime import ttft_trace

    now = [100.0]
    monkeypatch.setattr(ttft_trace, "monotonic", lambda: now[0])
    trace = Trace(str(tmp_path), "gateway")
    lock = trace.timed_lock(threading.Lock())
    assert trace.timed_lock(lock) is lock  # wrapped once

    def dispatch_all() -> None:
        with lock:
            now[0] += 0.004  # held 4 ms

    def quick() -> None:
        with lock:
            now[0] += 0.0001

    dispatch_all()
    quick()
    now[0] = 101.5
    quick()  # the next second: the summary of the one before is written
    lines = _lines(tmp_path)
    longs = [r for r in lines if r["kind"] == "lock"]
    assert [(r["where"], r["hold_ms"]) for r in longs] == [("dispatch_all", 4.0)]
    (summary,) = [r for r in lines if r["kind"] == "lock_second"]
    assert summary["at"] == 100.0 and summary["count"] == 2 and summary["hold_max_ms"] == 4.0


def test_the_process_cpu_clock_reads_a_whole_processs_cpu_time_as_the_process_reads_its_own():
    """MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED) of Linux's include/linux/posix-timers.h, as glibc's
    clock_getcpuclockid builds it for another process (sysdeps/unix/sysv/linux/clock_getcpuclockid.c): read for this
    process's pid, it falls between two readings of CLOCK_PROCESS_CPUTIME_ID (time.process_time) taken around it."""
    for _ in range(3):
        before = time.process_time()
        mine = process_cpu_s(os.getpid())
        after = time.process_time()
        assert before <= mine <= after
