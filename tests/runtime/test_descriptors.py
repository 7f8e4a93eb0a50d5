"""A serving process makes room in its descriptor table before its first thread: no growth mid-burst.

Why (torvalds/linux fs/file.c, `expand_fdtable`): growing the table of a process whose files_struct is
shared by threads waits for an RCU grace period in the thread that opened the descriptor, the loop's.
`bench/fd_table_probe.py` measures that wait; these tests pin down the table's size (proc(5), FDSize),
not a time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runtime.descriptors import descriptor_room, descriptor_slots

ROOT = Path(__file__).resolve().parents[2]

_CHILD = r"""
import json, resource, socket, sys, threading
sys.path.insert(0, sys.argv[1])
from runtime.descriptors import descriptor_room, descriptor_slots, reserve_descriptors
room, soft = int(sys.argv[2]), int(sys.argv[3])
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
soft = soft if hard == resource.RLIM_INFINITY else min(soft, hard)
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
got = reserve_descriptors(room) if room else None
after_reserve = descriptor_slots()
threading.Thread(target=threading.Event().wait, daemon=True).start()
held = [socket.socket() for _ in range(600)]
print(json.dumps({"reserved": got, "slots_after_reserve": after_reserve, "slots_after_600": descriptor_slots(),
                  "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))
"""


# Started through a relay process: a child's table is sized by its parent's highest open descriptor, and this
# test process may hold one in its last slot (a Supervisor made by another test reserves for its children).
_RELAY = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"


def _child(room: int, soft: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _RELAY, sys.executable, "-c", _CHILD, str(ROOT), str(room), str(soft)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_reserved_table_holds_600_sockets_without_growing_once_threads_exist():
    room = descriptor_room(4096)
    got = _child(room=4096, soft=4096)
    assert got["reserved"] == room
    assert got["slots_after_reserve"] >= room
    assert got["slots_after_600"] == got["slots_after_reserve"]  # no growth, so no grace period to wait for


def test_without_the_reservation_the_same_sockets_grow_the_table():
    """The counter-case: what the reservation spares the loop thread (each growth, with threads, waits)."""
    got = _child(room=0, soft=4096)
    assert got["slots_after_600"] > got["slots_after_reserve"]


def test_the_soft_descriptor_limit_is_raised_to_the_room_where_the_hard_limit_allows_and_never_lowered():
    reachable = descriptor_room(8192)
    if reachable < 8192:
        capped = _child(room=8192, soft=1024)
        assert capped["soft"] == reachable and capped["reserved"] == reachable  # never past the hard limit
        return
    raised = _child(room=8192, soft=1024)  # a common soft default
    assert raised["soft"] == 8192 and raised["reserved"] == 8192
    kept = _child(room=2048, soft=8192)
    assert kept["soft"] == 8192 and kept["reserved"] == 2048


def test_descriptor_slots_reads_this_process_table():
    assert descriptor_slots() >= 64  # NR_OPEN_DEFAULT: BITS_PER_LONG (include/linux/fdtable.h)
