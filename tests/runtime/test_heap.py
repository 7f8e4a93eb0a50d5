"""A serving process freezes its startup heap (runtime/heap.py): a full collection then walks only what serving
created, not what startup loaded for the life of the process.

The source: CPython's gc module, docs.python.org/3/library/gc.html#gc.freeze ("Freeze all the objects tracked by
the garbage collector; move them to a permanent generation and ignore them in all the future collections") and
gc.get_objects ("Returns a list of all objects tracked by the collector", the three generations a collection walks).
Each check runs in a child interpreter: freezing pytest's own heap would change every later test's collections."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

from runtime import heap

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


# What a serving process holds while a neighbour floods it: requests waiting for an engine slot, each keeping its
# objects alive past two young collections (about 50 tracked objects a waiting request in the gateway), 6,000 of them
# arriving while short-lived garbage is made and dropped; every automatic collection is recorded with how many
# objects it walks (the generations it collects, read in the collector's "start" callback).
FLOOD = r"""
import gc, json, sys
from runtime import heap

policy = sys.argv[1] == "policy"
walks = []

def watch(phase, info):
    if phase == "start":
        g = info["generation"]
        walks.append((g, sum(len(gc.get_objects(generation=k)) for k in range(g + 1))))

if policy:
    p = heap.GcPolicy(busy=lambda: True, check_s=3600)  # busy throughout: only the young collections run
    p.apply()
else:
    heap.freeze_startup_heap()  # the startup freeze alone, as before the policy
gc.callbacks.append(watch)
held = []
for request in range(6_000):
    held.append([{"n": request, "parts": [[k] for k in range(50)]}])  # waiting: alive to the end
    for _ in range(20):
        scratch = {"tmp": [request]}  # the request's garbage, freed at once
gc.callbacks.remove(watch)
print(json.dumps({"walks": walks, "young_bound": heap.young_scan_bound(), "held": len(held),
                  "threshold": gc.get_threshold()}))
"""


def _flood(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", FLOOD, mode], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True)
    return json.loads(out.stdout)


def test_a_process_holding_a_floods_requests_makes_no_automatic_full_collection_and_each_walks_a_bounded_young_heap():
    """docs.python.org/3/library/gc.html#gc.set_threshold: a collection of generation 0 starts when allocations less
    deallocations exceed threshold0; generation 1 is examined when generation 0 was more than threshold1 times since;
    the oldest generation (3.12 and 3.13: "Collecting the oldest generation") when generation 1 was more than
    threshold2 times since AND, by CPython's Include/internal/pycore_gc.h note on long_lived_pending, only once
    what survived into it since exceeds 25% of what it held. The policy's threshold2 (heap.NO_AUTOMATIC_FULL) is
    never reached, so every automatic collection is a young one, and walks only what survived since the last."""
    got = _flood("policy")
    generations = {g for g, _ in got["walks"]}
    assert generations and 2 not in generations
    assert got["threshold"][1:] == [heap.YOUNG_PERIODS, heap.NO_AUTOMATIC_FULL]
    # Objects walked, not wall time: a pause proportional to this, whatever the machine.
    assert max(walked for _, walked in got["walks"]) <= got["young_bound"] < 10_000


def test_without_the_policy_the_same_flood_makes_full_collections_that_walk_every_held_request():
    """What the policy removes (bench/FAIRNESS_DEVICE.md, call 4: nine 80-135 ms full collections a phase in each
    gateway worker, none of which freed anything): with the startup freeze alone, full collections come as the held
    requests accumulate, each walking all of them."""
    got = _flood("freeze-only")
    full = [walked for g, walked in got["walks"] if g == 2]
    assert full and max(full) > 100_000


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_full_collection_runs_when_the_process_holds_no_request_or_once_it_waited_max_defer_s():
    clock, busy = _Clock(), [True]
    policy = heap.GcPolicy(lambda: busy[0], max_defer_s=600.0, clock=clock)  # not applied: ticked by hand
    gc.collect(1)  # something reached the oldest generation (its count: generation-1 collections since a full one)
    assert not policy.tick()  # busy: deferred
    busy[0] = False
    assert policy.tick() and policy.full_collections == 1  # idle: collected
    assert not policy.tick()  # nothing new in the oldest generation: nothing to walk
    busy[0] = True
    gc.collect(1)
    clock.now = 599.0
    assert not policy.tick()
    clock.now = 600.0
    assert policy.tick() and policy.deferred == 1  # never idle for max_defer_s: collected anyway


AGAIN = r"""
import gc, json, threading
from runtime import heap

first = heap.serve_gc_policy(lambda: True)
before = first.frozen
loaded_later = [[i] for i in range(20_000)]
second = heap.serve_gc_policy(lambda: False)
print(json.dumps({"same": first is second, "threads": sum(t.name == "gc-idle" for t in threading.enumerate()),
                  "frozen_more": second.frozen - before - 20_000, "busy": second.busy()}))
"""


def test_a_process_that_applies_the_policy_twice_keeps_one_collector_and_freezes_what_it_loaded_since():
    out = subprocess.run([sys.executable, "-c", AGAIN], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True)
    got = json.loads(out.stdout)
    assert got["same"] and got["threads"] == 1 and got["frozen_more"] >= 0 and got["busy"] is False
