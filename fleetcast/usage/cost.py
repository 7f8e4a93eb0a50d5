"""What each account costs: every instance-hour and each region's fixed costs, attributed to consumers and models.

`fleetcast usage --cost` reads the same metering as `fleetcast usage --by-model` (tokens per consumer, model
and pool) and the same instance-hours (each group's GroupTotalInstances), and splits the bill by the GPU
time each row's tokens took:

- GPU seconds of a row on a pool = requests x t_pre(its mean prompt) + output tokens x t_dec(c) / c, where
  t_pre (one request's prefill) and t_dec (one decode step of c requests) are the planner's roofline terms
  (fleetcast.plan.estimate.roofline_seconds) for the pool's GPU, the model's precision and shape, and c is
  the requests each engine process runs at once at the pool's planned load (its active_requests scaling
  target over its processes, within the batch limit): a decode step serves c requests, so each output token
  takes 1/c of one. A model the planner has no shape for is split by tokens on its pool (noted).
- Each pool's instance cost (instance-hours x on-demand price, the shipped price table) goes to the rows that
  ran on it, by GPU seconds; a pool nobody used is spread over the region's rows by their GPU seconds.
- Each region's fixed costs (one NLB with its LCUs, the provider's and consumers' interface endpoints and
  their data processing: the planner's table, fleetcast/config/data/fixed_costs.yaml, priced with its own
  formula at the window's mean request rate and bytes) go to the region's rows by GPU seconds.
So the attributed costs add up to the fleet's cost: the sum check says by how much they do (a region without
any metered tokens cannot be attributed and is named).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetcast.config import FleetConfig, Pool
from fleetcast.config.catalog import instance_catalog
from fleetcast.contract.errors import EXIT_USAGE, UserError

from .report import UsageReport, csv_text, table_lines

SUM_TOLERANCE = 0.02  # the attributed costs must add up to the fleet's within 2%


@dataclass
class Attribution:
    consumer: str
    region: str
    model: str
    gpu_seconds: float = 0.0
    by_tokens: bool = False  # its pool was split by tokens (no architecture figures): gpu_seconds unknown
    instance_usd: float = 0.0
    fixed_usd: float = 0.0

    @property
    def total_usd(self) -> float:
        return self.instance_usd + self.fixed_usd


@dataclass
class RegionBill:
    region: str
    instance_usd: float
    fixed_usd: float
    attributed_usd: float = 0.0

    @property
    def total_usd(self) -> float:
        return self.instance_usd + self.fixed_usd


@dataclass
class CostReport:
    usage: UsageReport
    rows: list[Attribution]
    bills: list[RegionBill]
    notes: list[str] = field(default_factory=list)

    @property
    def fleet_usd(self) -> float:
        return sum(b.total_usd for b in self.bills)

    @property
    def attributed_usd(self) -> float:
        return sum(r.total_usd for r in self.rows)

    @property
    def sum_error(self) -> float:
        """(attributed - fleet) / fleet; 0 for a fleet that cost nothing."""
        return (self.attributed_usd - self.fleet_usd) / self.fleet_usd if self.fleet_usd else 0.0

    @property
    def sums_up(self) -> bool:
        return abs(self.sum_error) <= SUM_TOLERANCE


def _base_models(cfg: FleetConfig) -> dict[str, str]:
    """Every model and adapter id -> the model whose processes serve it."""
    bases = {m.id: m.id for m in cfg.models}
    for m in cfg.models:
        for adapter in m.adapters:
            bases[adapter.id] = m.id
    return bases


def _concurrency(cfg: FleetConfig, pool: Pool, batch: int) -> float:
    """Requests each engine process runs at once at the pool's planned load."""
    processes = sum(s.copies for s in cfg.serves_of(pool)) or 1
    target = pool.scaling.target if pool.scaling.metric == "active_requests" else batch
    return min(float(batch), max(1.0, target / processes))


def _fixed_usd(region: str, requests: int, input_tokens: int, output_tokens: int, hours: float) -> float:
    """The region's fixed costs over the window, by the planner's table and formula (fleetcast/plan/inputs.py)."""
    from fleetcast.plan.inputs import load_fixed_costs

    fixed = load_fixed_costs(None)
    rps = requests / (hours * 3600) if hours else 0.0
    gb = fixed.gb_per_request(input_tokens / requests, output_tokens / requests) if requests else (0.0, 0.0)
    return fixed.hourly(region, region, rps, gb) * hours


