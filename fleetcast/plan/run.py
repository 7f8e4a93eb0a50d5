"""Assemble a plan from the command's options: read every input, run the method (the packing search, one model
a packing of one), return a Planned for the report. The CLI (scripts/plan_cmd.py) only parses arguments and
prints; tests call `plan_fleet` or `build_packing` directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetcast.config import catalog
from fleetcast.contract.errors import EXIT_USAGE, UserError

from .aws import live_availability, refresh_prices
from .estimate import estimate_specs
from .inputs import (
    Availability,
    FixedCosts,
    Latency,
    Prices,
    QualityFile,
    load_fixed_costs,
    load_latency,
    load_prices,
    load_quality,
    shipped_availability,
    stale_table_warning,
)
from .packing import PackingPlan
from .solver import PlanContext, PlannedPool, Slo
from .traffic import ConsumerTraffic, TrafficProfile, load_traffic

if TYPE_CHECKING:
    from fleetcast.bench.schema import Results
    from fleetcast.config.model import FleetConfig

    from .packing import ModelCurve
    from .spot import SpotAdvice


@dataclass
class PlanOptions:
    results: list[str]
    traffic: str | None
    config: str | None = "config/fleet.yaml"
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    error_rate: float | None = None
    prices: str | None = None
    refresh_prices: bool = False
    fixed_costs: str | None = None
    latency: str | None = None
    live_availability: bool = False
    quality: str | None = None
    quality_threshold: float | None = None
    estimate: list[str] = field(default_factory=list)
    min_instances: int | None = None
    # AWS named profile for --refresh-prices / --live-availability (None: the standard credential chain).
    profile: str | None = None
    # Spot tier (fleetcast/plan/spot.py): tables overriding the shipped ones, and the re-launch assumption.
    spot_prices: str | None = None
    spot_interruptions: str | None = None
    spot_relaunch_s: float | None = None
    # Capacity reservations already paid for: {(instance type, region): count} (`--reserved TYPE@REGION=N`).
    reserved: dict[tuple[str, str], int] = field(default_factory=dict)
    # Injected AWS clients (tests use botocore Stubber); None means clients of the shared AWS session.
    pricing_client: Any = None
    ec2_client_for: Callable[[str], Any] | None = None
    # The date price tables are aged against; None means today (tests fix it).
    today: date | None = None
    # A traffic profile already in hand (`plan --check --traffic-from cloudwatch`); else `traffic` is read.
    traffic_profile: TrafficProfile | None = None
    # Lab machines (`--lab GPU=TYPE`): reference-backend results measured on that GPU, without an instance type,
    # planned as TYPE (a catalog entry the caller supplies: FLEETCAST_INSTANCES). Several-model fleets only.
    lab: dict[str, str] = field(default_factory=dict)
    # `--gpu-sharing MODE`: plan every pool of a several-model fleet as if it shared its GPU that way (a what-if).
    gpu_sharing: str | None = None


def _expand(paths: list[str]) -> list[str | Path]:
    out: list[str | Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(str(x) for x in p.glob("*.json"))
            if not found:
                raise UserError(f"--results: directory {p} holds no .json results files")
            out += found
        else:
            out.append(raw)
    return out


def _tables(opts: PlanOptions, instance_types: list[str], consumer_regions: list[str], warnings: list[str]
            ) -> tuple[Prices, Availability, Latency, FixedCosts, QualityFile | None]:
    """Prices, availability, latency, fixed costs and quality: shipped tables, files, or AWS where asked."""
    prices = load_prices(opts.prices)
    candidate_regions = sorted(set(consumer_regions) | catalog.privatelink_cross_region())
    aws: Any = None
    if opts.refresh_prices or opts.live_availability:
        from fleetcast.aws_session import AwsSession

        aws = AwsSession(opts.profile)
    if opts.refresh_prices:
        from .aws import PRICING_REGION

        pricing = opts.pricing_client or aws.client("pricing", PRICING_REGION)
        prices, notes = refresh_prices(prices, instance_types, candidate_regions, client=pricing)
        warnings += notes
    availability = shipped_availability()
    if opts.live_availability:
        ec2_for = opts.ec2_client_for or (lambda region: aws.client("ec2", region))
        availability = live_availability(availability, instance_types, candidate_regions, client_for=ec2_for)
    return prices, availability, load_latency(opts.latency), load_fixed_costs(opts.fixed_costs), load_quality(opts.quality)


def _stale_tables(prices: Prices, fixed: FixedCosts, today: date) -> list[str]:
    """A warning per dated table older than inputs.PRICE_MAX_AGE_DAYS on `today`."""
    found = (
        stale_table_warning("on-demand prices", prices.as_of, today,
                            "refresh them (--refresh-prices) or give current ones (--prices FILE)"),
        stale_table_warning("fixed costs (NLB, PrivateLink, transfer)", fixed.as_of, today,
                            "give current ones (--fixed-costs FILE) or update fleetcast/config/data/fixed_costs.yaml"),
    )
    return [w for w in found if w]


def _traffic(opts: PlanOptions) -> TrafficProfile:
    if opts.traffic_profile is not None:
        return opts.traffic_profile
    if not opts.traffic:
        raise UserError("--traffic: give a traffic profile (fleetcast.traffic/v1)", exit_code=EXIT_USAGE)
    return load_traffic(opts.traffic)


def consumerless_regions(cfg: Any, traffic: TrafficProfile) -> list[str]:
    """A warning per traffic region where the config has no consumer. The planner plans it all the same (the
    profile may describe consumers still to come: examples/plan/seed/traffic-us-east-1.yaml is planned against
    config/fleet.yaml, whose consumers sit in Seoul and Oregon), so the plan is a price for them, not for traffic
    the fleet serves today; the warning says so, and what the config still lacks."""
    have = sorted({c.region for c in cfg.consumers})
    out = []
    for region in dict.fromkeys(c.region for c in traffic.consumers):
        if region in have:
            continue
        lacks = "" if any(r.region == region for r in cfg.regions) else \
            f"; regions has no entry for {region} either, so --write-config cannot put a pool there"
        out.append(f"the traffic profile's consumers[].region {region} has no consumer in the config "
                   f"(consumers[].region: {', '.join(have) or 'none'}): planned for consumers still to come there; "
                   f"add them under consumers before they call (the gateway serves only configured consumers){lacks}")
    return out


def _config(opts: PlanOptions) -> FleetConfig | None:
    """The fleet config, or None for a one-model plan without one (--ttft-p99-ms and --itl-p99-ms give its SLO)."""
    from fleetcast.config import load_config

    if opts.config and Path(opts.config).exists():
        return load_config(opts.config)
    if opts.ttft_p99_ms is None or opts.itl_p99_ms is None:
        raise UserError(f"--config: {opts.config} does not exist; give a fleet config (its slo is the default) "
                        "or both --ttft-p99-ms and --itl-p99-ms")
    return None


def build_packing(opts: PlanOptions, max_copies: int | None = None
                  ) -> tuple[PackingPlan, PlanContext, FleetConfig | None]:
    """The plan of a fleet of several models: which models share an instance, with how many copies
    (fleetcast/plan/packing.py). Returns (PackingPlan, PlanContext, FleetConfig); without a config (one model, its
    SLO from --ttft-p99-ms/--itl-p99-ms) the config is None and the model the one the results measured."""
    from fleetcast.bench.schema import results_reader

    from . import packing

    cfg = _config(opts)
    paths = _expand(opts.results)
    read = results_reader()
    models = tuple(m.id for m in cfg.models) if cfg is not None else _measured_model(paths, read)
    traffic = _traffic(opts).checked_against(models)
    if cfg is not None:
        packing.unentitled_traffic(cfg, traffic)
    curves = packing.load_model_curves(paths, models, lab=opts.lab, read=read)
    warnings = consumerless_regions(cfg, traffic) if cfg is not None else []
    for mc in curves:
        warnings += [f"{mc.model} on {mc.candidate.label}, {mc.kind} curve: {n}" for n in mc.candidate.curve.notes]
    estimators = _estimate_per_model(opts.estimate, cfg, models, curves, traffic) if opts.estimate else []
    curves += [c for _, estimated in estimators for c in estimated]
    tables = _tables(opts, sorted({c.instance_type for c in curves}), [c.region for c in traffic.consumers], warnings)
    quality = tables[4]
    unknown = sorted({r.model for r in quality.results if r.model and r.model not in models}) if quality else []
    if unknown:
        raise UserError(f"--quality: results[].model {', '.join(unknown)} is not a model of the config; allowed: "
                        f"{', '.join(models)}")
    ctx = _context(opts, cfg, tables, warnings)
    warnings += _synthetic([c.candidate.provenance for c in curves], "curve")
    lab = [c for c in curves if c.candidate.backend == "reference"]
    if lab:
        warnings.append(f"{len(lab)} curve(s) were measured with the reference backend on a lab machine (--lab): "
                        "not a TensorRT-LLM engine and not an AWS instance type; the plan shows how the packing is "
                        "chosen from them, not what an AWS fleet would cost")
    result = packing.plan_packing(cfg, curves, traffic, ctx, fleet_slo=ctx.slo, lab=opts.lab,
                                  max_copies=max_copies or packing.DEFAULT_MAX_COPIES, gpu_sharing=opts.gpu_sharing,
                                  models=models)
    result.spot = _spot_advice(opts, ctx, result.planned_pools(ctx))
    result.warnings = warnings
    result.data_notes = _data_notes(ctx, packing.curves_text(curves))
    result.estimator = "; ".join(text for text, _ in estimators) or None
    return result, ctx, cfg


def _measured_model(paths: list[str | Path], read: Callable[[str | Path], Results]) -> tuple[str]:
    """The model a plan without a config is for: the one its results name (labels.model)."""
    named = sorted({m for m in (read(p).labels.model for p in paths) if m})
    if len(named) != 1:
        raise UserError(f"--results: a plan without a fleet config is for the one model its results measured; they "
                        f"name {', '.join(named) if named else 'none'} (labels.model): give --config for several")
    return (named[0],)


def _synthetic(provenances: list[str], noun: str) -> list[str]:
    """The warning every plan gives when some of its inputs are authored data (results `provenance: synthetic`)."""
    n = provenances.count("synthetic")
    return [f"{n} of {len(provenances)} {noun}(s) rest on SYNTHETIC results (authored data, not measurements): this "
            "plan shows the method, not a decision; benchmark the candidates (fleetcast bench) before acting on it"] \
        if n else []


def _spot_advice(opts: PlanOptions, ctx: PlanContext, pools: list[PlannedPool]) -> list[SpotAdvice]:
    """The Spot verdict per planned pool, one model or a packing (spot.advise); a lab machine (--lab) has no Spot
    market, so no verdict for it."""
    from . import spot

    inputs = spot.load_spot_inputs(opts.spot_prices, opts.spot_interruptions, opts.spot_relaunch_s)
    return [spot.advise(spot.spot_pool(p), ctx, inputs) for p in pools if p.instance_type in catalog.instance_catalog()]


def _context(opts: PlanOptions, cfg: Any, tables: tuple[Prices, Availability, Latency, FixedCosts, QualityFile | None],
             warnings: list[str]) -> PlanContext:
    """What the method reads besides curves and traffic, one model or several: the SLO (flags over the config's),
    the tables, each region's floor (the config pool's capacity.min, or --min-instances) and the reservations;
    `warnings` gets the tables' age and any region launching into reservations --reserved does not size."""
    prices, availability, latency, fixed, quality = tables
    floors: dict[str, int] = {}
    sources: dict[str, str] = {}
    for region in cfg.regions if cfg is not None else []:
        pool = max(region.pools, key=lambda p: p.capacity.min)
        floors[region.region] = pool.capacity.min
        sources[region.region] = f"the config floor regions[{region.region}].pools[{pool.name}].capacity.min"
        if any(p.capacity_reservation_ids for p in region.pools) and not any(r == region.region for _, r in opts.reserved):
            warnings.append(f"regions[{region.region}] launches into capacity reservations; give their size "
                            "(--reserved TYPE@REGION=N) so the plan counts them as paid for")
    if opts.min_instances is not None:
        floors, sources = {}, {}
    warnings += _stale_tables(prices, fixed, opts.today or date.today())
    slo = Slo(opts.ttft_p99_ms if opts.ttft_p99_ms is not None else cfg.slo.ttft_p99_ms,
              opts.itl_p99_ms if opts.itl_p99_ms is not None else cfg.slo.itl_p99_ms,
              opts.error_rate if opts.error_rate is not None else (cfg.slo.error_rate if cfg else 0.01))
    return PlanContext(slo=slo, prices=prices, availability=availability, latency=latency, fixed=fixed,
                       quality=quality, quality_threshold=opts.quality_threshold, min_instances=floors,
                       default_min_instances=opts.min_instances if opts.min_instances is not None else 1,
                       reserved=dict(opts.reserved), min_instances_source=sources)


