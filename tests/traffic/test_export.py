"""`fleetcast traffic export`: days of traffic through the real gateway -> CloudWatch (moto) -> a profile
that reproduces what was sent: arrivals per hour within 2%, length quantiles within one bucket."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import boto3
import pytest

from fleetcast.contract import telemetry as t
from fleetcast.plan.traffic import load_traffic
from fleetcast.traffic.export import export, floor_hour
from scripts.traffic_cmd import cloudwatch_caller, write_profile
from tests.conftest import reset_moto
from tests.gateway.conftest import REGION, fleet_config, start_harness, stop_harness

from .emf import ShippedOnDemand, with_percentiles
from .week import DAYS, HOURS, WIDE_LIMITS, Week, send_week, simulate

NOW = floor_hour(datetime.now(UTC))
START = NOW - timedelta(days=DAYS)


def run_week(week: Week, moto_endpoint: str) -> list[dict]:
    """Send the days through a real gateway on loopback; their EMF records, for moto CloudWatch (emptied)."""
    async def body():
        h = await start_harness(fleet_config(WIDE_LIMITS, WIDE_LIMITS))
        try:
            await send_week(week, h.gateway, h.port)
            return list(h.records)
        finally:
            await stop_harness(h)
    records = asyncio.run(asyncio.wait_for(body(), 600))
    reset_moto(moto_endpoint)
    return records


def _quantile_bucket(counts: dict[str, int], labels: tuple[str, ...], q: float) -> int:
    total = sum(counts.values())
    seen = 0
    for i, label in enumerate(labels):
        seen += counts.get(label, 0)
        if seen >= q * total:
            return i
    return len(labels) - 1


def _sent_quantile_bucket(values: list[int], q: float) -> int:
    ordered = sorted(values)
    value = ordered[min(len(ordered) - 1, max(0, int(-(-q * len(ordered) // 1)) - 1))]
    return t.TOKEN_LABELS.index(t.token_label(value))


def test_days_through_the_gateway_export_to_a_profile_that_reproduces_them(aws_env, tmp_path):
    cfg = fleet_config(WIDE_LIMITS, WIDE_LIMITS)
    week = simulate(START)
    records = run_week(week, aws_env)
    assert len(week.sent) == len(week.arrivals) > 2000 * DAYS / 7  # every arrival sent (about 500 a day)

    shipped = ShippedOnDemand(records, boto3.client("cloudwatch", region_name=REGION))
    profile, doc = export(cfg, START, NOW, with_percentiles(shipped.caller(cloudwatch_caller(None)), records),
                          region=REGION, now=NOW)
    out = tmp_path / "traffic.yaml"
    write_profile(doc, out)
    assert load_traffic(out) == profile  # what is written reads back as the same profile

    (entry,) = profile.consumers  # both consumers sit in ap-northeast-2
    o = entry.observed
    sent = week.per_hour()
    assert len(o.arrivals) == HOURS
    for hour, (got, want) in enumerate(zip(o.arrivals, sent)):
        assert abs(got - want) <= 0.02 * want, f"hour {hour}: exported {got}, sent {want}"
    assert o.consumers == {"analytics": sum(week.per_hour("analytics")), "voice-app": sum(week.per_hour("voice-app"))}
    assert sum(o.throttled) == 0

    # Burstiness: the busiest minute and the dispersion of per-minute counts, per hour, as sent.
    for hour in range(HOURS):
        minutes = week.minutes(hour)
        total = sum(minutes)
        if total:
            mean = total / 60
            assert o.peak_minute_ratio[hour] == pytest.approx(max(minutes) / mean, abs=1e-3)
            assert o.dispersion_60s[hour] == pytest.approx(sum((m - mean) ** 2 for m in minutes) / 60 / mean, abs=1e-3)
    bursty = [h for h in range(HOURS) if o.dispersion_60s[h] > 5]
    assert bursty, "the analytics bursts show as over-dispersed hours"

    # Lengths: every quantile of the sent prompts and answers falls in the exported histogram's bucket (or next to it).
    prompts = [a.prompt_words for a in week.sent]
    answers = [a.max_tokens for a in week.sent]
    for q in (0.05, 0.25, 0.5, 0.75, 0.9, 0.99):
        assert abs(_quantile_bucket(o.input_tokens, t.TOKEN_LABELS, q) - _sent_quantile_bucket(prompts, q)) <= 1
        assert abs(_quantile_bucket(o.output_tokens, t.TOKEN_LABELS, q) - _sent_quantile_bucket(answers, q)) <= 1
    assert entry.input_mean == pytest.approx(sum(prompts) / len(prompts), rel=1e-3)
    assert entry.output_mean == pytest.approx(sum(answers) / len(answers), rel=1e-3)

    # In flight at arrival: the exported histogram is the gateway's own, bucket for bucket.
    seen: dict[str, int] = {}
    for r in records:
        if t.DIM_IN_FLIGHT in r:
            seen[r[t.DIM_IN_FLIGHT]] = seen.get(r[t.DIM_IN_FLIGHT], 0) + 1
    assert o.in_flight == seen
    assert sum(entry.concurrency.values()) == pytest.approx(1.0, abs=1e-6)

    # rate_rps, per UTC hour of the day, is the busiest day's.
    for utc_hour in range(24):
        days = [sent[i] for i in range(HOURS) if (START + timedelta(hours=i)).hour == utc_hour]
        assert entry.hourly_rps()[utc_hour] == pytest.approx(max(days) / 3600, rel=1e-6)
