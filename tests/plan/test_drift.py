"""Plan drift rules (fleetcast.plan.drift): each reason fires on its own cause and names it."""

from __future__ import annotations

import math

import pytest

from fleetcast.plan.drift import Observation, check_pool, hour_of_day_rates, instance_cost_per_m_output, share_above

SLO = {"ttft_p99_ms": 300, "itl_p99_ms": 40}


def base(**over) -> dict:
    rates = [1.0] * 24
    doc = {"region": "ap-northeast-2", "pool": "l40s", "target": 16, "capacity": {"min": 2, "max": 4}, "n_min": 2,
           "seconds_per_request": 2.0, "peak_rps": 1.0, "slo_safe_rps": 2.0, "share_above_target": 0.05,
           "price_per_hour": 2.0, "output_mean": 200.0,
           "usd_per_m_output": instance_cost_per_m_output(rates, 2.0, 2, 2.0, 200.0)}
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
    assert math.isinf(instance_cost_per_m_output([0.0] * 24, 1.0, 1, 1.0, 100.0))
