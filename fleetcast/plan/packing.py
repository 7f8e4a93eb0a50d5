"""Several models per instance: the packing search (docs/plan.md, "Several models: the packing search").

For a fleet of several models the question is not only instance type x precision but which models share an
instance and how many copies each gets. For each consumer region (served from its own region; one model's
traffic also from the other regions a one-model plan serves it from: solver.service_regions) and each
instance type with results:

  1. candidates: every packing of the region's models (each model at each precision with a curve on that
     type that the support matrix allows, 1..max_copies copies) whose processes fit the GPU by the memory
     home (fleetcast/config/memory.py: weights at precision + per-process overhead + an even KV share),
     at most MAX_PROCESSES processes; the enumeration stops at MAX_PACKINGS per type (said in the notes);
  2. each model's process curve in that packing: the co-located curve measured on exactly that packing with
     its peers busy (bench results `packing`), else, for a packing of one process, its solo curve as
     measured under the pool's GPU sharing (never a curve of the other mode), else its solo curve under that
     mode's estimator (fleetcast/plan/estimate.py: `time_sliced`, or the calibrated MPS one): "estimated (solo
     curves)" / "estimated (solo curves, MPS)";
  3. per UTC hour, per model: the fewest processes meeting that model's P99 TTFT (its consumers' network
     included) / ITL / error SLO at its busiest-minute arrivals (queueing.instances_needed, the same
     service model as one-model plans), instances = max over models of ceil(processes / copies), at least
     the region's floor; a region whose traffic is one model's concurrency histogram sizes each packing of one
     process by the one-model histogram method instead (solver.size_from_histogram) and tries no more copies;
  4. cost = instances x price + the region's fixed costs (one NLB and endpoint set for the fleet);
     $ per 1M output tokens over every model's tokens.
The choice is the cheapest packing all of whose curves are measured (or synthetic: authored scenario
data); an estimated packing that would be cheaper is named in the notes, never chosen silently. The
comparison prices the same traffic as one model per pool (each model its own instances, one fleet's fixed
costs) and one model per fleet (each model its own fleet: its own NLB and endpoints).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetcast.config import catalog
from fleetcast.config.memory import PoolMemory, plan_pool
from fleetcast.config.model import EngineOverride, GpuSharing, Serve
from fleetcast.contract import support
from fleetcast.contract.errors import UserError
from fleetcast.contract.serving import GIB, MAX_PROCESSES

from .curves import Candidate, Curve
from .estimate import colocated, mps_calibration
from .queueing import Limits, Prediction, ServiceModel, Stream, max_safe_rate, model_for, occupancy, predict
from .sharing import (
    ESTIMATED as ESTIMATED_BY,
    MEASURED,
    MODE_WORDS,
    MPS,
    TIME_SLICING,
    is_estimated,
    is_measured_shared,
    pool_sharing,
    sharing_notes,
)
from .solver import (
    DayPart,
    HistogramDay,
    Option,
    PlanContext,
    PlannedPool,
    PoolDay,
    Served,
    Sizing,
    Slo,
    arrival_p99s,
    cheaper_estimates,
    cheaper_words,
    cost_words,
    deciding_constraints,
    fixed_by_hour,
    floor_tenth,
    loss_reason,
    lowest_load_refusal,
    output_shift,
    peak_notes,
    per_m_input,
    per_m_output,
    pick,
    pool_moves,
    pooled_histogram,
    pooled_hold,
    pooled_traffic,
    provider_side,
    safe_goodput,
    service_regions,
    size_day,
    size_from_histogram,
    stats_notes,
)
from .traffic import ConsumerTraffic, TrafficProfile

if TYPE_CHECKING:
    from fleetcast.bench.schema import Results
    from fleetcast.config.model import EngineSpec, FleetConfig

    from .spot import SpotAdvice

# What one plan's search shares between packings: service models by curve, estimated curves, the lab machines.
Cache = dict[Any, Any]

# Copies per model the search tries by default: two processes busy at once time-slice one GPU (no MPS), so
# a second copy adds queue slots, not throughput (docs/runtime.md, "Latency when both are busy").
DEFAULT_MAX_COPIES = 2
# Ruled-out packings of one reason whose own figures the report lists (the rest are counted).
RULED_OUT_SHOWN = 6
# Packings tried per instance type at most; past it the search stops and the notes say so.
MAX_PACKINGS = 2000
# A copy is planned only with at least this much KV cache (a design floor: the planner does not know a
# model's KV bytes per token, so it cannot check the KV against the curve's batch sizes).
MIN_KV_GIB = 1.0

# A co-located curve of this few levels interpolates ITL where it may climb steeply: the size of the gap it leaves
# is the one measured on the H200 example (tests/plan/test_packing.py, the H200 simulation).
SPARSE_LEVELS = 3
SPARSE_ITL_GAP = "which ran 4-12% below the simulation's P99 ITL on the H200 example (3 levels)"

MEASURED_COLOCATED = MEASURED[TIME_SLICING]  # a co-located curve measured time-sliced; MEASURED[MPS] under MPS
MEASURED_ALONE = "measured (one process)"
ESTIMATED = ESTIMATED_BY[TIME_SLICING]  # solo curves by the time-slicing rule; ESTIMATED_BY[MPS] by the MPS estimator
ROOFLINE = "estimated (roofline model)"  # --estimate: a curve no bench run backs (fleetcast/plan/estimate.py)


# ---------------------------------------------------------------- curves per model


@dataclass(frozen=True)
class ModelCurve:
    """One model's process curve on one instance type at one precision.

    `packing` is what shared the instance while it was measured, as sorted (model, copies) pairs; None: a
    solo measurement (the process alone on its GPU). `peers_busy`: the packing's other processes were busy
    during the runs (a co-located measurement); False: they were loaded but idle.
    """

    model: str
    candidate: Candidate
    packing: tuple[tuple[str, int], ...] | None = None
    peers_busy: bool = False
    kv_cache_gb: dict[str, float] | None = None  # the packing's KV budgets as measured (model -> GB each copy)
    # The packing's precisions as measured, sorted (model, precision) pairs: a co-located curve stands for a
    # packing only with every model at the precision it ran at. None: a solo measurement.
    precisions: tuple[tuple[str, str], ...] | None = None
    # How the packing's processes shared the GPU while measured (bench results packing.gpu_sharing); None: solo.
    sharing: str | None = None

    @property
    def instance_type(self) -> str:
        return self.candidate.instance_type

    @property
    def precision(self) -> str:
        return self.candidate.precision

    @property
    def colocated(self) -> bool:
        return self.packing is not None and self.peers_busy and sum(c for _, c in self.packing) > 1

    @property
    def kind(self) -> str:
        """Which of a model's curves this is, for the lines that name one (a model on one instance type and
        precision may have several: solo, alone beside idle peers under either mode, co-located under either)."""
        if self.packing is None:
            return "solo"
        mode = MODE_WORDS[self.sharing or TIME_SLICING]
        return f"co-located ({mode})" if self.colocated else f"alone, peers idle ({mode})"


def _packing_key(results: Any) -> tuple[tuple[str, int], ...] | None:
    packing = getattr(results, "packing", None)
    if packing is None:
        return None
    serves = packing.serves if hasattr(packing, "serves") else packing.get("serves", [])
    rows = [(s.model, s.copies) if hasattr(s, "model") else (s["model"], int(s.get("copies", 1))) for s in serves]
    return tuple(sorted(rows))


def _packing_precisions(path: str | Path, results: Any) -> tuple[tuple[str, str], ...] | None:
    """Each packed model's precision as the file records it (bench results revision 5); a model it does not
    record ran at the file's labels.precision (before revision 5 one label covered the whole run)."""
    packing = getattr(results, "packing", None)
    if packing is None:
        return None
    own = results.labels.precision
    mine = next((s.precision for s in packing.serves if s.model == results.labels.model), None)
    if mine is not None and own is not None and mine != own:
        raise UserError(f"--results: {path}: labels.precision {own!r} but its packing records {results.labels.model} "
                        f"at {mine!r}; one file, one precision per model")
    return tuple(sorted((s.model, s.precision or own) for s in packing.serves))


def _packing_kv(results: Any) -> dict[str, float] | None:
    packing = getattr(results, "packing", None)
    if packing is None:
        return None
    kv = {s.model: s.kv_cache_gb for s in packing.serves if s.kv_cache_gb is not None}
    return kv if len(kv) == len(packing.serves) else None


def _peers_busy(results: Any) -> bool:
    """Every run recorded its peers' load and every peer was busy (Run.peers: {model: concurrency})."""
    runs = list(results.runs)
    peers: list[Any] = [getattr(r, "peers", None) for r in runs]
    return bool(runs) and all(p for p in peers) and all(v and v > 0 for p in peers for v in p.values())


def load_model_curves(paths: Sequence[str | Path], models: tuple[str, ...], lab: dict[str, str] | None = None,
                      read: Callable[[str | Path], Results] | None = None) -> list[ModelCurve]:
    """One ModelCurve per (instance type, precision, model, packing, peers busy) in the results files.

    Each group goes through the one-model loader (inputs.load_candidates: the same refusals, merging and
    length checks), so a file that a one-model plan refuses is refused here in the same words. `read`: the plan's
    results_reader, if it has read the files already; each file is read once either way.
    """
    from fleetcast.bench.schema import results_reader

    from .inputs import load_candidates

    read = read or results_reader()
    groups: dict[tuple[Any, ...], list[str | Path]] = {}
    for path in paths:
        results = read(path)
        model = results.labels.model
        if model not in models:
            raise UserError(f"--results: {path}: labels.model {model!r} is not a model of the config; allowed: "
                            f"{', '.join(models)} (a results file of a fleet of several models names its model)")
        instance_type = results.labels.instance_type or (lab or {}).get(results.labels.gpu or "")
        kv = _packing_kv(results)
        key = (instance_type, results.labels.precision, model, _packing_key(results),
               _peers_busy(results), tuple(sorted(kv.items())) if kv else None, _packing_precisions(path, results),
               results.packing.sharing() if results.packing is not None else None)
        groups.setdefault(key, []).append(path)
    out = []
    for (_, _, model, packing, busy, kv, precisions, sharing), group in sorted(groups.items(),
                                                                              key=lambda kv: str(kv[0])):
        (candidate,) = load_candidates(group, lab, read)
        out.append(ModelCurve(model, candidate, packing, busy, dict(kv) if kv else None, precisions, sharing))
    return out


