"""Everything the planner reads besides the traffic profile: benchmark results,
prices, fixed costs, network latency, availability and quality results.

Each table is shipped, dated data (fleetcast/config/data/) that a file of the
same shape can override; loaders raise UserError naming the flag and field.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from ruamel.yaml.error import YAMLError

from fleetcast.config import catalog
from fleetcast.config.model import Precision
from fleetcast.contract.errors import UserError
from fleetcast.contract.network import PROVIDER_INTERFACE_ENDPOINTS

from .curves import REPEAT_MIN_SAMPLE_SHARE, Candidate, Curve, LoadPoint, spread_text, worst_of
from .traffic import validation_summary

if TYPE_CHECKING:
    from fleetcast.bench.schema import Results

DATA_DIR = catalog.DATA_DIR


def _read_yaml(path: Path, flag: str) -> Any:
    try:
        return catalog.parse_yaml(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{flag}: {path} does not exist") from None
    except YAMLError as exc:
        raise UserError(f"{flag}: {path} is not valid YAML/JSON: {exc}") from None


# ---------------------------------------------------------------- benchmark results


def load_candidates(paths: Sequence[str | Path], lab: dict[str, str] | None = None,
                    read: Callable[[str | Path], Results] | None = None) -> list[Candidate]:
    """One Candidate per (instance type, precision) found in the results files.

    Files for the same pair are merged by load level; a level measured more than
    once is sized from its worst repeat, its spread kept (curves.worst_of). Reference-backend results are refused outright:
    they come from a development stand-in, not from an AWS GPU. `lab` ({GPU: type},
    `fleetcast plan --lab`) is the exception the caller asks for: reference-backend
    results measured on that GPU without an instance type are read as that lab type. `read` reads a file (a
    caller that has read them already passes its reader: results_reader).
    """
    from fleetcast.bench.schema import load_results

    if not paths:
        raise UserError("--results: give at least one fleetcast bench results file")
    instances = catalog.instance_catalog()
    grouped: dict[tuple[str, str], dict[str, Any]] = {}
    for path in paths:
        results = (read or load_results)(path)
        labels = results.labels
        lab_type = (lab or {}).get(labels.gpu or "") if not labels.instance_type else None
        if lab_type is not None:
            labels = labels.model_copy(update={"instance_type": lab_type})
        elif labels.backend == "reference":
            raise UserError(
                f"--results: {path}: labels.backend is 'reference' (the development stand-in server); "
                "refused as an AWS candidate. Benchmark a tensorrt or pytorch endpoint on the instance type."
            )
        if not labels.instance_type:
            raise UserError(f"--results: {path}: labels.instance_type is missing; the planner needs the instance type measured "
                            "(fleetcast bench --label instance_type=g6e.xlarge)")
        if labels.instance_type not in instances and lab_type is None:
            raise UserError(f"--results: {path}: labels.instance_type {labels.instance_type!r} is not in the instance catalog; "
                            f"allowed: {', '.join(sorted(instances))}")
        allowed = sorted(p.value for p in Precision)
        if labels.precision not in allowed:
            raise UserError(f"--results: {path}: labels.precision {labels.precision!r} is not one of {', '.join(allowed)}")
        key = (labels.instance_type, labels.precision)
        slot = grouped.setdefault(key, {"runs": [], "sources": [], "backend": labels.backend, "model": labels.model,
                                        "provenance": set()})
        slot["sources"].append(str(path))
        slot["provenance"].add(results.provenance)
        if slot["model"] and labels.model and slot["model"] != labels.model:
            raise UserError(f"--results: {path}: labels.model {labels.model!r} differs from {slot['model']!r} in "
                            f"{slot['sources'][0]} for the same instance type and precision")
        for run in results.runs:
            slot["runs"].append((str(path), run))
        if results.interrupted:
            slot.setdefault("interrupted", []).append(f"{path}: the bench run was interrupted ({results.interrupted}); "
                                                      "its curve ends at the last level that finished")
    out = []
    for (instance_type, precision), slot in sorted(grouped.items()):
        points, notes, lengths = _points(slot["runs"])
        notes = slot.get("interrupted", []) + notes
        if not points:
            raise UserError(f"--results: {', '.join(slot['sources'])}: no usable run for {instance_type} {precision} "
                            f"({'; '.join(notes) or 'no runs'})")
        # How wide the repeats spread, said wherever the curve's notes are (both planners' warnings and reports).
        spread = spread_text(Curve(tuple(points)))
        notes += [spread] if spread else []
        out.append(Candidate(
            instance_type=instance_type, precision=precision, curve=Curve(tuple(points), tuple(notes)),
            backend=slot["backend"], model=slot["model"], sources=tuple(slot["sources"]),
            input_mean=lengths[0], output_mean=lengths[1],
            # One synthetic file makes the merged curve synthetic: it is no longer all measurement.
            provenance="synthetic" if "synthetic" in slot["provenance"] else "measured",
        ))
    return out


def _point(level: float, run: Any) -> LoadPoint:
    s = run.summary
    return LoadPoint(
        concurrency=level,
        ttft_p99=s.ttft_ms.p99, itl_p99=s.itl_ms.p99, e2e_mean=s.e2e_ms.mean,
        error_rate=s.error_rate, ttft_mean=s.ttft_ms.mean, itl_mean=s.itl_ms.mean, e2e_p99=s.e2e_ms.p99,
        ttft_p99_ci=tuple(s.ttft_ms.p99_ci) if s.ttft_ms.p99_ci else None,
        itl_p99_ci=tuple(s.itl_ms.p99_ci) if s.itl_ms.p99_ci else None,
        samples=s.ttft_ms.count, output_tps=s.output_throughput_tps, request_rps=s.request_throughput_rps,
        bench_rtt_ms=s.network_rtt_ms, records=tuple((r.ttft_ms, r.itl_ms, r.ok) for r in run.records),
        tail_note=s.ttft_ms.tail_note,
    )


def _points(runs: list[tuple[str, Any]]) -> tuple[list[LoadPoint], list[str], tuple[float, float]]:
    notes: list[str] = []
    usable = []
    for source, run in runs:
        s = run.summary
        level = run.load.concurrency if run.load.mode == "concurrency" else s.mean_concurrency
        if s.saturated:
            notes.append(f"{source}: run at load {level} skipped: client saturated ({s.saturation_reason or 'schedule lag'})")
            continue
        if not level or level <= 0 or s.ttft_ms.p99 is None or s.itl_ms.p99 is None or s.e2e_ms.mean is None:
            notes.append(f"{source}: run at load {level} skipped: no completed requests")
            continue
        usable.append((source, run, float(level)))
    if not usable:
        return [], notes, (0.0, 0.0)
    # Results may hold several length specs; every run must share one, or latencies are not comparable.
    specs = {(r.lengths.input_mean, r.lengths.output_mean) for _, r, _ in usable}
    if len(specs) > 1:
        counts: dict[tuple[float, float], int] = {}
        for _, r, _ in usable:
            key = (r.lengths.input_mean, r.lengths.output_mean)
            counts[key] = counts.get(key, 0) + 1
        keep = max(counts, key=lambda k: (counts[k], -k[0]))
        notes.append(f"runs at {len(specs)} length specs; kept input={keep[0]:g} output={keep[1]:g} ({counts[keep]} runs)")
        usable = [u for u in usable if (u[1].lengths.input_mean, u[1].lengths.output_mean) == keep]
    by_level: dict[float, list[Any]] = {}
    for _source, run, level in usable:
        by_level.setdefault(level, []).append(run)
    points = []
    for level, level_runs in by_level.items():
        # A level measured more than once is sized from its worst repeat (curves.worst_of); a run with far fewer
        # samples than the largest is not a repeat of equal standing and is left out, as before repeats counted.
        most = max(r.summary.ttft_ms.count for r in level_runs)
        kept = [r for r in level_runs if r.summary.ttft_ms.count >= REPEAT_MIN_SAMPLE_SHARE * most]
        if len(kept) < len(level_runs):
            times = "twice" if len(level_runs) == 2 else f"{len(level_runs)} times"
            notes.append(f"load {level:g} measured {times}; left out {len(level_runs) - len(kept)} "
                         f"run(s) with under {REPEAT_MIN_SAMPLE_SHARE:.0%} of the largest run's samples")
        points.append(worst_of([_point(level, r) for r in kept]))
    first = usable[0][1].lengths
    return points, notes, (first.input_mean, first.output_mean)


# ---------------------------------------------------------------- prices

# Past this age a dated price table is flagged in every output: AWS changes list prices.
PRICE_MAX_AGE_DAYS = 90


def stale_table_warning(what: str, as_of: str, today: date, update: str) -> str | None:
    """A warning when a table dated `as_of` (ISO date first) is older than PRICE_MAX_AGE_DAYS on `today`,
    or carries no date; None when it is recent."""
    try:
        dated = date.fromisoformat(as_of.split()[0][:10])
    except (ValueError, IndexError):
        return f"{what} carry no date ({as_of!r}): their age is unknown; {update}"
    age = (today - dated).days
    if age <= PRICE_MAX_AGE_DAYS:
        return None
    return f"{what} are {age} days old (as of {dated.isoformat()}, more than {PRICE_MAX_AGE_DAYS}): {update}"


@dataclass
class Prices:
    """On-demand $/hour per instance type and region."""

    table: dict[str, dict[str, float]]
    as_of: str
    source: str

    def price(self, instance_type: str, region: str) -> float | None:
        return self.table.get(instance_type, {}).get(region)

    def with_price(self, instance_type: str, region: str, value: float) -> Prices:
        table = {k: dict(v) for k, v in self.table.items()}
        table.setdefault(instance_type, {})[region] = value
        return Prices(table, self.as_of, self.source)


def shipped_prices() -> Prices:
    raw = _read_yaml(DATA_DIR / "instances.yaml", "instances.yaml")
    table = {name: dict(inst.price_per_hour) for name, inst in catalog.instance_catalog().items()}
    return Prices(table, str(raw.get("as_of", "unknown")), "shipped")


def load_prices(path: str | Path | None) -> Prices:
    """Shipped prices, overridden entry by entry by --prices FILE.

    FILE is either the instances.yaml shape (`instances: {type: {price: {region: usd}}}`)
    or a flat `prices: {type: {region: usd}}`, each with an `as_of` date.
    """
    prices = shipped_prices()
    if path is None:
        return prices
    raw = _read_yaml(Path(path), "--prices")
    if not isinstance(raw, dict) or not ({"prices", "instances"} & set(raw)):
        raise UserError(f"--prices: {path} must have a `prices: {{instance_type: {{region: usd_per_hour}}}}` mapping "
                        "(or the instances.yaml shape) and an `as_of` date")
    flat = raw.get("prices") or {name: spec.get("price", {}) for name, spec in (raw.get("instances") or {}).items()}
    table = {k: dict(v) for k, v in prices.table.items()}
    for name, regions in flat.items():
        if not isinstance(regions, dict):
            raise UserError(f"--prices: {path}: prices.{name} must map region -> USD per hour")
        for region, value in regions.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or math.isinf(value):
                raise UserError(f"--prices: {path}: prices.{name}.{region} = {value!r}; must be a positive number (USD per hour)")
            table.setdefault(name, {})[region] = float(value)
    return Prices(table, str(raw.get("as_of", "undated")), str(path))


# ---------------------------------------------------------------- fixed costs


class _RegionFixed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    nlb_hour: float = Field(ge=0, description="Network Load Balancer, USD per hour.")
    nlb_lcu_hour: float = Field(ge=0, description="NLB capacity unit (LCU), USD per LCU-hour.")
    endpoint_az_hour: float = Field(ge=0, description="Interface VPC endpoint, USD per AZ per hour.")
    endpoint_gb: float = Field(ge=0, description="Interface endpoint data processed, USD per GB.")
    inter_region_gb: float = Field(ge=0, description="Data transfer out of this region to another AWS region, USD per GB.")


class _Assumptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    bytes_per_input_token: float = Field(gt=0)
    bytes_per_output_token: float = Field(gt=0, description="Streamed: one SSE chunk per token.")
    bytes_per_request: float = Field(ge=0, description="HTTP headers, JSON envelope, final usage chunk.")
    new_connections_per_request: float = Field(ge=0, le=1)
    availability_zones: int = Field(ge=1, le=6)
    consumer_interface_endpoints: int = Field(ge=0, le=50)

    @property
    def provider_interface_endpoints(self) -> int:
        """What the provider stack creates for isolated subnets: not an assumption, so not in the table."""
        return len(PROVIDER_INTERFACE_ENDPOINTS)


class FixedCosts(BaseModel):
    """Per-region costs that do not scale with instance count (dated)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    as_of: str
    assumptions: _Assumptions
    regions: dict[str, _RegionFixed]

    def row(self, region: str) -> tuple[_RegionFixed, bool]:
        if region in self.regions:
            return self.regions[region], False
        return self.regions["default"], True

    def gb_per_request(self, input_tokens: float, output_tokens: float) -> tuple[float, float]:
        """(GB consumer -> service, GB service -> consumer) for one request."""
        a = self.assumptions
        envelope = a.bytes_per_request / 2
        return ((input_tokens * a.bytes_per_input_token + envelope) / 1e9,
                (output_tokens * a.bytes_per_output_token + envelope) / 1e9)

    def hourly(self, service_region: str, consumer_region: str, rps: float, gb: tuple[float, float]) -> float:
        """USD for one hour at `rps` requests per second (formula in docs/plan.md)."""
        a = self.assumptions
        svc, _ = self.row(service_region)
        con, _ = self.row(consumer_region)
        gb_in, gb_out = rps * 3600 * gb[0], rps * 3600 * gb[1]
        gb_hour = gb_in + gb_out
        # NLB LCU for TCP: the largest of 800 new flows/s, 100k active flows, 1 GB/hour processed.
        lcu = max(rps * a.new_connections_per_request / 800.0, gb_hour / 1.0)
        cost = svc.nlb_hour + lcu * svc.nlb_lcu_hour
        cost += a.provider_interface_endpoints * a.availability_zones * svc.endpoint_az_hour
        cost += a.consumer_interface_endpoints * a.availability_zones * con.endpoint_az_hour + gb_hour * con.endpoint_gb
        if service_region != consumer_region:
            # Inter-region transfer is billed by the region the bytes leave.
            cost += gb_in * con.inter_region_gb + gb_out * svc.inter_region_gb
        return cost