def attribute(cfg: FleetConfig, report: UsageReport) -> CostReport:
    """Split each region's instance and fixed costs over its consumer-and-model rows by GPU time."""
    from fleetcast.config.architectures import MODEL_SHAPES
    from fleetcast.plan.estimate import roofline_seconds

    if any(u.model is None for u in report.rows):
        raise UserError("cost attribution needs the per-model usage (collect with by_model=True)", exit_code=EXIT_USAGE)
    catalog = instance_catalog()
    bases = _base_models(cfg)
    hours = (report.until - report.since).total_seconds() / 3600
    rows: list[Attribution] = []
    bills: list[RegionBill] = []
    notes: list[str] = []
    for cost in report.costs:
        region = cfg.region(cost.region)
        usage = [u for u in report.rows if u.region == cost.region]
        if cost.cost_usd is None:
            notes.append(f"{cost.region}: {cost.basis}; its cost is not attributed")
            continue
        attributions = {(u.consumer, u.model or ""): Attribution(u.consumer, cost.region, u.model or "") for u in usage}
        per_pool: dict[str, dict[tuple[str, str], float]] = {}
        for pool in region.pools:
            served = {s.model.id: s for s in cfg.served_by(pool)}
            gpu = catalog[pool.instance_type].gpu if pool.instance_type in catalog else None
            shares: dict[tuple[str, str], float] = {}
            by_tokens = False
            for u in usage:
                requests, input_tokens, output_tokens = u.by_pool.get(pool.name, (0, 0, 0))
                base = bases.get(u.model or "")
                entry = served.get(base or "")
                if not requests or entry is None:
                    continue
                shape = MODEL_SHAPES.get(entry.model.id)
                if shape is None or gpu is None:
                    by_tokens = True
                    shares[(u.consumer, u.model or "")] = float(input_tokens + output_tokens)
                    continue
                c = _concurrency(cfg, pool, entry.engine.max_batch_size)
                t_pre, t_dec = roofline_seconds(gpu, entry.engine.precision.value, shape, c,
                                                input_tokens / requests, max(1.0, output_tokens / requests))
                shares[(u.consumer, u.model or "")] = requests * t_pre + output_tokens * t_dec / c
            if by_tokens:
                notes.append(f"{cost.region}/{pool.name}: no architecture figures for a model it serves; its "
                             "instance cost is split by tokens (input + output)")
                shares = {k: float(sum(u.by_pool.get(pool.name, (0, 0, 0))[1:])) for u in usage
                          if (k := (u.consumer, u.model or "")) in shares}
            per_pool[pool.name] = shares
            for key, seconds in shares.items():
                if by_tokens:
                    attributions[key].by_tokens = True
                else:
                    attributions[key].gpu_seconds += seconds
        region_weights: dict[tuple[str, str], float] = {
            k: sum((p.get(k, 0.0) for p in per_pool.values()), 0.0) for k in attributions}
        region_total = sum(region_weights.values())
        requests = sum(u.requests for u in usage)
        fixed = _fixed_usd(cost.region, requests, sum(u.input_tokens for u in usage),
                           sum(u.output_tokens for u in usage), hours)
        bill = RegionBill(cost.region, cost.cost_usd, fixed)
        bills.append(bill)
        if not region_total:
            notes.append(f"{cost.region}: no metered tokens in the window; its ${bill.total_usd:,.2f} is not "
                         "attributed to any consumer")
            continue
        for pool_name, (_pool_hours, pool_usd) in cost.pools.items():
            shares = per_pool.get(pool_name) or {}
            total = sum(shares.values())
            if not total:
                if pool_usd:
                    notes.append(f"{cost.region}/{pool_name}: no metered tokens; its ${pool_usd:,.2f} of instance-hours "
                                 "is spread over the region's consumers by GPU time")
                shares, total = region_weights, region_total
            for key, weight in shares.items():
                attributions[key].instance_usd += (pool_usd or 0.0) * weight / total
        for key, weight in region_weights.items():
            attributions[key].fixed_usd += fixed * weight / region_total
        kept = [a for a in attributions.values() if a.total_usd > 0 or a.gpu_seconds > 0]
        bill.attributed_usd = sum(a.total_usd for a in kept)
        rows.extend(kept)
    return CostReport(report, rows, bills, sorted(set(report.notes + notes)))


# ---------------------------------------------------------------- output

COLUMNS = ("consumer", "region", "model", "gpu_hours", "share_of_region", "instance_usd", "fixed_usd", "total_usd")
METHOD = ("Split by GPU time: requests x prefill + output tokens x decode step / requests per step, by the planner's "
          "roofline (fleetcast.plan.estimate) for each pool's GPU, precision and planned requests per process; "
          "instance-hours from GroupTotalInstances x on-demand price, fixed costs (NLB, LCUs, endpoints) from the "
          "planner's table. Estimates.")


def _records(report: CostReport) -> list[dict[str, Any]]:
    totals = {b.region: b.attributed_usd for b in report.bills}
    return [{"consumer": r.consumer, "region": r.region, "model": r.model,
             "gpu_hours": None if r.by_tokens else round(r.gpu_seconds / 3600, 6),
             "share_of_region": round(r.total_usd / totals[r.region], 6) if totals.get(r.region) else 0.0,
             "instance_usd": round(r.instance_usd, 4), "fixed_usd": round(r.fixed_usd, 4),
             "total_usd": round(r.total_usd, 4)} for r in sorted(report.rows, key=lambda r: -r.total_usd)]