def curves_text(curves: list[ModelCurve]) -> str:
    """What backs the curves, counted: e.g. '6 synthetic solo curve(s), 2 measured co-located curve(s)'."""
    counts: dict[str, int] = {}
    for c in curves:
        what = ("estimated (roofline)" if c.candidate.estimated else
                "synthetic" if c.candidate.provenance == "synthetic" else "measured") + \
            (f" co-located ({MODE_WORDS[c.sharing or TIME_SLICING]})" if c.colocated else " solo") + \
            (" (reference backend, lab machine)" if c.candidate.backend == "reference" else "")
        counts[what] = counts.get(what, 0) + 1
    return ", ".join(f"{n} {what} curve(s)" for what, n in sorted(counts.items()))


def lab_instance(instance_type: str, lab: dict[str, str]) -> catalog.InstanceType | None:
    """A lab machine (`--lab GPU=TYPE`): one GPU of the catalog's GPU, no AWS availability, priced by --prices."""
    for gpu, name in lab.items():
        if name == instance_type:
            return catalog.InstanceType(name=name, gpu=catalog.gpu_by_name(gpu), gpus=1, vcpus=0, memory_gib=0,
                                        price_per_hour={})
    return None


def _instance(instance_type: str, lab: dict[str, str]) -> catalog.InstanceType | None:
    return catalog.instance_catalog().get(instance_type) or lab_instance(instance_type, lab)


# ---------------------------------------------------------------- the interference rule


def mean_step_ms(curve: Curve, level: float) -> float:
    """The curve's mean ITL (a decode step) at `level`, held at its ends."""
    p = curve.at(min(max(level, curve.points[0].concurrency), curve.points[-1].concurrency))
    return p.itl_mean if p.itl_mean is not None else p.itl_p99


def peer_steps(load: ModelLoad, instances_by_hour: list[int], cache: Cache) -> float:
    """What one process of `load` adds to each step of a process it shares the GPU with: over the day's
    hours, the largest busy share x mean step at its mean batch while busy, at the hour's busiest minute
    spread over the planned instances and copies (queueing.occupancy: the same chain the sizing uses)."""
    model = _models_of(cache, load.curve)
    rates, bursts = load.traffic.hourly_rps(), load.traffic.hourly_burstiness()
    worst = 0.0
    for h in range(24):
        if rates[h] <= 0:
            continue
        per_process = rates[h] * bursts[h] / (instances_by_hour[h] * load.copies)
        pmf = occupancy(model, per_process, load.traffic.output_mean)
        if pmf is None:
            return mean_step_ms(load.curve, load.curve.points[-1].concurrency)  # beyond its range: always busy
        busy = 1.0 - pmf[0]
        if busy <= 0:
            continue
        batch = sum(k * w for k, w in enumerate(pmf)) / busy
        worst = max(worst, busy * mean_step_ms(load.curve, batch))
    return worst


# ---------------------------------------------------------------- memory (the one home)


@dataclass(frozen=True)
class _PoolShape:
    """A pool the config does not hold yet: an instance type and what it serves, without engine overrides."""

    instance_type: str
    serves: tuple[Serve, ...] = ()
    engine: EngineOverride = field(default_factory=EngineOverride)
    gpu_sharing: GpuSharing = GpuSharing.TIME_SLICING  # under MPS the memory plan checks each client's limit too


def model_engine(cfg: FleetConfig, model_id: str) -> EngineSpec:
    """The engine a model is built with before any pool override: the fleet engine <- the model's."""
    shape: Any = _PoolShape("")  # duck-typed: a pool without overrides
    return cfg.engine_for(shape, model_id)


class _PackedFleet:
    """What memory.plan_pool reads of a config, for a packing the config does not hold yet."""

    def __init__(self, cfg: FleetConfig, precisions: dict[str, str]) -> None:
        self.models = cfg.models
        self._cfg = cfg
        self._precisions = precisions

    def serves_of(self, pool: _PoolShape) -> tuple[Serve, ...]:
        return pool.serves

    def engine_for(self, pool: _PoolShape, model_id: str) -> EngineSpec:
        # One engine per config, model and precision, made once: the search asks for it in every packing it tries.
        key = (id(self._cfg), model_id, self._precisions[model_id])
        known = _ENGINES.get(key)
        if known is None or known[0] is not self._cfg:
            if len(_ENGINES) >= 4096:
                _ENGINES.clear()
            engine = model_engine(self._cfg, model_id)
            known = _ENGINES[key] = (self._cfg, engine.model_copy(
                update={"precision": type(engine.precision)(self._precisions[model_id])}))
        return known[1]


# (id(config), model, precision) -> (the config, its engine at that precision): the config is held, so its id
# names it while it is here. EngineSpec is frozen.
_ENGINES: dict[tuple[int, str, str], tuple[FleetConfig, EngineSpec]] = {}


def packing_memory(cfg: FleetConfig, instance_type: str, packing: tuple[tuple[str, str, int], ...],
                   lab: dict[str, str] | None = None, kv_cache_gb: dict[str, float] | None = None,
                   sharing: str = TIME_SLICING) -> PoolMemory | None:
    """The memory plan of one instance serving `packing` ((model, precision, copies)): memory.plan_pool's.
    `kv_cache_gb` fixes budgets (model -> GB each copy, as a co-located measurement ran them); the others
    share what is left evenly."""
    kv = kv_cache_gb or {}
    shape = _PoolShape(instance_type, tuple(Serve(model=m, copies=c, kv_cache_gb=kv.get(m)) for m, _, c in packing),
                       gpu_sharing=GpuSharing(sharing))
    # Duck-typed: what plan_pool reads of a config and a pool, for a packing neither holds yet.
    fleet: Any = _PackedFleet(cfg, {m: p for m, p, _ in packing})
    pool: Any = shape
    return plan_pool(fleet, pool, _instance(instance_type, lab or {}))


MEMORY_RULE = "memory"  # PackingEval.ruled_by of a packing the memory check refused


def memory_check(cfg: FleetConfig | None, instance_type: str, packing: tuple[tuple[str, str, int], ...], lab: dict[str, str] | None = None,
                 kv_cache_gb: dict[str, float] | None = None, sharing: str = TIME_SLICING
                 ) -> tuple[PoolMemory | None, str | None]:
    """The planner's one memory check (a fuller memory model swaps in here): the instance's memory plan and, when
    the packing does not fit, why, its first clause the reason the report groups ruled-out packings by.

    A packing of one process keeps its engine's KV fraction, as the validator lets a one-model pool do, so it
    needs no model size; several processes split the GPU by the validator's arithmetic (memory.plan_pool), each
    copy with at least MIN_KV_GIB of KV cache. Without a config (a one-model plan from --ttft-p99-ms/--itl-p99-ms)
    a packing of one process is checked as a one-model plan is, by nothing: no engine or model size is known."""
    if cfg is None:
        return None, None if sum(c for *_, c in packing) == 1 else \
            ("memory: size unknown without a fleet config (models[].parameters_b), so several processes cannot be "
             "checked against the GPU")
    memory = packing_memory(cfg, instance_type, packing, lab, kv_cache_gb, sharing)
    if memory is None:
        return None, f"memory: {instance_type} is not in the instance catalog"
    if memory.process_count == 1:
        return memory, None if memory.fits is not False else \
            f"memory: the weights exceed the {memory.gpu}'s usable memory ({memory.arithmetic()})"
    if memory.fits is None:
        unknown = ", ".join(p.model_id for p in memory.processes if p.parameters is None)
        return memory, (f"memory: size unknown for {unknown} (models[].parameters_b), so several processes cannot be "
                        "checked against the GPU")
    if memory.fits is False:
        return memory, f"memory: exceeds the {memory.gpu}'s usable memory ({memory.arithmetic()})"
    short = [p.model_id for p in memory.processes if p.kv_bytes is not None and p.kv_bytes < MIN_KV_GIB * GIB]
    if short:
        return memory, (f"memory: under {MIN_KV_GIB:g} GiB of KV cache per copy ({', '.join(short)}: "
                        f"{memory.arithmetic()})")
    return memory, None


def kv_gib_written(kv_gib: float) -> float:
    """A KV budget in GiB as the config gets it: rounded down to 0.1 so the memory sum still fits (solver.floor_tenth).
    The budget comes back from whole bytes (int(kv_cache_gb x 2^30)), a hair under a budget already on the 0.1 grid
    (a measured packing's 2.3 GiB reads 2.29999...), which must stay 2.3, not drop to 2.2."""
    return floor_tenth(kv_gib)


# ---------------------------------------------------------------- evaluation


@dataclass
class ModelLoad:
    """One model's part of a packing in a region: its curve, source and the day's sizing."""

    model: str
    precision: str
    copies: int
    source: str  # MEASURED_COLOCATED, MEASURED_ALONE (or "synthetic ..."), ESTIMATED
    curve: Curve
    slo: Slo
    network_ms: float
    traffic: ConsumerTraffic
    processes_by_hour: list[int] = field(default_factory=list)
    predictions: list[Prediction | None] = field(default_factory=list)  # at the hour's busiest minute
    kv_gib: float | None = None
    sources: tuple[str, ...] = ()
    peer_step_ms: float = 0.0  # estimated: what the other processes add to each of its steps (interference rule)
    provenance: str = "measured"  # the results' provenance ("synthetic": authored data)
    results_output_mean: float | None = None  # the results' mean output length (the histogram method rescales E2E)
    results_input_mean: float | None = None  # the results' mean input length (the pick's notes compare the traffic's)
    results_source: str = "measured"  # the results' source as the pick's notes name it (curves.Candidate.source)
    histogram: HistogramDay | None = None  # sized by its traffic's concurrency histogram (size_packing), not arrivals
    # Pooled across regions: each member region's own traffic (`traffic` is their sum, solver.pooled_traffic), which
    # the Spot advice, `plan --check` and `plan simulate` read per region as for a one-model pool.
    members: tuple[ConsumerTraffic, ...] = ()

    @property
    def instances_by_hour(self) -> list[int]:
        return [math.ceil(n / self.copies) for n in self.processes_by_hour]

    @property
    def limits(self) -> Limits:
        """Its SLOs in-region: P99 TTFT less its consumers' network."""
        return Limits(self.slo.ttft_p99_ms - self.network_ms, self.slo.itl_p99_ms, self.slo.error_rate)

    @property
    def kv_cache_gb(self) -> float | None:
        """Each copy's KV budget as `--write-config` writes it and the report shows it (kv_gib_written)."""
        return None if self.kv_gib is None else kv_gib_written(self.kv_gib)

    def worst(self) -> tuple[float, float] | None:
        """(P99 TTFT incl. network, P99 ITL) at the day's worst planned minute; sized from a histogram, which has no
        minutes, the traffic-weighted figures."""
        if self.histogram is not None:
            return self.histogram.weighted_ttft_p99, self.histogram.weighted_itl_p99
        ps = [p for p in self.predictions if p is not None]
        if not ps:
            return None
        w = max(ps, key=lambda p: p.ttft_p99_ms)
        return w.ttft_p99_ms + self.network_ms, max(p.itl_p99_ms for p in ps)


