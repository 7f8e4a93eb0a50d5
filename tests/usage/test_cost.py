"""`fleetcast usage --cost`: every instance-hour and the region's fixed costs, attributed to consumers and models by
the GPU time their tokens took (moto CloudWatch on loopback, as `usage` is tested)."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest

from fleetcast.config.catalog import instance_catalog
from fleetcast.plan.inputs import load_fixed_costs
from fleetcast.usage import attribute, collect, render_cost, write_png
from scripts.cli import main as cli
from tests.gateway.conftest import REGION, fleet_config

from .test_usage import NOW, cloudwatch, config_file, put  # noqa: F401 - fixtures

DAY = timedelta(hours=24)
GROUP = "fleetcast-ap-northeast-2-l40s"


def run_instances(cw, count: float) -> None:
    """The Seoul group ran `count` instances all day (one GroupTotalInstances datapoint every 15 minutes)."""
    cw.put_metric_data(Namespace="AWS/AutoScaling", MetricData=[
        {"MetricName": "GroupTotalInstances", "Value": count, "Timestamp": NOW - timedelta(minutes=m),
         "Dimensions": [{"Name": "AutoScalingGroupName", "Value": GROUP}]} for m in range(1, 24 * 60, 15)])


def fleet_cost_for_the_day(instances: float, requests: int, input_tokens: int, output_tokens: int) -> float:
    """The fleet's cost as the planner prices it: instance-hours x the price table, plus the region's fixed
    costs (fleetcast/config/data/fixed_costs.yaml, FixedCosts.hourly) at the day's mean rate."""
    price = instance_catalog()["g6e.xlarge"].price_per_hour[REGION]
    fixed = load_fixed_costs(None)
    gb = fixed.gb_per_request(input_tokens / requests, output_tokens / requests)
    return instances * 24 * price + fixed.hourly(REGION, REGION, requests / 86400, gb) * 24


def test_attributed_costs_add_up_to_the_fleets_cost_for_the_day(cloudwatch):  # noqa: F811
    run_instances(cloudwatch, 2.0)
    put(cloudwatch, "voice-app", "gpt2-xl", InputTokens=120_000, OutputTokens=400_000, Requests=2_000)
    put(cloudwatch, "analytics", "gpt2-xl", InputTokens=900_000, OutputTokens=60_000, Requests=300)
    report = attribute(fleet_config(), collect(fleet_config(), NOW - DAY, NOW, region=REGION, now=NOW, by_model=True))
    expected = fleet_cost_for_the_day(2.0, 2_300, 1_020_000, 460_000)
    assert report.fleet_usd == pytest.approx(expected, rel=1e-3)
    assert abs(report.attributed_usd - expected) / expected <= 0.02
    assert report.sums_up
    (bill,) = report.bills
    assert bill.fixed_usd > 0 and bill.instance_usd == pytest.approx(
        48 * instance_catalog()["g6e.xlarge"].price_per_hour[REGION])
    assert {(r.consumer, r.model) for r in report.rows} == {("voice-app", "gpt2-xl"), ("analytics", "gpt2-xl")}
    assert all(r.gpu_seconds > 0 and r.instance_usd > 0 and r.fixed_usd > 0 for r in report.rows)


def test_the_split_follows_gpu_time_not_tokens(cloudwatch):  # noqa: F811
    """Same tokens, different work: a decode token holds a share of a whole decode step (the weights read once per
    step for c requests), a prompt token is one slice of a compute-bound prefill, so the account that generates
    pays more than the one that reads, and neither pays the even split tokens alone would give."""
    run_instances(cloudwatch, 1.0)
    put(cloudwatch, "voice-app", "gpt2-xl", InputTokens=90_000, OutputTokens=10_000, Requests=100)
    put(cloudwatch, "analytics", "gpt2-xl", InputTokens=10_000, OutputTokens=90_000, Requests=100)
    report = attribute(fleet_config(), collect(fleet_config(), NOW - DAY, NOW, region=REGION, now=NOW, by_model=True))
    cost = {r.consumer: r.total_usd for r in report.rows}
    assert cost["analytics"] > 2 * cost["voice-app"]
    gpu = {r.consumer: r.gpu_seconds for r in report.rows}
    assert cost["analytics"] / sum(cost.values()) == pytest.approx(gpu["analytics"] / sum(gpu.values()))
    assert report.sums_up


def test_a_region_without_metered_tokens_is_named_and_the_sum_check_says_so(cloudwatch):  # noqa: F811
    run_instances(cloudwatch, 1.0)
    report = attribute(fleet_config(), collect(fleet_config(), NOW - DAY, NOW, region=REGION, now=NOW, by_model=True))
    assert report.rows == [] and not report.sums_up
    assert any(REGION in n and "not attributed" in n for n in report.notes)
    assert "OUTSIDE" in render_cost(report, "table")


def test_cli_prints_the_table_csv_and_draws_the_picture(cloudwatch, config_file, capsys, tmp_path):  # noqa: F811
    run_instances(cloudwatch, 2.0)
    put(cloudwatch, "voice-app", "gpt2-xl", InputTokens=50_000, OutputTokens=80_000, Requests=500)
    put(cloudwatch, "analytics", "gpt2-xl", InputTokens=5_000, OutputTokens=20_000, Requests=50)
    png = tmp_path / "cost.png"
    base = ["usage", "--config", str(config_file), "--since", "24h", "--region", REGION, "--cost"]
    assert cli([*base, "--format", "csv", "--png", str(png)]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["consumer"] for r in rows] == ["voice-app", "analytics"]  # the largest first
    assert sum(float(r["share_of_region"]) for r in rows) == pytest.approx(1.0, abs=1e-4)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli(base) == 0
    table = capsys.readouterr().out
    assert "GPU-HOURS" in table and "sum check" in table and "within the ±2% bound" in table


def test_png_without_cost_is_a_usage_error(config_file, capsys):  # noqa: F811
    assert cli(["usage", "--config", str(config_file), "--since", "24h", "--png", "x.png"]) == 2
    assert "--cost" in capsys.readouterr().err


def test_the_picture_is_written_whole(cloudwatch, tmp_path):  # noqa: F811
    run_instances(cloudwatch, 1.0)
    put(cloudwatch, "voice-app", "gpt2-xl", InputTokens=1_000, OutputTokens=1_000, Requests=10)
    report = attribute(fleet_config(), collect(fleet_config(), NOW - DAY, NOW, region=REGION, now=NOW, by_model=True))
    out = write_png(report, tmp_path / "c.png")
    assert out.exists() and not (tmp_path / "c.png.tmp").exists()


def test_a_model_without_architecture_figures_splits_its_pool_by_tokens_and_says_so(cloudwatch):  # noqa: F811
    from runtime.devtools.harness import tiny_config

    cfg = tiny_config()  # gpt2-tiny: the reference backend's shape, not a model the planner has figures for
    run_instances(cloudwatch, 1.0)
    put(cloudwatch, "voice-app", "gpt2-tiny", InputTokens=300, OutputTokens=100, Requests=4)
    report = attribute(cfg, collect(cfg, NOW - DAY, NOW, region=REGION, now=NOW, by_model=True))
    (row,) = report.rows
    assert row.by_tokens and row.total_usd == pytest.approx(report.fleet_usd)
    assert any("split by tokens" in n for n in report.notes)
    assert "by tokens" in render_cost(report, "table") and report.sums_up
