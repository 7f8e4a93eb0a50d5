"""`fleetcast traffic export` on a fleet of several models: one profile entry per (consumer region, model),
read from the gateway's per-model metering (telemetry.DIM_MODEL). Requests sent through the real gateway
(two models, two consumers, one not entitled to the second model) -> CloudWatch (moto) -> a profile whose
per-model arrivals, burstiness, consumer counts, length histograms and means are what was sent to each model."""

from __future__ import annotations

import asyncio
import json
import math
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest

from fleetcast.config.loader import parse_config
from fleetcast.contract import telemetry as t
from fleetcast.plan.traffic import load_traffic
from fleetcast.traffic.export import export, floor_hour, per_model, trimmed_count
from runtime.gateway.routing import Router
from scripts.traffic_cmd import cloudwatch_caller, write_profile
from tests.conftest import reset_moto
from tests.gateway.conftest import ANALYTICS_VPCE, REGION, VOICE_VPCE, fleet_config, start_harness, stop_harness
from tests.gateway.fakes import Client, FakeModelServer

from .emf import ShippedOnDemand, with_percentiles
from .week import WIDE_LIMITS

NOW = floor_hour(datetime.now(UTC))
HOURS = 3
START = NOW - timedelta(hours=HOURS)
SMALL = "gpt2-small-chat"
ROOT_MULTI = Path(__file__).resolve().parents[2] / "examples" / "multi-model" / "fleet.yaml"  # the second model: voice-app may call it, analytics may not


def two_model_config():
    """The gateway tests' fleet (both consumers in Seoul) serving gpt2-xl and a second model only voice-app calls."""
    data = fleet_config(WIDE_LIMITS, WIDE_LIMITS).model_dump(mode="json")
    first = data.pop("model")
    data.pop("calibration", None)
    first["parameters_b"] = 1.56  # several processes per instance: the memory check needs model sizes
    data["models"] = [first, {**first, "id": SMALL, "parameters_b": 0.12, "consumers": ["voice-app"]}]
    return parse_config(data, "<two-model test config>")


def _sends(rng: random.Random) -> list[tuple[int, str, str, int, int]]:
    """(minute, consumer, model, prompt words, max_tokens): each model its own lengths and rates."""
    out = []
    for minute in range(HOURS * 60):
        for _ in range(rng.choice((0, 0, 1, 1, 2))):
            out.append((minute, "voice-app", "gpt2-xl", rng.randint(20, 200), rng.randint(4, 48)))
        if rng.random() < 0.3:
            out.append((minute, "voice-app", SMALL, rng.randint(600, 1500), rng.randint(100, 300)))
        if rng.random() < 0.25:
            out.append((minute, "analytics", "gpt2-xl", rng.randint(60, 120), rng.randint(8, 16)))
    # A burst to the small model in the second hour (minute 75-76): its per-minute counts show it.
    out += [(75 + i % 2, "voice-app", SMALL, 700, 120) for i in range(30)]
    # analytics asking for the model it may not call: 404 model_not_found, no engine loaded, not in the profile.
    out += [(minute, "analytics", SMALL, 50, 5) for minute in (10, 70, 130)]
    return sorted(out)


def _run(cfg, sends) -> tuple[list[dict], list[tuple[int, int]]]:
    async def body():
        xl, small = await FakeModelServer().start(), await FakeModelServer().start()
        router = Router({"gpt2-xl": [("127.0.0.1", xl.port)], SMALL: [("127.0.0.1", small.port)]})
        h = await start_harness(cfg, upstream=xl, router=router,
                                entitled={c.name: cfg.models_for(c.name) for c in cfg.consumers})
        statuses = []
        clients = {"voice-app": await Client(h.port, VOICE_VPCE).connect(),
                   "analytics": await Client(h.port, ANALYTICS_VPCE).connect()}
        try:
            for minute, consumer, model, words, max_tokens in sends:
                h.gateway.clock = lambda minute=minute: START.timestamp() + minute * 60 + 1
                reply = await clients[consumer].request("POST", "/v1/completions", {
                    "model": model, "prompt": " ".join(["w"] * words), "max_tokens": max_tokens, "stream": False})
                statuses.append((reply.status, minute))
            return list(h.records), statuses
        finally:
            for c in clients.values():
                await c.close()
            await stop_harness(h)
            await small.stop()
    return asyncio.run(asyncio.wait_for(body(), 300))