@dataclass
class PackingEval(PoolDay):
    """One packing of one instance type serving one consumer region's models."""

    instance_type: str
    region: str
    loads: list[ModelLoad]
    memory: PoolMemory | None
    rejected: str | None = None
    price_per_hour: float = 0.0
    instances_by_hour: list[int] = field(default_factory=list)
    fixed_by_hour: list[float] = field(default_factory=list)
    cost_by_hour: list[float] = field(default_factory=list)  # the instances above any reservation, plus fixed costs
    cost_per_hour: float = 0.0
    usd_per_m_output: float = 0.0
    label_text: str = ""  # a packing the memory check refused before any model was loaded: what it was
    reserved_used: int = 0  # reserved instances (--reserved) this packing runs on, paid whatever the pick
    sharing: str = TIME_SLICING  # how its processes share the GPU (the pool's gpu_sharing, or plan --gpu-sharing)
    consumer_regions: tuple[str, ...] = ()  # pooled across regions (pool_across_regions); () serves `region` alone
    # The one-model table's figures (report.figure_cells), set by size_packing: the consumers' round trip for any
    # packing; for a packing of one model (one_model_figures) c*, the traffic-weighted P99s (the TTFT's 95% CI where
    # the curve has one) and goodput, per instance as a one-model candidate's are. None: not defined for several models.
    rtt_ms: float = 0.0
    max_load: float | None = None
    weighted_ttft_p99: float | None = None
    weighted_ttft_ci: tuple[float, float] | None = None
    weighted_itl_p99: float | None = None
    goodput_rps: float | None = None
    goodput_exact: bool = False
    # A packing of one model: per process, its SLO-safe arrival rate and what caps it (sized from arrivals), and the
    # highest measured level where it, not an SLO, capped the load (either method), as a one-model candidate has them.
    safe_rate_rps: float | None = None
    binding: str | None = None
    measured_cap: float | None = None
    # A packing of one model: what its figures rest on beyond the table (pick_notes), as a one-model candidate's.
    notes: list[str] = field(default_factory=list)
    # Pooled across regions: what each joining consumer region adds to the pool's cost per hour.
    marginal: dict[str, float] = field(default_factory=dict)
    # A fleet's pool: per consumer region it serves, per model, (P99 TTFT with that region's own network, P99 ITL)
    # at the pool's worst planned minute (member_checks).
    member_checks: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)

    @property
    def seconds_per_request(self) -> float:
        """Instance-seconds each request costs at the planned sizes (the histogram method's S(k); from arrivals, the
        instances of the hours with traffic over their requests), as a one-model candidate's."""
        if len(self.loads) == 1 and self.loads[0].histogram is not None:
            return self.loads[0].histogram.seconds_per_request
        rates = [sum(r) for r in zip(*(m.traffic.hourly_rps() for m in self.loads))]
        served = sum(rates)
        return sum(n for n, r in zip(self.instances_by_hour, rates) if r > 0) / served if served else 0.0

    @property
    def usd_per_m_input(self) -> float:
        """$ per 1M input tokens over every model's tokens (from the cost, which pooling recomputes)."""
        return per_m_input(self.cost_per_hour * 24, [m.traffic for m in self.loads])

    @property
    def estimated(self) -> bool:
        return any(is_estimated(m.source) or m.source == ROOFLINE for m in self.loads)

    @property
    def roofline(self) -> bool:
        return self.source == ROOFLINE

    @property
    def synthetic(self) -> bool:
        return any(m.source.startswith("synthetic") for m in self.loads)

    @property
    def source(self) -> str:
        if self.estimated:
            return ROOFLINE if any(m.source == ROOFLINE for m in self.loads) else ESTIMATED_BY[self.sharing]
        shared = next((m.source for m in self.loads if is_measured_shared(m.source)), None)
        if shared is not None:
            return shared
        return self.loads[0].source if self.loads else "measured"

    @property
    def packing_text(self) -> str:
        return " + ".join(f"{m.model} {m.precision} x{m.copies}" for m in self.loads) or self.label_text

    @property
    def label(self) -> str:
        # Under MPS a packing of several processes is another candidate than the same packing time-sliced.
        mode = " under MPS" if self.sharing == MPS and self.processes > 1 else ""
        # Served from a region none of its consumers is in, it says where, as a one-model candidate's label does.
        where = f" @ {self.region}" if self.consumer_regions and self.region not in self.consumer_regions else ""
        return f"{self.instance_type} [{self.packing_text}]{mode}{where}"

    @property
    def processes(self) -> int:
        return sum(m.copies for m in self.loads)

    def slo_use(self) -> float:
        """The largest share of its P99 TTFT or ITL SLO any model reaches at its worst planned minute."""
        use = 0.0
        for m in self.loads:
            worst = m.worst()
            if worst is not None:
                use = max(use, worst[0] / m.slo.ttft_p99_ms, worst[1] / m.slo.itl_p99_ms)
        return use

    def planned(self) -> PlannedPool:
        cache: Cache = {}
        serves = tuple(Served(m.model, m.precision, m.copies, m.kv_cache_gb, Sizing(
            _models_of(cache, m.curve), m.members or (m.traffic,), m.limits, m.network_ms,
            tuple(n * m.copies for n in self.instances_by_hour), tuple(m.processes_by_hour),
            tuple(m.predictions) if m.histogram is None else (None,) * 24, m.provenance == "synthetic", m.source,
            m.histogram is None, None if m.histogram is None else m.histogram.hold_ms,
            None if m.histogram is None else m.histogram.seconds_per_request)) for m in self.loads)
        return PlannedPool(self.region, self.consumer_regions or (self.region,), self.instance_type, self.label,
                           cost_words(self.cost_per_hour, self.usd_per_m_output),
                           serves, tuple(self.instances_by_hour), scaling_target(self), self.estimated,
                           # One process of one model is written as a one-model pool is (its precision on the pool).
                           packed=self.processes > 1,
                           price_per_hour=self.price_per_hour, cost_per_hour=self.cost_per_hour)

    def worst_ttft(self, ctx: PlanContext) -> tuple[float, float]:
        rows = [(w[0], m.slo.ttft_p99_ms) for m in self.loads if (w := m.worst()) is not None]
        return min(rows, key=lambda r: r[1] - r[0]) if rows else (0.0, ctx.slo.ttft_p99_ms)

    def latency_rank(self) -> float:
        return round(self.slo_use(), 3)

    def latency_words(self) -> tuple[str, str]:
        return "the largest share of a P99 SLO at the worst planned minute", f"{self.slo_use():.0%}"


def _source_of(mc: ModelCurve, processes: int, sharing: str = TIME_SLICING) -> str:
    if mc.candidate.estimated:
        return ROOFLINE
    base = "synthetic (authored data, not measured)" if mc.candidate.provenance == "synthetic" else None
    if mc.colocated:
        return base or MEASURED[mc.sharing or TIME_SLICING]
    if processes == 1:
        return base or MEASURED_ALONE  # measured alone on its GPU (a packed file's peers idle: loaded, not busy)
    return ESTIMATED_BY[sharing]


def _model(t: ConsumerTraffic) -> str:
    assert t.model is not None  # a several-model profile names each entry's model (TrafficProfile.checked_against)
    return t.model


def _slo_for(cfg: FleetConfig | None, model_id: str, fleet: Slo) -> Slo:
    own = cfg.model_by_id(model_id).slo if cfg is not None else None
    return Slo(own.ttft_p99_ms, own.itl_p99_ms, own.error_rate) if own is not None else fleet


def _network_ms(curve: Curve, consumer: str, service: str, ctx: PlanContext) -> float:
    last = curve.points[-1]
    bench = last.bench_rtt_ms if last.bench_rtt_ms is not None else ctx.latency.same_region_ms
    between = ctx.latency.between(consumer, service)
    assert between is not None  # only offered, priced, reachable regions are planned
    return between - bench


def _models_of(curve_cache: Cache, curve: Curve) -> ServiceModel:
    key = id(curve)
    if key not in curve_cache:
        curve_cache[key] = (curve, model_for(curve))
    model: ServiceModel = curve_cache[key][1]
    return model


