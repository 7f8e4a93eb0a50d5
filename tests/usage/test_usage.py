"""`fleetcast usage`: per-consumer tokens and cost share, read back from CloudWatch (moto on loopback).

The end-to-end test drives real traffic for two consumers through the gateway,
ships its EMF records to CloudWatch the way CloudWatch Logs extracts them, and
checks that the report adds up to the tokens that were actually streamed.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
from datetime import UTC, datetime, timedelta

import boto3
import pytest

from fleetcast.config.catalog import instance_catalog
from fleetcast.contract import telemetry as t
from fleetcast.contract.errors import UserError
from fleetcast.usage import collect, parse_time
from scripts.cli import main as cli
from tests.conftest import reset_moto
from tests.gateway.conftest import ANALYTICS_VPCE, REGION, VOICE_VPCE, fleet_config, run, start_harness, stop_harness
from tests.gateway.fakes import Client

NOW = datetime.now(UTC)


@pytest.fixture
def cloudwatch(aws_env):
    reset_moto(aws_env)  # fresh metrics per test
    return boto3.client("cloudwatch", region_name=REGION)


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(json.dumps(fleet_config().model_dump(mode="json")))  # JSON is YAML
    return path


def ship_emf(cw, records):
    """What CloudWatch Logs does with EMF lines: one datapoint per metric per dimension set."""
    data = []
    for record in records:
        meta = record["_aws"]["CloudWatchMetrics"][0]
        stamp = datetime.fromtimestamp(record["_aws"]["Timestamp"] / 1000, UTC)
        for dims in meta["Dimensions"]:
            for metric in meta["Metrics"]:
                data.append({"MetricName": metric["Name"], "Unit": metric["Unit"], "Timestamp": stamp,
                             "Value": float(record[metric["Name"]]),
                             "Dimensions": [{"Name": d, "Value": record[d]} for d in dims]})
    for start in range(0, len(data), 500):
        cw.put_metric_data(Namespace=meta["Namespace"], MetricData=data[start:start + 500])


def put(cw, consumer, model=None, **values):
    model_dim = [{"Name": "Model", "Value": model}] if model else []
    cw.put_metric_data(Namespace=t.NAMESPACE, MetricData=[
        {"MetricName": name, "Value": value, "Timestamp": NOW - timedelta(minutes=5), "Dimensions": [
            {"Name": "Fleet", "Value": "fleetcast"}, {"Name": "Pool", "Value": "l40s"},
            {"Name": "Consumer", "Value": consumer}, *model_dim]} for name, value in values.items()])


def test_usage_adds_up_to_the_tokens_streamed_through_the_gateway(cloudwatch, config_file, capsys):
    cfg = fleet_config(voice_limits={"max_concurrency": 2, "requests_per_minute": 6000})

    async def traffic():
        h = await start_harness(cfg)
        try:
            async def go(vpce, n, stream=True):
                client = await Client(h.port, vpce).connect()
                reply = await client.request("POST", "/v1/completions", {
                    "model": "gpt2-xl", "prompt": "count these four", "max_tokens": n, "stream": stream})
                await client.close()
                return reply
            replies = await asyncio.gather(*[go(VOICE_VPCE, 5 + i) for i in range(6)],
                                           *[go(ANALYTICS_VPCE, 20, i % 2 == 0) for i in range(3)])
            return h.records, replies
        finally:
            await stop_harness(h)
    records, replies = run(traffic())
    # The gateway stamped its records with the real clock just now: the window is placed around that
    # moment, not around a time fixed when the module was collected (minutes earlier on a busy machine).
    now = datetime.now(UTC)
    throttled = sum(1 for r in replies if r.status == 429)
    streamed_voice = sum(r.text.count(" t") for r in replies[:6] if r.status == 200)
    ship_emf(cloudwatch, records)
    # The Seoul group ran 2 instances for the last hour (Auto Scaling's 1-minute group metric).
    cloudwatch.put_metric_data(Namespace="AWS/AutoScaling", MetricData=[
        {"MetricName": "GroupTotalInstances", "Value": 2.0, "Timestamp": now - timedelta(minutes=m),
         "Dimensions": [{"Name": "AutoScalingGroupName", "Value": "fleetcast-ap-northeast-2-l40s"}]}
        for m in range(0, 60)])

    since, until = (now - timedelta(hours=1)).isoformat(), (now + timedelta(minutes=5)).isoformat()
    assert cli(["usage", "--config", str(config_file), "--since", since, "--until", until, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["consumer"]: r for r in report["consumers"]}
    assert rows["voice-app"]["output_tokens"] == streamed_voice
    assert rows["analytics"]["output_tokens"] == 60 and rows["analytics"]["input_tokens"] == 9
    assert rows["voice-app"]["requests"] == 6 and rows["voice-app"]["throttled"] == throttled
    assert rows["analytics"]["requests"] == 3 and rows["analytics"]["errors"] == 0
    assert report["cost_is_estimate"] is True
    seoul = next(r for r in report["regions"] if r["region"] == REGION)
    assert sum(r["est_cost_usd"] for r in rows.values()) == pytest.approx(seoul["cost_usd"], rel=1e-3)
    assert seoul["instance_hours"] == pytest.approx(2.0) and "GroupTotalInstances" in seoul["basis"]

    assert cli(["usage", "--config", str(config_file), "--since", since, "--until", until]) == 0
    table = capsys.readouterr().out
    print("\n$ fleetcast usage --since ... --until ...\n" + table)  # the transcript, with pytest -s
    assert "voice-app" in table and "analytics" in table and "estimate" in table

    # Split by model: the gateway's [Fleet, Pool, Consumer, Model] records, one row per consumer and model.
    capsys.readouterr()  # the transcript above
    assert cli(["usage", "--config", str(config_file), "--since", since, "--until", until, "--by-model",
                "--json"]) == 0
    by_model = {(r["consumer"], r["model"]): r for r in json.loads(capsys.readouterr().out)["consumers"]}
    assert set(by_model) == {("voice-app", "gpt2-xl"), ("analytics", "gpt2-xl")}
    assert by_model[("voice-app", "gpt2-xl")]["output_tokens"] == streamed_voice
    assert by_model[("analytics", "gpt2-xl")]["requests"] == 3


def test_cost_share_follows_token_share(cloudwatch, config_file):
    put(cloudwatch, "voice-app", InputTokens=1000, OutputTokens=2000, Requests=10)
    put(cloudwatch, "analytics", InputTokens=500, OutputTokens=500, Requests=4, Errors=1)
    cfg = fleet_config()
    since, until = NOW - timedelta(hours=2), NOW
    report = collect(cfg, since, until, region=REGION, now=NOW)
    rows = {r.consumer: r for r in report.rows}
    assert rows["voice-app"].token_share == pytest.approx(0.75)
    assert rows["analytics"].errors == 1 and rows["analytics"].requests == 4
    seoul = cfg.region(REGION)
    hourly = sum(instance_catalog()[p.instance_type].price_per_hour[REGION] * p.capacity.baseline for p in seoul.pools)
    (cost,) = report.costs
    assert cost.cost_usd == pytest.approx(hourly * 2)
    assert rows["voice-app"].cost_usd == pytest.approx(hourly * 2 * 0.75)
    assert "estimate" in cost.basis and "capacity baseline" in cost.basis
    # No group metrics in the window: the report says which group and what it assumed.
    assert any("GroupTotalInstances" in n and "fleetcast-ap-northeast-2-l40s" in n for n in report.notes)


def test_cost_follows_the_instances_the_group_actually_ran(cloudwatch):
    """Instance-hours come from the group's GroupTotalInstances (pending builds included), not
    from the configured size: 3 instances for the last hour of a 2-hour window is 3 instance-hours."""
    put(cloudwatch, "voice-app", InputTokens=100, OutputTokens=100, Requests=1)
    group = [{"Name": "AutoScalingGroupName", "Value": "fleetcast-ap-northeast-2-l40s"}]
    cloudwatch.put_metric_data(Namespace="AWS/AutoScaling", MetricData=[
        {"MetricName": "GroupTotalInstances", "Value": 3.0, "Timestamp": NOW - timedelta(minutes=m),
         "Dimensions": group} for m in range(1, 61)])
    cfg = fleet_config()
    report = collect(cfg, NOW - timedelta(hours=2), NOW, region=REGION, now=NOW)
    (cost,) = report.costs
    price = instance_catalog()["g6e.xlarge"].price_per_hour[REGION]
    assert cost.instance_hours == pytest.approx(3.0)
    assert cost.cost_usd == pytest.approx(3 * price)
    assert "GroupTotalInstances" in cost.basis and not any("GroupTotalInstances" in n for n in report.notes)


def test_csv_has_one_row_per_consumer_and_regions_without_traffic_are_noted(cloudwatch, config_file, capsys):
    put(cloudwatch, "voice-app", InputTokens=10, OutputTokens=30, Requests=1)
    args = ["usage", "--config", str(config_file), "--since", "3h", "--format", "csv"]
    assert cli(args) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["consumer"], r["total_tokens"]) for r in rows] == [("voice-app", "40"), ("analytics", "0")]
    report = collect(fleet_config(), NOW - timedelta(hours=3), NOW, now=NOW)
    assert any("us-east-1" in n and "no consumers" in n for n in report.notes)


def test_bad_arguments_are_one_clear_line(config_file, capsys):
    assert cli(["usage", "--config", str(config_file), "--since", "last week"]) == 2
    assert "ISO 8601" in capsys.readouterr().err
    assert cli(["usage", "--config", str(config_file), "--since", "1h", "--until", "2h"]) == 2
    assert "must be before" in capsys.readouterr().err
    assert cli(["usage", "--config", str(config_file), "--since", "1h", "--region", "eu-west-1"]) == 2
    err = capsys.readouterr().err
    assert "eu-west-1" in err and "ap-northeast-2" in err and "Traceback" not in err


def test_missing_credentials_is_a_clear_error(config_file, capsys, monkeypatch, tmp_path):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # should anything still sign, it stays local
    assert cli(["usage", "--config", str(config_file), "--since", "1h"]) == 4  # missing access: exit 4
    assert "no AWS credentials" in capsys.readouterr().err


def test_time_arguments():
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    assert parse_time("now", now, "--until") == now
    assert parse_time("90m", now, "--since") == now - timedelta(minutes=90)
    assert parse_time("7d", now, "--since") == now - timedelta(days=7)
    assert parse_time("2026-11-28", now, "--since") == datetime(2026, 11, 28, tzinfo=UTC)
    assert parse_time("2026-11-28T09:30+09:00", now, "--since") == datetime(2026, 11, 28, 0, 30, tzinfo=UTC)
    with pytest.raises(UserError):
        parse_time("tomorrow", now, "--until")


def test_by_model_rows_split_a_consumers_tokens_and_cost_share_by_the_model_it_called(cloudwatch):
    put(cloudwatch, "voice-app", InputTokens=300, OutputTokens=900, Requests=4)  # the consumer set...
    put(cloudwatch, "voice-app", "gpt2-xl", InputTokens=300, OutputTokens=900, Requests=3)  # ...and routed ones
    put(cloudwatch, "analytics", InputTokens=100, OutputTokens=100, Requests=1)
    put(cloudwatch, "analytics", "gpt2-xl", InputTokens=100, OutputTokens=100, Requests=1)
    cfg = fleet_config()
    report = collect(cfg, NOW - timedelta(hours=2), NOW, region=REGION, now=NOW, by_model=True)
    rows = {(r.consumer, r.model): r for r in report.rows}
    assert set(rows) == {("voice-app", "gpt2-xl"), ("analytics", "gpt2-xl")}
    # One request of voice-app's was refused before routing (no model): it counts per consumer only.
    assert rows[("voice-app", "gpt2-xl")].requests == 3
    assert rows[("voice-app", "gpt2-xl")].token_share == pytest.approx(1200 / 1400)
    from fleetcast.usage import render

    table = render(report, "table")
    assert "MODEL" in table and "gpt2-xl" in table and "consumer and model tokens" in table
    header = render(report, "csv").splitlines()[0]
    assert header.startswith("consumer,region,model,requests")
    assert "model" not in render(collect(cfg, NOW - timedelta(hours=2), NOW, region=REGION, now=NOW), "csv"
                                 ).splitlines()[0]
