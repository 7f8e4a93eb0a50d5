"""Plan drift rules (fleetcast.plan.drift): each reason fires on its own cause and names it."""

from __future__ import annotations

import math

import pytest

from fleetcast.plan.drift import (
    V1,
    Observation,
    check_pool,
    hour_of_day_rates,
    planned_usd_per_m_output,
    share_above,
    upgrade,
)

SLO = {"ttft_p99_ms": 300, "itl_p99_ms": 40}


def base(**over) -> dict:
    """A one-model pool in the one baseline format (a packing of one): 0.5 req/s per instance within the SLO."""
    rates = [1.0] * 24
    model = {"model": "gpt2-xl", "adapters": [], "precision": "fp8", "copies": 1, "source": "measured",
             "hourly_rps": rates, "peak_rps": 1.0, "output_mean": 200.0, "rps_per_instance": 0.5, "slo": SLO}
    doc = {"region": "ap-northeast-2", "pool": "l40s", "target": 16, "capacity": {"min": 2, "max": 4}, "n_min": 2,
           "hourly_rps": rates, "peak_rps": 1.0, "share_above_target": 0.05, "price_per_hour": 2.0, "models": [model]}
    doc["usd_per_m_output"] = planned_usd_per_m_output(doc)
    return doc | over


def obs(rate: float = 1.0, in_flight=None, output_mean: float = 200.0, **kw) -> Observation:
    return Observation([rate] * 24, in_flight or {"9-16": 95, "17-32": 5}, output_mean, **kw)


def test_the_planned_traffic_raises_nothing():
    assert check_pool(base(), obs(), SLO) == []


def test_traffic_past_what_max_capacity_serves_within_the_slo():
    (f,) = [f for f in check_pool(base(), obs(rate=2.5), SLO) if f.kind == "throughput"]
    assert "traffic grew past the SLO-safe throughput of max capacity" in f.text and "2.5 req/s" in f.text


def test_a_mix_moved_to_larger_batches():
    findings = check_pool(base(), obs(in_flight={"33-64": 80, "9-16": 20}), SLO)
    assert [f.kind for f in findings] == ["mix"]
    assert "80% of requests arrive with more than 16 in flight" in findings[0].text


def test_observed_p99_above_the_slo_at_planned_load_but_not_at_overload():
    arrivals = [3600.0, 3600.0, 3 * 3600.0]
    ok = obs(arrivals=arrivals, ttft_p99_ms=[120.0, 450.0, 900.0], itl_p99_ms=[10.0, 10.0, None])
    (f,) = check_pool(base(), ok, SLO)
    # Hour 2 ran at 3 req/s, past the planned peak: its 900 ms is overload, not a failed latency assumption.
    assert f.kind == "slo" and "in 1 hour(s)" in f.text and "450 ms > 300 ms" in f.text


def test_cost_per_token_off_by_more_than_the_threshold():
    # Shorter answers: the same instances now produce a third of the tokens.
    (f,) = check_pool(base(), obs(output_mean=60.0), SLO, cost_threshold=0.2)
    assert f.kind == "cost" and "+233%" in f.text
    assert check_pool(base(), obs(output_mean=190.0), SLO, cost_threshold=0.2) == []


@pytest.mark.parametrize("histogram,level,share", [
    ({"1-16": 1.0}, 16, 0.0), ({"33-64": 1.0}, 48, 0.5), ({"3-4": 1.0, "64": 1.0}, 3, 0.75), ({}, 4, 0.0)])
def test_share_above_spreads_ranges_evenly(histogram, level, share):
    assert share_above(histogram, level) == pytest.approx(share)


def test_hour_of_day_rates_take_the_busiest_day_or_the_mean():
    arrivals = [3600.0] * 24 + [7200.0] * 24
    assert hour_of_day_rates(5, arrivals, "max") == [2.0] * 24
    assert hour_of_day_rates(5, arrivals, "mean") == [1.5] * 24
    assert hour_of_day_rates(23, [3600.0], "max")[23] == 1.0 and hour_of_day_rates(23, [3600.0])[0] == 0.0
    idle = base()
    idle["models"][0]["hourly_rps"] = [0.0] * 24
    assert math.isinf(planned_usd_per_m_output(idle))


def test_a_first_format_one_model_baseline_is_read_as_a_packing_of_one():
    """A baseline written before one format served every pool (v1: a one-model pool without `models`, S = 2 s per
    request, 2 req/s SLO-safe at capacity.max 4) reads as the same pool: quiet on its planned traffic, the same
    findings past it."""
    rates = [1.0] * 24
    old = {"schema": V1, "written": "2026-02-01", "slo": SLO, "pools": [
        {"region": "ap-northeast-2", "pool": "l40s", "candidate": "g6e.xlarge fp8", "instance_type": "g6e.xlarge",
         "precision": "fp8", "consumer_regions": ["ap-northeast-2"], "target": 16, "capacity": {"min": 2, "max": 4},
         "n_min": 2, "seconds_per_request": 2.0, "hourly_rps": rates, "peak_rps": 1.0, "slo_safe_rps": 2.0,
         "share_above_target": 0.05, "price_per_hour": 2.0, "output_mean": 200.0, "usd_per_m_output": 333.3}]}
    (pool,) = upgrade(old)["pools"]
    assert pool["models"][0]["rps_per_instance"] == 0.5
    assert check_pool(pool, obs(), SLO) == []
    assert [f.kind for f in check_pool(pool, obs(rate=2.5), SLO)] == [f.kind for f in check_pool(base(), obs(rate=2.5), SLO)]