def size_packing(ev: PackingEval, ctx: PlanContext, n_min: int, cache: Cache, histogram: bool = False) -> PackingEval:
    """Steps 3-4 for one packing: the one sizing from arrivals (solver.size_day) over its models' processes; with
    `histogram` (its region's traffic is one model's concurrency histogram), a packing of one process is sized by the
    one-model histogram method (solver.size_from_histogram), which that histogram describes."""
    price = ctx.prices.price(ev.instance_type, ev.region)
    assert price is not None  # _offer_refusal refused a type without one
    ev.price_per_hour = price
    if ev.loads:
        ev.rtt_ms = ctx.latency.between(ev.loads[0].traffic.region, ev.region) or 0.0
    if histogram and ev.processes == 1:
        return _size_from_histogram(ev, ctx, price, n_min)
    parts = [DayPart(_models_of(cache, ld.curve), ld.traffic, ld.limits, ld.copies, ld.members) for ld in ev.loads]
    day = size_day(parts, ev.instance_type, ev.region, price, ctx, n_min)
    if isinstance(day, int):
        load, model = ev.loads[day], parts[day].model
        p1 = predict(model, [Stream(1e-6, load.traffic.output_mean)], 1.0)
        peers = (f", its peers adding {load.peer_step_ms:.1f} ms to each of its steps at their planned load"
                 if load.peer_step_ms else "")
        ev.rejected = (f"{load.model} ({load.source}) fails its SLO even with one request per process"
                       f"{peers}: predicted P99 TTFT {p1.ttft_p99_ms + load.network_ms:.0f} ms (incl. "
                       f"{load.network_ms:.0f} ms network) vs {load.slo.ttft_p99_ms:g}, P99 ITL "
                       f"{p1.itl_p99_ms:.1f} ms vs {load.slo.itl_p99_ms:g}")
        return ev
    for load, needed, predictions in zip(ev.loads, day.needed, day.predictions):
        load.processes_by_hour, load.predictions = needed, predictions
    ev.instances_by_hour, ev.fixed_by_hour, ev.reserved_used = day.instances_by_hour, day.fixed_by_hour, day.reserved_used
    ev.cost_per_hour, ev.cost_by_hour = day.cost_per_hour, day.cost_by_hour
    ev.usd_per_m_output = per_m_output(sum(day.cost_by_hour), [ld.traffic for ld in ev.loads])
    if len(ev.loads) == 1:
        _one_model_figures(ev, cache)
        ev.notes = pick_notes(ev, ctx)
    return ev


def why_not_reason(ev: PackingEval, win: PackingEval) -> str:
    """Why `ev` is not the pick, one model or several: an estimate that ranks first is not chosen (cheaper_words);
    else solver.loss_reason, the one wording, with a histogram-sized packing's SLO-capped load."""
    if ev.estimated and ev.rank_key() < win.rank_key():
        return cheaper_words(ev, win)
    day = ev.loads[0].histogram if len(ev.loads) == 1 else None
    capped = (f"{day.first_failure.text()} caps its load at {day.target:g} in-flight requests per instance, while "
              f"{day.share_above_target:.0%} of {ev.loads[0].traffic.region}'s requests run at higher levels"
              if day is not None and day.first_failure and day.share_above_target > 0 else None)
    return loss_reason(ev, win, cap=ev.measured_cap, capped=capped,
                       held=(ev.seconds_per_request, win.seconds_per_request), regions=(ev.region, win.region),
                       fixed=(sum(ev.fixed_by_hour) / 24, sum(win.fixed_by_hour) / 24))


def pick_notes(ev: PackingEval, ctx: PlanContext) -> list[str]:
    """A feasible packing of one model: what its figures rest on beyond the table (docs/plan.md, "Reading the
    report"): results at other lengths than the traffic's, the histogram day's notes, a load capped by the measured
    range rather than an SLO, a roofline estimate, the quality verdict."""
    (load,) = ev.loads
    t, src, notes = load.traffic, load.results_source, []
    if output_shift(load.results_output_mean, t):
        notes.append(f"{src} results at {load.results_output_mean:g} output tokens, traffic averages "
                     f"{t.output_mean:g}: E2E rescaled by the results' mean ITL")
    if load.results_input_mean and abs(t.input_mean - load.results_input_mean) > 0.25 * load.results_input_mean:
        notes.append(f"{src} results at {load.results_input_mean:g} input tokens, traffic averages "
                     f"{t.input_mean:g}: TTFT may not transfer; benchmark at the traffic's lengths")
    if load.histogram is not None:
        notes += load.histogram.notes
    elif ctx.fixed.row(ev.region)[1]:
        notes.append(f"no fixed-cost row for {ev.region}: the default row is used")
    if ev.measured_cap is not None:
        notes.append(f"measured only up to concurrency {ev.measured_cap:g}, where it still meets every SLO: the "
                     "plan keeps its instances within that range, so it may need fewer instances than planned; "
                     f"benchmark it above {ev.measured_cap:g}")
    if ev.roofline:
        notes.append("estimated by the roofline model, not measured: benchmark it before deploying")
    if ctx.quality is not None:
        ok, why = ctx.quality.verdict(ev.instance_type, load.precision, ctx.quality_threshold, model=load.model)
        notes.append(f"quality not checked: {why}" if ok is None else f"quality: {why}")
    return notes


def _one_model_figures(ev: PackingEval, cache: Cache) -> None:
    """A packing of one model sized from arrivals: the figures the one-model candidates table gives, per
    instance: c* the in-flight count at the SLO-safe rate, goodput that rate less the predicted
    errors and a 2% margin, each times the copies; the P99s at each hour's busiest minute weighted by its requests."""
    (load,) = ev.loads
    model = _models_of(cache, load.curve)
    safe = max_safe_rate(model, load.traffic.output_mean, load.limits)
    if safe is not None:
        rate, at_safe, ev.binding = safe
        ev.safe_rate_rps = rate
        ev.measured_cap = model.top if ev.binding == "measured range" else None
        ev.max_load = round(at_safe.in_flight * load.copies, 1)
        ev.goodput_rps = safe_goodput(model, rate, load.traffic.output_mean) * load.copies
    ev.weighted_ttft_p99, ev.weighted_itl_p99 = arrival_p99s(load.traffic.hourly_rps(), load.predictions,
                                                             load.network_ms)


def _size_from_histogram(ev: PackingEval, ctx: PlanContext, price: float, n_min: int) -> PackingEval:
    (load,) = ev.loads
    t = load.traffic
    rtt = ctx.latency.between(t.region, ev.region)
    assert rtt is not None  # only offered, priced, reachable regions are planned
    day = size_from_histogram(load.curve, t, load.slo, rtt, output_shift(load.results_output_mean, t),
                              ev.instance_type, ev.region, price, ctx, n_min)
    if day.max_load is None:
        assert day.first_failure is not None
        ev.rejected = f"{load.model} ({load.source}) {lowest_load_refusal(day.first_failure)}"
        return ev
    load.histogram, load.processes_by_hour, load.predictions = day, day.needed_by_hour, []
    ev.instances_by_hour, ev.fixed_by_hour, ev.reserved_used = day.instances_by_hour, day.fixed_by_hour, day.reserved_used
    ev.cost_per_hour, ev.usd_per_m_output, ev.cost_by_hour = day.cost_per_hour, day.usd_per_m_output, day.cost_by_hour
    ev.max_load, ev.weighted_ttft_p99, ev.weighted_ttft_ci = day.max_load, day.weighted_ttft_p99, day.weighted_ttft_ci
    ev.weighted_itl_p99, ev.goodput_rps, ev.goodput_exact = day.weighted_itl_p99, day.goodput_rps, day.goodput_exact
    ev.measured_cap = day.measured_cap
    ev.notes = pick_notes(ev, ctx)
    return ev


# ---------------------------------------------------------------- the search


@dataclass
class Alternative:
    """A way to serve the region's models without packing them, priced on the same traffic."""

    name: str  # "one model per pool" / "one model per fleet"
    parts: list[PackingEval]  # one single-model evaluation per model
    instance_cost_per_hour: float
    fixed_cost_per_hour: float
    usd_per_m_output: float

    @property
    def cost_per_hour(self) -> float:
        return self.instance_cost_per_hour + self.fixed_cost_per_hour

    @property
    def estimated(self) -> bool:
        return any(p.estimated for p in self.parts)


@dataclass
class RegionPacking:
    region: str
    traffic: list[ConsumerTraffic]  # one entry per model
    evaluations: list[PackingEval]
    ranked: list[PackingEval]
    winner: PackingEval | None
    alternatives: list[Alternative] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    not_offered: list[str] = field(default_factory=list)  # instance types with results not offered in the region
    # (instance type, or model precision on type, why it cannot serve: no region reached offers it, or the support
    # matrix refuses it)
    refused: list[tuple[str, str]] = field(default_factory=list)
    decided_by: list[str] = field(default_factory=list)  # a floor or reservation, not the traffic, decided the pick
    # The pick without that floor or reservation, by label: "without ... it would win" (its why-not says so).
    wins_without: dict[str, str] = field(default_factory=dict)
    # One model's region: the one-model report's notes (solver.peak_notes / stats_notes) over its types x precisions.
    peak_notes: list[str] = field(default_factory=list)
    stats_notes: list[str] = field(default_factory=list)

    def why_not(self) -> list[tuple[str, str]]:
        """Each other way to serve at its best packing and why it lost (loss_reason): for one model each instance type
        x precision, as its candidates are; for several each instance type; and each GPU sharing."""
        if self.winner is None:
            return []
        one = len(self.traffic) == 1

        def option(e: PackingEval) -> tuple[str, ...]:
            return (e.instance_type, e.sharing) + ((e.loads[0].precision,) if one and e.loads else ())

        w, out, seen = self.winner, [], {option(self.winner)}
        for e in self.ranked:
            if option(e) in seen:
                continue
            seen.add(option(e))
            why = why_not_reason(e, w)
            out.append((e.label, f"{why}; {self.wins_without[e.label]}" if e.label in self.wins_without else why))
        return out

    def ruled_out(self) -> list[tuple[str, str]]:
        """What cannot serve, grouped by reason (docs/plan.md, "Reading the packing report"), one line per group:
        instance types no region its consumers reach offers, then infeasible packings, most first. A memory refusal
        groups by its whole reason before the arithmetic (which limit); another by its first clause, each member's own
        figures after it (the first RULED_OUT_SHOWN)."""
        groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for itype, reason in self.refused:
            groups.setdefault(("candidate", reason.split(" (")[0]), []).append((itype, reason))
        for e in self.evaluations:
            if not e.feasible:
                reason = e.rejected or ""
                key = reason.split(" (")[0] if reason.startswith("memory:") else reason.split(":")[0].split(",")[0]
                groups.setdefault(("packing", key), []).append((e.label, reason))
        out = []
        for (noun, head), items in sorted(groups.items(), key=lambda kv: (kv[0][0] == "packing", -len(kv[1]))):
            if noun != "packing" and len(items) == 1:
                out.append(items[0])
                continue
            # One sentence with each member's own figures after its last colon (an SLO refusal's P99 at its lowest
            # load): the sentence once, then each member's figures; a memory sum is too long to repeat.
            split = [reason.rsplit(": ", 1) for _, reason in items]
            if head.startswith("memory:") or len({p[0] for p in split}) > 1 or len({p[-1] for p in split}) == 1:
                out.append((f"{len(items)} {noun}(s)", f"{items[0][1]} (e.g. {items[0][0]})"))
                continue
            shown = "; ".join(f"{label}: {p[-1]}" for (label, _), p in zip(items[:RULED_OUT_SHOWN], split))
            more = f"; and {len(items) - RULED_OUT_SHOWN} more" if len(items) > RULED_OUT_SHOWN else ""
            out.append((f"{len(items)} {noun}(s)", f"{split[0][0]}: {shown}{more}"))
        return out

    def unpacked(self) -> list[str]:
        """With no packing chosen: what not packing would cost, as computed (none when some model has no choice)."""
        return [f"{alt.name}: ${alt.cost_per_hour:.2f}/h (${alt.usd_per_m_output:.3f} per 1M output tokens"
                + (", estimated" if alt.estimated else "") + f"; {', '.join(p.label for p in alt.parts)}; "
                f"{sum(sum(p.instances_by_hour) for p in alt.parts)} instance-hours/day)" for alt in self.alternatives]

    def savings(self) -> list[str]:
        """Where the choice's saving against each alternative comes from: instances, fixed costs."""
        if self.winner is None:
            return []
        w = self.winner
        w_inst = sum(w.instances_by_hour) * w.price_per_hour / 24
        w_fixed = sum(w.fixed_by_hour) / 24
        out = []
        for alt in self.alternatives:
            hours = sum(sum(p.instances_by_hour) for p in alt.parts)
            total = alt.cost_per_hour - w.cost_per_hour
            head = (f"vs {alt.name} (${alt.cost_per_hour:.2f}/h, ${alt.usd_per_m_output:.3f} per 1M output tokens"
                    + (", estimated" if alt.estimated else "") + "): ")
            if abs(total) < 0.005:
                head += "the same cost"
            elif total > 0:
                head += f"the packing saves ${total:.2f}/h"
            else:
                head += f"the packing costs ${-total:.2f}/h more"
            sets = 1 if alt.name == "one model per pool" else len(alt.parts)
            out.append(f"{head}; instances ${w_inst:.2f}/h vs ${alt.instance_cost_per_hour:.2f}/h "
                       f"({w.instance_hours} vs {hours} instance-hours/day), fixed costs ${w_fixed:.2f}/h vs "
                       f"${alt.fixed_cost_per_hour:.2f}/h (NLB, endpoints, LCUs of one fleet vs "
                       f"{'one fleet' if sets == 1 else f'{sets} fleets'})")
        return out


