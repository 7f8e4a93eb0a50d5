"""Scheduled plan drift check for one provider region (runs in AWS Lambda; boto3 + stdlib only).

What it reads:
- the plan baseline that `fleetcast plan --write-config` wrote (`<config>.plan-baseline.json`),
  staged to the region's model bucket under BASELINE_KEY (docs/plan.md, "Drift"): the plan's pick,
  target, capacity bounds, seconds per request, planned mix and cost per token;
- the gateways' metrics over the last WINDOW_DAYS days (GetMetricData through the Monitoring VPC
  endpoint): arrivals per hour, in-flight-at-arrival and output-length buckets, output tokens, and
  the pools' hourly P99 TTFT/ITL.
It runs the same checks as `fleetcast plan --check` (fleetcast.plan.drift, bundled), publishes
PlanDrift (1 or 0) per pool, and on drift one notice to the operations topic with every reason.
The re-plan itself (would the pick change?) needs the benchmark results and the planner: that
stays with `fleetcast plan --check`, which the notice tells the operator to run.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

# The asset carries these two stdlib-only modules at the same paths (stacks/plan_drift.py).
from fleetcast.contract import telemetry as t
from fleetcast.plan import drift

NOTICE_ATTRIBUTE = "fleetcast_notice"  # the connection auto-approver's subscription drops messages with it
_CLIENTS: dict = {}


def _client(name: str):
    if name not in _CLIENTS:
        import boto3

        _CLIENTS[name] = boto3.client(name)
    return _CLIENTS[name]


def _settings() -> dict:
    return {
        "fleet": os.environ["FLEET"], "region": os.environ["REGION"], "bucket": os.environ["BUCKET"],
        "key": os.environ["BASELINE_KEY"], "topic": os.environ["TOPIC_ARN"],
        "threshold": float(os.environ["THRESHOLD"]), "days": int(os.environ.get("WINDOW_DAYS", "7")),
        "pools": json.loads(os.environ["POOLS"]), "consumers": json.loads(os.environ["CONSUMERS"]),
    }


def _baseline(bucket: str, key: str) -> dict | None:
    from botocore.exceptions import ClientError

    try:
        body = _client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        # The role may read this one key and list nothing, so S3 answers a missing key with 403
        # AccessDenied rather than 404 NoSuchKey (GetObject API reference, "Permissions").
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "AccessDenied", "404", "403"):
            return None
        raise
    doc = json.loads(body)
    if doc.get("schema") not in drift.SCHEMAS:
        raise ValueError(f"s3://{bucket}/{key}: schema {doc.get('schema')!r}, expected {drift.SCHEMA!r}")
    return drift.upgrade(doc)


def _query(qid: str, name: str, dims: list[tuple[str, str]], period: int, stat: str) -> dict:
    return {"Id": qid, "ReturnData": True, "MetricStat": {
        "Metric": {"Namespace": t.NAMESPACE, "MetricName": name,
                   "Dimensions": [{"Name": k, "Value": v} for k, v in dims]},
        "Period": period, "Stat": stat}}


def _fetch(queries: list[dict], start: datetime, end: datetime) -> dict[str, list[tuple[datetime, float]]]:
    out: dict[str, list[tuple[datetime, float]]] = {q["Id"]: [] for q in queries}
    for first in range(0, len(queries), 500):  # GetMetricData: 500 queries per call
        params = {"MetricDataQueries": queries[first:first + 500], "StartTime": start, "EndTime": end,
                  "ScanBy": "TimestampAscending"}
        while True:
            page = _client("cloudwatch").get_metric_data(**params)
            for r in page.get("MetricDataResults", []):
                out[r["Id"]] += list(zip(r.get("Timestamps", []), r.get("Values", [])))
            if not page.get("NextToken"):
                break
            params["NextToken"] = page["NextToken"]
    return out


def observe(s: dict, pool: str, consumers: list[str], start: datetime, end: datetime,
            models: dict[str, list[str]] | None = None) -> drift.Observation:
    """The pool's traffic over [start, end) from the gateways' metrics; with `models` (a pool packing several
    models: model -> its adapter ids), each model's hourly arrivals too (the gateway's [Fleet, Pool, Model]
    requests, where Model is the id a request named: an adapter's requests count for its base model)."""
    hours = int((end - start) / timedelta(hours=1))
    week = hours * 3600
    queries, roles = [], {}

    def add(role, *args):
        qid = f"q{len(queries)}"
        queries.append(_query(qid, *args))
        roles[qid] = role

    base = [(t.DIM_FLEET, s["fleet"]), (t.DIM_POOL, pool)]
    for consumer in consumers:
        dims = base + [(t.DIM_CONSUMER, consumer)]
        add(("arrivals",), t.REQUESTS, dims, 3600, "Sum")
        add(("output_sum",), t.OUTPUT_TOKENS, dims, week, "Sum")
        for label in t.IN_FLIGHT_LABELS:
            add(("in_flight", label), t.SHAPED_REQUESTS, dims + [(t.DIM_IN_FLIGHT, label)], week, "Sum")
        for label in t.TOKEN_LABELS:
            add(("served",), t.SHAPED_REQUESTS, dims + [(t.DIM_OUTPUT_BUCKET, label)], week, "Sum")
    for model, adapters in (models or {}).items():
        for name in t.metered_ids(model, adapters):
            add(("model_arrivals", model), t.REQUESTS, base + [(t.DIM_MODEL, name)], 3600, "Sum")
    add(("ttft",), t.TTFT_MS, base, 3600, "p99")
    add(("itl",), t.ITL_MS, base, 3600, "p99")
    data = _fetch(queries, start, end)
    arrivals = [0.0] * hours
    ttft: list[float | None] = [None] * hours
    itl: list[float | None] = [None] * hours
    in_flight: dict[str, float] = {}
    per_model = {model: [0.0] * hours for model in models or []}
    output_sum = served = 0.0
    for qid, points in data.items():
        role = roles[qid]
        for stamp, value in points:
            h = int((stamp.astimezone(UTC) - start) / timedelta(hours=1))
            if role[0] == "arrivals" and 0 <= h < hours:
                arrivals[h] += value
            elif role[0] == "model_arrivals" and 0 <= h < hours:
                per_model[role[1]][h] += value
            elif role[0] in ("ttft", "itl") and 0 <= h < hours:
                (ttft if role[0] == "ttft" else itl)[h] = value
            elif role[0] == "in_flight":
                in_flight[role[1]] = in_flight.get(role[1], 0.0) + value
            elif role[0] == "output_sum":
                output_sum += value
            elif role[0] == "served":
                served += value
    return drift.Observation(
        hourly_rps=drift.hour_of_day_rates(start.hour, arrivals), in_flight=in_flight,
        output_mean=output_sum / served if served else 0.0, arrivals=arrivals, ttft_p99_ms=ttft, itl_p99_ms=itl,
        by_model={m: drift.hour_of_day_rates(start.hour, a) for m, a in per_model.items()} if models else None)