def load_fixed_costs(path: str | Path | None) -> FixedCosts:
    p = Path(path) if path else DATA_DIR / "fixed_costs.yaml"
    raw = _read_yaml(p, "--fixed-costs")
    try:
        table = FixedCosts.model_validate(raw)
    except ValidationError as exc:
        raise UserError(f"--fixed-costs: {p}: {validation_summary(exc)}") from None
    if "default" not in table.regions:
        raise UserError(f"--fixed-costs: {p}: regions.default is required (used for regions without their own row)")
    return table


# ---------------------------------------------------------------- latency


@dataclass
class Latency:
    """Round-trip ms between regions; same-region PrivateLink adds `same_region_ms`."""

    same_region_ms: float
    rtt: dict[frozenset[str], float]
    as_of: str
    source: str

    def between(self, a: str, b: str) -> float | None:
        if a == b:
            return self.same_region_ms
        return self.rtt.get(frozenset((a, b)))


def load_latency(path: str | Path | None) -> Latency:
    p = Path(path) if path else DATA_DIR / "network_latency.yaml"
    raw = _read_yaml(p, "--latency")
    if not isinstance(raw, dict) or not isinstance(raw.get("rtt_ms"), dict):
        raise UserError(f"--latency: {p} must have `same_region_ms` and `rtt_ms: {{region: {{region: ms}}}}`")
    same = raw.get("same_region_ms", 1.0)
    if not isinstance(same, (int, float)) or same < 0:
        raise UserError(f"--latency: {p}: same_region_ms must be a number >= 0, got {same!r}")
    rtt: dict[frozenset[str], float] = {}
    for a, row in raw["rtt_ms"].items():
        if not isinstance(row, dict):
            raise UserError(f"--latency: {p}: rtt_ms.{a} must map region -> milliseconds")
        for b, ms in row.items():
            if not isinstance(ms, (int, float)) or ms < 0:
                raise UserError(f"--latency: {p}: rtt_ms.{a}.{b} = {ms!r}; must be a number >= 0 (milliseconds)")
            rtt[frozenset((a, b))] = float(ms)
    return Latency(float(same), rtt, str(raw.get("as_of", "undated")), str(path) if path else "shipped")