@dataclass
class PackingPlan:
    traffic_name: str
    models: tuple[str, ...]
    regions: list[RegionPacking]
    warnings: list[str] = field(default_factory=list)
    data_notes: list[str] = field(default_factory=list)
    max_copies: int = DEFAULT_MAX_COPIES
    spot: list[SpotAdvice] = field(default_factory=list)  # per chosen packing
    # The fleet's pools: each region's choice, a consumer region pooled onto another's where that is cheaper.
    pools: list[PackingEval] = field(default_factory=list)
    joins: list[str] = field(default_factory=list)  # what each pooling move saves, for the report
    write_notes: list[tuple[bool, str]] = field(default_factory=list)  # writeback.write_config_notes: (refuses, text)
    estimator: str | None = None  # --estimate: what the roofline estimates rest on, per model

    @property
    def cost_per_hour(self) -> float:
        return sum(p.cost_per_hour for p in self.pools)

    def alternative_cost(self, name: str) -> float:
        return sum(a.cost_per_hour for r in self.regions for a in r.alternatives if a.name == name)

    # The interface run.Planned drives.
    def unserved(self) -> list[str]:
        return [r.region for r in self.regions if not r.winner]

    def winners(self) -> list[tuple[PackingEval, str]]:
        """Each consumer region's own choice and the region serving it."""
        return [(r.winner, r.winner.region) for r in self.regions if r.winner is not None]

    def consumers(self) -> list[ConsumerTraffic]:
        return [t for r in self.regions for t in r.traffic]

    def planned_pools(self, ctx: PlanContext) -> list[PlannedPool]:
        return [p.planned() for p in self.pools]

    def candidate_pools(self, label: str, ctx: PlanContext) -> tuple[list[PlannedPool], set[str]]:
        """(each region's feasible packing labelled `label`, as a pool serving that region alone, every feasible
        label)."""
        return ([e.planned() for r in self.regions for e in r.ranked if e.label == label],
                {e.label for r in self.regions for e in r.ranked})



def _engine_support(cfg: FleetConfig | None, model: str, curves: list[ModelCurve], instance_type: str,
                    precision: str) -> tuple[str | None, str]:
    """(backend, KV-cache dtype) the support matrix checks a model's precision with: its engine in the config; without
    a config, the results' backend where it is one the matrix knows and the default KV-cache dtype."""
    if cfg is not None:
        engine = model_engine(cfg, model)
        return engine.backend.value, engine.kv_cache_dtype.value
    backend = next((c.candidate.backend for c in curves if c.model == model and c.instance_type == instance_type
                    and c.precision == precision), None)
    return (backend if backend in support.BACKENDS else None), "auto"


def _options(curves: list[ModelCurve], model: str, instance_type: str, cfg: FleetConfig | None,
             family_of: Callable[[str], str | None],
             lab: dict[str, str], ctx: PlanContext | None = None, notes: list[str] | None = None,
             refused: list[tuple[str, str]] | None = None) -> list[str]:
    """Precisions with a solo or co-located curve of `model` on `instance_type` that the support matrix allows (with
    the model's own backend and KV-cache dtype) and that pass `model`'s quality check (--quality: per model and
    precision); a failed check goes to `notes`, a support-matrix refusal to `refused` (label, reason). A precision that needs a calibration set stays a candidate, as in a
    one-model plan: --write-config refuses it until one is staged (writeback.calibration_use, the one rule)."""
    instance = _instance(instance_type, lab)
    out = []
    for prec in sorted({c.precision for c in curves if c.model == model and c.instance_type == instance_type}):
        if ctx is not None and ctx.quality is not None:
            ok, why = ctx.quality.verdict(instance_type, prec, ctx.quality_threshold, model=model)
            if ok is False:
                if notes is not None:
                    notes.append(f"{model} {prec} on {instance_type}: ruled out: quality check failed: {why}")
                continue
        backend, kv_dtype = _engine_support(cfg, model, curves, instance_type, prec)
        assert instance is not None  # a catalog type or a lab machine: the curves were read for it
        refusal = support.check(family_of(model), backend, prec, kv_dtype, instance.gpu.arch,
                                support.instance_where(instance_type, instance.gpu.name, instance.gpu.arch))
        if refusal is None:
            out.append(prec)
        elif refused is not None:
            refused.append((f"{model} {prec} on {instance_type}", f"{refusal.reason}; the config validator would "
                                                                  "refuse it"))
    return out


def _curve_for(curves: list[ModelCurve], model: str, instance_type: str, precision: str,
               key: tuple[tuple[str, int], ...], precisions: tuple[tuple[str, str], ...], sharing: str = TIME_SLICING
               ) -> tuple[ModelCurve | None, ModelCurve | None]:
    """(co-located curve measured on exactly this packing, every model at its precision, with peers busy, under
    the GPU sharing `sharing` (a curve of the other mode is never used), best solo-like curve).

    The solo-like curve is the process alone on its GPU, else alone with its peers loaded and idle and no MPS
    daemon, else alone as an MPS client: what one process per GPU measures, and what both estimators stretch
    (the MPS estimator is calibrated against solo figures without a daemon: data/gpu_sharing.yaml)."""
    mine = [c for c in curves if c.model == model and c.instance_type == instance_type and c.precision == precision]
    coloc = next((c for c in mine if c.colocated and c.packing == key and c.precisions == precisions
                  and (c.sharing or TIME_SLICING) == sharing), None)
    solo = (next((c for c in mine if c.packing is None), None)
            or next((c for c in mine if not c.colocated and c.sharing != MPS), None)
            or next((c for c in mine if not c.colocated), None))
    return coloc, solo


def plan_packing(cfg: FleetConfig | None, curves: list[ModelCurve], profile: TrafficProfile, ctx: PlanContext, *,
                 max_copies: int = DEFAULT_MAX_COPIES, fleet_slo: Slo | None = None,
                 lab: dict[str, str] | None = None, gpu_sharing: str | None = None,
                 models: tuple[str, ...] | None = None) -> PackingPlan:
    """Search every consumer region's packings; the choice per region, priced against not packing (and, where it
    plans under MPS, against the same region time-sliced). `gpu_sharing` plans every pool under that mode. Without a
    config (`cfg` None) `models` names the one model the results measured (run.build_packing)."""
    fleet_slo = fleet_slo or ctx.slo
    models = tuple(m.id for m in cfg.models) if cfg is not None else tuple(models or ())
    families = {m.id: m.family.value for m in cfg.models} if cfg is not None else {}
    regions: dict[str, list[ConsumerTraffic]] = {}
    for entry in profile.consumers:
        regions.setdefault(entry.region, []).append(entry)
    out = []
    cache: Cache = {"lab": dict(lab or {})}
    left = dict(ctx.reserved)
    for region, entries in regions.items():
        entries = sorted(entries, key=lambda t: models.index(t.model))
        # Each region's own choice sees only the reservation the regions before it left (claim_reserved).
        own = replace(ctx, reserved=dict(left))
        plan = _plan_region(cfg, curves, region, entries, own, fleet_slo, max_copies, families, cache,
                            gpu_sharing)
        if plan.winner is not None:
            decided = _decided_by(plan, plan.winner, cfg, curves, own, fleet_slo, max_copies, families,
                                  cache["lab"], gpu_sharing)
            plan.decided_by = [note for _, note, _ in decided]
            plan.wins_without = {label: text for label, _, text in decided}
        if any(e.sharing == MPS for e in plan.evaluations):
            sliced = _plan_region(cfg, curves, region, entries, own, fleet_slo, max_copies, families, cache,
                                  TIME_SLICING)
            plan.alternatives += _time_sliced_alternative(sliced)
        if plan.winner is not None:
            claim_reserved(left, plan.winner)
        out.append(plan)
    result = PackingPlan(profile.name, models, out, max_copies=max_copies)
    pool_across_regions(result, cfg, curves, ctx, fleet_slo, cache)
    left = dict(ctx.reserved)
    result.pools = [claim_reserved(left, p) for p in result.pools]
    return result


