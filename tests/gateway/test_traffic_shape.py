"""What the gateway publishes for traffic profiles: per request, the in-flight count on the instance at
arrival and the length buckets as dimensions of `Requests`, stamped with the arrival time."""

from __future__ import annotations

import asyncio

from fleetcast.contract import telemetry as t

from .conftest import ANALYTICS_VPCE, VOICE_VPCE, run, start_harness, stop_harness
from .fakes import Client, one_request


def completion(n: int, words: int = 3, stream: bool = True):
    return {"model": "gpt2-xl", "prompt": " ".join(["w"] * words), "max_tokens": n, "stream": stream}


def test_each_request_carries_its_length_buckets_and_in_flight_count_under_a_second_directive():
    async def body():
        h = await start_harness()
        try:
            await one_request(h.port, "POST", "/v1/completions", completion(70, words=300), vpce_id=VOICE_VPCE)
            (rec,) = h.records_with(t.REQUESTS)
            assert (rec[t.DIM_INPUT_BUCKET], rec[t.DIM_OUTPUT_BUCKET], rec[t.DIM_IN_FLIGHT]) == ("257-512", "65-128", "1")
            first, shape = rec["_aws"]["CloudWatchMetrics"]
            assert first["Dimensions"] == [["Fleet", "Pool"], ["Fleet", "Pool", "Consumer"],
                                           ["Fleet", "Pool", "Consumer", "Model"],
                                           ["Fleet", "Pool", "Model"]]  # unchanged by the shape
            assert shape["Namespace"] == t.NAMESPACE
            assert shape["Metrics"] == [{"Name": t.SHAPED_REQUESTS, "Unit": "Count"}] and rec[t.SHAPED_REQUESTS] == 1
            # Each directive names its own members: none is named twice.
            assert not {m["Name"] for m in first["Metrics"]} & {m["Name"] for m in shape["Metrics"]}
            # One set per bucket dimension; a one-model fleet's export reads no model dimension, so none per model.
            assert shape["Dimensions"] == [["Fleet", "Pool", "Consumer", d]
                                           for d in (t.DIM_IN_FLIGHT, t.DIM_INPUT_BUCKET, t.DIM_OUTPUT_BUCKET)]
            # Specification: Embedded metric format: a dimension set holds at most 30 dimensions, a directive's
            # Metrics at most 100.
            assert all(len(s) <= 30 for s in shape["Dimensions"]) and len(shape["Metrics"]) <= 100
        finally:
            await stop_harness(h)
    run(body())


def test_in_flight_at_arrival_counts_every_consumer_on_the_instance_including_the_request_itself():
    async def body():
        h = await start_harness()
        h.upstream.gate = asyncio.Event()  # streams stop after their first token until released
        try:
            clients = []
            for vpce in [VOICE_VPCE, ANALYTICS_VPCE, VOICE_VPCE, ANALYTICS_VPCE, VOICE_VPCE]:
                c = await Client(h.port, vpce).connect()
                await c.send("POST", "/v1/completions", completion(3))
                status, headers = await c.read_head()  # admitted and streaming before the next one arrives
                assert status == 200
                clients.append((c, headers))
            h.upstream.gate.set()
            for c, headers in clients:
                await c.read_body(headers)
                await c.close()
            await asyncio.sleep(0)
            levels = sorted(int(t.IN_FLIGHT_LABELS.index(r[t.DIM_IN_FLIGHT])) for r in h.records_with(t.REQUESTS))
            # 1, 2, 3-4, 3-4, 5-8: the k-th arrival saw k requests in flight, whatever their consumer.
            assert [t.IN_FLIGHT_LABELS[i] for i in levels] == ["1", "2", "3-4", "3-4", "5-8"]
        finally:
            await stop_harness(h)
    run(body())


def test_records_are_stamped_at_arrival_by_the_gateways_clock_and_throttled_ones_carry_no_shape():
    async def body():
        from .conftest import fleet_config

        h = await start_harness(fleet_config(voice_limits={"max_concurrency": 1, "requests_per_minute": 6000}))
        h.gateway.clock = lambda: 1_764_547_200.25  # 2025-12-01T00:00:00.25Z
        h.upstream.gate = asyncio.Event()
        try:
            held = await Client(h.port, VOICE_VPCE).connect()
            await held.send("POST", "/v1/completions", completion(2))
            status, headers = await held.read_head()
            refused = await one_request(h.port, "POST", "/v1/completions", completion(2), vpce_id=VOICE_VPCE)
            assert (status, refused.status) == (200, 429)
            h.gateway.clock = lambda: 1_764_550_800.0  # an hour later: the held stream's record keeps its arrival
            h.upstream.gate.set()
            await held.read_body(headers)
            await held.close()
            await asyncio.sleep(0)
            stamps = sorted((r["_aws"]["Timestamp"], r[t.THROTTLED]) for r in h.records_with(t.REQUESTS))
            assert stamps == [(1_764_547_200_250, 0), (1_764_547_200_250, 1)]
            throttled = next(r for r in h.records_with(t.REQUESTS) if r[t.THROTTLED])
            assert len(throttled["_aws"]["CloudWatchMetrics"]) == 1 and t.DIM_IN_FLIGHT not in throttled
            assert t.SHAPED_REQUESTS not in throttled
        finally:
            await stop_harness(h)
    run(body())


def test_a_failed_request_reports_zero_tokens_in_bucket_0():
    async def body():
        h = await start_harness()
        await h.upstream.stop()  # nothing listens upstream: a retryable 503
        try:
            reply = await one_request(h.port, "POST", "/v1/completions", completion(2), vpce_id=VOICE_VPCE)
            assert reply.status == 503
            (rec,) = h.records_with(t.REQUESTS)
            assert (rec[t.DIM_INPUT_BUCKET], rec[t.DIM_OUTPUT_BUCKET]) == ("0", "0")
        finally:
            await stop_harness(h)
    run(body())
