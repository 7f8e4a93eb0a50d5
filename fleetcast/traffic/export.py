"""`fleetcast traffic export`: a `fleetcast.traffic/v1` profile from what the gateways metered.

The gateway writes one EMF record per inference request (runtime/gateway/metrics.py); CloudWatch
turns it into `Requests` = 1 under [Fleet, Pool, Consumer] and `ShapedRequests` = 1 under the
traffic-shape dimension sets [Fleet, Pool, Consumer, InFlightAtArrival | InputTokensBucket |
OutputTokensBucket] (and [Fleet, Pool, Consumer, Model, InFlightAtArrival]),
stamped with the request's arrival time. Everything the profile says is a Sum of those over a
period, so it is exact (not sampled, not a percentile sketch) for as long as CloudWatch keeps the
period:

- arrivals per hour: Sum of Requests, period 3600 (kept 455 days);
- burstiness within the hour: Sum of Requests, period 60 (kept 15 days), per minute of the hour:
  the busiest minute over the hour's mean, and the index of dispersion of the 60 counts. A finer
  time scale would need high-resolution metrics, whose sub-minute data CloudWatch keeps 3 hours
  only (GetMetricStatistics, "Amazon CloudWatch retains metric data as follows"): a 7-day window
  could not be exact below one minute;
- length and in-flight histograms: Sum of ShapedRequests per bucket dimension value;
- length means: Sum of InputTokens / OutputTokens over the requests that reported usage.

A fleet of several models gets one entry per (consumer region, model), read from the gateway's
per-model metering ([Fleet, Pool, Consumer, Model], fleetcast.contract.telemetry.DIM_MODEL): arrivals
per hour and per minute, throttled, token sums, and the length histograms as CloudWatch trimmed
counts over the raw per-request token values: TC(a:b) counts the values v with a < v <= b
(CloudWatch User Guide, "CloudWatch statistics definitions": TM(150:1000) "removing all data points
that are lower than or equal to 150, or higher than 1000"; TC is the count of that range), so bucket
"65-128" is TC(64:128), exact as a Sum is; the last bucket is open above (TC(131072:), the lower bound alone,
as aws-cdk-lib's statistic parser, aws-cloudwatch/lib/private/statistic.ts, accepts it), as the gateway's
token_label counts a longer request there. A request naming an adapter counts for its base model
(its processes serve it). Each entry's `concurrency` is the Sum of ShapedRequests under [Fleet, Pool,
Consumer, Model, InFlightAtArrival] (fleetcast.contract.telemetry.SHAPE_MODEL_DIMENSION_SETS): the
in-flight count on the instance (every model's requests) when that model's requests arrived. Requests
naming no model of the config (404 model_not_found) load no engine and are left out.

One GetMetricData call per hour of the window (queries chunked by 500, the per-call limit): each
answer holds at most 60 datapoints per query, far under the 100,800 per call, so no answer is
paged, and the hour is the profile's unit. P99 TTFT/ITL per hour come from CloudWatch's p99 over
the raw per-request values ([Fleet, Pool]; per model [Fleet, Pool, Model] for each id its requests are metered
under, telemetry.metered_ids, the worst of them); a pool with no data gives null.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from fleetcast.config import Consumer, FleetConfig
from fleetcast.config.model import ModelSpec
from fleetcast.contract import telemetry as t
from fleetcast.contract.errors import EXIT_INVALID, EXIT_USAGE, UserError
from fleetcast.contract.spill import spill_consumers_into
from fleetcast.plan.drift import hour_of_day_rates

if TYPE_CHECKING:
    from fleetcast.plan.traffic import TrafficProfile

MAX_QUERIES = 500  # GetMetricData: at most 500 metrics per call
MAX_AGE = timedelta(days=15)  # 60-second data is kept 15 days: past that, minutes are gone
HOUR = timedelta(hours=1)

_SHAPE = {"in_flight": (t.DIM_IN_FLIGHT, t.IN_FLIGHT_LABELS),
          "input_tokens": (t.DIM_INPUT_BUCKET, ("0",) + t.TOKEN_LABELS),
          "output_tokens": (t.DIM_OUTPUT_BUCKET, ("0",) + t.TOKEN_LABELS)}


def trimmed_count(label: str) -> str:
    """The CloudWatch statistic counting the values of a token bucket label: '65-128' -> 'TC(64:128)'
    (lower bound exclusive, upper inclusive: module docstring), '1-64' -> 'TC(0:64)'; the last bucket has no
    upper bound, 'TC(131072:)', since the gateway's token_label counts every value above it there too."""
    lo, hi = t.token_bounds(label)
    return f"TC({lo}:{'' if hi is None else hi})"


def floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


@dataclass
class Tally:
    """Counts for one consumer region over the window."""

    hours: int
    arrivals: list[float] = field(default_factory=list)
    throttled: list[float] = field(default_factory=list)
    minutes: list[list[float]] = field(default_factory=list)  # per hour, 60 per-minute arrival counts
    buckets: dict[str, dict[str, float]] = field(default_factory=dict)
    input_sum: float = 0.0
    output_sum: float = 0.0
    consumers: dict[str, float] = field(default_factory=dict)
    served_in: dict[str, float] = field(default_factory=dict)  # provider region that metered them -> requests
    ttft_p99: list[float | None] = field(default_factory=list)
    itl_p99: list[float | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.arrivals = [0.0] * self.hours
        self.throttled = [0.0] * self.hours
        self.minutes = [[0.0] * 60 for _ in range(self.hours)]
        self.buckets = {name: {} for name in _SHAPE}
        self.ttft_p99 = [None] * self.hours
        self.itl_p99 = [None] * self.hours


@dataclass(frozen=True)
class _Usage:
    """What a query answers for a consumer's requests: `what` (a Tally field or a _SHAPE name, with its bucket
    `label`) of `model` (None: a one-model fleet, read per consumer)."""

    consumer: Consumer
    model: str | None
    what: str
    label: str = ""


@dataclass(frozen=True)
class _PoolP99:
    """What a query answers for a pool: its P99 `what` (ttft_p99, itl_p99) of `model` (None: all its requests)."""

    pool: str
    model: str | None
    what: str


def _metric(name: str, dims: list[tuple[str, str]], period: int, stat: str, qid: str) -> dict[str, Any]:
    return {"Id": qid, "ReturnData": True, "MetricStat": {
        "Metric": {"Namespace": t.NAMESPACE, "MetricName": name,
                   "Dimensions": [{"Name": k, "Value": v} for k, v in dims]},
        "Period": period, "Stat": stat}}


def per_model(cfg: FleetConfig) -> bool:
    """Whether the profile gets one entry per (region, model): a fleet of several models."""
    return t.metered_per_model(len(cfg.models))


def _model_names(cfg: FleetConfig, consumer: Consumer) -> list[tuple[str, str]]:
    """(name the gateway meters, the fleet model it runs on) for every model and adapter `consumer` may call."""
    allowed = set(cfg.models_for(consumer.name))
    return [(name, m.id) for m in cfg.models for name in _metered(m) if name in allowed]


def _metered(model: ModelSpec) -> tuple[str, ...]:
    return t.metered_ids(model.id, (a.id for a in model.adapters))


def _queries(cfg: FleetConfig, region: str,
             consumers: list[Consumer]) -> tuple[list[dict[str, Any]], dict[str, _Usage | _PoolP99]]:
    """Every query one hour needs, and what each answer is for."""
    queries: list[dict[str, Any]] = []
    targets: dict[str, _Usage | _PoolP99] = {}

    def add(target: _Usage | _PoolP99, name: str, dims: list[tuple[str, str]], period: int, stat: str) -> None:
        qid = f"q{len(queries)}"
        queries.append(_metric(name, dims, period, stat, qid))
        targets[qid] = target

    if per_model(cfg):
        for pool in cfg.region(region).pools:
            base = [(t.DIM_FLEET, cfg.name), (t.DIM_POOL, pool.name)]
            for consumer in consumers:
                for name, model_id in _model_names(cfg, consumer):
                    dims = base + [(t.DIM_CONSUMER, consumer.name), (t.DIM_MODEL, name)]
                    add(_Usage(consumer, model_id, "arrivals"), t.REQUESTS, dims, 3600, "Sum")
                    add(_Usage(consumer, model_id, "throttled"), t.THROTTLED, dims, 3600, "Sum")
                    add(_Usage(consumer, model_id, "minutes"), t.REQUESTS, dims, 60, "Sum")
                    add(_Usage(consumer, model_id, "input_sum"), t.INPUT_TOKENS, dims, 3600, "Sum")
                    add(_Usage(consumer, model_id, "output_sum"), t.OUTPUT_TOKENS, dims, 3600, "Sum")
                    for what, metric in (("input_tokens", t.INPUT_TOKENS), ("output_tokens", t.OUTPUT_TOKENS)):
                        for label in t.TOKEN_LABELS:
                            add(_Usage(consumer, model_id, what, label), metric, dims, 3600, trimmed_count(label))
                    dim, labels = _SHAPE["in_flight"]  # t.SHAPE_MODEL_DIMENSION_SETS
                    for label in labels:
                        add(_Usage(consumer, model_id, "in_flight", label), t.SHAPED_REQUESTS, dims + [(dim, label)],
                            3600, "Sum")
            for model in cfg.models:
                # One P99 per metered id (a percentile does not add up across metrics); the model's hour takes the
                # worst: at most 1% of each id's requests lie above its own P99, so at most 1% of all lie above the
                # largest, which is an upper bound of the model's P99 over all of them.
                for name in _metered(model):
                    dims = base + [(t.DIM_MODEL, name)]
                    add(_PoolP99(pool.name, model.id, "ttft_p99"), t.TTFT_MS, dims, 3600, "p99")
                    add(_PoolP99(pool.name, model.id, "itl_p99"), t.ITL_MS, dims, 3600, "p99")
        return queries, targets

    for pool in cfg.region(region).pools:
        base = [(t.DIM_FLEET, cfg.name), (t.DIM_POOL, pool.name)]
        for consumer in consumers:
            dims = base + [(t.DIM_CONSUMER, consumer.name)]
            add(_Usage(consumer, None, "arrivals"), t.REQUESTS, dims, 3600, "Sum")
            add(_Usage(consumer, None, "throttled"), t.THROTTLED, dims, 3600, "Sum")
            add(_Usage(consumer, None, "minutes"), t.REQUESTS, dims, 60, "Sum")
            add(_Usage(consumer, None, "input_sum"), t.INPUT_TOKENS, dims, 3600, "Sum")
            add(_Usage(consumer, None, "output_sum"), t.OUTPUT_TOKENS, dims, 3600, "Sum")
            for what, (dim, labels) in _SHAPE.items():
                for label in labels:
                    add(_Usage(consumer, None, what, label), t.SHAPED_REQUESTS, dims + [(dim, label)], 3600, "Sum")
        add(_PoolP99(pool.name, None, "ttft_p99"), t.TTFT_MS, base, 3600, "p99")
        add(_PoolP99(pool.name, None, "itl_p99"), t.ITL_MS, base, 3600, "p99")
    return queries, targets


def collect(cfg: FleetConfig, since: datetime, until: datetime, call: Callable[..., dict[str, Any]],
            region: str | None = None, consumer: str | None = None,
            now: datetime | None = None) -> dict[tuple[str, str | None], Tally]:
    """Tallies per (consumer region, model) over [since, until) (hour boundaries) from every provider region
    asked; the model is None for a one-model fleet (its entries name no model).

    `call(region, **GetMetricData params)` runs one GetMetricData call (fleetcast.connections.aws.Access).
    """
    now = now or datetime.now(UTC)
    names = [r.region for r in cfg.regions]
    if region is not None and region not in names:
        raise UserError(f"--region {region!r} is not a provider region of fleet {cfg.name}; "
                        f"choose one of: {', '.join(names)}", exit_code=EXIT_USAGE)
    known = [c.name for c in cfg.consumers]
    if consumer is not None and consumer not in known:
        raise UserError(f"--consumer {consumer!r} is not a consumer of fleet {cfg.name}; "
                        f"choose one of: {', '.join(known) or '(none configured)'}", exit_code=EXIT_USAGE)
    if since >= until:
        raise UserError(f"--since ({since.isoformat()}) must be before --until ({until.isoformat()})", exit_code=EXIT_USAGE)
    if now - since > MAX_AGE:
        raise UserError("--since is more than 15 days ago: CloudWatch keeps 1-minute data 15 days, and the "
                        "profile's burstiness needs it; export a window inside the last 15 days", exit_code=EXIT_USAGE)
    hours = int((until - since) / HOUR)
    tallies: dict[tuple[str, str | None], Tally] = {}
    for region_name in [region] if region else names:
        # With spill, a consumer's requests served here from another home are metered here (the serving region
        # meters, once): its demand adds up from every region that served it.
        spilled = {c.name for c in spill_consumers_into(cfg, region_name)}  # the config's Consumers, in its order
        consumers = [c for c in (*cfg.consumers_of(region_name), *(s for s in cfg.consumers if s.name in spilled))
                     if consumer is None or c.name == consumer]
        if not consumers:
            continue
        queries, targets = _queries(cfg, region_name, consumers)
        pool_hours: dict[tuple[str, str | None], dict[str, list[float | None]]] = {}
        for h in range(hours):
            start = since + h * HOUR
            for first in range(0, len(queries), MAX_QUERIES):
                for result in _get(call, region_name, queries[first:first + MAX_QUERIES], start, start + HOUR):
                    _fold(result, targets[result["Id"]], h, start, hours, tallies, pool_hours, region_name)
        # The pool's P99 (all consumers; the model's, per model) goes to every consumer region it served; with
        # more than one pool the worst hour counts: the SLO is per request, whichever pool served it.
        for c in consumers:
            for model in ({m for _, m in _model_names(cfg, c)} if per_model(cfg) else {None}):
                if (c.region, model) not in tallies:
                    continue
                _worst_p99(tallies[(c.region, model)], [v for (_, m), v in pool_hours.items() if m == model], hours)
    return tallies


def _worst_p99(tally: Tally, pools: list[dict[str, list[float | None]]], hours: int) -> None:
    """Each hour's worst pool P99 into the tally."""
    for series in pools:
        for key in ("ttft_p99", "itl_p99"):
            mine = getattr(tally, key)
            for i, v in enumerate(series.get(key, [None] * hours)):
                if v is not None and (mine[i] is None or v > mine[i]):
                    mine[i] = v


def _get(call: Callable[..., dict[str, Any]], region: str, queries: list[dict[str, Any]], start: datetime,
         end: datetime) -> list[dict[str, Any]]:
    merged: dict[str, dict[str, Any]] = {}
    params: dict[str, Any] = {"MetricDataQueries": queries, "StartTime": start, "EndTime": end,
                              "ScanBy": "TimestampAscending"}
    while True:
        page = call(region, **params)
        for result in page.get("MetricDataResults", []):
            entry = merged.setdefault(result["Id"], {"Id": result["Id"], "Values": [], "Timestamps": []})
            entry["Values"].extend(result.get("Values", []))
            entry["Timestamps"].extend(result.get("Timestamps", []))
        token = page.get("NextToken")
        if not token:
            return list(merged.values())
        params["NextToken"] = token


def _fold(result: dict[str, Any], target: _Usage | _PoolP99, h: int, start: datetime, hours: int,
          tallies: dict[tuple[str, str | None], Tally],
          pool_hours: dict[tuple[str, str | None], dict[str, list[float | None]]], serving: str = "") -> None:
    values: list[float] = result["Values"]
    stamps: list[datetime] = result["Timestamps"]
    what = target.what
    if isinstance(target, _PoolP99):
        series = pool_hours.setdefault((target.pool, target.model), {}).setdefault(what, [None] * hours)
        good = [v for v in values if v is not None and math.isfinite(v)]
        earlier = series[h]
        if earlier is not None:
            good.append(earlier)  # another of the model's metered ids, answered earlier
        if good:
            series[h] = max(good)
        return
    consumer = target.consumer
    tally = tallies.setdefault((consumer.region, target.model), Tally(hours))
    total = sum(values)
    if what == "arrivals":
        tally.arrivals[h] += total
        tally.consumers[consumer.name] = tally.consumers.get(consumer.name, 0.0) + total
        tally.served_in[serving] = tally.served_in.get(serving, 0.0) + total
    elif what == "throttled":
        tally.throttled[h] += total
    elif what == "minutes":
        for stamp, value in zip(stamps, values):
            minute = int((stamp.astimezone(UTC) - start).total_seconds() // 60)
            if 0 <= minute < 60:
                tally.minutes[h][minute] += value
    elif what in ("input_sum", "output_sum"):
        setattr(tally, what, getattr(tally, what) + total)
    else:
        label = target.label
        tally.buckets[what][label] = tally.buckets[what].get(label, 0.0) + total


# ---------------------------------------------------------------- profile


def _burst(minutes: list[float]) -> tuple[float, float]:
    """(busiest minute x 60 / the hour's arrivals, variance / mean of the per-minute counts)."""
    total = sum(minutes)
    if not total:
        return 1.0, 0.0
    mean = total / 60
    variance = sum((m - mean) ** 2 for m in minutes) / 60
    return max(minutes) / mean, variance / mean


def _bucket_counts(counts: dict[str, float], labels: tuple[str, ...], skip_zero: bool) -> dict[str, int]:
    return {label: int(round(counts[label])) for label in labels
            if counts.get(label) and not (skip_zero and label == "0")}


def profile_document(tallies: dict[tuple[str, str | None], Tally], since: datetime, until: datetime, name: str,
                     fleet: str, hour_stat: str = "max", cfg: FleetConfig | None = None) -> dict[str, Any]:
    """The profile as plain data (validated by fleetcast.plan.traffic before it is written): one entry per
    (consumer region, model) with traffic, `model` set where the tallies are per model."""
    from fleetcast.plan.traffic import SCHEMA_ID, ConsumerTraffic

    consumers = []
    by_region: dict[str, dict[str, int]] = {}
    for (region, model), tally in tallies.items():
        if model is not None and sum(tally.arrivals) != 0:
            by_region.setdefault(region, {})[model] = int(round(sum(tally.arrivals)))
    for region, model in sorted(tallies, key=lambda k: (k[0], k[1] or "")):
        tally = tallies[(region, model)]
        served = sum(tally.buckets["input_tokens"].get(label, 0.0) for label in t.TOKEN_LABELS)
        if not sum(tally.arrivals):
            continue
        bursts = [_burst(m) for m in tally.minutes]
        observed: dict[str, Any] = {
            "since": since.isoformat().replace("+00:00", "Z"), "until": until.isoformat().replace("+00:00", "Z"),
            "arrivals": [int(round(x)) for x in tally.arrivals],
            "throttled": [int(round(x)) for x in tally.throttled],
            "peak_minute_ratio": [round(p, 3) for p, _ in bursts],
            "dispersion_60s": [round(d, 3) for _, d in bursts],
            "in_flight": _bucket_counts(tally.buckets["in_flight"], t.IN_FLIGHT_LABELS, False),
            "input_tokens": _bucket_counts(tally.buckets["input_tokens"], t.TOKEN_LABELS, True),
            "output_tokens": _bucket_counts(tally.buckets["output_tokens"], t.TOKEN_LABELS, True),
            "consumers": {k: int(round(v)) for k, v in sorted(tally.consumers.items())},
            "ttft_p99_ms": [None if v is None else round(v, 3) for v in tally.ttft_p99],
            "itl_p99_ms": [None if v is None else round(v, 3) for v in tally.itl_p99],
        }
        if model is not None:
            observed["models"] = dict(sorted(by_region[region].items()))
        served_in = {k: int(round(v)) for k, v in sorted(tally.served_in.items()) if round(v)}
        homes = {c.service_region for c in cfg.consumers if c.name in tally.consumers} if cfg is not None else set()
        if set(served_in) - homes:  # some were served outside their home region: say where (origin: this entry)
            observed["served_in"] = served_in
        entry: dict[str, Any] = {
            "region": region,
            **({"model": model} if model is not None else {}),
            "rate_rps": hour_of_day_rates(since.hour, tally.arrivals, hour_stat),
            "input_tokens": round(tally.input_sum / served, 3) if served else 1,
            "output_tokens": round(tally.output_sum / served, 3) if served else 1,
        }
        in_flight = {k: v for k, v in observed["in_flight"].items()}
        total = sum(in_flight.values())
        if total:
            shares = {k: v / total for k, v in in_flight.items()}
            # Rounded shares must still sum to 1 within the schema's tolerance: the largest takes the rest.
            rounded = {k: round(v, 6) for k, v in shares.items()}
            top = max(rounded, key=lambda k: rounded[k])
            rounded[top] = round(rounded[top] + 1 - sum(rounded.values()), 6)
            entry["concurrency"] = rounded
        if "burstiness" in ConsumerTraffic.model_fields:
            # The planner's arrival-driven sizing (when merged) reads the busiest minute over the hour's mean,
            # per UTC hour of the day: the worst day's, as the rates are.
            worst = [1.0] * 24
            for i, (peak, _) in enumerate(bursts):
                hour = (since + i * HOUR).hour
                worst[hour] = max(worst[hour], min(60.0, peak))
            entry["burstiness"] = [round(v, 3) for v in worst]
        entry["observed"] = observed
        consumers.append(entry)
    if not consumers:
        raise UserError(f"no requests metered for fleet {fleet} between {since:%Y-%m-%d %H:%M} and "
                        f"{until:%Y-%m-%d %H:%M} UTC (check --region / --consumer, and that the gateways' EMF "
                        "records reach CloudWatch)", exit_code=EXIT_INVALID)
    return {"schema": SCHEMA_ID, "name": name,
            "description": f"exported from CloudWatch: fleet {fleet}, {since:%Y-%m-%dT%H:%MZ} .. {until:%Y-%m-%dT%H:%MZ}; "
                           f"rate_rps = the {'busiest' if hour_stat == 'max' else 'mean'} day's rate per UTC hour",
            "consumers": consumers}


def export(cfg: FleetConfig, since: datetime, until: datetime, call: Callable[..., dict[str, Any]], *,
           region: str | None = None, consumer: str | None = None, name: str | None = None,
           hour_stat: str = "max", now: datetime | None = None) -> tuple[TrafficProfile, dict[str, Any]]:
    """Read, build and validate the profile; returns (TrafficProfile, plain document)."""
    from pydantic import ValidationError

    from fleetcast.plan.traffic import TrafficProfile, validation_summary

    if hour_stat not in ("max", "mean"):
        raise UserError(f"--hour-stat {hour_stat!r}: choose max or mean", exit_code=EXIT_USAGE)
    since, until = floor_hour(since), floor_hour(until)
    tallies = collect(cfg, since, until, call, region, consumer, now)
    doc = profile_document(tallies, since, until, name or f"{cfg.name}-production", cfg.name, hour_stat, cfg)
    try:
        return TrafficProfile.model_validate(doc), doc
    except ValidationError as exc:  # a bug here, not a user mistake: say what broke
        raise UserError(f"the exported profile does not validate: {validation_summary(exc)}") from None