def claim_reserved(left: dict[tuple[str, str], int], ev: PackingEval) -> PackingEval:
    """The one rule by which a reservation (--reserved) is counted once in a plan: `ev` (a region's own choice, or a
    pool of the fleet) is priced with only the instances of its type and region that `left` still holds, up to its
    peak, and takes them from `left`. Reserved instances are billed at the On-Demand rate whether used or not (AWS,
    "Capacity Reservation pricing and billing"): sunk, so each evaluation prices only the instances beyond its share,
    and two regions or two pools never both count the same instances as free (docs/plan.md, "Pooling across
    regions"). Returns `ev` where its share is what it was priced with, else a re-priced copy."""
    at = (ev.instance_type, ev.region)
    share = min(left.get(at, 0), max(ev.instances_by_hour, default=0))
    if at in left:
        left[at] -= share
    if share == ev.reserved_used:
        return ev
    cost = [max(n - share, 0) * ev.price_per_hour + f for n, f in zip(ev.instances_by_hour, ev.fixed_by_hour)]
    return replace(ev, cost_by_hour=cost, cost_per_hour=sum(cost) / 24, reserved_used=share,
                   usd_per_m_output=per_m_output(sum(cost), [ld.traffic for ld in ev.loads]))


def _decided_by(plan: RegionPacking, winner: PackingEval, cfg: FleetConfig | None, curves: list[ModelCurve], ctx: PlanContext,
                fleet_slo: Slo, max_copies: int, families: dict[str, str], lab: dict[str, str],
                gpu_sharing: str | None) -> list[tuple[str, str, str]]:
    """What a floor or a reservation decided in this region's pick (solver.deciding_constraints): (the pick without
    it, by label; the note for the region; the text for that pick's why-not)."""
    def replan(alt_ctx: PlanContext) -> PackingEval | None:
        return _plan_region(cfg, curves, plan.region, plan.traffic, alt_ctx, fleet_slo, max_copies, families,
                            {"lab": lab}, gpu_sharing, alternatives=False).winner

    return [(alt.label, note, text) for alt, note, text in deciding_constraints(ctx, winner, replan, lambda e: e.label,
                                                                                lambda e: e.region)]


def _pooled(cfg: FleetConfig | None, curves: list[ModelCurve], pool: PackingEval, members: list[RegionPacking],
            ctx: PlanContext, fleet_slo: Slo, cache: Cache) -> PackingEval | None:
    """`pool`'s packing in its region serving every member region's models (the same model set): each model's
    processes sized for the members' summed busiest minutes within its SLO less the farthest member's network; the
    fixed costs each member's, the provider side (NLB hour, provider endpoints) paid once."""
    service = pool.region
    if any(m.region != service and not ({m.region, service} <= ctx.privatelink_regions
                                        and ctx.latency.between(m.region, service) is not None) for m in members):
        return None
    if any(ld.histogram is not None for ld in pool.loads) or any(_histogram_sized(m.traffic) for m in members):
        return _pooled_histogram(pool, members, ctx)
    models = [ld.model for ld in pool.loads]
    own = [[t for m in members for t in m.traffic if t.model == model] for model in models]
    entries = [pooled_traffic(ts, service, ctx) for ts in own]
    combo = tuple((ld.precision, ld.copies) for ld in pool.loads)
    ev = _evaluate(cfg, curves, pool.instance_type, service, entries, combo, ctx, fleet_slo, ctx.n_min(service), cache,
                   pool.sharing, members={model: tuple(ts) for model, ts in zip(models, own)})
    if ev is None or not ev.feasible:
        return None
    member_fixed = [fixed_by_hour(service, m.traffic, ctx) for m in members]
    ev.fixed_by_hour = [sum(f[h] for f in member_fixed) - (len(members) - 1) * provider_side(service, ctx)
                        for h in range(24)]
    reserved = ctx.reserved.get((ev.instance_type, service), 0)
    day = sum(max(n - reserved, 0) * ev.price_per_hour + f for n, f in zip(ev.instances_by_hour, ev.fixed_by_hour))
    ev.cost_per_hour, ev.usd_per_m_output = day / 24, per_m_output(day, entries)
    ev.consumer_regions = tuple(m.region for m in members)
    return ev


def _pooled_histogram(pool: PackingEval, members: list[RegionPacking], ctx: PlanContext) -> PackingEval | None:
    """A packing of one process sized by the histogram method, pooled across regions as a one-model pool is
    (solver.pooled_histogram): one target at most every member's c* there, each hour the members' summed load. Each
    member's own sizing on this packing in this region (its network, its histogram) is read off its region's plan.
    A histogram describes instances of one process and has no arrivals to sum: a member sized from arrivals is not
    pooled with it."""
    if len(pool.loads) != 1 or not all(_histogram_sized(m.traffic) for m in members):
        return None
    own = [next((e for e in m.ranked if pool_key(e) == pool_key(pool) and e.loads[0].histogram is not None), None)
           for m in members]
    if any(e is None for e in own):
        return None
    days = [(e.loads[0].traffic, e.loads[0].histogram) for e in own if e is not None and e.loads[0].histogram]
    sized = [(t, d.max_load, d.seconds_at) for t, d in days if d.max_load is not None and d.seconds_at is not None]
    (load,) = pool.loads
    if len(sized) != len(members) or load.histogram is None:
        return None
    k, loads = pooled_histogram(load.curve, sized)
    hold, spr = pooled_hold([(t, d.hold_ms, d.seconds_per_request) for t, d in days])
    service, n_min = pool.region, ctx.n_min(pool.region)
    needed = [math.ceil(x - 1e-9) for x in loads]
    counts = [max(n_min, n) for n in needed]
    fixed = [sum(d.fixed_by_hour[h] for _, d in days) - (len(days) - 1) * provider_side(service, ctx)
             for h in range(24)]
    reserved = ctx.reserved.get((pool.instance_type, service), 0)
    cost = [max(n - reserved, 0) * pool.price_per_hour + f for n, f in zip(counts, fixed)]
    traffic = [t for t, _ in days]
    host = load.histogram
    day = replace(host, target=k, needed_by_hour=needed, instances_by_hour=counts, fixed_by_hour=fixed,
                  cost_by_hour=cost, seconds_per_request=spr, weighted_e2e=hold + max(host.network_ms, 0.0),
                  usd_per_m_output=per_m_output(sum(cost), traffic), reserved_used=min(reserved, max(counts)))
    # Its TTFT limit is the farthest member's, as for a pool sized from arrivals.
    network = max(e.loads[0].network_ms for e in own if e is not None)
    pooled = replace(load, traffic=pooled_traffic(traffic, service, ctx), histogram=day, processes_by_hour=needed,
                     members=tuple(traffic), network_ms=network)
    return replace(pool, loads=[pooled], instances_by_hour=counts, fixed_by_hour=fixed, cost_per_hour=sum(cost) / 24,
                   cost_by_hour=cost, usd_per_m_output=day.usd_per_m_output, reserved_used=day.reserved_used,
                   consumer_regions=tuple(m.region for m in members))


def pool_across_regions(result: PackingPlan, cfg: FleetConfig | None, curves: list[ModelCurve], ctx: PlanContext,
                        fleet_slo: Slo, cache: Cache) -> None:
    """Pooling across regions for several models (solver.pool_moves, as for one model): a pool serves the same model
    set in every region it serves, each pool the packing its host region chose, sized again for its members.

    A pool is a packing in a service region: consumer regions
    whose own choice is the same packing served from the same region start on one pool, since the config holds one
    group for it and a reservation (--reserved) there is one set of instances, not one per consumer region."""
    regions = [r for r in result.regions if r.winner is not None]
    hosts: dict[PoolKey, PackingEval] = {}
    start: dict[PoolKey, list[RegionPacking]] = {}
    for r in regions:
        assert r.winner is not None
        hosts.setdefault(pool_key(r.winner), r.winner)
        start.setdefault(pool_key(r.winner), []).append(r)
    sized: dict[tuple[PoolKey, tuple[str, ...]], PackingEval | None] = {}

    def pool(key: PoolKey, members: list[RegionPacking]) -> PackingEval | None:
        at = (key, tuple(m.region for m in members))
        if at not in sized:
            (own,) = members if len(members) == 1 else (None,)
            sized[at] = own.winner if own is not None and own.winner is not None and pool_key(own.winner) == key else \
                _pooled(cfg, curves, hosts[key], members, ctx, fleet_slo, cache)
        return sized[at]

    def cost(key: PoolKey, members: list[RegionPacking]) -> float:
        ev = pool(key, members) if members else None
        return 0.0 if not members else math.inf if ev is None else ev.cost_per_hour

    def fits(member: RegionPacking, key: PoolKey) -> bool:
        return {t.model for t in member.traffic} == {ld.model for ld in hosts[key].loads}

    moved = pool_moves(start, cost, fits, len(regions) * len(regions) + 1)
    for key, members in moved.items():
        ev = pool(key, members)
        assert ev is not None  # a move is made only onto a pool that serves its members
        ev.member_checks = member_checks(ev, ctx)
        result.pools.append(ev)
        for guest in members:
            own = guest.winner
            assert own is not None
            if pool_key(own) == key:
                continue  # served by its own choice
            adds = ev.cost_per_hour - cost(key, [m for m in members if m is not guest])
            ev.marginal[guest.region] = adds
            result.joins.append(f"{guest.region} joins the {key[0]} pool ({ev.label}, serving "
                                f"{', '.join(ev.consumer_regions)}): +${adds:.2f}/h there vs ${own.cost_per_hour:.2f}/h "
                                f"for its own {own.label} pool in {own.region} (one NLB, one set of provider endpoints "
                                "and one minimum for both)")