def test_a_fleet_of_several_models_exports_one_entry_per_region_and_model(aws_env, tmp_path):
    cfg = two_model_config()
    assert per_model(cfg)
    sends = _sends(random.Random(7))
    records, statuses = _run(cfg, sends)
    refused = [s for s, (status, _) in zip(sends, statuses) if status != 200]
    assert {(s[1], s[2]) for s in refused} == {("analytics", SMALL)} and len(refused) == 3
    reset_moto(aws_env)
    shipped = ShippedOnDemand(records, boto3.client("cloudwatch", region_name=REGION))

    profile, doc = export(cfg, START, NOW, with_percentiles(shipped.caller(cloudwatch_caller(None)), records),
                          region=REGION, now=NOW)
    out = tmp_path / "traffic.yaml"
    write_profile(doc, out)
    assert load_traffic(out) == profile
    assert profile.checked_against(tuple(m.id for m in cfg.models)) == profile  # every entry names its model
    # By region, then model id.
    assert [(c.region, c.model) for c in profile.consumers] == [(REGION, SMALL), (REGION, "gpt2-xl")]

    served = [s for s, (status, _) in zip(sends, statuses) if status == 200]
    for entry in profile.consumers:
        mine = [s for s in served if s[2] == entry.model]
        o = entry.observed
        per_hour = [sum(1 for s in mine if s[0] // 60 == h) for h in range(HOURS)]
        assert o.arrivals == per_hour  # Sums of per-request records: exact
        assert o.consumers == {c: sum(1 for s in mine if s[1] == c) for c in sorted({s[1] for s in mine})}
        assert o.models == {"gpt2-xl": sum(1 for s in served if s[2] == "gpt2-xl"),
                            SMALL: sum(1 for s in served if s[2] == SMALL)}
        # Length histograms from CloudWatch trimmed counts over the raw token values: bucket for bucket.
        want_in: dict[str, int] = {}
        want_out: dict[str, int] = {}
        for s in mine:
            want_in[t.token_label(s[3])] = want_in.get(t.token_label(s[3]), 0) + 1
            want_out[t.token_label(s[4])] = want_out.get(t.token_label(s[4]), 0) + 1
        assert (o.input_tokens, o.output_tokens) == (want_in, want_out)
        assert entry.input_mean == pytest.approx(sum(s[3] for s in mine) / len(mine), abs=1e-3)  # written to 3 decimals
        assert entry.output_mean == pytest.approx(sum(s[4] for s in mine) / len(mine), abs=1e-3)  # written to 3 decimals
        # Sent one at a time, every request arrived alone on the instance: each model's own in-flight histogram
        # ([Fleet, Pool, Consumer, Model, InFlightAtArrival]); the planner still sizes from arrivals.
        assert o.in_flight == {"1": len(mine)} and entry.concurrency == {"1": 1.0} and entry.arrival_driven
        for h in range(HOURS):
            minutes = [sum(1 for s in mine if s[0] == h * 60 + m) for m in range(60)]
            if sum(minutes):
                assert o.peak_minute_ratio[h] == pytest.approx(max(minutes) / (sum(minutes) / 60), abs=1e-3)
    small = profile.consumers[0]
    assert small.observed.peak_minute_ratio[1] > 5  # the burst in the second hour
    assert small.observed.consumers == {"voice-app": sum(1 for s in served if s[2] == SMALL)}


@pytest.mark.parametrize("label, stat", [("1-64", "TC(0:64)"), ("65-128", "TC(64:128)"),
                                         ("65537-131072", "TC(65536:131072)"), ("131073-1048576", "TC(131072:)")])
def test_a_token_bucket_is_read_as_the_trimmed_count_of_its_range(label, stat):
    # CloudWatch statistics definitions: TM(150:1000) removes the points "lower than or equal to 150, or higher
    # than 1000" (lower bound exclusive, upper inclusive); a bucket 'a-b' holds a <= v <= b of integer counts.
    # The last is open above (aws-cdk-lib aws-cloudwatch/lib/private/statistic.ts, parsePairStatistic: one side
    # of a pair statistic may be empty), as the gateway's token_label puts longer requests there.
    assert trimmed_count(label) == stat
    assert label in t.TOKEN_LABELS


def test_the_per_model_buckets_count_a_value_where_the_gateways_label_puts_it():
    """One rule for both export paths: the one-model path sums ShapedRequests by the gateway's token_label, the
    per-model path trimmed counts; every count lands in the same bucket either way, past the last bound too."""
    for value in (1, 64, 65, 128, 129, 131072, 131073, 1_048_576, 1_048_577, 2_000_000, 10**9):
        holding = [label for label in t.TOKEN_LABELS
                   if t.token_bounds(label)[0] < value <= (t.token_bounds(label)[1] or math.inf)]
        assert holding == [t.token_label(value)], value


def _adapter_config():
    from fleetcast.config import load_config

    data = load_config(ROOT_MULTI).model_dump(mode="json")
    small = next(m for m in data["models"] if m["id"] == "qwen2.5-0.5b")  # PyTorch backend: adapters allowed
    small["adapters"] = [{"id": "qwen-sql", "source": "example-org/qwen-sql-lora", "revision": "main"}]
    return parse_config(data, "<adapter config>")


def _records(cfg, start, sent: list[tuple[str, dict]]) -> list[dict]:
    """One voice-app request record a minute, (model id it named, its metric values)."""
    from runtime.gateway.metrics import emf_record

    return [emf_record(cfg.name, "l40s", "voice-app", {t.REQUESTS: 1, t.THROTTLED: 0, t.ERRORS: 0, **values},
                       timestamp_ms=int(start.timestamp() * 1000) + 60_000 * (i + 1), model=model)
            for i, (model, values) in enumerate(sent)]


def _export(aws_env, cfg, start, records):
    region = cfg.regions[0].region
    reset_moto(aws_env)
    shipped = ShippedOnDemand(records, boto3.client("cloudwatch", region_name=region))
    profile, _ = export(cfg, start, NOW, with_percentiles(shipped.caller(cloudwatch_caller(None)), records),
                        region=region, consumer="voice-app", now=NOW)
    return {c.model: c for c in profile.consumers}


def test_a_request_longer_than_the_last_bound_counts_in_the_last_bucket_per_model_too(aws_env):
    cfg = _adapter_config()
    start = NOW - timedelta(hours=1)
    records = _records(cfg, start, [("qwen2.5-0.5b", {t.INPUT_TOKENS: 2_000_000, t.OUTPUT_TOKENS: 10}),
                                    ("qwen2.5-0.5b", {t.INPUT_TOKENS: 300, t.OUTPUT_TOKENS: 1_500_000}),
                                    ("gpt2-xl", {t.INPUT_TOKENS: 20, t.OUTPUT_TOKENS: 5})])
    qwen = _export(aws_env, cfg, start, records)["qwen2.5-0.5b"]
    last = t.TOKEN_LABELS[-1]
    assert t.token_label(2_000_000) == last  # where the one-model path's ShapedRequests count it
    assert qwen.observed.input_tokens == {"257-512": 1, last: 1}
    assert qwen.observed.output_tokens == {"1-64": 1, last: 1}


def test_a_models_latency_includes_its_adapters_requests(aws_env):
    """The gateway meters TTFT/ITL under the id a request named: the base model's hourly P99 covers its adapters'
    requests as its arrivals do (the worst of the ids' P99s, an upper bound of the P99 over all of them)."""
    cfg = _adapter_config()
    start = NOW - timedelta(hours=1)
    sent = [("gpt2-xl", {t.TTFT_MS: 40.0, t.ITL_MS: 4.0})] + [("qwen2.5-0.5b", {t.TTFT_MS: 100.0, t.ITL_MS: 8.0})] * 3
    sent += [("qwen-sql", {t.TTFT_MS: 900.0, t.ITL_MS: 30.0}), ("qwen-sql", {t.TTFT_MS: 120.0, t.ITL_MS: 9.0})]
    entries = _export(aws_env, cfg, start, _records(cfg, start, sent))
    qwen, xl = entries["qwen2.5-0.5b"], entries["gpt2-xl"]
    assert sum(qwen.observed.arrivals) == 5
    assert (qwen.observed.ttft_p99_ms, qwen.observed.itl_p99_ms) == ([900.0], [30.0])
    assert (xl.observed.ttft_p99_ms, xl.observed.itl_p99_ms) == ([40.0], [4.0])


def test_an_adapters_requests_count_for_its_base_model(aws_env):
    """A request naming a LoRA adapter runs on its base model's processes: the export adds it to that model's entry
    (the gateway meters the id the request named, runtime/gateway/metrics.py emf_record)."""
    cfg = _adapter_config()
    start = NOW - timedelta(hours=1)
    sent = [("gpt2-xl", 100, 20), ("qwen2.5-0.5b", 300, 40), ("qwen-sql", 700, 90), ("qwen-sql", 80, 10)]
    records = _records(cfg, start, [(model, {t.INPUT_TOKENS: n_in, t.OUTPUT_TOKENS: n_out}) for model, n_in, n_out in sent])
    entries = _export(aws_env, cfg, start, records)
    assert [(m, sum(c.observed.arrivals)) for m, c in entries.items()] == [("gpt2-xl", 1), ("qwen2.5-0.5b", 3)]
    qwen = entries["qwen2.5-0.5b"]
    assert qwen.observed.input_tokens == {"257-512": 1, "513-1024": 1, "65-128": 1}
    assert qwen.input_mean == pytest.approx((300 + 700 + 80) / 3, abs=1e-3)
    assert qwen.observed.models == {"gpt2-xl": 1, "qwen2.5-0.5b": 3}


def test_each_models_concurrency_is_the_in_flight_its_own_requests_arrived_at(aws_env):
    """Streams of the small model held open on the instance: every gpt2-xl request then arrives with them in flight,
    and only the small model's entry has the levels its own streams arrived at."""
    cfg = two_model_config()

    async def body():
        xl, small = await FakeModelServer().start(), await FakeModelServer().start()
        router = Router({"gpt2-xl": [("127.0.0.1", xl.port)], SMALL: [("127.0.0.1", small.port)]})
        h = await start_harness(cfg, upstream=xl, router=router,
                                entitled={c.name: cfg.models_for(c.name) for c in cfg.consumers})
        h.gateway.clock = lambda: START.timestamp() + 61
        small.gate = asyncio.Event()  # the small model's streams stop after their first token until released
        held = []
        try:
            for _ in range(3):  # arrive at 1, 2, 3 in flight
                c = await Client(h.port, VOICE_VPCE).connect()
                await c.send("POST", "/v1/completions", {"model": SMALL, "prompt": "w w", "max_tokens": 2, "stream": True})
                status, headers = await c.read_head()
                assert status == 200
                held.append((c, headers))
            xl_client = await Client(h.port, ANALYTICS_VPCE).connect()
            for _ in range(5):  # each arrives with the 3 streams in flight: 4
                reply = await xl_client.request("POST", "/v1/completions",
                                                {"model": "gpt2-xl", "prompt": "w", "max_tokens": 3, "stream": False})
                assert reply.status == 200
            await xl_client.close()
            small.gate.set()
            for c, headers in held:
                await c.read_body(headers)
                await c.close()
            return list(h.records)
        finally:
            await stop_harness(h)
            await small.stop()

    records = asyncio.run(asyncio.wait_for(body(), 120))
    # A fleet of several models: the shape directive has the per-model in-flight set (telemetry.SHAPE_MODEL_...),
    # each set within EMF's 30 dimensions (tests/traffic/emf.py checks it as it extracts).
    (shape,) = {json.dumps(r["_aws"]["CloudWatchMetrics"][1]["Dimensions"]) for r in records if t.SHAPED_REQUESTS in r}
    assert json.loads(shape) == [list(d) for d in t.SHAPE_MODEL_DIMENSION_SETS]
    reset_moto(aws_env)
    shipped = ShippedOnDemand(records, boto3.client("cloudwatch", region_name=REGION))
    profile, _ = export(cfg, START, NOW, with_percentiles(shipped.caller(cloudwatch_caller(None)), records),
                        region=REGION, now=NOW)
    by_model = {c.model: c.observed.in_flight for c in profile.consumers}
    assert by_model == {SMALL: {"1": 1, "2": 1, "3-4": 1}, "gpt2-xl": {"3-4": 5}}

