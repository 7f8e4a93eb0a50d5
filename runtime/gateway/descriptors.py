"""Room in the descriptor table for every connection a gateway process will hold, made at its start.

Linux grows a process's descriptor table by doubling it (64 slots, then 128, 256, ...) when a new
descriptor does not fit. In a process with more than one thread, each growth first waits for an RCU
grace period (torvalds/linux fs/file.c, `expand_fdtable`: `if (atomic_read(&files->count) > 1)
synchronize_rcu();`). The gateway has threads (the metrics writer, the executor's), and its loop thread
is the one calling accept() or socket() when the table fills: every stream of that process stands still
for the grace period. Measured 12-45 ms on Firecracker guests (docs/gateway.md, "The descriptor table"),
the first time each worker passes 64 and 128 open descriptors: a fresh instance meeting its first burst.

A table grown while the process has one thread costs no grace period, and a table never shrinks. A
forked child's table is only as large as its open descriptors need (`dup_fd`, `sane_fdtable_size`), so
each worker makes its own room, right after the fork and before its first thread.
"""

from __future__ import annotations

import os
import resource

# 8 bytes a slot (plus 3 bits): 512 KiB per process for 64k descriptors, 32k streams each.
DESCRIPTOR_ROOM = 65536


def reserve_descriptors(room: int = DESCRIPTOR_ROOM) -> int:
    """Grow this process's descriptor table to `room` slots now; returns the slots it has room for.

    The soft RLIMIT_NOFILE is raised to `room` where the hard limit allows (a container's soft default of
    1024 would refuse the 513th stream long before memory or CPU run out), never lowered. Call it while the
    process has one thread: then the growth costs no RCU grace period.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = room if hard == resource.RLIM_INFINITY else min(room, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            target = soft
    elif soft != resource.RLIM_INFINITY:
        target = min(target, soft)
    probe = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        highest = target - 1
        if highest > probe:
            try:
                # Placing a descriptor in the last slot makes the kernel grow the table to hold it, once.
                os.dup2(probe, highest, inheritable=False)
                os.close(highest)
            except OSError:  # /proc/sys/fs/nr_open below the limit: the table grows later, as before
                return probe + 1
    finally:
        os.close(probe)
    return target


def descriptor_slots(pid: int | str = "self") -> int:
    """The slots of a process's descriptor table now (proc(5): FDSize in /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("FDSize:"):
                return int(line.split()[1])
    raise OSError(f"/proc/{pid}/status has no FDSize line")