def member_checks(ev: PackingEval, ctx: PlanContext) -> dict[str, dict[str, tuple[float, float]]]:
    """Per consumer region a pool serves, per model sized from arrivals: (P99 TTFT with that region's own network, P99
    ITL) at the pool's worst planned minute. The pool is sized for its farthest member; this says what each member
    gets. A model sized from a histogram has no minutes, so no figure."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for ld in ev.loads:
        worst = max((p for p in ld.predictions if p is not None), key=lambda p: p.ttft_p99_ms, default=None)
        if worst is None or ld.histogram is not None:
            continue
        for t in ld.members or (ld.traffic,):
            network = _network_ms(ld.curve, t.region, ev.region, ctx)
            out.setdefault(t.region, {})[ld.model] = (worst.ttft_p99_ms + network, worst.itl_p99_ms)
    return out


PoolKey = tuple[str, str, str, str]


def pool_key(ev: PackingEval) -> PoolKey:
    """A pool of the fleet: the service region, instance type, packing and GPU sharing (one config group)."""
    return ev.region, ev.instance_type, ev.packing_text, ev.sharing


def unentitled_traffic(cfg: FleetConfig, profile: TrafficProfile) -> None:
    """Traffic for a model that no consumer in its region may call is refused (UserError naming the entry): the
    gateway answers it 403, so sizing a pool for it would pay for load that never arrives. A region with no
    consumer at all is planned for consumers still to come (run.consumerless_regions warns)."""
    for i, t in enumerate(profile.consumers):
        callers = [c.name for c in cfg.consumers if c.region == t.region]
        if callers and t.model and sum(t.hourly_rps()) > 0 and not any(t.model in cfg.models_for(c) for c in callers):
            raise UserError(f"--traffic: consumers[{i}].model {t.model} in {t.region}: no consumer there may call it "
                            f"(models[{t.model}].consumers; consumers in {t.region}: {', '.join(callers)}); the "
                            "gateway refuses that traffic, so no pool is sized for it: entitle a consumer there or "
                            "drop the entry")


def _entitlement_notes(cfg: FleetConfig | None, region: str, entries: list[ConsumerTraffic]) -> list[str]:
    if cfg is None:
        return []
    callers = [c.name for c in cfg.consumers if c.region == region]
    return [f"{region}: {t.model} is called by {', '.join(c for c in callers if t.model in cfg.models_for(c))}"
            for t in entries if callers]


def _time_sliced_alternative(sliced: RegionPacking) -> list[Alternative]:
    """The region's choice had its pools time-sliced, priced as an alternative to the MPS plan ("time slicing")."""
    w = sliced.winner
    if w is None:
        return []
    inst = sum(w.instances_by_hour) * w.price_per_hour / 24
    return [Alternative("time slicing", [w], inst, sum(w.fixed_by_hour) / 24, w.usd_per_m_output)]


def _plan_region(cfg: FleetConfig | None, curves: list[ModelCurve], region: str, entries: list[ConsumerTraffic],
                 ctx: PlanContext, fleet_slo: Slo, max_copies: int, families: dict[str, str], cache: Cache,
                 gpu_sharing: str | None = None, alternatives: bool = True) -> RegionPacking:
    notes = _entitlement_notes(cfg, region, entries)
    histogram = _histogram_sized(entries)
    if histogram and max_copies > 1:
        # The histogram counts requests on an instance of one process: it says nothing of an instance of two, and a
        # packing sized from arrivals instead would be ranked by another method than the one-process packings.
        notes.append(f"{region}: sized by the traffic's concurrency histogram, which describes instances of one "
                     "process: packings of several copies are not tried (give burstiness to size from arrivals)")
        max_copies = 1
    types = sorted({c.instance_type for c in curves})
    evaluations: list[PackingEval] = []
    n_min = ctx.n_min(region)
    not_offered: list[str] = []
    refused: list[tuple[str, str]] = []
    for instance_type in types:
        refusal = _offer_refusal(instance_type, region, ctx, cache["lab"])
        if refusal is not None and "not offered" in refusal:
            not_offered.append(instance_type)
        where = _service_regions(instance_type, region, entries, ctx, refusal is None)
        if refusal is not None and not where:
            # No region its consumers reach serves it: ruled out, with why no other region can.
            cross = (f"; cross-region is not an option: {region} is not in the cross-region PrivateLink table (so no "
                     "other region can serve it)" if region not in ctx.privatelink_regions else "")
            refused.append((instance_type, refusal + cross))
        elif refusal is not None:
            notes.append(f"{instance_type}: {refusal}")
        if not where:
            continue
        unsupported: list[tuple[str, str]] = []
        per_model = [_options(curves, _model(t), instance_type, cfg, families.get, cache["lab"], ctx, notes,
                              unsupported) for t in entries]
        # Each precision the support matrix refuses is ruled out with its reason, whether or not the model keeps
        # another precision on this type (a one-model plan ruled each candidate out by it).
        refused += unsupported
        missing = [_model(t) for t, opts in zip(entries, per_model) if not opts]
        if missing:
            unexplained = [m for m in missing if not any(label.split(" ")[0] == m for label, _ in unsupported)]
            if unexplained:
                notes.append(f"{instance_type}: no curve (at a precision its GPU runs) for {', '.join(unexplained)}")
            continue
        for service in where:
            tried = 0
            for combo in packings_by_size(per_model, max_copies):
                tried += 1
                if tried > MAX_PACKINGS:
                    notes.append(f"{instance_type}: stopped after {MAX_PACKINGS} packings (MAX_PACKINGS), fewest "
                                 f"processes first: some packings of {sum(c for _, c in combo)} or more processes "
                                 "were not tried")
                    break
                ev = _evaluate(cfg, curves, instance_type, service, entries, combo, ctx, fleet_slo,
                               n_min if service == region else ctx.n_min(service), cache,
                               pool_sharing(cfg, service, instance_type, gpu_sharing), histogram)
                if ev is not None:
                    ev.consumer_regions = () if service == region else (region,)
                    evaluations.append(ev)
    ranked = sorted((e for e in evaluations if e.feasible), key=PackingEval.rank_key)
    winner = pick(ranked)
    if winner is not None and winner.estimated:
        notes.append(f"no packing with measured curves meets every SLO: the choice {winner.label} is ESTIMATED "
                     f"{winner.source.removeprefix('estimated ')}; measure it co-located (fleetcast bench run "
                     "--model-mix) before deploying")
    elif winner is not None and len(entries) > 1:  # one model's: its statistical notes say it (_one_model_notes)
        notes += cheaper_estimates(ranked, winner, "packing")
    if winner is not None:
        notes += [f"{m.model}: its co-located curve has {len(m.curve.points)} load levels: the planner's P99 ITL comes "
                  f"from the batch averaged over a request's life between them, {SPARSE_ITL_GAP} (docs/plan.md, Limits)"
                  for m in winner.loads if is_measured_shared(m.source) and len(m.curve.points) <= SPARSE_LEVELS]
        notes += sharing_notes(winner, curves, mps_calibration().describe()
                               if any(e.sharing == MPS and e.estimated for e in ranked) else None)
    plan = RegionPacking(region, entries, evaluations, ranked, winner, notes=notes, not_offered=not_offered,
                         refused=refused)
    if winner is not None and len(entries) == 1:
        plan.peak_notes, plan.stats_notes = _one_model_notes(plan, curves, ctx, cache["lab"])
    if alternatives:
        plan.alternatives = _alternatives(cfg, curves, region, entries, ctx, fleet_slo, families, cache)
    return plan


def _one_model_notes(plan: RegionPacking, curves: list[ModelCurve], ctx: PlanContext,
                     lab: dict[str, str]) -> tuple[list[str], list[str]]:
    """A packing of one model: the one-model plan's peak-throughput and statistical notes, each of the model's solo
    curves (instance type x precision) a candidate at its best packing, as one model's candidates are."""
    (traffic,) = plan.traffic
    winner = plan.winner
    assert winner is not None

    def key(e: PackingEval) -> tuple[str, str]:
        return e.instance_type, e.loads[0].precision

    peaks = []
    for mc in curves:
        if mc.model != traffic.model or mc.packing is not None:
            continue
        mine = [e for e in plan.evaluations if e.loads and key(e) == (mc.instance_type, mc.precision)]
        best = min(mine, key=lambda e: (not e.feasible, e.rank_key() if e.feasible else ()), default=None)
        refusal = _offer_refusal(mc.instance_type, plan.region, ctx, lab)
        unsupported = dict(plan.refused).get(f"{mc.model} {mc.precision} on {mc.instance_type}")
        peaks.append(Option(mc.candidate.label, mc.instance_type, mc.candidate.curve, best,
                            (mc.instance_type, mc.precision) == key(winner), mc.candidate.estimated,
                            refusal=f"{mc.candidate.family} is {refusal}" if refusal else
                            unsupported or "no packing of it serves"))
    firsts = {(*key(winner), winner.processes, winner.sharing): winner}
    for e in plan.ranked:
        firsts.setdefault((*key(e), e.processes, e.sharing), e)  # each candidate at its best, in rank order
    options = [Option(f"{e.instance_type} {e.loads[0].precision}", e.instance_type, e.loads[0].curve, e,
                      e is winner, e.estimated, scaling_target(e) / e.processes,
                      e.loads[0].histogram.noise_fallback if e.loads[0].histogram else None) for e in firsts.values()]
    # The statistical notes weigh the TTFT CI against the model's own SLO (models[].slo), not the fleet's.
    own = replace(ctx, slo=winner.loads[0].slo) if winner is not None and winner.loads else ctx
    return peak_notes(peaks, winner, traffic, ctx), stats_notes(plan.ranked, winner, options, own)


def _service_regions(instance_type: str, region: str, entries: list[ConsumerTraffic], ctx: PlanContext,
                     offered_here: bool) -> list[str]:
    """Where a consumer region's packings on `instance_type` are evaluated: its own region (where offered and priced)
    and, when its traffic is one model's, every other region that could serve it
    (solver.service_regions), its consumers' network added to each model's TTFT. The models of a region
    of several are served from their own region: a pool serves them from another only by pooling
    (pool_across_regions), which keeps the model set in every region it serves."""
    own = [region] if offered_here else []
    if len(entries) != 1:
        return own
    return own + [r for r in service_regions(instance_type, region, ctx) if r != region]


