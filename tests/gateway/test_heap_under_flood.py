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


def test_a_waiting_request_keeps_no_closure_of_the_gateway_and_few_objects_alive():
    """What each of a flood's waiting requests keeps alive is what every young collection walks (runtime/heap.py):
    counted as gc.get_objects() deltas over 200 requests held at the gateway. 58 objects each at first, 11 of them
    closure cells (the `refuse` closure over `_request`'s locals, the `gone` lambda) and the cancelled idle timer
    with its context; then 45, with no gateway closure (2 cells each were asyncio's own done callback of the
    connection's task: StreamReaderProtocol.connection_made, github.com/python/cpython Lib/asyncio/streams.py); now
    30: the gateway starts that task itself (no done callback: its function, tuple, cells and context), no helper
    coroutine of the wait (`_engine_slot`, `fair.acquire`), no partial for `gone`, no proxy header, caller or salted
    tuple kept by the request's frames, a shared ticket, and headers in a tuple the collector untracks."""
    import collections
    import json
    import socket
    import threading

    from fleetcast.config import parse_config
    from runtime.gateway import ppv2

    from .conftest import fleet_config

    n = 200
    data = fleet_config(analytics_limits={"max_concurrency": 5000, "requests_per_minute": 600000}).model_dump(mode="json")
    for c in data["consumers"]:
        if c["name"] == "analytics":
            c["admission"] = {"max_queued": 10000}
    cfg = parse_config(data, "<test config>")
    payload = json.dumps({"model": MODEL_ID, "prompt": "a b", "max_tokens": 2}).encode()

    def raw(vpce: str) -> bytes:
        return ppv2.build(vpce_id=vpce) + (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                                           b"\r\nContent-Length: %d\r\n\r\n" % len(payload)) + payload

    async def body():
        h = await start_harness(cfg, admission_caps={MODEL_ID: 1}, disconnect_poll_s=0.02)
        h.upstream.hold = asyncio.Event()
        socks: list[socket.socket] = []

        def connect(count: int, what: bytes) -> None:  # a thread: the test's clients allocate nothing in the loop
            for _ in range(count):
                s = socket.create_connection(("127.0.0.1", h.port))
                s.sendall(what)
                socks.append(s)

        async def waiting(count: int) -> None:
            for _ in range(3000):
                if h.gateway.fair.waiting() >= count:
                    break
                await asyncio.sleep(0.01)
            for _ in range(5):
                await asyncio.sleep(0.01)

        try:
            await asyncio.to_thread(connect, 1, raw(VOICE_VPCE))  # holds the one slot
            for _ in range(3000):
                if h.upstream.active:
                    break
                await asyncio.sleep(0.01)
            await asyncio.to_thread(connect, 20, raw(ANALYTICS_VPCE))  # warm-up: first-use caches
            await waiting(20)
            gc.collect()
            before = collections.Counter(type(o).__name__ for o in gc.get_objects())
            thread = threading.Thread(target=connect, args=(n, raw(ANALYTICS_VPCE)))
            thread.start()
            await waiting(20 + n)
            thread.join()
            gc.collect()
            after = collections.Counter(type(o).__name__ for o in gc.get_objects())
            return h.gateway.fair.waiting(), after - before
        finally:
            h.upstream.hold.set()
            for s in socks:
                s.close()
            await stop_harness(h)

    held, kept = run(body(), timeout=120)
    assert held == 20 + n
    print(f"per waiting request: {sum(kept.values()) / n:.1f} tracked objects, {kept['cell'] / n:.1f} closure cells; "
          f"most: {kept.most_common(8)}")
    assert kept["cell"] <= n // 20  # 11 a request with the gateway's closures, 2 with asyncio's done callback
    # 58 a request at first (the test's own socket among them), 45, then 29.8-30.1 now: 22 of them asyncio's (the
    # connection's socket, transport, protocol, reader, writer, task and their futures, handles and contexts), 7 the
    # gateway's (the connection's and the request's coroutines, the Request, the Exchange, the waiter, its future and
    # the await on it). The rest: the loop's turn the count runs in, whose list of ready sockets holds a (key,
    # events) tuple each.
    assert sum(kept.values()) <= 32 * n
