"""Plan drift: does the traffic production serves still fit the plan the config was written from?

`fleetcast plan --write-config` records a *baseline* next to the config (`<config>.plan-baseline.json`,
schema fleetcast.plan-baseline/v1): per provider pool what the plan chose and the figures it rested
on (the target, the capacity bounds, seconds each request holds an instance at the traffic's load
levels, the share of requests above the target, the instance cost per 1M output tokens).
`check_pool` compares a traffic observation against it and names each way the plan no longer
holds:

- throughput: the busiest hour's arrival rate is past what `capacity.max` instances serve within
  the SLO (max / seconds-per-request, Little's law at the target);
- mix: more than `threshold` more of the requests arrive with more requests in flight on their
  instance than the target (the mix moved to larger batches);
- slo: an hour whose observed P99 TTFT or ITL is above the SLO while its arrival rate was within
  the planned peak (the plan's latency assumption failed, not its size);
- cost: the instance cost per 1M output tokens at the observed traffic, sized the way the plan
  sizes (instances per hour = max(min, ceil(rate x seconds-per-request))), is more than
  `cost_threshold` off the planned figure.

A pool that packs several models (fleetcast/plan/packing.py) records per model (`models`) its copies and
the SLO-safe rate of its processes; with per-model rates in the observation, the throughput check runs per
model and names the model whose traffic grew, and the cost check sizes each hour by its most demanding model.

Standard library only: the scheduled drift Lambda (stacks/lambdas/plan_drift) bundles this module
and runs the same checks from CloudWatch; `fleetcast plan --check` adds the full re-plan (pick,
capacity bounds, target), which needs the planner and the benchmark results.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = "fleetcast.plan-baseline/v1"
DEFAULT_THRESHOLD = 0.2


@dataclass(frozen=True)
class Finding:
    kind: str  # pick | capacity | target | throughput | mix | slo | cost
    region: str
    text: str

    def line(self) -> str:
        return f"{self.region}: {self.kind}: {self.text}"


def hour_of_day_rates(first_hour_utc: int, arrivals: list[float], stat: str = "max") -> list[float]:
    """Requests per second for each UTC hour of the day from hourly arrival counts starting at `first_hour_utc`:
    the busiest day's (`max`) or the mean over the days observed (`mean`); 0 for an hour never observed."""
    by_hour: dict[int, list[float]] = {h: [] for h in range(24)}
    for i, count in enumerate(arrivals):
        by_hour[(first_hour_utc + i) % 24].append(count / 3600)
    return [0.0 if not xs else max(xs) if stat == "max" else sum(xs) / len(xs) for xs in by_hour.values()]


def baseline_path(config_path: str | Path) -> Path:
    p = Path(config_path)
    return p.with_name(f"{p.stem}.plan-baseline.json")


def _range(key: str) -> tuple[int, int]:
    lo, _, hi = str(key).partition("-")
    return int(lo), int(hi or lo)


def _slo_findings(base: dict[str, Any], obs: Observation, slo: dict[str, Any]) -> list[Finding]:
    """Hours whose observed P99 TTFT or ITL is above the SLO while the arrival rate was within the planned peak."""
    findings = []
    for metric, series, limit in (("TTFT", obs.ttft_p99_ms, slo["ttft_p99_ms"]),
                                  ("ITL", obs.itl_p99_ms, slo["itl_p99_ms"])):
        bad = [(v, n / 3600) for v, n in zip(series or [], obs.arrivals or [])
               if v is not None and v > limit and n / 3600 <= base["peak_rps"] * (1 + 1e-9)]
        if bad:
            worst = max(bad)
            findings.append(Finding("slo", base["region"], (
                f"observed P99 {metric} above the SLO at planned load in {len(bad)} hour(s): worst "
                f"{worst[0]:.0f} ms > {limit:g} ms at {worst[1]:.3g} req/s (planned peak {base['peak_rps']:.3g})")))
    return findings


def share_above(histogram: dict[str, float], level: float) -> float:
    """Share of a {level or 'lo-hi': weight} histogram above `level` (ranges spread evenly over their levels)."""
    total = sum(histogram.values())
    if not total:
        return 0.0
    above = 0.0
    for key, weight in histogram.items():
        lo, hi = _range(key)
        above += weight * max(0, hi - max(lo - 1, math.floor(level))) / (hi - lo + 1)
    return above / total