def _histogram_sized(entries: list[ConsumerTraffic]) -> bool:
    """Whether a region's packings of one process are sized by the histogram method: its traffic is one model's, with
    a concurrency histogram and no burstiness (TrafficProfile.arrival_driven). With several models each entry's
    histogram counts every model's requests on the instance it measured, which no packing here reproduces: those are
    sized from arrivals (docs/plan.md, "Several models")."""
    return len(entries) == 1 and not entries[0].arrival_driven


def _offer_refusal(instance_type: str, region: str, ctx: PlanContext, lab: dict[str, str]) -> str | None:
    """Why `instance_type` cannot serve in `region` (not offered there, or no price), or None. A lab machine is
    wherever its price says."""
    if instance_type not in lab.values() and not ctx.availability.offered(instance_type, region):
        return f"not offered in {region} (availability as of {ctx.availability.as_of})"
    if ctx.prices.price(instance_type, region) is None:
        return f"no price in {region} (prices as of {ctx.prices.as_of}; give --prices FILE)"
    return None


def _offered(instance_type: str, region: str, ctx: PlanContext, lab: dict[str, str]) -> bool:
    return _offer_refusal(instance_type, region, ctx, lab) is None


def packings_by_size(precisions: list[list[str]], max_copies: int) -> Iterator[tuple[tuple[str, int], ...]]:
    """Every packing of the models (per model: one of its precisions, 1..max_copies copies) as ((precision, copies),
    ...) per model, fewest processes first, at most MAX_PROCESSES processes. The order is what makes the
    MAX_PACKINGS cap safe: it cuts the largest packings (the most memory, the most interference), never the small
    ones a wider --max-copies still holds; in the product's own order a model's first precision at 1..max_copies
    copies came first and a larger --max-copies could leave a cheaper packing of few copies unevaluated."""
    n = len(precisions)
    for total in range(n, min(n * max_copies, MAX_PROCESSES) + 1):
        for copies in _compositions(total, n, max_copies):
            for chosen in itertools.product(*precisions):
                yield tuple(zip(chosen, copies))


def _compositions(total: int, parts: int, most: int) -> Iterator[tuple[int, ...]]:
    """Tuples of `parts` whole numbers in 1..most summing to `total`, in lexicographic order."""
    if parts == 1:
        if 1 <= total <= most:
            yield (total,)
        return
    for first in range(max(1, total - most * (parts - 1)), min(most, total - (parts - 1)) + 1):
        for rest in _compositions(total - first, parts - 1, most):
            yield (first, *rest)


def _evaluate(cfg: FleetConfig | None, curves: list[ModelCurve], instance_type: str, region: str,
              entries: list[ConsumerTraffic], combo: tuple[tuple[str, int], ...], ctx: PlanContext, fleet_slo: Slo,
              n_min: int, cache: Cache, sharing: str = TIME_SLICING, histogram: bool = False,
              members: dict[str, tuple[ConsumerTraffic, ...]] | None = None) -> PackingEval | None:
    """One packing, its processes sharing the GPU by `sharing`; None when it does not fit memory (not a candidate at
    all). `histogram`: a packing of one process is sized by its traffic's histogram (size_packing). `members`: pooled
    across regions, each model's consumer regions' own traffic (`entries` their sums, solver.pooled_traffic)."""
    packing = tuple((_model(t), p, c) for t, (p, c) in zip(entries, combo))
    processes = sum(c for _, _, c in packing)
    if processes > MAX_PROCESSES:
        return None
    key = tuple(sorted((m, c) for m, _, c in packing))
    precisions = tuple(sorted((m, p) for m, p, _ in packing))
    picked: list[tuple[ConsumerTraffic, str, str, int, ModelCurve | None, ModelCurve]] = []
    for t, (model, prec, copies) in zip(entries, packing):
        coloc, solo = _curve_for(curves, model, instance_type, prec, key, precisions, sharing)
        base = solo or coloc  # the solo curve where there is one (the interference rule reads it)
        if base is None:
            return None
        picked.append((t, model, prec, copies, coloc, base))
    # A co-located curve holds at the KV budgets it was measured with: the plan keeps them.
    measured_kv = {m: gb for *_, coloc, _ in picked if coloc is not None and coloc.kv_cache_gb
                   for m, gb in coloc.kv_cache_gb.items()}
    memory, refusal = memory_check(cfg, instance_type, packing, cache["lab"], measured_kv, sharing)
    if refusal is not None:
        label = " + ".join(f"{m} {p} x{c}" for m, p, c in packing)
        return PackingEval(instance_type, region, [], memory, rejected=refusal, label_text=label, sharing=sharing)
    kv = {p.model_id: p.kv_bytes for p in memory.processes} if memory is not None else {}
    def load_of(t: ConsumerTraffic, model: str, prec: str, copies: int, mc: ModelCurve, curve: Curve,
                source: str) -> ModelLoad:
        kv_b = kv.get(model)
        return ModelLoad(model, prec, copies, source, curve, _slo_for(cfg, model, fleet_slo),
                         _network_ms(curve, t.region, region, ctx), t,
                         kv_gib=None if kv_b is None else kv_b / GIB, sources=mc.candidate.sources,
                         provenance=mc.candidate.provenance, results_output_mean=mc.candidate.output_mean,
                         results_input_mean=mc.candidate.input_mean, results_source=mc.candidate.source,
                         members=(members or {}).get(model, ()))

    def as_measured(coloc: ModelCurve | None, solo: ModelCurve | None) -> bool:
        return coloc is not None or processes == 1

    # What each process's curve is as measured (the co-located curve, else the solo one).
    first = [load_of(t, m, p, c, coloc or solo, (coloc or solo).candidate.curve,
                     _source_of(coloc or solo, processes, sharing)) for t, m, p, c, coloc, solo in picked]
    if all(as_measured(coloc, solo) for *_, coloc, solo in picked):
        return size_packing(PackingEval(instance_type, region, first, memory, sharing=sharing), ctx, n_min, cache,
                            histogram)
    # Interference rule: the peers' load comes from sizing the packing on the curves as measured (pass 1,
    # which needs fewer instances than the stretched curves will, so it overstates the peers' load).
    pre = size_packing(PackingEval(instance_type, region, first, memory, sharing=sharing), ctx, n_min, cache)
    if not pre.feasible:
        pre.loads = [replace(ld, source=_stretched(pk[5], sharing)) if not as_measured(pk[4], pk[5]) else ld
                     for ld, pk in zip(pre.loads, picked)]
        return pre
    adds = [peer_steps(ld, pre.instances_by_hour, cache) for ld in first]
    loads = []
    for i, (t, model, prec, copies, coloc, solo) in enumerate(picked):
        if as_measured(coloc, solo):
            loads.append(replace(first[i], processes_by_hour=[], predictions=[]))
            continue
        others = sum(a * ld.copies for a, ld in zip(adds, first)) - adds[i]  # every process but this one
        key_est = ("est", sharing, id(solo), round(others, 3))
        if key_est not in cache:
            cache[key_est] = colocated(sharing, solo.candidate.curve, others)
        loads.append(replace(load_of(t, model, prec, copies, solo, cache[key_est], _stretched(solo, sharing)),
                             peer_step_ms=others))
    return size_packing(PackingEval(instance_type, region, loads, memory, sharing=sharing), ctx, n_min, cache)


def _stretched(solo: ModelCurve, sharing: str) -> str:
    """The source of a solo curve under the interference rule of `sharing`: still a roofline estimate where it was
    one."""
    return ROOFLINE if solo.candidate.estimated else ESTIMATED_BY[sharing]


def _alternatives(cfg: FleetConfig | None, curves: list[ModelCurve], region: str, entries: list[ConsumerTraffic],
                  ctx: PlanContext, fleet_slo: Slo, families: dict[str, str], cache: Cache) -> list[Alternative]:
    """The same traffic without packing: each model on instances of its own (its best single-process choice)."""
    parts = []
    histogram = _histogram_sized(entries)
    for t in entries:
        best = None
        for instance_type in sorted({c.instance_type for c in curves}):
            for service in _service_regions(instance_type, region, entries, ctx,
                                            _offered(instance_type, region, ctx, cache["lab"])):
                for prec in _options(curves, _model(t), instance_type, cfg, families.get, cache["lab"], ctx):
                    ev = _evaluate(cfg, curves, instance_type, service, [t], ((prec, 1),), ctx, fleet_slo,
                                   ctx.n_min(service), cache, histogram=histogram)
                    if ev is None:
                        continue
                    ev.consumer_regions = () if service == region else (region,)
                    if ev.feasible and (best is None or (best.estimated, best.rank_key())
                                        > (ev.estimated, ev.rank_key())):
                        best = ev
        if best is None:
            return []
        parts.append(best)
    instance_cost = sum(sum(p.instances_by_hour) * p.price_per_hour for p in parts) / 24
    # One model's only pool may serve from another region (_service_regions): its fixed costs are paid there.
    shared_fixed = sum(fixed_by_hour(parts[0].region if len(parts) == 1 else region, entries, ctx)) / 24
    own_fixed = sum(sum(p.fixed_by_hour) for p in parts) / 24
    day_shared = (instance_cost + shared_fixed) * 24
    day_own = (instance_cost + own_fixed) * 24
    return [Alternative("one model per pool", parts, instance_cost, shared_fixed, per_m_output(day_shared, entries)),
            Alternative("one model per fleet", parts, instance_cost, own_fixed, per_m_output(day_own, entries))]


def scaling_target(ev: PackingEval) -> float:
    """The pool's in-flight target: solver.scaling_target over the packing's models, or the histogram method's k
    for a packing of one process sized from a histogram (the same figure a one-model plan gets for a packing of
    one)."""
    from .solver import scaling_target as target_of, target_part

    sized = [m.histogram for m in ev.loads if m.histogram is not None]
    if sized:
        return sized[0].target  # the histogram method's k, as for one model (a packing of one process alone has one)
    cache: Cache = {}
    parts = [target_part(_models_of(cache, m.curve), m.traffic, m.limits, m.copies) for m in ev.loads]
    return target_of([p for p in parts if p is not None])
