"""`fleetcast usage --cost` on the metering of a `make demo` run, with CloudWatch played by moto in this process.

    python -m scripts.usage_cost_demo /tmp/fleetcast-demo-XXXX/a.emf.jsonl [--png cost.png]

`make demo` writes instance A's gateway EMF records to a.emf.jsonl in its work folder (it prints the path).
They are put into moto's CloudWatch as CloudWatch Logs would extract them (one datapoint per metric and
dimension set), then the day ending now is attributed exactly as `fleetcast usage --cost --region R` does for
the demo's config (runtime.devtools.harness.adapter_config). The demo leaves no Auto Scaling metrics, so the
report prices each pool at its capacity baseline for the day, and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any


def emf_records(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines():
        if '"_aws"' in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def metric_data(records: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(namespace, MetricDatum) per metric and dimension set of each EMF record (the EMF specification)."""
    data = []
    for record in records:
        for meta in record["_aws"]["CloudWatchMetrics"]:
            stamp = datetime.fromtimestamp(record["_aws"]["Timestamp"] / 1000, UTC)
            for dims in meta["Dimensions"]:
                if not all(d in record for d in dims):
                    continue
                for metric in meta["Metrics"]:
                    if metric["Name"] in record:
                        data.append((meta["Namespace"], {
                            "MetricName": metric["Name"], "Unit": metric.get("Unit", "None"), "Timestamp": stamp,
                            "Value": float(record[metric["Name"]]),
                            "Dimensions": [{"Name": d, "Value": str(record[d])} for d in dims]}))
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.usage_cost_demo", description=__doc__.split("\n\n")[0])
    p.add_argument("log", help="the demo's a.emf.jsonl (its path is printed by `make demo`)")
    p.add_argument("--region", default="ap-northeast-2", help="the demo's provider region (default ap-northeast-2)")
    p.add_argument("--png", help="also draw the picture here")
    args = p.parse_args(argv)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "demo")  # moto in this process: no real AWS is called
    import boto3
    from moto import mock_aws

    from fleetcast.usage import attribute, collect, render_cost, write_png
    from runtime.devtools.harness import adapter_config

    records = emf_records(Path(args.log))
    if not records:
        raise SystemExit(f"{args.log}: no EMF records (is it the demo's a.log?)")
    cfg = adapter_config(args.region)
    now = datetime.now(UTC)
    with mock_aws():
        cw = boto3.client("cloudwatch", region_name=args.region)
        data = metric_data(records)
        for namespace in {ns for ns, _ in data}:
            items = [d for ns, d in data if ns == namespace]
            for start in range(0, len(items), 500):
                cw.put_metric_data(Namespace=namespace, MetricData=items[start:start + 500])
        report = attribute(cfg, collect(cfg, now - timedelta(hours=24), now, args.region,
                                        client=lambda region: boto3.client("cloudwatch", region_name=region),
                                        now=now, by_model=True))
    print(f"{len(records)} EMF records from {args.log}")
    print(render_cost(report, "table"))
    if args.png:
        write_png(report, args.png)
        print(f"picture: {args.png}")
    return 0 if report.sums_up else 1


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    sys.exit(run_quietly(main))
