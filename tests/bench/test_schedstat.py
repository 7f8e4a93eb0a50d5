"""The client's run-queue wait (Linux schedstat): parsing, the saturation rule,
and a client whose core is taken by other processes flagging its run.

Source for the file format: Linux Documentation/scheduler/sched-stats.rst,
"/proc/<pid>/schedstat": 1) time spent on the cpu (ns), 2) time spent waiting
on a runqueue (ns), 3) # of timeslices run on this cpu.
"""

import multiprocessing
import os
from pathlib import Path

import pytest

from fleetcast.bench.accuracy import run_fleetcast
from fleetcast.bench.schedstat import ThreadWait, parse_schedstat, process_wait_ns, wait_between

CPUS = sorted(os.sched_getaffinity(0))
HAVE_SCHEDSTAT = Path("/proc/thread-self/schedstat").exists()


def test_a_schedstat_line_is_on_cpu_ns_run_queue_wait_ns_and_timeslices():
    assert parse_schedstat("111497 3529709 2\n") == (111497, 3529709, 2)


@pytest.mark.parametrize("text", ["", "1 2", "1 2 3 4", "1 -2 3", "a b c"])
def test_anything_but_three_counters_is_refused_with_what_was_read(text):
    with pytest.raises(ValueError, match="schedstat: expected three non-negative integers"):
        parse_schedstat(text)


def test_without_schedstat_the_wait_is_none_and_the_reader_says_why(tmp_path):
    reader = ThreadWait(str(tmp_path / "absent"))
    assert not reader.available and reader() is None
    assert "absent" in reader.why
    assert process_wait_ns(str(tmp_path / "no-tasks")) is None
    assert wait_between(None, {"1": 5}) is None


def test_the_process_wait_is_the_growth_of_the_threads_seen_at_both_readings():
    # Thread 3 ended before the second reading, thread 4 started after the first: neither counts.
    assert wait_between({"1": 100, "2": 50, "3": 7}, {"1": 160, "2": 50, "4": 9}) == 60


@pytest.mark.skipif(not HAVE_SCHEDSTAT, reason="no /proc/thread-self/schedstat (not Linux, or /proc hidden)")
def test_this_threads_wait_is_read_and_never_goes_back():
    reader = ThreadWait()
    try:
        first = reader()
        second = reader()
        assert first is not None and second >= first
    finally:
        reader.close()


def _spin(spinning) -> None:
    spinning.release()
    while True:
        pass


@pytest.mark.skipif(not HAVE_SCHEDSTAT or len(CPUS) < 2, reason="needs schedstat and two CPUs")
def test_a_client_whose_core_is_taken_by_busy_processes_flags_its_run(fast_server):
    """Processes, not threads: the GIL is not what delays the client, the OS run queue is. (The rule that turns a
    run-queue wait into the flag is test_metrics'; here, that the wait is read end to end.)"""
    core = CPUS[-1]
    ctx = multiprocessing.get_context("spawn")
    spinning = ctx.Semaphore(0)
    spinners = [ctx.Process(target=_spin, args=(spinning,), daemon=True) for _ in range(4)]
    for p in spinners:
        p.start()
        os.sched_setaffinity(p.pid, {core})
    try:
        # Each spawned interpreter takes its time to start (more on a loaded machine): a client run that begins
        # before they spin may end before they do, with nothing to flag (seen once in a full-suite run).
        assert all(spinning.acquire(timeout=60) for _ in spinners)
        res = run_fleetcast(fast_server.url, 8, 48, input_tokens=8, output_tokens=8, cpu=core, timeout_s=120)
    finally:
        for p in spinners:
            p.kill()
            p.join(10)
    # Which threshold it crosses first depends on how the kernel shares the core (a woken client often preempts the
    # spinners, so its wait between send and first token can stay short while its loop's timers run late): the run
    # is flagged for its client either way, and the wait on the run queue is measured.
    assert res.saturated
    assert "the OS kept the client waiting for a CPU" in res.note or "event-loop lag" in res.note, res.note
    assert res.run_queue_wait_p99_ms is not None and res.run_queue_wait_p99_ms > 0
