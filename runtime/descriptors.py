"""Room in the descriptor table for every connection a serving process will hold, made before it needs it.

Linux grows a process's descriptor table by doubling it (64 slots, then 128, 256, ...) when a new
descriptor does not fit. In a process with more than one thread, each growth first waits for an RCU
grace period (torvalds/linux fs/file.c, `expand_fdtable`: `if (atomic_read(&files->count) > 1)
synchronize_rcu();`), in the thread that asked for the descriptor: a server's event loop, inside the
accept() of a new client or the socket() of a new upstream connection, while every stream of that
process waits. Measured 6-30 ms a growth on the H200 host (docs/gateway.md, "The descriptor table"):
a fresh instance meeting its first burst paid it at 64 and again at 128 open descriptors.

A table grown while the process has one thread waits for nothing, and a table never shrinks. A child's
table at fork is only as large as its parent's highest open descriptor needs (fs/file.c, `dup_fd` and
`sane_fdtable_size`), and exec keeps it. Hence two uses:
- a gateway worker reserves its own table right after the fork, before its first thread;
- the supervisor reserves with `for_children=True`, keeping a close-on-exec descriptor in the last slot,
  so every server it starts (trtllm-serve, the gateway's parent) begins with the whole table.
"""

from __future__ import annotations

import os
import resource

# 8 bytes a slot (plus 3 bits): 512 KiB of kernel memory a process for 64k descriptors, 32k proxied streams.
DESCRIPTOR_ROOM = 65536

_held: list[int] = []  # the descriptor kept in the last slot for children (for_children=True), at most one


def descriptor_room(room: int = DESCRIPTOR_ROOM) -> int:
    """The slots a reservation of `room` can reach here: within the hard RLIMIT_NOFILE and the kernel's
    fs.nr_open (proc(5): no process may have more descriptors than either)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    try:
        with open("/proc/sys/fs/nr_open") as f:
            nr_open = int(f.read())
    except (OSError, ValueError):
        nr_open = room
    return min(room, nr_open, room if hard == resource.RLIM_INFINITY else hard)


def reserve_descriptors(room: int = DESCRIPTOR_ROOM, for_children: bool = False) -> int:
    """Grow this process's descriptor table to `room` slots now; returns the slots it has room for.

    The soft RLIMIT_NOFILE is raised to `room` where the hard limit allows (a soft limit of 1024, a common
    default, would refuse the 513th proxied stream long before memory or CPU run out), never lowered; children
    inherit it. Call it while the process has one thread: then the growth costs no RCU grace period.
    `for_children`: keep the descriptor that grew the table open (close-on-exec), so that every process
    started from here on inherits a table of that size.
    """
    if for_children and _held:
        return _held[0] + 1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = descriptor_room(room)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            target = soft
    highest = target - 1
    probe = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if highest <= probe:
            return probe + 1
        try:
            # Placing a descriptor in the last slot makes the kernel grow the table to hold it, once.
            os.dup2(probe, highest, inheritable=False)
        except OSError:  # refused after all: the table grows later, as before
            return probe + 1
        if for_children:
            _held.append(highest)
        else:
            os.close(highest)
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