# ---------------------------------------------------------------- availability


@dataclass
class Availability:
    """Which instance types each region offers: the shipped family table, or a live answer."""

    families: dict[str, frozenset[str]]
    as_of: str
    live_types: dict[str, frozenset[str]] = field(default_factory=dict)  # region -> types (live check)

    def offered(self, instance_type: str, region: str) -> bool:
        if region in self.live_types:
            return instance_type in self.live_types[region]
        return region in self.families.get(instance_type.split(".", 1)[0], frozenset())

    def regions_for(self, instance_type: str) -> set[str]:
        regions = set(self.families.get(instance_type.split(".", 1)[0], frozenset()))
        for region, types in self.live_types.items():
            (regions.add if instance_type in types else regions.discard)(region)
        return regions


def shipped_availability() -> Availability:
    return Availability(dict(catalog.availability()), catalog.availability_as_of())


# ---------------------------------------------------------------- quality


class QualityResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    precision: Precision
    value: float = Field(description="Degradation against the fp16 baseline, in the file's metric (higher is worse).")
    instance_type: str | None = Field(default=None, description="When the result is specific to one instance type.")
    model: str | None = Field(default=None, description="When the result is one model's (a fleet of several models: "
                                                        "a models[].id); absent: every model's.")


class QualityFile(BaseModel):
    """`fleetcast.quality/v1`: quality degradation per precision (e.g. perplexity delta in %)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    schema_id: str = Field(alias="schema", pattern=r"^fleetcast\.quality/v1$")
    metric: str = Field(min_length=1, description="e.g. perplexity_delta_pct, accuracy_drop_pct")
    threshold: float = Field(description="Largest tolerated degradation; a precision above it is excluded.")
    results: list[QualityResult] = Field(min_length=1)

    def verdict(self, instance_type: str, precision: str, threshold: float | None = None,
                model: str | None = None) -> tuple[bool | None, str]:
        """(passes, explanation); passes is None when nothing was measured for the precision (of `model`: its own
        results and those naming no model)."""
        limit = self.threshold if threshold is None else threshold
        rows = [r for r in self.results if r.precision.value == precision and r.instance_type in (None, instance_type)
                and r.model in (None, model)]
        if not rows:
            return None, f"no {self.metric} result for {precision}" + (f" of {model}" if model else "")
        worst = max(rows, key=lambda r: r.value)
        ok = worst.value <= limit
        op = "<=" if ok else ">"
        return ok, f"{self.metric} {worst.value:g} {op} threshold {limit:g}"


def load_quality(path: str | Path | None) -> QualityFile | None:
    if path is None:
        return None
    raw = _read_yaml(Path(path), "--quality")
    try:
        return QualityFile.model_validate(raw)
    except ValidationError as exc:
        raise UserError(f"--quality: {path}: {validation_summary(exc)}") from None