def sum_check(report: CostReport) -> str:
    verdict = "within" if report.sums_up else "OUTSIDE"
    return (f"sum check: attributed ${report.attributed_usd:,.2f} of the fleet's ${report.fleet_usd:,.2f} "
            f"({report.sum_error * 100:+.2f}%, {verdict} the ±{SUM_TOLERANCE * 100:g}% bound)")


def render_cost(report: CostReport, fmt: str) -> str:
    records = _records(report)
    if fmt == "json":
        return json.dumps({
            "fleet": report.usage.fleet, "since": report.usage.since.isoformat(), "until": report.usage.until.isoformat(),
            "rows": records,
            "regions": [{"region": b.region, "instance_usd": round(b.instance_usd, 4), "fixed_usd": round(b.fixed_usd, 4),
                         "attributed_usd": round(b.attributed_usd, 4)} for b in report.bills],
            "fleet_usd": round(report.fleet_usd, 4), "attributed_usd": round(report.attributed_usd, 4),
            "sum_error": round(report.sum_error, 6), "method": METHOD, "cost_is_estimate": True, "notes": report.notes,
        }, indent=2)
    if fmt == "csv":
        return csv_text(records, COLUMNS)
    if fmt != "table":
        raise UserError(f"--format {fmt!r}: choose table, csv or json", exit_code=EXIT_USAGE)
    headers = ("CONSUMER", "REGION", "MODEL", "GPU-HOURS", "SHARE", "INSTANCES USD", "FIXED USD", "TOTAL USD")
    cells = [(r["consumer"], r["region"], r["model"],
              "by tokens" if r["gpu_hours"] is None else f"{r['gpu_hours']:,.4f}", f"{r['share_of_region'] * 100:.1f}%",
              f"{r['instance_usd']:,.2f}", f"{r['fixed_usd']:,.2f}", f"{r['total_usd']:,.2f}") for r in records]
    u = report.usage
    out = [f"fleet {u.fleet}: cost by consumer and model {u.since:%Y-%m-%d %H:%M} .. {u.until:%Y-%m-%d %H:%M} UTC",
           *table_lines(headers, cells, 3), ""]
    for b in report.bills:
        out.append(f"{b.region}: instances ${b.instance_usd:,.2f} + fixed ${b.fixed_usd:,.2f} = ${b.total_usd:,.2f}; "
                   f"attributed ${b.attributed_usd:,.2f}")
    out += [sum_check(report), METHOD]
    out += [f"note: {n}" for n in report.notes]
    return "\n".join(out)


def write_png(report: CostReport, path: str | Path) -> Path:
    """One bar per consumer, its cost stacked by model, labelled with dollars and share: readable at a glance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    consumers: dict[str, dict[str, float]] = {}
    for r in report.rows:
        consumers.setdefault(r.consumer, {}).setdefault(r.model, 0.0)
        consumers[r.consumer][r.model] += r.total_usd
    order = sorted(consumers, key=lambda c: sum(consumers[c].values()))
    models = sorted({m for v in consumers.values() for m in v})
    colours = plt.get_cmap("tab10")
    # Dollar signs are escaped below: two in one string would otherwise be read as mathtext and vanish.
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.7 * max(1, len(order))), dpi=120)
    total = report.attributed_usd or 1.0
    for y, consumer in enumerate(order):
        left = 0.0
        for i, model in enumerate(models):
            value = consumers[consumer].get(model, 0.0)
            if value <= 0:
                continue
            ax.barh(y, value, left=left, color=colours(i % 10), edgecolor="white",
                    label=model if y == next(k for k, c in enumerate(order) if consumers[c].get(model)) else None)
            left += value
        ax.text(left, y, f"  \\${left:,.2f} ({left / total:.0%})", va="center", fontsize=10)
    ax.set_yticks(range(len(order)), order, fontsize=11)
    ax.set_xlabel("USD over the window (instances + fixed costs)")
    u = report.usage
    ax.set_title(f"{u.fleet}: what each account cost, {u.since:%Y-%m-%d %H:%M} to {u.until:%Y-%m-%d %H:%M} UTC\n"
                 f"fleet \\${report.fleet_usd:,.2f}, attributed \\${report.attributed_usd:,.2f} "
                 f"({report.sum_error * 100:+.1f}%)", fontsize=11)
    ax.set_xlim(0, max((sum(v.values()) for v in consumers.values()), default=1.0) * 1.35 or 1.0)
    ax.spines[["top", "right"]].set_visible(False)
    if models:  # beside the bars, never over a bar's label
        ax.legend(title="model", loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=9, frameon=False)
    how = ("Split by the GPU time each account's tokens took (prefill + decode, planner's roofline)"
           + ("; a pool without architecture figures split by tokens" if any(r.by_tokens for r in report.rows)
              else "") + ". Estimates.")
    fig.text(0.01, 0.01, how, fontsize=8, color="#555555")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    tmp.replace(out)  # written whole or not at all
    return out


def check_png_path(path: str) -> None:
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise UserError(f"--png {path}: folder {parent} does not exist", exit_code=EXIT_USAGE)
