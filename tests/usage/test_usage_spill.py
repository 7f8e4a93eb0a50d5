"""`fleetcast usage` and `traffic export` with cross-region spill (examples/spill/fleet.yaml): the serving region's
gateway meters a spilled request once (tests/gateway/test_spill_processes.py checks that across processes), the
home gateway counts only that it left (SpilledRequests). The reports read each region's records and show where a
consumer's requests came from (origin, its home) and where they ran (region)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3

from fleetcast.config import load_config
from fleetcast.contract import telemetry as t
from fleetcast.traffic.export import export, floor_hour
from fleetcast.usage import collect
from fleetcast.usage.report import render
from runtime.gateway.metrics import emf_record
from scripts.traffic_cmd import cloudwatch_caller
from tests.conftest import reset_moto
from tests.traffic.emf import ship, with_percentiles

ROOT = Path(__file__).resolve().parents[2]
NOW = floor_hour(datetime.now(UTC))
AT = int((NOW - timedelta(minutes=30)).timestamp() * 1000)


def served(consumer: str, tokens: tuple[int, int], **props) -> dict:
    return emf_record("spillfleet", "l40s", consumer, {t.REQUESTS: 1, t.THROTTLED: 0, t.ERRORS: 0,
                                                       t.INPUT_TOKENS: tokens[0], t.OUTPUT_TOKENS: tokens[1]},
                      {"status": 200, **props}, AT, {t.DIM_IN_FLIGHT: "1", t.DIM_INPUT_BUCKET: t.token_label(tokens[0]),
                                                     t.DIM_OUTPUT_BUCKET: t.token_label(tokens[1])})


def metered(aws_env):
    """checkout: two requests served at home, one spilled to us-west-2; reports: one at home (strict)."""
    reset_moto(aws_env)
    home = [served("checkout", (3, 5), origin_region="us-east-1", serving_region="us-east-1"),
            served("checkout", (2, 4), origin_region="us-east-1", serving_region="us-east-1"),
            served("reports", (10, 20), origin_region="us-east-1", serving_region="us-east-1"),
            emf_record("spillfleet", "l40s", "checkout", {t.SPILLED_REQUESTS: 1, t.ERRORS: 0},
                       {"status": 200, "serving_region": "us-west-2"}, AT)]
    remote = [served("checkout", (4, 7), origin_region="us-east-1", serving_region="us-west-2")]
    ship(home, boto3.client("cloudwatch", region_name="us-east-1"))
    ship(remote, boto3.client("cloudwatch", region_name="us-west-2"))
    return home + remote


def test_usage_shows_each_row_where_it_ran_and_where_it_came_from_and_counts_each_request_once(aws_env):
    metered(aws_env)
    cfg = load_config(ROOT / "examples" / "spill" / "fleet.yaml")
    report = collect(cfg, NOW - timedelta(hours=2), NOW, now=NOW)
    rows = {(u.consumer, u.region): u for u in report.rows}
    home, away = rows[("checkout", "us-east-1")], rows[("checkout", "us-west-2")]
    assert (home.origin, home.requests, home.spilled_out, home.output_tokens) == ("us-east-1", 2, 1, 9)
    assert (away.origin, away.requests, away.input_tokens, away.output_tokens) == ("us-east-1", 1, 4, 7)
    assert ("reports", "us-west-2") not in rows  # strict residency: never read (nor served) there
    assert sum(u.requests for u in report.rows) == 4  # every request once, wherever it ran
    # The serving region's cost is split over what it served, the spilled tokens included.
    assert away.token_share == 1.0
    table = render(report, "table")
    assert "ORIGIN" in table and "SPILLED OUT" in table
    assert render(report, "csv").splitlines()[0].startswith("consumer,region,origin,requests,spilled_out")


def test_usage_of_a_fleet_without_spill_keeps_its_columns(aws_env):
    from tests.gateway.conftest import fleet_config

    reset_moto(aws_env)
    report = collect(fleet_config(), NOW - timedelta(hours=2), NOW, now=NOW)
    assert all(u.origin is None for u in report.rows)
    assert render(report, "csv").splitlines()[0].startswith("consumer,region,requests,errors")


def test_the_exported_profile_counts_a_consumers_spilled_requests_in_its_demand_and_says_where_they_ran(aws_env):
    records = metered(aws_env)
    cfg = load_config(ROOT / "examples" / "spill" / "fleet.yaml")
    _, doc = export(cfg, NOW - timedelta(hours=1), NOW, with_percentiles(cloudwatch_caller(None), records), now=NOW)
    (entry,) = [e for e in doc["consumers"] if e["observed"]["consumers"].get("checkout")]
    observed = entry["observed"]
    assert entry["region"] == "us-east-1"  # the consumer region: where the demand comes from
    assert observed["consumers"]["checkout"] == 3 and sum(observed["arrivals"]) == 4
    assert observed["served_in"] == {"us-east-1": 3, "us-west-2": 1}
