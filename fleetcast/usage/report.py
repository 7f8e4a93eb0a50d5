"""Tokens, requests, errors and cost share per consumer over a time window.

The gateway on every instance writes one embedded-metric record per request
with the dimension set [Fleet, Pool, Consumer]; CloudWatch turns them into
metrics. This module sums them with GetMetricData (Sum over the window) per
provider region, pool and consumer, and splits each region's fleet cost over
its consumers by their share of tokens (input + output).

The fleet cost is an estimate, and labelled so: each pool's instance-hours
over the window, read from its Auto Scaling group's GroupTotalInstances
(in service, pending and terminating instances: scaling and engine builds
included), times the on-demand price in the shipped, dated price table
(fleetcast.config.catalog). A group without datapoints falls back to its
capacity baseline for the whole window, and the notes say so. It ignores the
stopped warm pool's volumes, savings plans and reservations; the token shares
are exact.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from fleetcast.config import FleetConfig
from fleetcast.config.catalog import instance_catalog
from fleetcast.contract import telemetry as t
from fleetcast.contract.errors import EXIT_USAGE, UserError
from fleetcast.contract.spill import spill_consumers_into

SUMMED = {
    "requests": t.REQUESTS,
    "errors": t.ERRORS,
    "throttled": t.THROTTLED,
    "input_tokens": t.INPUT_TOKENS,
    "output_tokens": t.OUTPUT_TOKENS,
}
POOL_FIELDS = ("requests", "input_tokens", "output_tokens")  # ConsumerUsage.by_pool's columns
# Auto Scaling group metric (enabled on every fleet group): InService + Pending + Terminating,
# i.e. every instance being paid for except the stopped warm pool.
GROUP_INSTANCES = "GroupTotalInstances"
MAX_QUERIES = 500  # GetMetricData limit per call

_RELATIVE = re.compile(r"^(\d+)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_time(value: str, now: datetime, flag: str) -> datetime:
    """`now`, a relative age (`90m`, `24h`, `7d`, `2w`: that long before now) or ISO 8601 (UTC unless offset given)."""
    text = value.strip()
    if text.lower() == "now":
        return now
    match = _RELATIVE.match(text.lower())
    if match:
        return now - timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"{flag} {value!r}: use an ISO 8601 time (2026-11-28 or 2026-11-28T09:00Z), "
                        "a relative age such as 24h or 7d, or 'now'", exit_code=EXIT_USAGE) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass
class ConsumerUsage:
    consumer: str
    region: str
    model: str | None = None  # with --by-model: the model or adapter id this row counts
    origin: str | None = None  # with spill configured: the consumer's home region (`region` is where it was served)
    spilled_out: int = 0  # requests of its home region its gateways forwarded to another region (SpilledRequests)
    requests: int = 0
    errors: int = 0
    throttled: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    token_share: float = 0.0  # of its region's tokens
    cost_usd: float | None = None  # estimate
    # pool -> [requests, input tokens, output tokens] of this row on that pool's instances (cost attribution)
    by_pool: dict[str, list[int]] = field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass
class RegionCost:
    region: str
    cost_usd: float | None
    instance_hours: float
    basis: str
    pools: dict[str, tuple[float, float | None]] = field(default_factory=dict)  # pool -> (instance-hours, USD)


@dataclass
class UsageReport:
    fleet: str
    since: datetime
    until: datetime
    rows: list[ConsumerUsage]
    costs: list[RegionCost]
    notes: list[str] = field(default_factory=list)


def _period(since: datetime, now: datetime, window_s: float) -> int:
    """A period CloudWatch still keeps at that age (1-min data 15 days, 5-min 63 days, then hourly),
    coarse enough that each query returns at most ~100 datapoints: only their sum matters."""
    age = now - since
    base = 60 if age <= timedelta(days=15) else 300 if age <= timedelta(days=63) else 3600
    return base * max(1, -(-int(window_s) // (100 * base)))


def _region_cost(cfg: FleetConfig, region_name: str, hours: float,
                 measured: dict[str, float | None]) -> tuple[RegionCost, list[str]]:
    """Instance-hours per pool from its group's GroupTotalInstances (what was running, pending
    builds included), or the configured baseline when CloudWatch has no datapoints for it."""
    region = cfg.region(region_name)
    catalog = instance_catalog()
    total, instance_hours, missing, notes = 0.0, 0.0, [], []
    pools: dict[str, tuple[float, float | None]] = {}
    for pool in region.pools:
        entry = catalog.get(pool.instance_type)
        price = entry.price_per_hour.get(region_name) if entry is not None else None
        pool_hours = measured.get(pool.name)
        if pool_hours is None:
            pool_hours = pool.capacity.baseline * hours
            notes.append(f"{region_name}: no {GROUP_INSTANCES} data for {cfg.asg_name_of(region_name, pool)}; "
                         f"its cost assumes {pool.capacity.baseline} instance(s) (capacity baseline) all window")
        instance_hours += pool_hours
        pools[pool.name] = (pool_hours, None if price is None else price * pool_hours)
        if price is None:
            missing.append(f"{pool.instance_type} in {region_name}")
        else:
            total += price * pool_hours
    if missing:
        return RegionCost(region_name, None, instance_hours,
                          f"no price for {', '.join(missing)} in the price table", pools), notes
    source = ("the groups' GroupTotalInstances" if not notes else
              "the capacity baseline (no group metrics in the window)" if len(notes) == len(region.pools) else
              "GroupTotalInstances, partly the capacity baseline (see notes)")
    basis = f"estimate: instance-hours x on-demand price (shipped price table); instance-hours from {source}"
    return RegionCost(region_name, total, instance_hours, basis, pools), notes


def collect(cfg: FleetConfig, since: datetime, until: datetime, region: str | None = None,
            client: Callable[[str], Any] | None = None, now: datetime | None = None,
            by_model: bool = False) -> UsageReport:
    """Sum the gateway's per-consumer metrics over [since, until) in each provider region; with
    `by_model`, one row per consumer and model (the gateway's [Fleet, Pool, Consumer, Model] set).

    A by-model row counts the requests routed to a model; requests refused before routing (a malformed
    body, an unknown model) carry no model and appear only in the per-consumer report."""
    now = now or datetime.now(UTC)
    if since >= until:
        raise UserError(f"--since ({since.isoformat()}) must be before --until ({until.isoformat()})", exit_code=EXIT_USAGE)
    if now - since > timedelta(days=455):
        raise UserError("--since is more than 455 days ago: CloudWatch keeps metrics for 455 days", exit_code=EXIT_USAGE)
    names = [r.region for r in cfg.regions]
    if region is not None and region not in names:
        raise UserError(f"--region {region!r} is not a provider region of fleet {cfg.name}; "
                        f"choose one of: {', '.join(names)}", exit_code=EXIT_USAGE)
    if client is None:
        from fleetcast.aws_session import AwsSession

        session = AwsSession()

        def client(name: str) -> Any:
            return session.client("cloudwatch", name)

    window_s = (until - since).total_seconds()
    hours = window_s / 3600
    period = _period(since, now, window_s)
    rows: list[ConsumerUsage] = []
    costs: list[RegionCost] = []
    notes: list[str] = []
    spill = any(c.spill_regions for c in cfg.consumers)
    for region_name in ([region] if region else names):
        # The serving region meters a spilled request (once): a consumer served elsewhere has a row here too,
        # its origin its home region.
        consumers = (*cfg.consumers_of(region_name), *spill_consumers_into(cfg, region_name))
        homes = {c.name: c.service_region for c in consumers}
        pools = [p.name for p in cfg.region(region_name).pools]
        keys = [(c.name, m) for c in consumers for m in (cfg.models_for(c.name) if by_model else (None,))]
        usage = {key: ConsumerUsage(key[0], region_name, key[1], homes[key[0]] if spill else None) for key in keys}
        queries: list[dict[str, Any]] = []
        # Query id -> the usage row, its field and the pool it sums; or -> the pool whose group it averages.
        targets: dict[str, tuple[tuple[str, str | None], str, str]] = {}
        group_targets: dict[str, str] = {}
        for ki, key in enumerate(keys):
            model_dim = [{"Name": t.DIM_MODEL, "Value": key[1]}] if key[1] is not None else []
            summed = dict(SUMMED)
            if spill and homes[key[0]] == region_name:
                summed["spilled_out"] = t.SPILLED_REQUESTS
            for pi, pool in enumerate(pools):
                for field_name, metric in summed.items():
                    qid = f"q{ki}_{pi}_{field_name}"
                    targets[qid] = (key, field_name, pool)
                    queries.append({"Id": qid, "ReturnData": True, "MetricStat": {
                        "Metric": {"Namespace": t.NAMESPACE, "MetricName": metric, "Dimensions": [
                            {"Name": t.DIM_FLEET, "Value": cfg.name}, {"Name": t.DIM_POOL, "Value": pool},
                            {"Name": t.DIM_CONSUMER, "Value": key[0]}, *model_dim]},
                        "Period": period, "Stat": "Sum"}})
        for pi, group_pool in enumerate(cfg.region(region_name).pools):
            qid = f"g{pi}"
            group_targets[qid] = group_pool.name
            queries.append({"Id": qid, "ReturnData": True, "MetricStat": {
                "Metric": {"Namespace": "AWS/AutoScaling", "MetricName": GROUP_INSTANCES, "Dimensions": [
                    {"Name": "AutoScalingGroupName", "Value": cfg.asg_name_of(region_name, group_pool)}]},
                "Period": period, "Stat": "Average"}})
        measured: dict[str, float | None] = {}
        if queries:
            cw = client(region_name)
            for start in range(0, len(queries), MAX_QUERIES):
                for result in _get_metric_data(cw, queries[start:start + MAX_QUERIES], since, until, region_name):
                    if result["Id"] in group_targets:
                        # Average instances over each period -> instance-hours; no datapoints: unknown.
                        values = result["Values"]
                        measured[group_targets[result["Id"]]] = sum(values) * period / 3600 if values else None
                        continue
                    name, field_name, pool_name = targets[result["Id"]]
                    value = int(round(sum(result["Values"])))
                    setattr(usage[name], field_name, getattr(usage[name], field_name) + value)
                    if field_name in POOL_FIELDS:
                        counts = usage[name].by_pool.setdefault(pool_name, [0, 0, 0])
                        counts[POOL_FIELDS.index(field_name)] += value
                    if result.get("StatusCode") == "PartialData":
                        who = name[0] if name[1] is None else f"{name[0]} / {name[1]}"
                        notes.append(f"{region_name}: CloudWatch returned partial data for {who}")
        cost, cost_notes = _region_cost(cfg, region_name, hours, measured)
        notes.extend(cost_notes)
        costs.append(cost)
        total = sum(u.total_tokens for u in usage.values())
        for u in usage.values():
            u.token_share = u.total_tokens / total if total else 0.0
            u.cost_usd = cost.cost_usd * u.token_share if cost.cost_usd is not None and total else None
        if not total and consumers:
            notes.append(f"{region_name}: no tokens in the window; its cost is not attributed to any consumer")
        if not consumers:
            notes.append(f"{region_name}: no consumers configured")
        rows.extend(usage.values())
    return UsageReport(cfg.name, since, until, rows, costs, sorted(set(notes)))


def _get_metric_data(cw: Any, queries: list[dict[str, Any]], since: datetime, until: datetime,
                     region: str) -> list[dict[str, Any]]:
    from botocore.exceptions import BotoCoreError, ClientError

    merged: dict[str, dict[str, Any]] = {}
    kwargs: dict[str, Any] = {"MetricDataQueries": queries, "StartTime": since, "EndTime": until,
                              "ScanBy": "TimestampAscending"}
    try:
        while True:
            page = cw.get_metric_data(**kwargs)
            for result in page.get("MetricDataResults", []):
                entry = merged.setdefault(result["Id"], {"Id": result["Id"], "Values": [], "StatusCode": "Complete"})
                entry["Values"].extend(result.get("Values", []))
                if result.get("StatusCode") == "PartialData":
                    entry["StatusCode"] = "PartialData"
            token = page.get("NextToken")
            if not token:
                return list(merged.values())
            kwargs["NextToken"] = token
    except (BotoCoreError, ClientError) as exc:
        from fleetcast.aws_session import translate

        raise translate(exc, service="cloudwatch", operation="GetMetricData", region=region, other_exit=1) from None


# ---------------------------------------------------------------- output

COLUMNS = ("consumer", "region", "origin", "model", "requests", "spilled_out", "errors", "throttled", "input_tokens",
           "output_tokens", "total_tokens", "token_share", "est_cost_usd")
_SPILL_COLUMNS = ("origin", "spilled_out")  # shown when the fleet spills: region is where a row was served


def _row(u: ConsumerUsage) -> dict[str, Any]:
    return {"consumer": u.consumer, "region": u.region, "origin": u.origin, "model": u.model, "requests": u.requests,
            "spilled_out": u.spilled_out, "errors": u.errors,
            "throttled": u.throttled, "input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
            "total_tokens": u.total_tokens, "token_share": round(u.token_share, 6),
            "est_cost_usd": None if u.cost_usd is None else round(u.cost_usd, 4)}


def csv_text(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().rstrip("\n")


def table_lines(headers: tuple[str, ...], cells: Sequence[tuple[str, ...]], left: int) -> list[str]:
    """Header, rule and rows, each column as wide as its widest cell; the first `left` columns flush left."""
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) if i < left else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths)))

    return [line(headers), line(["-" * w for w in widths])] + [line(c) for c in cells]


def render(report: UsageReport, fmt: str) -> str:
    by_model = any(u.model is not None for u in report.rows)
    spill = any(u.origin is not None for u in report.rows)
    rows = [_row(u) for u in report.rows]
    dropped = (() if by_model else ("model",)) + (() if spill else _SPILL_COLUMNS)
    for r in rows:
        for name in dropped:
            del r[name]
    columns = tuple(c for c in COLUMNS if c not in dropped)
    if fmt == "json":
        return json.dumps({
            "fleet": report.fleet, "since": report.since.isoformat(), "until": report.until.isoformat(),
            "consumers": rows,
            "regions": [asdict(c) | {"cost_usd": None if c.cost_usd is None else round(c.cost_usd, 4)}
                        for c in report.costs],
            "cost_is_estimate": True, "notes": report.notes,
        }, indent=2)
    if fmt == "csv":
        return csv_text(rows, columns)
    if fmt != "table":
        raise UserError(f"--format {fmt!r}: choose table, csv or json", exit_code=EXIT_USAGE)
    names = ("CONSUMER", "REGION") + (("ORIGIN",) if spill else ()) + (("MODEL",) if by_model else ())
    headers = names + ("REQUESTS",) + (("SPILLED OUT",) if spill else ()) + (
        "ERRORS", "THROTTLED", "INPUT TOK", "OUTPUT TOK", "TOKEN SHARE", "EST. COST USD")
    cells = [(r["consumer"], r["region"], *((r["origin"],) if spill else ()), *((r["model"],) if by_model else ()),
              f"{r['requests']:,}", *((f"{r['spilled_out']:,}",) if spill else ()),
              f"{r['errors']:,}", f"{r['throttled']:,}", f"{r['input_tokens']:,}", f"{r['output_tokens']:,}",
              f"{r['token_share'] * 100:.1f}%", "n/a" if r["est_cost_usd"] is None else f"{r['est_cost_usd']:,.2f}")
             for r in rows]
    out = [f"fleet {report.fleet}: usage {report.since:%Y-%m-%d %H:%M} .. {report.until:%Y-%m-%d %H:%M} UTC",
           *table_lines(headers, cells, len(names))]
    out.append("")
    for cost in report.costs:
        figure = "n/a" if cost.cost_usd is None else f"${cost.cost_usd:,.2f}"
        out.append(f"{cost.region}: fleet cost {figure} over {cost.instance_hours:,.1f} instance-hours ({cost.basis})")
    out.append(f"Cost share = {'consumer and model' if by_model else 'consumer'} tokens (input + output) / region tokens "
               "x region cost. Costs are estimates.")
    out += [f"note: {n}" for n in report.notes]
    return "\n".join(out)