def instance_cost_per_m_output(hourly_rps: list[float], seconds_per_request: float, n_min: int,
                               price_per_hour: float, output_mean: float) -> float:
    """Instance $ per 1M output tokens over a day sized the planner's way (docs/plan.md step 4)."""
    instances = sum(max(n_min, math.ceil(rps * seconds_per_request - 1e-9)) for rps in hourly_rps)
    tokens = sum(hourly_rps) * 3600 * output_mean
    return instances * price_per_hour / tokens * 1e6 if tokens else math.inf


def baseline_document(pools: list[Any], ctx: Any, config_pools: dict[str, str | None], written: str) -> dict[str, Any]:
    """The baseline for the planned pools (fleetcast.plan.solver.FleetPool objects, read by attribute)."""
    out = []
    for pool in pools:
        members = pool.members
        rates = [sum(plan.traffic.hourly_rps()[h] for plan, _ in members) for h in range(24)]
        volume = sum(sum(plan.traffic.hourly_rps()) for plan, _ in members)
        spr = sum(sum(plan.traffic.hourly_rps()) * ev.seconds_per_request for plan, ev in members) / volume \
            if volume else members[0][1].seconds_per_request
        output_mean = sum(sum(plan.traffic.hourly_rps()) * plan.traffic.output_mean for plan, _ in members) / volume \
            if volume else members[0][0].traffic.output_mean
        win = pool.evaluation
        lo, _, hi = pool.capacity()
        histogram = pool.levels_at_arrival(ctx)
        n_min = ctx.n_min(pool.service_region)
        out.append({
            "region": pool.service_region, "pool": config_pools.get(pool.service_region),
            "candidate": win.candidate.label, "instance_type": win.candidate.instance_type,
            "precision": win.candidate.precision, "consumer_regions": pool.consumer_regions,
            "target": pool.target, "capacity": {"min": lo, "max": hi}, "n_min": n_min,
            "seconds_per_request": spr, "hourly_rps": rates, "peak_rps": max(rates),
            "slo_safe_rps": pool.slo_safe_rps(hi, spr),
            "share_above_target": share_above(histogram, pool.target),
            "price_per_hour": win.price_per_hour, "output_mean": output_mean,
            "usd_per_m_output": instance_cost_per_m_output(rates, spr, n_min, win.price_per_hour, output_mean),
        })
    return {"schema": SCHEMA, "written": written,
            "slo": {"ttft_p99_ms": ctx.slo.ttft_p99_ms, "itl_p99_ms": ctx.slo.itl_p99_ms}, "pools": out}


def load_baseline(path: str | Path) -> dict[str, Any]:
    from fleetcast.contract.errors import UserError

    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise UserError(f"--baseline: {p} does not exist; `fleetcast plan --write-config` writes it next to the "
                        "config it updates") from None
    except ValueError as exc:
        raise UserError(f"--baseline: {p} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise UserError(f"--baseline: {p}: schema is {doc.get('schema') if isinstance(doc, dict) else None!r}, "
                        f"expected {SCHEMA!r}")
    return doc


@dataclass
class Observation:
    """The traffic a pool serves now: rates per UTC hour of the day and, where metered, the rest."""

    hourly_rps: list[float]  # 24, summed over the pool's consumer regions
    in_flight: dict[str, float]  # requests by in-flight level at arrival ('1', '3-4', ...)
    output_mean: float
    arrivals: list[float] | None = None  # per hour of the window, for the latency check
    ttft_p99_ms: list[float | None] | None = None
    itl_p99_ms: list[float | None] | None = None
    by_model: dict[str, list[float]] | None = None  # several models: each model's 24 hourly rates


def packed_instances(by_model: dict[str, list[float]], models: list[dict[str, Any]], n_min: int) -> list[int]:
    """Instances per UTC hour a packed pool needs for these rates: its most demanding model's processes over
    their copies (each model's `rps_per_instance`: the hourly mean rate one instance serves within its SLOs)."""
    out = []
    for h in range(24):
        need = [math.ceil(by_model.get(m["model"], [0.0] * 24)[h] / m["rps_per_instance"] - 1e-9)
                for m in models if m["rps_per_instance"] > 0]
        out.append(max([n_min] + need))
    return out


