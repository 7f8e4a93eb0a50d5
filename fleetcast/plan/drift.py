"""Plan drift: does the traffic production serves still fit the plan the config was written from?

`fleetcast plan --write-config` records a *baseline* next to the config (`<config>.plan-baseline.json`,
schema fleetcast.plan-baseline/v2, written by fleetcast.plan.check.baseline_document): per provider pool what the
plan chose and the figures it rested on (the target, the capacity bounds, the planned in-flight mix, the instance
cost per 1M output tokens) and, per model it serves (one for a one-model fleet: a packing of one), its copies,
planned rates and `rps_per_instance`, the hourly mean rate one instance serves of it within its SLOs.
`check_pool` compares a traffic observation against it and names each way the plan no longer holds:

- throughput: a model's busiest-hour arrival rate is past what `capacity.max` instances serve of it within its
  SLO (max x rps_per_instance);
- mix: more than `threshold` more of the requests arrive with more requests in flight on their
  instance than the target (the mix moved to larger batches);
- slo: an hour whose observed P99 TTFT or ITL is above the (strictest model's) SLO while its arrival rate was
  within the planned peak (the plan's latency assumption failed, not its size);
- cost: the instance cost per 1M output tokens at the observed traffic, sized the way the baseline sizes
  (instances per hour = the most demanding model's rate over its rps_per_instance, at least the floor), is more
  than `cost_threshold` off the planned figure.

A baseline of the first format (v1, whose one-model pools had no `models`) is read as this one (`upgrade`).

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

SCHEMA = "fleetcast.plan-baseline/v2"
V1 = "fleetcast.plan-baseline/v1"  # read too (upgrade): what one-model plans wrote before one format served all
SCHEMAS = (SCHEMA, V1)
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


def planned_usd_per_m_output(pool: dict[str, Any]) -> float:
    """A baseline pool's instance $ per 1M output tokens at its planned rates, sized as check_pool sizes observed
    traffic (packed_instances), so unchanged traffic reads unchanged."""
    models = pool["models"]
    instances = sum(packed_instances({m["model"]: m["hourly_rps"] for m in models}, models, pool["n_min"]))
    tokens = sum(sum(m["hourly_rps"]) * 3600 * m["output_mean"] for m in models)
    return instances * pool["price_per_hour"] / tokens * 1e6 if tokens else math.inf


def upgrade(doc: dict[str, Any]) -> dict[str, Any]:
    """A baseline of the first format (V1: a one-model pool without `models`, as one-model plans wrote it before
    one format served every pool) in this one: the pool's one model, serving `slo_safe_rps / capacity.max` per
    instance (what its throughput check read), its planned cost sized that way. Pools already listing `models`
    (V1's packed pools) read as they are."""
    pools = []
    for pool in doc["pools"]:
        if "models" not in pool:
            one = {"model": "", "adapters": [], "precision": pool.get("precision", ""),
                   "copies": 1, "hourly_rps": pool["hourly_rps"], "peak_rps": pool["peak_rps"],
                   "output_mean": pool["output_mean"],
                   "rps_per_instance": pool["slo_safe_rps"] / max(pool["capacity"]["max"], 1), "slo": doc["slo"]}
            pool = {**pool, "models": [one]}
            pool["usd_per_m_output"] = planned_usd_per_m_output(pool)
        pools.append(pool)
    return {**doc, "schema": SCHEMA, "pools": pools}


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
    if not isinstance(doc, dict) or doc.get("schema") not in SCHEMAS:
        raise UserError(f"--baseline: {p}: schema is {doc.get('schema') if isinstance(doc, dict) else None!r}, "
                        f"expected {SCHEMA!r} (or {V1!r})")
    return upgrade(doc)


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


def check_pool(base: dict[str, Any], obs: Observation, slo: dict[str, Any], threshold: float = DEFAULT_THRESHOLD,
               cost_threshold: float = DEFAULT_THRESHOLD) -> list[Finding]:
    """Every baseline check on one pool, one model or a packing (a one-model pool is a packing of one): throughput
    per model, the in-flight mix at the pool's target, the P99s against the strictest model's SLO, the cost."""
    region, cap_max, models = base["region"], base["capacity"]["max"], base["models"]
    # One model's rates are the pool's (whatever the metering of models); several: each model's own.
    single = len(models) == 1
    rates_of = {m["model"]: obs.hourly_rps if single else (obs.by_model or {}).get(m["model"]) for m in models}
    findings: list[Finding] = []
    for m in models:
        rates = rates_of[m["model"]]
        safe = cap_max * m["rps_per_instance"]
        if rates is not None and max(rates) > safe * (1 + 1e-9):
            findings.append(Finding("throughput", region, (
                f"traffic{'' if single else ' for ' + m['model']} grew past the SLO-safe throughput of max capacity: "
                f"the busiest hour brings {max(rates):.3g} req/s, {cap_max} instance(s) with {m['copies']} "
                f"process(es) of it each serve {safe:.3g} req/s within its SLO (planned peak {m['peak_rps']:.3g} "
                "req/s)")))
    if "share_above_target" in base:
        k = base["target"]
        above = share_above(obs.in_flight, k)
        if above - base["share_above_target"] > threshold:
            findings.append(Finding("mix", region, (
                f"the mix moved to larger batches: {above:.0%} of requests arrive with more than {k:g} in flight on "
                f"their instance (planned {base['share_above_target']:.0%}, threshold +{threshold:.0%})")))
    if obs.arrivals is not None:
        strictest = {"ttft_p99_ms": min(m["slo"]["ttft_p99_ms"] for m in models),
                     "itl_p99_ms": min(m["slo"]["itl_p99_ms"] for m in models)}
        findings += _slo_findings(base, obs, strictest)
    if all(r is not None for r in rates_of.values()):
        observed = {name: r for name, r in rates_of.items() if r is not None}
        instances = packed_instances(observed, models, base["n_min"])
        # One model: the metered mean output length too (a pool's lengths are its one model's).
        lengths = {m["model"]: obs.output_mean if single and obs.output_mean else m["output_mean"] for m in models}
        tokens = sum(sum(observed[name]) * 3600 * length for name, length in lengths.items())
        cost = sum(instances) * base["price_per_hour"] / tokens * 1e6 if tokens else math.inf
        findings += _cost_finding(region, cost, base["usd_per_m_output"], cost_threshold,
                                  "the observed rates and lengths" if single else "the observed rates of every model")
    return findings


def _cost_finding(region: str, cost: float, planned: float, cost_threshold: float, at: str) -> list[Finding]:
    if planned and math.isfinite(cost) and abs(cost / planned - 1) > cost_threshold:
        return [Finding("cost", region, (
            f"cost per token off by more than {cost_threshold:.0%}: ${cost:.4f} vs ${planned:.4f} planned per 1M "
            f"output tokens ({cost / planned - 1:+.0%}; instance cost at {at})"))]
    return []