def _data_notes(ctx: PlanContext, results: str) -> list[str]:
    """Where the plan's inputs came from, dated."""
    notes = [f"prices as of {ctx.prices.as_of} ({ctx.prices.source})", f"availability as of {ctx.availability.as_of}",
             f"network latency as of {ctx.latency.as_of} ({ctx.latency.source})", f"fixed costs as of {ctx.fixed.as_of}",
             f"results: {results}"]
    if ctx.quality is not None:
        limit = ctx.quality_threshold if ctx.quality_threshold is not None else ctx.quality.threshold
        notes.append(f"quality: {ctx.quality.metric} <= {limit:g}")
    return notes


def _estimate_per_model(specs: list[str], cfg: FleetConfig | None, models: tuple[str, ...], curves: list[ModelCurve],
                        traffic: TrafficProfile) -> list[tuple[str, list[ModelCurve]]]:
    """--estimate for a fleet of several models: per model, roofline curves for the specs, calibrated on that model's
    solo curves (estimate.estimate_specs) at its traffic's lengths. Returns (what the estimator rests on, its
    curves as packing.ModelCurve) per model."""
    from .packing import ModelCurve

    out: list[tuple[str, list[ModelCurve]]] = []
    for model in models:
        measured = [c.candidate for c in curves if c.model == model and c.packing is None]
        entries = [t for t in traffic.consumers if t.model == model] or traffic.consumers
        family = cfg.model_by_id(model).family if cfg is not None else None
        estimated, estimator = estimate_specs(specs, measured, model, family, entries[0].input_mean,
                                              entries[0].output_mean)
        out.append((f"{model}: {estimator.describe()}", [ModelCurve(model, c) for c in estimated]))
    return out


