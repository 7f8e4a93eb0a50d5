"""A gateway under a bounded flood holds a bounded heap: what a burst of requests leaves behind once it is served,
refused or abandoned is the same after a second equal burst (no per-request or per-consumer structure grows), and
serving leaves almost no cyclic garbage, so the full collection runtime/heap.py defers to an idle moment walks
few objects and frees little.

Objects, not wall time: a collection's pause is proportional to the objects it walks (the tracked objects of the
generations it collects: docs.python.org/3/library/gc.html#gc.get_objects), whatever the machine's load."""

from __future__ import annotations

import asyncio
import gc

from .conftest import ANALYTICS_VPCE, MODEL_ID, VOICE_VPCE, run, start_harness, stop_harness
from .fakes import Client, one_request
from .test_fair import consumers

BODY = {"model": MODEL_ID, "prompt": "a b", "max_tokens": 2, "stream": True}


async def _burst(port: int, gateway) -> dict[str, int]:
    """One burst at an engine that holds one request at a time: 90 of the neighbour's (beyond its queue of 64: some
    refused 429), 10 of the quiet account's, and 10 clients that leave while they wait."""
    leavers = []
    for _ in range(10):
        client = await Client(port, VOICE_VPCE).connect()
        await client.send("POST", "/v1/completions", BODY)
        leavers.append(client)
    sends = [one_request(port, "POST", "/v1/completions", BODY, vpce_id=ANALYTICS_VPCE) for _ in range(90)]
    sends += [one_request(port, "POST", "/v1/completions", BODY, vpce_id=VOICE_VPCE) for _ in range(10)]
    replies = asyncio.gather(*sends)
    await asyncio.sleep(0.05)
    for client in leavers:
        await client.close()
    statuses = [r.status for r in await replies]
    for _ in range(200):  # the last connections close on the loop's next turns
        if not gateway.holds_connections():
            break
        await asyncio.sleep(0.01)
    return {str(s): statuses.count(s) for s in sorted(set(statuses))}


def test_two_equal_bursts_leave_the_same_heap_and_serving_leaves_almost_no_cyclic_garbage():
    cfg, _ = consumers()

    async def body():
        h = await start_harness(cfg, admission_caps={MODEL_ID: 1}, disconnect_poll_s=0.02)
        try:
            await _burst(h.port, h.gateway)  # warm-up: first-use caches (the consumer's records, the routes)
            gc.collect()
            gc.freeze()  # what the test process and the warmed gateway hold: out of the counts, as in a worker
            heaps, garbage, answers = [], [], []
            for _ in range(2):
                gc.disable()  # what serving leaves as cycles is what the deferred full collection finds
                answers.append(await _burst(h.port, h.gateway))
                gc.enable()
                garbage.append(gc.collect())
                h.records.clear()  # the harness's own copy of the metric records (the gateway keeps none)
                h.upstream.requests.clear()  # and the fake engine's of the bodies it got
                heaps.append(len(gc.get_objects()))  # what a full collection at this idle moment walks
            return heaps, garbage, answers
        finally:
            gc.unfreeze()
            await stop_harness(h)

    heaps, garbage, answers = run(body(), timeout=120)
    assert answers[0] == answers[1] and answers[0].get("200", 0) >= 20 and answers[0].get("429", 0) > 0
    assert heaps[1] <= heaps[0] + 50  # no growth across equal bursts: one object kept a request would add 110
    assert heaps[1] < 5_000  # the idle full collection walks a few thousand objects: well under a millisecond
    # At most a few cyclic objects per request (two connections each here, the test's client and the gateway's):
    # on 3.11 each asyncio socket transport is a cycle through a bound method it keeps, 8 objects
    # (github.com/python/cpython/issues/100348, fixed in 3.12 by gh-100349 and gh-106504).
    assert max(garbage) <= 20 * 110
