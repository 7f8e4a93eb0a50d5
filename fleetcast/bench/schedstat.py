"""How long the OS kept the client waiting for a CPU, from Linux schedstat.

`/proc/<pid>/schedstat` (and per thread `/proc/<pid>/task/<tid>/schedstat`)
holds three numbers (kernel Documentation/scheduler/sched-stats.rst): time
spent on the cpu (ns), time spent waiting on a runqueue (ns), and the number
of timeslices run. The second is what the event-loop and CPU-busy detectors
cannot see: a thread that is runnable but not running stamps nothing, so a
probe in the same process misses the wait, yet a send stamped before the wait
and written after it adds the wait to that request's TTFT.

Where the files are absent (not Linux, a kernel without CONFIG_SCHED_INFO, a
sandbox hiding /proc) every reading is None and the caller records null.
"""

from __future__ import annotations

import os
from pathlib import Path

SOURCE = "Linux Documentation/scheduler/sched-stats.rst, /proc/<pid>/schedstat"
THREAD_PATH = "/proc/thread-self/schedstat"
TASKS_DIR = "/proc/self/task"
# Three decimal fields of at most 20 digits, two separators, a newline.
_MAX_BYTES = 128


def parse_schedstat(text: str) -> tuple[int, int, int]:
    """(on-CPU ns, run-queue wait ns, timeslices) from one schedstat line."""
    fields = text.split()
    if len(fields) != 3 or not all(f.isdigit() for f in fields):
        raise ValueError(f"schedstat: expected three non-negative integers, got {text.strip()[:80]!r}")
    on_cpu, wait, slices = (int(f) for f in fields)
    return on_cpu, wait, slices


class ThreadWait:
    """The calling thread's run-queue wait so far, in ns: one pread per reading.

    The file is opened by the thread that will read it (the event loop's) and
    kept open; /proc/thread-self names the opener, so the readings stay that
    thread's. `why` says why there are none, once.
    """

    def __init__(self, path: str = THREAD_PATH) -> None:
        self.why: str | None = None
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY)
            parse_schedstat(os.pread(self._fd, _MAX_BYTES, 0).decode("ascii", "replace"))
        except (OSError, ValueError) as e:
            self.close()
            self.why = f"{path} unreadable ({e})"

    @property
    def available(self) -> bool:
        return self._fd is not None

    def __call__(self) -> int | None:
        if self._fd is None:
            return None
        try:
            return parse_schedstat(os.pread(self._fd, _MAX_BYTES, 0).decode("ascii", "replace"))[1]
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            os.close(fd)


def process_wait_ns(tasks_dir: str = TASKS_DIR) -> dict[str, int] | None:
    """Run-queue wait so far per thread of this process ({tid: ns}); None where unreadable.

    Per thread: the process-level file is the main thread's alone. A thread that
    ends between two readings takes its wait with it, so the caller sums the
    growth of the threads seen at both ends.
    """
    try:
        tids = [p.name for p in Path(tasks_dir).iterdir()]
    except OSError:
        return None
    waits = {}
    for tid in tids:
        try:
            waits[tid] = parse_schedstat((Path(tasks_dir) / tid / "schedstat").read_text())[1]
        except (OSError, ValueError):
            continue  # the thread ended, or this one is hidden: the rest still count
    return waits or None


def wait_between(start: dict[str, int] | None, end: dict[str, int] | None) -> int | None:
    """Run-queue wait (ns) accumulated between two `process_wait_ns` readings, over the threads in both."""
    if start is None or end is None:
        return None
    return sum(max(0, end[t] - start[t]) for t in start.keys() & end.keys())