@dataclass
class Planned:
    """A plan behind the one interface the command drives, whatever the number of models: the report, the
    simulation, the re-plan check, the config edit and its drift baseline. Every fleet is planned by the packing
    search (one model a packing of one), reported by packing_report."""

    result: PackingPlan
    ctx: PlanContext

    @property
    def served(self) -> bool:
        """Every consumer region has a choice."""
        return not self.result.unserved()

    def unserved(self) -> list[str]:
        return self.result.unserved()

    def consumers(self) -> list[ConsumerTraffic]:
        return self.result.consumers()

    def pools(self) -> list[PlannedPool]:
        """The planned pools, one per provider region used."""
        return self.result.planned_pools(self.ctx)

    def promise_writes(self, cfg: Any, allow_estimated: bool) -> None:
        """What --write-config will do, for the report: its refusals and notes."""
        from .writeback import write_config_notes

        self.result.write_notes = write_config_notes(cfg, self.pools(), allow_estimated)

    def render(self, as_json: bool) -> str:
        import json

        from . import packing_report

        return json.dumps(packing_report.to_json(self.result), indent=1) if as_json else \
            packing_report.render_terminal(self.result)

    def write_report(self, directory: str) -> list[Path]:
        from . import packing_report

        return packing_report.write_report(self.result, directory)

    def simulate(self, seed: int, candidates: list[str] | None, max_groups: int | None,
                 report: Path | None) -> tuple[list[str], bool]:
        """The planned pools (or the candidates named, by label as the report writes them) by simulation."""
        from .simulate import simulate_pools

        pools = [p for label in candidates for p in self.candidate_pools(label)] if candidates else self.pools()
        notes = [] if candidates else [f"{region}: nothing chosen; nothing to simulate" for region in self.unserved()]
        return simulate_pools(pools, self.ctx, seed, max_groups, report, notes, bool(candidates))

    def candidate_pools(self, label: str) -> list[PlannedPool]:
        """Each consumer region's best evaluation labelled `label`, as a pool serving that region alone."""
        found, known = self.result.candidate_pools(label, self.ctx)
        if not found:
            raise UserError(f"--candidate {label!r}: not a feasible candidate of this plan; one of: "
                            f"{'; '.join(sorted(known))}")
        return found

    def edit(self, path: str, allow_estimated: bool, write_schedule: bool, write_spot: bool) -> Any:
        """The config at `path` with this plan written in, validated (writeback.ConfigEdit); writes nothing."""
        from .writeback import compute_edit

        return compute_edit(path, self.pools(), self.unserved(), allow_estimated, write_schedule, self.result.spot,
                            write_spot)

    def baseline(self, config_path: str, cfg: Any, written: str) -> tuple[Path, str]:
        """(path, text) of the drift baseline for the config as written (`cfg`)."""
        import json

        from . import drift
        from .check import baseline_document
        from .writeback import pool_name_for

        # The config pool each planned pool was written to, as the write picks it (writeback.pool_for).
        regions = {r.region: r for r in cfg.regions}
        pools = self.pools()
        chosen = {p.region: pool_name_for(regions[p.region], p.instance_type.split(".")[0]) for p in pools
                  if p.region in regions}
        doc = baseline_document(pools, self.ctx, chosen, written, {m.id: [a.id for a in m.adapters] for m in cfg.models})
        return drift.baseline_path(config_path), json.dumps(doc, indent=1) + "\n"

    def write_notes(self, cfg: Any) -> list[str]:
        """Notes on the config as written: what each pool's target means for consumers' concurrency limits."""
        from .writeback import throttling_notes

        return throttling_notes(cfg, self.pools())


def plan_fleet(opts: PlanOptions, max_copies: int | None = None) -> Planned:
    """Plan the fleet `opts.config` describes, one model or several: the packing search (docs/plan.md), one model
    a packing of one."""
    packed, ctx, _ = build_packing(opts, max_copies=max_copies)
    return Planned(packed, ctx)