def handler(event, context, now: datetime | None = None):
    s = _settings()
    baseline = _baseline(s["bucket"], s["key"])
    cloudwatch, sns = _client("cloudwatch"), _client("sns")
    if baseline is None:
        text = (f"{s['fleet']} plan drift check in {s['region']}: no plan baseline at s3://{s['bucket']}/{s['key']}; "
                "stage the <config>.plan-baseline.json that `fleetcast plan --write-config` wrote (docs/plan.md)")
        print(json.dumps({"event": "plan_drift_no_baseline", "key": s["key"]}))
        sns.publish(TopicArn=s["topic"], Subject=f"{s['fleet']}: plan drift check has no baseline"[:100], Message=text,
                    MessageAttributes={NOTICE_ATTRIBUTE: {"DataType": "String", "StringValue": "plan_drift"}})
        return {"drift": None}
    end = (now or datetime.now(UTC)).replace(minute=0, second=0, microsecond=0)
    start = end - timedelta(days=s["days"])
    findings, data = [], []
    for base in baseline["pools"]:
        if base["region"] != s["region"] or base.get("pool") not in s["pools"]:
            continue
        consumers = [name for name, region in s["consumers"] if region in base["consumer_regions"]]
        # One model's arrivals are the pool's: per-model requests are read for a packing of several only.
        several = base["models"] if len(base["models"]) > 1 else []
        obs = observe(s, base["pool"], consumers, start, end,
                      {m["model"]: m.get("adapters", []) for m in several} or None)
        found = drift.check_pool(base, obs, baseline["slo"], s["threshold"], s["threshold"])
        findings += found
        data.append({"MetricName": t.PLAN_DRIFT, "Value": 1.0 if found else 0.0, "Unit": t.unit(t.PLAN_DRIFT), "Timestamp": end,
                     "Dimensions": [{"Name": t.DIM_FLEET, "Value": s["fleet"]}, {"Name": t.DIM_POOL, "Value": base["pool"]}]})
    if data:
        cloudwatch.put_metric_data(Namespace=t.NAMESPACE, MetricData=data)
    print(json.dumps({"event": "plan_drift_checked", "window": [start.isoformat(), end.isoformat()],
                      "findings": [f.line() for f in findings]}))
    if findings:
        message = "\n".join([f"{s['fleet']}: the traffic of {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} UTC no longer "
                             f"fits the plan the config was written from ({len(findings)} finding(s)):"]
                            + [f"- {f.line()}" for f in findings]
                            + ["Re-plan with `fleetcast plan --check --traffic-from cloudwatch --since "
                               f"{s['days']}d` and review with `fleetcast config diff` (docs/runbook.md)."])
        sns.publish(TopicArn=s["topic"], Subject=f"{s['fleet']}: plan drift in {s['region']}"[:100], Message=message,
                    MessageAttributes={NOTICE_ATTRIBUTE: {"DataType": "String", "StringValue": "plan_drift"}})
    return {"drift": bool(findings), "findings": [f.line() for f in findings]}