def _packed_findings(base: dict[str, Any], obs: Observation, cost_threshold: float) -> list[Finding]:
    region, cap_max = base["region"], base["capacity"]["max"]
    findings: list[Finding] = []
    for m in base["models"]:
        rates = (obs.by_model or {}).get(m["model"])
        if rates is None:
            continue
        safe = cap_max * m["rps_per_instance"]
        if max(rates) > safe * (1 + 1e-9):
            findings.append(Finding("throughput", region, (
                f"traffic for {m['model']} grew past the SLO-safe throughput of max capacity: its busiest hour brings "
                f"{max(rates):.3g} req/s, {cap_max} instance(s) with {m['copies']} copy(ies) each serve "
                f"{safe:.3g} req/s of it within its SLO (planned peak {m['peak_rps']:.3g} req/s)")))
    if obs.by_model and all(m["model"] in obs.by_model for m in base["models"]):
        instances = packed_instances(obs.by_model, base["models"], base["n_min"])
        tokens = sum(sum(obs.by_model[m["model"]]) * 3600 * m["output_mean"] for m in base["models"])
        cost = sum(instances) * base["price_per_hour"] / tokens * 1e6 if tokens else math.inf
        findings += _cost_finding(region, cost, base["usd_per_m_output"], cost_threshold, "the observed rates of every model")
    return findings


def check_pool(base: dict[str, Any], obs: Observation, slo: dict[str, Any], threshold: float = DEFAULT_THRESHOLD,
               cost_threshold: float = DEFAULT_THRESHOLD) -> list[Finding]:
    if "models" in base:
        # A packed pool: throughput and cost per model; the pool-level P99s against the strictest model's SLO.
        packed = _packed_findings(base, obs, cost_threshold)
        if obs.arrivals is not None:
            strictest = {"ttft_p99_ms": min(m["slo"]["ttft_p99_ms"] for m in base["models"]),
                         "itl_p99_ms": min(m["slo"]["itl_p99_ms"] for m in base["models"])}
            packed += _slo_findings(base, obs, strictest)
        return packed
    region, k, spr = base["region"], base["target"], base["seconds_per_request"]
    cap_max = base["capacity"]["max"]
    findings: list[Finding] = []
    peak = max(obs.hourly_rps)
    if peak > base["slo_safe_rps"] * (1 + 1e-9):
        findings.append(Finding("throughput", region, (
            f"traffic grew past the SLO-safe throughput of max capacity: the busiest hour brings {peak:.3g} req/s, "
            f"{cap_max} instance(s) at target {k:g} serve {base['slo_safe_rps']:.3g} req/s within the SLO "
            f"(planned peak {base['peak_rps']:.3g} req/s)")))
    above = share_above(obs.in_flight, k)
    if above - base["share_above_target"] > threshold:
        findings.append(Finding("mix", region, (
            f"the mix moved to larger batches: {above:.0%} of requests arrive with more than {k:g} in flight on "
            f"their instance (planned {base['share_above_target']:.0%}, threshold +{threshold:.0%})")))
    if obs.arrivals is not None:
        findings += _slo_findings(base, obs, slo)
    cost = instance_cost_per_m_output(obs.hourly_rps, spr, base["n_min"], base["price_per_hour"], obs.output_mean)
    findings += _cost_finding(region, cost, base["usd_per_m_output"], cost_threshold, "the observed rates and lengths")
    return findings


def _cost_finding(region: str, cost: float, planned: float, cost_threshold: float, at: str) -> list[Finding]:
    if planned and math.isfinite(cost) and abs(cost / planned - 1) > cost_threshold:
        return [Finding("cost", region, (
            f"cost per token off by more than {cost_threshold:.0%}: ${cost:.4f} vs ${planned:.4f} planned per 1M "
            f"output tokens ({cost / planned - 1:+.0%}; instance cost at {at})"))]
    return []
