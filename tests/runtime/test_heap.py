"""A serving process freezes its startup heap (runtime/heap.py): a full collection then walks only what serving
created, not what startup loaded for the life of the process.

The source: CPython's gc module, docs.python.org/3/library/gc.html#gc.freeze ("Freeze all the objects tracked by
the garbage collector; move them to a permanent generation and ignore them in all the future collections") and
gc.get_objects ("Returns a list of all objects tracked by the collector", the three generations a collection walks).
Each check runs in a child interpreter: freezing pytest's own heap would change every later test's collections."""

from __future__ import annotations

import json
import subprocess
import sys

from .reference_helpers import ROOT

CHILD = r"""
import gc, json, weakref
from runtime.heap import freeze_startup_heap

class Node:
    pass

loaded = [[i] for i in range(100_000)]  # what startup keeps for the life of the process (lists: always tracked)
garbage = Node()
garbage.self = garbage  # a cycle startup dropped: collected before the freeze, not frozen for ever
dropped = weakref.ref(garbage)
del garbage
frozen = freeze_startup_heap()
walked = len(gc.get_objects())  # what a full collection walks from now on
print(json.dumps({"frozen": frozen, "walked": walked, "cycle_collected": dropped() is None,
                  "loaded_alive": len(loaded)}))
"""


def test_after_the_freeze_a_full_collection_walks_none_of_the_startup_heap_and_startup_garbage_is_gone():
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True)
    got = json.loads(out.stdout)
    assert got["frozen"] >= 100_000  # the 100k lists and everything else startup left tracked
    assert got["walked"] < 1_000  # before the fix a full collection walked all of them (and the interpreter's own)
    assert got["cycle_collected"]  # collected first: a freeze would keep startup's garbage for the process's life
    assert got["loaded_alive"] == 100_000
