"""The planning method: from candidates, traffic, SLOs, prices and the network to
a ranked, explained choice per consumer region. Formulas in docs/plan.md.

For each candidate (instance type x precision) and reachable service region:
  1. add the network round trip to P99 TTFT (and E2E) at every measured load level;
  2. c* = the highest measured concurrency such that every level up to it meets
     every SLO at P99 (P99 TTFT incl. network, P99 ITL, error rate);
  3. pick the per-instance concurrency target k <= c* that minimises the
     instance-seconds each request costs, S(k) = sum_l w_l * W(min(l,k)) / min(l,k),
     weighing the load levels l by the traffic histogram w (Little's law: an
     instance holding c requests for W seconds serves c/W requests per second);
  4. instances per UTC hour N_h = max(n_min, ceil(rate_h * S(k)));
  5. cost = instances x price + the region's fixed costs; $ per 1M tokens, goodput,
     traffic-weighted latency.
With arrivals (a profile with `burstiness`, or without a concurrency histogram)
steps 2-4 become (fleetcast/plan/queueing.py):
  2'. the highest per-instance arrival rate x* whose steady state (Little's law
     L = x * W(1 + L), arrivals joining 1 + Poisson(L) requests) meets both P99 SLOs,
     the error SLO and the measured range; L* = its in-flight count;
  3'. the scaling target: the in-flight count at x* / H, H = the busiest minute's
     ratio to the hour's mean (at least 1/(1 - TARGET_HEADROOM)), so the average the
     group tracks leaves room for the bursts it cannot launch for;
  4'. N_h = max(n_min, the fewest instances meeting those limits at rate_h x burstiness_h).
Ranking: lowest mean cost per hour (to the cent), then lower traffic-weighted
P99 TTFT, then fewer instance-hours.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fleetcast.config import catalog
from fleetcast.config.model import ModelFamily
from fleetcast.contract import support

from .curves import MIN_P99_SAMPLES, Candidate, Curve, LoadPoint
from .inputs import Availability, FixedCosts, Latency, Prices, QualityFile
from .queueing import (
    Limits,
    Prediction,
    ServiceModel,
    Stream,
    instances_needed,
    max_safe_rate,
    model_for,
    predict,
)
from .traffic import ConsumerTraffic, TrafficProfile

# The scaling target stays at least this far below the SLO-safe in-flight count, for the minute or two a
# scale-out takes to be served even without bursts.
TARGET_HEADROOM = 0.10


T = TypeVar("T")


def _given(value: T | None) -> T:
    """A figure every feasible evaluation has (the method sets it before it can pass)."""
    assert value is not None
    return value


def capacity_bounds(hourly: list[int]) -> tuple[int, int, int]:
    """(min, desired, max) for a pool: the day's lowest, mean (rounded up) and highest instance counts."""
    return min(hourly), min(max(hourly), math.ceil(sum(hourly) / len(hourly))), max(hourly)


@dataclass(frozen=True)
class Slo:
    ttft_p99_ms: float
    itl_p99_ms: float
    error_rate: float

    def text(self) -> str:
        return (f"P99 TTFT <= {self.ttft_p99_ms:g} ms (network included), P99 ITL <= {self.itl_p99_ms:g} ms, "
                f"errors <= {self.error_rate:.1%}")


@dataclass
class PlanContext:
    """Everything besides candidates and traffic that the method reads."""

    slo: Slo
    prices: Prices
    availability: Availability
    latency: Latency
    fixed: FixedCosts
    privatelink_regions: frozenset[str] = field(default_factory=catalog.privatelink_cross_region)
    quality: QualityFile | None = None
    quality_threshold: float | None = None
    min_instances: dict[str, int] = field(default_factory=dict)  # per service region, from the config's pools
    default_min_instances: int = 1
    model_id: str | None = None
    model_family: ModelFamily | None = None
    kv_cache_dtype: str = "auto"  # the model's KV-cache dtype (fleet engine <- models[].engine: packing.model_engine)
    # Instances already paid for (On-Demand Capacity Reservations): (instance type, region) -> count. A plan
    # pays only for the instances above them; the reservation itself is paid whatever the plan picks.
    reserved: dict[tuple[str, str], int] = field(default_factory=dict)
    # Where each region's floor comes from, for explanations (e.g. "capacity.min of pool main").
    min_instances_source: dict[str, str] = field(default_factory=dict)

    def n_min(self, region: str) -> int:
        return self.min_instances.get(region, self.default_min_instances)

    def model(self, candidate: Candidate) -> ServiceModel:
        """One service model per candidate (its lognormal fits and predictions are cached inside, and shared with
        every plan of this process that reads the same curve: queueing.model_for)."""
        cache: dict[int, tuple[Candidate, ServiceModel]] = self.__dict__.setdefault("_models", {})
        if id(candidate) not in cache:
            cache[id(candidate)] = (candidate, model_for(candidate.curve))
        return cache[id(candidate)][1]


@dataclass(frozen=True)
class Failure:
    """The first SLO a candidate breaks, at the lowest load level where it breaks."""

    level: float
    metric: str
    value: float
    limit: float
    network_ms: float = 0.0

    def text(self) -> str:
        if self.metric == "P99 TTFT":
            extra = f" (incl. {self.network_ms:.0f} ms network)" if self.network_ms >= 0.5 else ""
            return f"P99 TTFT {self.value:.0f} ms{extra} > {self.limit:g} ms at concurrency {self.level:g}"
        if self.metric == "error rate":
            return f"error rate {self.value:.2%} > {self.limit:.2%} at concurrency {self.level:g}"
        return f"{self.metric} {self.value:.1f} ms > {self.limit:g} ms at concurrency {self.level:g}"


class PoolDay:
    """What one planned way to serve a region has, one model or a packing: a rejection (None: feasible) and its
    instances per UTC hour."""

    rejected: str | None
    instances_by_hour: list[int]
    cost_per_hour: float
    usd_per_m_output: float
    price_per_hour: float
    # What the peak-throughput and statistical notes read (peak_notes, stats_notes): c*, the consumers' round trip,
    # the traffic-weighted P99 TTFT and its 95% CI; for a packing of several models None (per model there).
    max_load: float | None
    rtt_ms: float
    weighted_ttft_p99: float | None
    weighted_ttft_ci: tuple[float, float] | None

    @property
    def feasible(self) -> bool:
        return self.rejected is None

    @property
    def label(self) -> str:
        raise NotImplementedError

    @property
    def estimated(self) -> bool:
        raise NotImplementedError

    @property
    def roofline(self) -> bool:
        """Estimated by the roofline model (--estimate), not from any measured curve of this instance type."""
        raise NotImplementedError

    @property
    def processes(self) -> int:
        """Processes per instance: one for a one-model candidate, the copies summed for a packing."""
        raise NotImplementedError

    @property
    def source(self) -> str:
        """Where its curves come from, as every table's source column words it ("measured", "synthetic",
        "estimated ...")."""
        raise NotImplementedError

    def worst_ttft(self, ctx: PlanContext) -> tuple[float, float]:
        """(its worst planned P99 TTFT in ms, network included, the SLO it is held to): one model's, or for a packing
        the model's with the least headroom."""
        raise NotImplementedError

    def latency_rank(self) -> float:
        """How close to its latency SLOs this way serves (lower: more headroom), the last tie-break."""
        raise NotImplementedError

    def latency_words(self) -> tuple[str, str]:
        """(what latency_rank reads, its value as the report writes it)."""
        raise NotImplementedError

    def rank_key(self) -> tuple[Any, ...]:
        """The one order every plan ranks by, one model or a packing (docs/plan.md, Objective). Cost to the cent
        first; on a tie (floors often decide it) the exact counts before the measured latency, whose P99 differences
        are often within noise (the report's CI notes): fewer instance-hours, measured before estimated, fewer
        processes (less memory and interference), then more headroom under the SLOs."""
        return (round(self.cost_per_hour, 2), self.instance_hours, self.estimated, self.processes,
                self.latency_rank(), self.label)

    @property
    def instance_hours(self) -> int:
        return sum(self.instances_by_hour)

    def capacity(self) -> tuple[int, int, int]:
        return capacity_bounds(self.instances_by_hour)


P = TypeVar("P", bound=PoolDay)


@dataclass(frozen=True)
class Sizing:
    """How the planner sized one model's processes on a pool, as `plan simulate` checks it."""

    service: ServiceModel
    members: tuple[ConsumerTraffic, ...]  # the traffic those processes serve, one entry per consumer region
    limits: Limits  # in-region: the SLOs less the farthest member's network
    network_ms: float
    processes: tuple[int, ...]  # planned per UTC hour (instances x copies)
    needed: tuple[int, ...]  # what the SLOs need, before the floor
    predictions: tuple[Prediction | None, ...]
    synthetic: bool
    source: str
    arrival_driven: bool = True  # False: sized from an in-flight histogram, which has no arrivals to simulate
    # The histogram method's figures, which it has no predictions to derive from (None: sized from arrivals): the
    # milliseconds a request holds an instance and the instance-seconds it costs, rate-weighted over the members.
    hold_ms: float | None = None
    seconds_per_request: float | None = None


@dataclass(frozen=True)
class Served:
    """One model's processes on each instance of a planned pool."""

    model: str  # "" for a plan without a config whose results name no model
    precision: str
    copies: int = 1
    kv_cache_gb: float | None = None  # each copy's KV budget as written; None: the engine's fraction
    sizing: Sizing | None = field(default=None, compare=False)


@dataclass(frozen=True)
class PlannedPool:
    """What a planned pool asks of the config, whatever planned it (one model is a packing of one): what the
    re-plan check compares, the report promises and --write-config writes."""

    region: str
    consumer_regions: tuple[str, ...]
    instance_type: str
    label: str  # as the report and the Spot advice name it
    cost_text: str
    serves: tuple[Served, ...]
    instances_by_hour: tuple[int, ...]
    target: float
    estimated: bool = False
    backend: str | None = None  # the results' backend, for a plan without a config
    packed: bool = False  # from the packing search: its models' precisions go to models[].engine, copies to serves
    price_per_hour: float = 0.0  # On-Demand, per instance
    cost_per_hour: float = 0.0  # the pool's: its instances and fixed costs, mean over the day

    @property
    def capacity(self) -> tuple[int, int]:
        lo, _, hi = capacity_bounds(list(self.instances_by_hour))
        return lo, hi


@dataclass
class Evaluation(PoolDay):
    candidate: Candidate
    consumer_region: str
    service_region: str
    rejected: str | None = None
    rtt_ms: float = 0.0
    max_load: float | None = None  # c*
    first_failure: Failure | None = None
    target: float | None = None  # k, the per-instance concurrency target
    seconds_per_request: float = 0.0
    instances_by_hour: list[int] = field(default_factory=list)
    cost_by_hour: list[float] = field(default_factory=list)
    price_per_hour: float = 0.0
    fixed_per_hour: float = 0.0
    cost_per_hour: float = 0.0
    usd_per_m_output: float = 0.0
    usd_per_m_input: float = 0.0
    weighted_ttft_p99: float = 0.0
    weighted_ttft_ci: tuple[float, float] | None = None
    weighted_itl_p99: float = 0.0
    weighted_e2e: float = 0.0
    goodput_rps: float = 0.0  # per instance at the target load
    goodput_exact: bool = False
    share_above_target: float = 0.0  # share of requests whose traffic level exceeds k
    noise_fallback: tuple[float, float] | None = None  # (next lower target, its cost/h) when the pass at k is marginal
    notes: list[str] = field(default_factory=list)
    # Arrival-driven sizing (queueing.py): per UTC hour, the prediction at that hour's busiest minute.
    arrival_driven: bool = False
    predictions: list[Prediction | None] = field(default_factory=list)
    safe_rate_rps: float | None = None  # x*, per instance
    binding: str | None = None  # what caps x*: "P99 TTFT", "P99 ITL", "error rate" or "measured range"
    # The highest measured concurrency when it, not an SLO, capped the load (the curve ends before it fails).
    measured_cap: float | None = None
    network_ms: float = 0.0  # one-way share of the RTT the bench did not see, added to TTFT
    reserved_used: int = 0  # reserved instances this plan runs on (paid whatever the pick)
    seconds_at: Callable[[float], float] | None = None  # histogram method: target k -> instance-seconds per request S(k)
    needed_by_hour: list[int] = field(default_factory=list)  # arrivals: instances the SLOs need, before any floor

    @property
    def label(self) -> str:
        return f"{self.candidate.label} @ {self.service_region}"

    @property
    def estimated(self) -> bool:
        return self.candidate.estimated

    @property
    def roofline(self) -> bool:
        return self.candidate.estimated  # a one-model estimate is the roofline model's (estimate.estimate_specs)

    @property
    def processes(self) -> int:
        return 1

    @property
    def source(self) -> str:
        return self.candidate.source

    def worst_ttft(self, ctx: PlanContext) -> tuple[float, float]:
        # Sized from arrivals: the busiest planned minute's; from a histogram: the traffic-weighted figure.
        if self.arrival_driven and any(p is not None for p in self.predictions):
            return max(p.ttft_p99_ms for p in self.predictions if p is not None) + self.network_ms, ctx.slo.ttft_p99_ms
        return self.weighted_ttft_p99, ctx.slo.ttft_p99_ms

    def latency_rank(self) -> float:
        # One model, one SLO: the traffic-weighted P99 TTFT (network included) orders as its share of the SLO does.
        return round(self.weighted_ttft_p99, 1)

    def latency_words(self) -> tuple[str, str]:
        return "traffic-weighted P99 TTFT", f"{self.weighted_ttft_p99:.0f} ms"


# ---------------------------------------------------------------- one candidate


def evaluate(candidate: Candidate, traffic: ConsumerTraffic, service_region: str, ctx: PlanContext) -> Evaluation:
    """Apply the method to one candidate served from one region to one consumer region."""
    ev = Evaluation(candidate, traffic.region, service_region)
    reason = _structural_rejection(candidate, traffic.region, service_region, ctx)
    if reason:
        ev.rejected = reason
        return ev
    ev.rtt_ms = _given(ctx.latency.between(traffic.region, service_region))  # else a structural rejection
    ev.price_per_hour = _given(ctx.prices.price(candidate.instance_type, service_region))
    slo = ctx.slo
    curve = candidate.curve
    out_adjust = output_shift(candidate.output_mean, traffic)
    if out_adjust:
        ev.notes.append(f"{candidate.source} results at {candidate.output_mean:g} output tokens, traffic averages "
                        f"{traffic.output_mean:g}: E2E rescaled by the results' mean ITL")
    if candidate.input_mean and abs(traffic.input_mean - candidate.input_mean) > 0.25 * candidate.input_mean:
        ev.notes.append(f"{candidate.source} results at {candidate.input_mean:g} input tokens, traffic averages "
                        f"{traffic.input_mean:g}: TTFT may not transfer; benchmark at the traffic's lengths")

    # 2. c*: the highest level with every level up to it inside every SLO.
    ev.max_load, ev.first_failure = slo_cap(curve, slo, ev.rtt_ms, ctx)
    if ev.max_load is None:
        ev.rejected = lowest_load_refusal(_given(ev.first_failure))
        return ev
    ev.network_ms = network_of(curve.points[-1], ev.rtt_ms, ctx)
    if traffic.arrival_driven:
        _size_from_arrivals(ev, traffic, ctx)
        _finish(ev, candidate, ctx)
        return ev
    day = size_from_histogram(curve, traffic, slo, ev.rtt_ms, out_adjust, candidate.instance_type, service_region,
                              ev.price_per_hour, ctx, ctx.n_min(service_region))
    ev.notes += day.notes
    ev.target, ev.seconds_per_request, ev.seconds_at = day.target, day.seconds_per_request, day.seconds_at
    ev.share_above_target, ev.measured_cap, ev.noise_fallback = day.share_above_target, day.measured_cap, day.noise_fallback
    ev.instances_by_hour, ev.cost_by_hour, ev.fixed_per_hour = day.instances_by_hour, day.cost_by_hour, day.fixed_per_hour
    ev.cost_per_hour, ev.usd_per_m_output, ev.usd_per_m_input = day.cost_per_hour, day.usd_per_m_output, day.usd_per_m_input
    ev.weighted_ttft_p99, ev.weighted_ttft_ci = day.weighted_ttft_p99, day.weighted_ttft_ci
    ev.weighted_itl_p99, ev.weighted_e2e = day.weighted_itl_p99, day.weighted_e2e
    ev.goodput_rps, ev.goodput_exact, ev.reserved_used = day.goodput_rps, day.goodput_exact, day.reserved_used
    _finish(ev, candidate, ctx)
    return ev


def output_shift(results_output_mean: float | None, traffic: ConsumerTraffic) -> float:
    """The traffic's mean output length less the results' (0 within half a token, or without a results mean): the
    histogram method rescales each level's E2E by it at the results' mean ITL."""
    if results_output_mean and abs(traffic.output_mean - results_output_mean) >= 0.5:
        return traffic.output_mean - results_output_mean
    return 0.0


def network_of(p: LoadPoint, rtt_ms: float, ctx: PlanContext) -> float:
    """The network a load level's TTFT lacks: the consumers' round trip less the one its bench run already saw."""
    bench = p.bench_rtt_ms if p.bench_rtt_ms is not None else ctx.latency.same_region_ms
    return rtt_ms - bench


def slo_cap(curve: Curve, slo: Slo, rtt_ms: float, ctx: PlanContext) -> tuple[float | None, Failure | None]:
    """Step 2: (c*, the highest measured level with every level up to it inside every SLO, network included; the
    first failure above it). c* is None when the lowest level already fails."""
    cap, failure = None, None
    for p in curve.points:
        ttft = p.ttft_p99 + network_of(p, rtt_ms, ctx)
        if ttft > slo.ttft_p99_ms:
            failure = Failure(p.concurrency, "P99 TTFT", ttft, slo.ttft_p99_ms, rtt_ms)
        elif p.itl_p99 > slo.itl_p99_ms:
            failure = Failure(p.concurrency, "P99 ITL", p.itl_p99, slo.itl_p99_ms)
        elif p.error_rate > slo.error_rate:
            failure = Failure(p.concurrency, "error rate", p.error_rate, slo.error_rate)
        if failure:
            break
        cap = p.concurrency
    return cap, failure


def lowest_load_refusal(failure: Failure) -> str:
    return f"fails the SLO even at its lowest measured load: {failure.text()}"


@dataclass
class HistogramDay:
    """A pool of one process per instance sized by the histogram method (steps 2-5): one rule for a one-model
    candidate (evaluate) and a packing of one process (packing.size_packing)."""

    max_load: float | None  # c*; None: the lowest measured level fails (first_failure says how)
    first_failure: Failure | None
    target: float = 0.0  # k
    seconds_per_request: float = 0.0  # S(k)
    seconds_at: Callable[[float], float] | None = None  # target k -> instance-seconds per request S(k)
    share_above_target: float = 0.0
    measured_cap: float | None = None
    needed_by_hour: list[int] = field(default_factory=list)  # ceil(rate_h x S(k)), before the floor
    instances_by_hour: list[int] = field(default_factory=list)
    cost_by_hour: list[float] = field(default_factory=list)
    fixed_by_hour: list[float] = field(default_factory=list)
    reserved_used: int = 0
    usd_per_m_output: float = 0.0
    usd_per_m_input: float = 0.0
    weighted_ttft_p99: float = 0.0
    weighted_ttft_ci: tuple[float, float] | None = None
    weighted_itl_p99: float = 0.0
    weighted_e2e: float = 0.0  # network included (the client's wait)
    network_ms: float = 0.0  # at the highest measured level, as an arrival-sized plan reads it
    noise_fallback: tuple[float, float] | None = None
    goodput_rps: float = 0.0
    goodput_exact: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def cost_per_hour(self) -> float:
        return sum(self.cost_by_hour) / 24

    @property
    def fixed_per_hour(self) -> float:
        return sum(self.fixed_by_hour) / 24

    @property
    def hold_ms(self) -> float:
        """What a request holds an instance for: its in-region E2E (the network delays the client, not the GPU)."""
        return self.weighted_e2e - max(self.network_ms, 0.0)


def size_from_histogram(curve: Curve, traffic: ConsumerTraffic, slo: Slo, rtt_ms: float, out_adjust: float,
                        instance_type: str, region: str, price: float, ctx: PlanContext, n_min: int) -> HistogramDay:
    """Steps 2-5 for a profile with only a concurrency histogram: c*, the target k <= c* that makes each request
    cheapest, instances per UTC hour N_h = max(n_min, ceil(rate_h x S(k))), the cost, the traffic-weighted
    latencies with their confidence intervals, and the next lower target's cost where the pass at k is marginal.
    `out_adjust`: the traffic's mean output length less the results' (E2E rescaled by the results' ITL)."""
    cap, failure = slo_cap(curve, slo, rtt_ms, ctx)
    day = HistogramDay(cap, failure, network_ms=network_of(curve.points[-1], rtt_ms, ctx))
    if cap is None:
        return day

    def network(p: LoadPoint) -> float:
        return network_of(p, rtt_ms, ctx)

    def ttft(p: LoadPoint) -> float:
        return p.ttft_p99 + network(p)

    def e2e(p: LoadPoint) -> float:
        # The network delays the client, not the GPU: instance occupancy is the in-region E2E.
        itl = p.itl_mean if p.itl_mean is not None else p.itl_p99
        return p.e2e_mean + out_adjust * itl

    weights = traffic.level_weights()
    lowest = curve.points[0].concurrency
    if min(weights) < lowest:
        day.notes.append(f"traffic levels below {lowest:g} use the latencies measured at {lowest:g} (conservative)")

    def seconds_per_request(k: float) -> float:
        return sum(w * (e2e(curve.at(min(level, k))) / 1000.0) / min(level, k) for level, w in weights.items())
    day.seconds_at = seconds_per_request

    def weighted(k: float, fn: Callable[[LoadPoint], float]) -> float:
        return sum(w * fn(curve.at(min(level, k))) for level, w in weights.items())

    # 3. the target k <= c* that makes each request cheapest (ties: lower weighted TTFT).
    options = [p.concurrency for p in curve.points if p.concurrency <= cap]
    k = min(options, key=lambda k: (seconds_per_request(k), weighted(k, ttft)))
    day.target = k
    day.seconds_per_request = seconds_per_request(k)
    day.share_above_target = sum(w for level, w in weights.items() if level > k)
    if failure is None and k == curve.points[-1].concurrency and day.share_above_target > 0:
        day.measured_cap = k

    # 4-5. instances, cost and tokens per hour (at least `n_min`).
    _, default_row = ctx.fixed.row(region)
    if default_row:
        day.notes.append(f"no fixed-cost row for {region}: the default row is used")
    rates = traffic.hourly_rps()
    day.fixed_by_hour = fixed_by_hour(region, [traffic], ctx)
    reserved = ctx.reserved.get((instance_type, region), 0)

    def daily(seconds: float) -> tuple[list[int], list[float]]:
        counts = [max(n_min, math.ceil(rps * seconds - 1e-9)) for rps in rates]
        return counts, [max(n - reserved, 0) * price + f for n, f in zip(counts, day.fixed_by_hour)]

    day.instances_by_hour, day.cost_by_hour = daily(day.seconds_per_request)
    day.needed_by_hour = [math.ceil(rps * day.seconds_per_request - 1e-9) for rps in rates]
    out_tokens = sum(rates) * 3600 * traffic.output_mean
    in_tokens = sum(rates) * 3600 * traffic.input_mean
    cost = sum(day.cost_by_hour)
    day.usd_per_m_output = cost / out_tokens * 1e6 if out_tokens else math.inf
    day.usd_per_m_input = cost / in_tokens * 1e6 if in_tokens else math.inf

    day.weighted_ttft_p99 = weighted(k, ttft)
    day.weighted_itl_p99 = weighted(k, lambda p: p.itl_p99)
    day.weighted_e2e = weighted(k, lambda p: e2e(p) + max(network(p), 0.0))
    served = [(w, curve.at(min(level, k))) for level, w in weights.items()]
    cis = [(w, p.ttft_p99_ci, network(p)) for w, p in served if p.ttft_p99_ci]
    if len(cis) == len(served):
        day.weighted_ttft_ci = (sum(w * (ci[0] + net) for w, ci, net in cis),
                                sum(w * (ci[1] + net) for w, ci, net in cis))
    at_k = curve.at(k)
    # The SLO inside the P99 CI at the target: say what the plan costs if a longer run fails there.
    ci_t, ci_i = at_k.ttft_p99_ci, at_k.itl_p99_ci
    marginal = (ci_t and ci_t[0] + network(at_k) <= slo.ttft_p99_ms <= ci_t[1] + network(at_k)) or \
        (ci_i and ci_i[0] <= slo.itl_p99_ms <= ci_i[1])
    lower = [o for o in options if o < k]
    if marginal and lower:
        k2 = max(lower)
        _, costs = daily(seconds_per_request(k2))
        day.noise_fallback = (k2, sum(costs) / 24)
    throughput = k / (e2e(at_k) / 1000.0)  # Little's law at the target
    if at_k.records:
        good = sum(1 for t, i, ok in at_k.records if ok and t is not None and t + network(at_k) <= slo.ttft_p99_ms
                   and (i is None or i <= slo.itl_p99_ms))
        day.goodput_rps, day.goodput_exact = throughput * good / len(at_k.records), True
    else:
        # Each P99 within its SLO bounds that metric's violations to 1%.
        day.goodput_rps = throughput * max(0.0, 1 - at_k.error_rate - 0.02)
    day.reserved_used = min(reserved, max(day.instances_by_hour, default=0))
    return day


def _finish(ev: Evaluation, candidate: Candidate, ctx: PlanContext) -> None:
    if ev.measured_cap is not None:
        ev.notes.append(f"measured only up to concurrency {ev.measured_cap:g}, where it still meets every SLO: the "
                        "plan keeps its instances within that range, so it may need fewer instances than planned; "
                        f"benchmark it above {ev.measured_cap:g}")
    if candidate.estimated:
        ev.notes.append("estimated by the roofline model, not measured: benchmark it before deploying")
    if ctx.quality is not None:
        ok, why = ctx.quality.verdict(candidate.instance_type, candidate.precision, ctx.quality_threshold,
                                            model=ctx.model_id)
        ev.notes.append(f"quality not checked: {why}" if ok is None else f"quality: {why}")


def _limits(ctx: PlanContext, network_ms: float) -> Limits:
    return Limits(ctx.slo.ttft_p99_ms - network_ms, ctx.slo.itl_p99_ms, ctx.slo.error_rate)


def fixed_by_hour(region: str, traffic: list[ConsumerTraffic], ctx: PlanContext) -> list[float]:
    """One fleet's fixed costs per UTC hour in `region` carrying `traffic` (one NLB, one endpoint set): one entry
    for a one-model region, one per model for a packing (bytes per request weighted by each model's rate)."""
    hourly = [t.hourly_rps() for t in traffic]  # once per entry, not once per hour
    per = [ctx.fixed.gb_per_request(t.input_mean, t.output_mean) for t in traffic]
    out = []
    for h in range(24):
        rates = [r[h] for r in hourly]
        rps = sum(rates)
        if len(per) == 1:
            gb = per[0]
        elif rps > 0:
            gb = (sum(r * g[0] for r, g in zip(rates, per)) / rps, sum(r * g[1] for r, g in zip(rates, per)) / rps)
        else:
            gb = (0.0, 0.0)
        out.append(ctx.fixed.hourly(region, traffic[0].region, rps, gb))
    return out


def floor_tenth(value: float) -> float:
    """A figure the plan writes into the config (a scaling target, a KV budget in GiB), rounded down to 0.1: the
    written figure must not exceed the computed one. Float error is forgiven first: a figure already on the 0.1
    grid often arrives a hair under it (2.3 as 2.2999999999999998, or 2.3 GiB back from whole bytes), and must
    stay 2.3, not drop to 2.2."""
    return math.floor(round(value * 10, 6)) / 10


@dataclass(frozen=True)
class TargetPart:
    """One model's processes on an instance, as the scaling target reads them: its service model, mean output
    length, SLO-safe arrival rate per process x* (queueing.max_safe_rate), copies per instance and its day."""

    model: ServiceModel
    output_mean: float
    safe_rate: float
    copies: int
    hourly_rps: tuple[float, ...]
    hourly_burstiness: tuple[float, ...]


def scaling_target(parts: list[TargetPart]) -> float:
    """In-flight requests per instance to track (docs/plan.md, "Scaling target"), for one model or a packing.

    Each hour with traffic, the instance count at which the hour's most demanding model sits at its SLO-safe
    rate x* in the busiest minute is n_h = max_m rate_m,h x H_h / (copies_m x x*_m), H_h the busiest minute's
    ratio to the hour's mean (at least 1/(1 - TARGET_HEADROOM)); at the hour's mean rate those n_h instances
    hold k_h = sum_m copies_m x L_m(rate_m,h / (n_h x copies_m)) requests each. Target tracking holds the
    fleet's mean in-flight per instance at the target, so a target at most every k_h keeps every hour at or
    above its n_h: the target is min_h k_h, at least 1, rounded down to 0.1. With one model every hour gives
    L(x* / H_h), so the target is L at x* over the day's highest H: the same figure whatever the number of
    models planned beside it. The SLO-safe rate, not the planned count, sets it: a planned count is rounded up
    and floored (capacity.min), and a target read from it scales the pool out before the SLO needs it."""
    floor_ratio = 1.0 / (1.0 - TARGET_HEADROOM)
    best = math.inf
    for h in range(24):
        busy = [p for p in parts if p.hourly_rps[h] > 0 and p.safe_rate > 0]
        if not busy:
            continue
        ratio = max(floor_ratio, *(p.hourly_burstiness[h] for p in busy))
        n = max(p.hourly_rps[h] * ratio / (p.copies * p.safe_rate) for p in busy)
        level = sum(p.copies * predict(p.model, [Stream(p.hourly_rps[h] / (n * p.copies), p.output_mean)], 1.0).in_flight
                    for p in busy)
        best = min(best, level)
    return max(1.0, floor_tenth(best)) if best < math.inf else 1.0


def target_part(model: ServiceModel, traffic: ConsumerTraffic, limits: Limits, copies: int = 1) -> TargetPart | None:
    """One model's part of a pool's scaling target (scaling_target), its day `traffic` (a pool's: pooled_traffic);
    None where no per-process rate meets `limits`."""
    safe = max_safe_rate(model, traffic.output_mean, limits)
    if safe is None:
        return None
    return TargetPart(model, traffic.output_mean, safe[0], copies, tuple(traffic.hourly_rps()),
                      tuple(traffic.hourly_burstiness()))


def pooled_traffic(entries: list[ConsumerTraffic], service: str, ctx: PlanContext) -> ConsumerTraffic:
    """One model's traffic from several consumer regions as a pool's processes see it, one model or a packing: the
    hourly rates summed, each hour's busiest minute the members' busiest minutes summed (as if they coincided:
    conservative, and what the pool is sized for), so its burstiness is the summed peaks over the summed rates; the
    lengths rate-weighted, and the region the farthest member's (its network binds the TTFT SLO). The scaling target
    reads this burstiness (docs/plan.md, "Pools"): the busiest member's alone would make the target scale the pool out
    past the count its SLOs need."""
    if len(entries) == 1:
        return entries[0]
    rates, bursts = pooled_day(entries)
    day = sum(sum(t.hourly_rps()) for t in entries) or 1.0
    far = max(entries, key=lambda t: ctx.latency.between(t.region, service) or 0.0)
    return far.model_copy(update={
        "rate_rps": rates, "burstiness": bursts, "concurrency": None,
        "input_tokens": sum(sum(t.hourly_rps()) * t.input_mean for t in entries) / day,
        "output_tokens": sum(sum(t.hourly_rps()) * t.output_mean for t in entries) / day, "observed": None})


def pooled_day(entries: Sequence[ConsumerTraffic]) -> tuple[list[float], list[float]]:
    """(rates, busiest-minute ratios) per UTC hour of one model's pooled traffic (pooled_traffic): the rates summed,
    each hour's ratio the summed busiest minutes over the summed rate (1 in an hour without traffic)."""
    rates = [sum(t.hourly_rps()[h] for t in entries) for h in range(24)]
    peaks = [sum(t.hourly_rps()[h] * t.hourly_burstiness()[h] for t in entries) for h in range(24)]
    return rates, [p / r if r > 0 else 1.0 for p, r in zip(peaks, rates)]


def _streams(traffics: Sequence[ConsumerTraffic], h: int) -> list[Stream]:
    """Hour h's busiest-minute arrivals of one model's processes, one stream per consumer region: each keeps its own
    output length, so an hour's mix of long and short requests is the mix that hour has."""
    return [Stream(t.hourly_rps()[h] * t.hourly_burstiness()[h], t.output_mean) for t in traffics]


def processes_by_hour(model: ServiceModel, traffics: Sequence[ConsumerTraffic], limits: Limits) -> list[int | None]:
    """Per UTC hour, the fewest processes (instances, for one process per instance) meeting `limits` at the hour's
    busiest-minute arrivals of every member (one model's consumer regions), spread at random over them
    (queueing.instances_needed); None where none does."""
    out: list[int | None] = []
    for h in range(24):
        sized = instances_needed(model, _streams(traffics, h), limits, 0)
        out.append(None if sized is None else sized[0])
    return out


def predictions_by_hour(model: ServiceModel, traffics: Sequence[ConsumerTraffic],
                        processes: list[int]) -> list[Prediction | None]:
    """Per UTC hour, the prediction at the busiest minute over that hour's processes (None: no traffic)."""
    out: list[Prediction | None] = []
    for h, n in enumerate(processes):
        streams = _streams(traffics, h)
        out.append(predict(model, streams, 1.0 / n) if n > 0 and sum(x.rate_rps for x in streams) > 0 else None)
    return out


@dataclass(frozen=True)
class DayPart:
    """One model's processes on a pool's instances, as a day is sized from arrivals."""

    model: ServiceModel
    traffic: ConsumerTraffic
    limits: Limits  # its SLOs in-region (its consumers' network taken off the TTFT)
    copies: int = 1
    # Pooled across regions: each consumer region's own traffic (`traffic` their sum), sized as one stream each.
    members: tuple[ConsumerTraffic, ...] = ()

    @property
    def streams(self) -> tuple[ConsumerTraffic, ...]:
        return self.members or (self.traffic,)


@dataclass(frozen=True)
class Day:
    """A pool's day sized from arrivals, one model or a packing (size_day)."""

    needed: list[list[int]]  # per part, the processes its SLOs need per UTC hour, before the floor
    instances_by_hour: list[int]
    predictions: list[list[Prediction | None]]  # per part, at each hour's busiest minute over the planned processes
    fixed_by_hour: list[float]
    cost_by_hour: list[float]
    reserved_used: int

    @property
    def cost_per_hour(self) -> float:
        return sum(self.cost_by_hour) / 24


def size_day(parts: list[DayPart], instance_type: str, region: str, price: float, ctx: PlanContext,
             n_min: int) -> Day | int:
    """Steps 3'-5 for a pool's instances, one model or a packing: per part and UTC hour the fewest processes
    meeting its limits at the busiest minute, instances = the largest over the parts of processes / copies, at least
    `n_min`; cost = the instances above the reservation (--reserved) x price + the region's fixed costs. Returns the
    index of a part that no count of processes serves instead."""
    needed = []
    for i, part in enumerate(parts):
        hours = processes_by_hour(part.model, part.streams, part.limits)
        if any(n is None for n in hours):
            return i
        needed.append([n or 0 for n in hours])
    instances = [max([n_min] + [math.ceil(n[h] / p.copies) for n, p in zip(needed, parts)]) for h in range(24)]
    predictions = [predictions_by_hour(p.model, p.streams, [n * p.copies for n in instances]) for p in parts]
    fixed = fixed_by_hour(region, [p.traffic for p in parts], ctx)
    reserved = ctx.reserved.get((instance_type, region), 0)
    cost = [max(n - reserved, 0) * price + f for n, f in zip(instances, fixed)]
    return Day(needed, instances, predictions, fixed, cost, min(reserved, max(instances)))


def per_m_output(day_cost: float, traffic: list[ConsumerTraffic]) -> float:
    """$ per 1M output tokens of a day's cost over the traffic's tokens (docs/plan.md step 5)."""
    tokens = sum(sum(t.hourly_rps()) * 3600 * t.output_mean for t in traffic)
    return day_cost / tokens * 1e6 if tokens else math.inf


def per_m_input(day_cost: float, traffic: list[ConsumerTraffic]) -> float:
    """$ per 1M input tokens of a day's cost over the traffic's tokens, as per_m_output."""
    tokens = sum(sum(t.hourly_rps()) * 3600 * t.input_mean for t in traffic)
    return day_cost / tokens * 1e6 if tokens else math.inf


def arrival_p99s(rates: list[float], predictions: list[Prediction | None], network_ms: float) -> tuple[float, float]:
    """(P99 TTFT incl. network, P99 ITL) at each hour's busiest minute, weighted by the hour's requests: the table's
    wP99 columns for a pool sized from arrivals, one model's or a packing of one model's."""
    served = sum(rates)
    weights = [(r / served, p) for r, p in zip(rates, predictions) if p is not None] if served else []
    return (sum(w * (p.ttft_p99_ms + network_ms) for w, p in weights), sum(w * p.itl_p99_ms for w, p in weights))


def safe_goodput(model: ServiceModel, safe_rate: float, out_mean: float) -> float:
    """Requests per second per process at the SLO-safe rate x*, less the predicted error rate and a 2% margin."""
    at_target = predict(model, [Stream(safe_rate, out_mean)], 1.0)
    return safe_rate * max(0.0, 1 - at_target.error_rate - 0.02)


def _size_from_arrivals(ev: Evaluation, traffic: ConsumerTraffic, ctx: PlanContext) -> None:
    """Steps 2'-5 for a profile of arrivals: per-instance load derived from the fleet's arrivals and the curve.
    The service model holds requests for the traffic's own output length at the curve's mean ITL."""
    candidate, region = ev.candidate, ev.service_region
    ev.arrival_driven = True
    model = ctx.model(candidate)
    out_mean = traffic.output_mean
    limits = _limits(ctx, ev.network_ms)
    safe = max_safe_rate(model, out_mean, limits)
    if safe is None:
        p1 = predict(model, [Stream(1e-6, out_mean)], 1.0)
        ev.rejected = (f"fails the SLO even with one request per instance: predicted P99 TTFT "
                       f"{p1.ttft_p99_ms + ev.network_ms:.0f} ms (incl. {ev.network_ms:.0f} ms network), "
                       f"P99 ITL {p1.itl_p99_ms:.1f} ms")
        return
    ev.safe_rate_rps, at_safe, ev.binding = safe
    ev.max_load = round(at_safe.in_flight, 1)
    if ev.binding == "measured range":
        ev.measured_cap = model.top
    rates = traffic.hourly_rps()
    bursts = traffic.hourly_burstiness()
    ev.target = scaling_target([TargetPart(model, out_mean, ev.safe_rate_rps, 1, tuple(rates), tuple(bursts))])
    _, default_row = ctx.fixed.row(region)
    if default_row:
        ev.notes.append(f"no fixed-cost row for {region}: the default row is used")
    day = size_day([DayPart(model, traffic, limits)], candidate.instance_type, region, ev.price_per_hour, ctx,
                   ctx.n_min(region))
    if isinstance(day, int):
        ev.rejected = "no count of instances up to 100,000 meets the SLO at its busiest minute"
        return
    (ev.needed_by_hour,), ev.instances_by_hour, (ev.predictions,) = day.needed, day.instances_by_hour, day.predictions
    ev.cost_by_hour, ev.reserved_used, ev.fixed_per_hour = day.cost_by_hour, day.reserved_used, sum(day.fixed_by_hour) / 24
    ev.cost_per_hour = day.cost_per_hour
    ev.usd_per_m_output = per_m_output(sum(day.cost_by_hour), [traffic])
    ev.usd_per_m_input = per_m_input(sum(day.cost_by_hour), [traffic])
    served = sum(rates)
    # What each request costs in instance-seconds at the planned sizes (the busiest minutes included).
    ev.seconds_per_request = sum(ev.instances_by_hour[h] for h in range(24) if rates[h] > 0) / served if served else 0.0
    weights = [(r / served, p) for r, p in zip(rates, ev.predictions) if p is not None] if served else []
    ev.weighted_ttft_p99, ev.weighted_itl_p99 = arrival_p99s(rates, ev.predictions, ev.network_ms)
    ev.weighted_e2e = sum(w * (model.hold_ms(1.0 + p.in_flight, out_mean) + max(ev.network_ms, 0.0))
                          for w, p in weights)
    ev.goodput_rps = safe_goodput(model, ev.safe_rate_rps, out_mean)


def _structural_rejection(candidate: Candidate, consumer: str, region: str, ctx: PlanContext) -> str | None:
    """Constraints that do not depend on load: quality, support matrix, availability, reachability, price."""
    if ctx.quality is not None:
        ok, why = ctx.quality.verdict(candidate.instance_type, candidate.precision, ctx.quality_threshold,
                                            model=ctx.model_id)
        if ok is False:
            return f"quality check failed: {why}"
    if not ctx.availability.offered(candidate.instance_type, region):
        live = " (live check)" if region in ctx.availability.live_types else f" (availability as of {ctx.availability.as_of})"
        return f"{candidate.family} is not offered in {region}{live}"
    if ctx.model_id and candidate.model and candidate.model != ctx.model_id:
        return f"measured model {candidate.model!r}, the config serves {ctx.model_id!r}"
    if region != consumer and not (consumer in ctx.privatelink_regions and region in ctx.privatelink_regions):
        return f"cross-region PrivateLink between {consumer} and {region} is not supported (shipped table)"
    if ctx.latency.between(consumer, region) is None:
        return f"no network latency figure between {consumer} and {region} (give --latency FILE)"
    if ctx.prices.price(candidate.instance_type, region) is None:
        return f"no price for {candidate.instance_type} in {region} (prices as of {ctx.prices.as_of}; give --prices FILE)"
    # Last, so a type a region does not offer or price says that plainer reason first.
    instance = catalog.instance_catalog().get(candidate.instance_type)
    if instance is not None:
        # The validator's decision, in its words (fleetcast/contract/support.py).
        known_backend = candidate.backend if candidate.backend in support.BACKENDS else None
        refusal = support.check(ctx.model_family.value if ctx.model_family is not None else None, known_backend,
                                candidate.precision, ctx.kv_cache_dtype, instance.gpu.arch,
                                support.instance_where(candidate.instance_type, instance.gpu.name, instance.gpu.arch))
        if refusal is not None:
            return f"{refusal.reason}; the config validator would refuse it"
    return None


# ---------------------------------------------------------------- one consumer region


@dataclass
class RegionPlan:
    traffic: ConsumerTraffic
    evaluations: list[Evaluation]
    ranked: list[Evaluation]
    winner: Evaluation | None
    why_not: list[tuple[str, str]]  # (candidate label, reason), every candidate but the winner
    peak_notes: list[str]
    stats_notes: list[str]
    decided_by: list[str] = field(default_factory=list)  # a floor or reservation, not the traffic, decided the pick


def service_regions(instance_type: str, consumer: str, ctx: PlanContext) -> list[str]:
    """The consumer's own region, plus every other region that could serve it on `instance_type` (offered, priced,
    reachable by cross-region PrivateLink): the one rule for a one-model candidate and a packing of one model."""
    out = [consumer]
    if consumer not in ctx.privatelink_regions:
        return out
    for region in sorted(ctx.availability.regions_for(instance_type)):
        if region != consumer and region in ctx.privatelink_regions \
                and ctx.prices.price(instance_type, region) is not None \
                and ctx.latency.between(consumer, region) is not None:
            out.append(region)
    return out


def plan_region(candidates: list[Candidate], traffic: ConsumerTraffic, ctx: PlanContext) -> RegionPlan:
    evaluations = [evaluate(c, traffic, r, ctx) for c in candidates for r in service_regions(c.instance_type, traffic.region, ctx)]
    ranked = sorted((e for e in evaluations if e.feasible), key=Evaluation.rank_key)
    winner = pick(ranked)
    why_not = _why_not(candidates, evaluations, ranked, winner, traffic, ctx)
    decided = _deciding_constraints(candidates, traffic, ctx, winner, evaluations) if winner else []
    for label, _, text in decided:
        why_not = [(lbl, f"{reason}; {text}" if lbl == label else reason) for lbl, reason in why_not]
    return RegionPlan(traffic, evaluations, ranked, winner, why_not,
                      _peak_notes(candidates, evaluations, winner, traffic, ctx),
                      _stats_notes(ranked, winner, ctx), [note for _, note, _ in decided])


def pick(ranked: list[P]) -> P | None:
    """The choice among ranked feasible ways to serve, one model or a packing: the first measured (or synthetic) one;
    an estimate wins only when nothing measured fits, one from measured solo curves before a roofline one."""
    return next((e for e in ranked if not e.estimated), None) or \
        next((e for e in ranked if not e.roofline), ranked[0] if ranked else None)


def _deciding_constraints(candidates: list[Candidate], traffic: ConsumerTraffic, ctx: PlanContext, winner: Evaluation,
                          evaluations: list[Evaluation]) -> list[tuple[str, str, str]]:
    def replan(alt_ctx: PlanContext) -> Evaluation | None:
        alt_ctx.__dict__["_models"] = ctx.__dict__.get("_models", {})
        alt = [evaluate(c, traffic, r, alt_ctx) for c in candidates for r in service_regions(c.instance_type, traffic.region, alt_ctx)]
        return pick(sorted((e for e in alt if e.feasible), key=Evaluation.rank_key))

    return [(alt.candidate.label, note, text) for alt, note, text in deciding_constraints(
        ctx, winner, replan, lambda e: (id(e.candidate), e.service_region), lambda e: e.service_region)]



def deciding_constraints(ctx: PlanContext, winner: P, replan: Callable[[PlanContext], P | None],
                         same: Callable[[P], Any], region_of: Callable[[P], str]) -> list[tuple[P, str, str]]:
    """When a config floor (capacity.min) or a reservation, not the traffic, decides the pick, one model or a
    packing: say which and what would win without it (`replan` plans the region again under another context).
    Returns (the pick without it, note for the region, text for that pick's why-not)."""
    from dataclasses import replace

    out = []
    floors = {r: n for r, n in ctx.min_instances.items() if n > 1} or ({} if ctx.default_min_instances <= 1 else
                                                                       {"*": ctx.default_min_instances})
    variants = []
    if floors:
        variants.append(("floor", replace(ctx, min_instances={}, default_min_instances=1)))
    if ctx.reserved:
        variants.append(("reservation", replace(ctx, reserved={})))
    for kind, alt_ctx in variants:
        alt_win = replan(alt_ctx)
        if alt_win is None or same(alt_win) == same(winner):
            continue
        if kind == "floor":
            region = region_of(winner) if region_of(winner) in ctx.min_instances else region_of(alt_win)
            source = ctx.min_instances_source.get(region, f"the floor of {ctx.n_min(region)} instances")
            what = f"{source} ({ctx.n_min(region)} instances in {region})"
        else:
            held = ", ".join(f"{n} x {t} in {r}" for (t, r), n in sorted(ctx.reserved.items()))
            what = f"the capacity reservation ({held}, paid whatever the plan picks)"
        note = (f"{what} decided the pick: without it {alt_win.label} would be chosen at ${alt_win.cost_per_hour:.2f}/h "
                f"({alt_win.instance_hours} instance-hours/day) vs {winner.label} at ${winner.cost_per_hour:.2f}/h")
        out.append((alt_win, note, f"without {what} it would win"))
    return out


def plan(candidates: list[Candidate], profile: TrafficProfile, ctx: PlanContext) -> list[RegionPlan]:
    return [plan_region(candidates, consumer, ctx) for consumer in profile.consumers]


@dataclass
class FleetPool:
    """One provider pool (service region x candidate) and the consumer regions it serves.

    Each region's own plan pays for a pool's minimum and the provider side's fixed costs
    (NLB hours, the provider VPC's interface endpoints) alone. Served together, those are
    paid once and the pool holds the summed load at ONE scaling target, since the group
    scales on one: with arrivals, N_h = the fewest instances at which the summed busiest-minute
    arrivals meet every member's SLOs, each member's own network latency included; with
    histograms, one target k <= every member's c* and N_h = max(n_min, ceil(sum_i rate_i,h * S_i(k))).
    """

    service_region: str
    candidate: str
    members: list[tuple[RegionPlan, Evaluation]]  # (consumer region's plan, its evaluation on this pool)
    instances_by_hour: list[int] = field(default_factory=list)
    cost_per_hour: float = 0.0
    marginal: dict[str, float] = field(default_factory=dict)  # consumer region -> what it adds to this pool's $/h
    pool_target: float | None = None
    predictions: list[Prediction | None] = field(default_factory=list)
    # consumer region -> predicted (P99 TTFT incl. its network, P99 ITL) at the pool's busiest planned minute
    member_checks: dict[str, tuple[float, float]] = field(default_factory=dict)
    needed_by_hour: list[int] = field(default_factory=list)  # arrivals: instances the SLOs need, before the floor

    @property
    def consumer_regions(self) -> list[str]:
        return [plan.traffic.region for plan, _ in self.members]

    @property
    def target(self) -> float:
        if self.pool_target is not None:
            return self.pool_target
        return min(_given(ev.target) for _, ev in self.members)

    @property
    def evaluation(self) -> Evaluation:
        return self.members[0][1]

    def capacity(self) -> tuple[int, int, int]:
        return capacity_bounds(self.instances_by_hour)

    def joined(self) -> list[tuple[RegionPlan, Evaluation]]:
        """Members served here rather than by their own plan's choice."""
        return [(plan, ev) for plan, ev in self.members if ev is not plan.winner]

    def planned(self, ctx: PlanContext) -> PlannedPool:
        return one_model_pool([(plan.traffic, ev) for plan, ev in self.members], ctx, self.instances_by_hour,
                              self.target, self.needed_by_hour, self.predictions, self.cost_per_hour)


def one_model_pool(members: list[tuple[ConsumerTraffic, Evaluation]], ctx: PlanContext, instances: list[int],
                   target: float | None, needed: list[int], predictions: list[Prediction | None],
                   cost_per_hour: float) -> PlannedPool:
    """A pool of one model (the evaluation of its first member's candidate) serving these consumer regions."""
    ev = members[0][1]
    assert target is not None  # every feasible evaluation has one
    cand = ev.candidate
    network = max(e.network_ms for _, e in members)
    arrivals = all(e.arrival_driven for _, e in members)
    # The network delays the client, not the GPU: an instance holds a request for its in-region E2E.
    hold, spr = pooled_hold([(t, e.weighted_e2e - max(e.network_ms, 0.0), e.seconds_per_request) for t, e in members])
    sizing = Sizing(ctx.model(cand), tuple(t for t, _ in members), _limits(ctx, network), network, tuple(instances),
                    tuple(needed), tuple(predictions), cand.provenance == "synthetic", cand.source, arrivals,
                    None if arrivals else hold, None if arrivals else spr)
    # The pool's cost, not its first member's own: pooled, that member's pool is not what the config runs.
    return PlannedPool(ev.service_region, tuple(t.region for t, _ in members), cand.instance_type, cand.label,
                       cost_words(cost_per_hour, per_m_output(cost_per_hour * 24, [t for t, _ in members])),
                       (Served(cand.model or "", cand.precision, sizing=sizing),), tuple(instances), float(target),
                       cand.estimated, cand.backend, price_per_hour=ev.price_per_hour, cost_per_hour=cost_per_hour)


def cost_words(cost_per_hour: float, usd_per_m_output: float) -> str:
    """A planned pool's cost as `plan --check` names the pick, one model or a packing."""
    return f"${cost_per_hour:.2f}/h, ${usd_per_m_output:.3f} per 1M output tokens"


@dataclass
class _PoolSize:
    counts: list[int]
    cost: float
    target: float | None
    predictions: list[Prediction | None]
    checks: dict[str, tuple[float, float]]
    needed: list[int]


def _pool_size(service: str, members: list[tuple[RegionPlan, Evaluation]], ctx: PlanContext) -> _PoolSize:
    if not members:
        return _PoolSize([], 0.0, None, [], {}, [])
    first = members[0][1]
    cand = first.candidate
    n_min = ctx.n_min(service)
    arrivals = [(plan, ev) for plan, ev in members if ev.arrival_driven]
    histogram = [(plan, ev) for plan, ev in members if not ev.arrival_driven]
    counts = [0] * 24
    predictions: list[Prediction | None] = [None] * 24
    needed = [0] * 24
    checks: dict[str, tuple[float, float]] = {}
    target = None
    if arrivals:
        model = ctx.model(cand)
        limits = _limits(ctx, max(ev.network_ms for _, ev in arrivals))
        # The one sizing of a pool's day (size_day's, as a packing's pool is sized): one stream per member.
        traffics = [plan.traffic for plan, _ in arrivals]
        counts = [n or 0 for n in processes_by_hour(model, traffics, limits)]
        needed = list(counts)
        predictions = predictions_by_hour(model, traffics, [max(c, n_min) for c in counts])
        # The pool's day as a packing's pool reads it (pooled_traffic, one rule): summed rates and busiest minutes.
        part = target_part(model, pooled_traffic([plan.traffic for plan, _ in arrivals], service, ctx), limits)
        target = scaling_target([part]) if part is not None else min(_given(ev.target) for _, ev in arrivals)
        worst = max((p for p in predictions if p is not None), key=lambda p: p.ttft_p99_ms, default=None)
        for plan, ev in arrivals:
            if worst is not None:
                checks[plan.traffic.region] = (worst.ttft_p99_ms + ev.network_ms, worst.itl_p99_ms)
    if histogram:
        k, loads = pooled_histogram(cand.curve, [(plan.traffic, _given(ev.max_load), _given(ev.seconds_at))
                                                 for plan, ev in histogram])
        counts = [c + math.ceil(x - 1e-9) for c, x in zip(counts, loads)]
        # What the SLOs need before the floor, as a histogram-sized candidate alone records it (was left at 0).
        needed = list(counts)
        target = k if target is None else min(target, k)
    counts = [max(n_min, c) for c in counts]
    reserved = ctx.reserved.get((cand.instance_type, service), 0)
    fixed = sum(ev.fixed_per_hour for _, ev in members) - (len(members) - 1) * provider_side(service, ctx)
    cost = sum(max(n - reserved, 0) for n in counts) / 24 * first.price_per_hour + fixed
    return _PoolSize(counts, cost, target, predictions, checks, needed)


def pooled_histogram(curve: Curve, members: Sequence[tuple[ConsumerTraffic, float, Callable[[float], float]]]
                     ) -> tuple[float, list[float]]:
    """A pool sized by the histogram method across consumer regions, one model or a packing of one process
    (docs/plan.md, "Pools"): members are (traffic, its c* there, its S(k)). One target for the pool, the level at
    most every member's c* making the summed load cheapest (ties: the higher level); returns it and each hour's
    load in instances, sum_i rate_i,h x S_i(k), before rounding up and the floor."""
    cap = min(c for _, c, _ in members)
    options = [p.concurrency for p in curve.points if p.concurrency <= cap]

    def loads(k: float) -> list[float]:
        return [sum(t.hourly_rps()[h] * at(k) for t, _, at in members) for h in range(24)]
    k = min(options, key=lambda k: (sum(math.ceil(x - 1e-9) for x in loads(k)), -k))
    return k, loads(k)


def pooled_hold(members: Sequence[tuple[ConsumerTraffic, float, float]]) -> tuple[float, float]:
    """(ms a request holds an instance, instance-seconds per request) of a histogram-sized pool, one model or a
    packing of one process: the members' (traffic, hold ms, seconds per request) weighted by their day's requests."""
    day = [sum(t.hourly_rps()) for t, _, _ in members]
    volume = sum(day) or 1.0
    return (sum(d * hold for d, (_, hold, _) in zip(day, members)) / volume,
            sum(d * spr for d, (_, _, spr) in zip(day, members)) / volume)


def provider_side(service: str, ctx: PlanContext) -> float:
    """$/h of a pool's provider side (its NLB hour and the provider VPC's interface endpoints): what consumer regions
    pooled on one pool pay once instead of once each."""
    a = ctx.fixed.assumptions
    row, _ = ctx.fixed.row(service)
    return row.nlb_hour + a.provider_interface_endpoints * a.availability_zones * row.endpoint_az_hour


def _pool_cost(service: str, members: list[tuple[RegionPlan, Evaluation]], ctx: PlanContext) -> tuple[list[int], float]:
    size = _pool_size(service, members, ctx)
    return size.counts, size.cost


K = TypeVar("K")
M = TypeVar("M")


def pool_moves(pools: dict[K, list[M]], cost: Callable[[K, list[M]], float], fits: Callable[[M, K], bool],
               bound: int) -> dict[K, list[M]]:
    """Pooling across regions, one model or a packing (docs/plan.md, "The fleet"): from every consumer region's own
    choice, move a member onto another pool it `fits` while that lowers the fleet's cost per hour by at least a cent,
    largest saving first; a pool left empty goes. `cost(key, [])` is 0, and inf for members the pool cannot serve.
    Bounded: at most `bound` moves, each saving a cent or more."""
    for _ in range(bound):
        best: tuple[float, M, K, K] | None = None
        for from_key, members in pools.items():
            for member in members:
                leave = cost(from_key, members) - cost(from_key, [m for m in members if m is not member])
                for to_key, other in pools.items():
                    if to_key == from_key or not fits(member, to_key):
                        continue
                    saving = leave - (cost(to_key, other + [member]) - cost(to_key, other))
                    if saving >= 0.01 and (best is None or saving > best[0]):
                        best = (saving, member, from_key, to_key)
        if best is None:
            break
        _, member, from_key, to_key = best
        pools[from_key] = [m for m in pools[from_key] if m is not member]
        pools[to_key].append(member)
        if not pools[from_key]:
            del pools[from_key]
    return pools


def fleet_pools(plans: list[RegionPlan], ctx: PlanContext) -> list[FleetPool]:
    """Start from every region's own choice, then move a consumer region onto another region's pool while that lowers
    the fleet's total cost per hour (pool_moves; its evaluation there must meet the SLO, network included, as every
    feasible evaluation does)."""

    def key_of(ev: Evaluation) -> tuple[str, str]:
        return ev.service_region, ev.candidate.label

    def at(plan: RegionPlan, key: tuple[str, str]) -> Evaluation | None:
        own = _given(plan.winner)
        return own if key_of(own) == key else next(
            (e for e in plan.ranked if key_of(e) == key and e.candidate.estimated == own.candidate.estimated), None)

    def cost(key: tuple[str, str], members: list[RegionPlan]) -> float:
        return _pool_cost(key[0], [(p, _given(at(p, key))) for p in members], ctx)[1]

    start: dict[tuple[str, str], list[RegionPlan]] = {}
    for plan in plans:
        if plan.winner is not None:
            start.setdefault(key_of(plan.winner), []).append(plan)
    moved = pool_moves(start, cost, lambda plan, key: at(plan, key) is not None, len(plans) * len(plans) + 1)
    pools = {key: FleetPool(*key, [(p, _given(at(p, key))) for p in members]) for key, members in moved.items()}

    def cost_of(key: tuple[str, str], members: list[tuple[RegionPlan, Evaluation]]) -> float:
        return _pool_cost(key[0], members, ctx)[1]

    for key, pool in pools.items():
        size = _pool_size(key[0], pool.members, ctx)
        pool.instances_by_hour, pool.cost_per_hour = size.counts, size.cost
        pool.pool_target, pool.predictions, pool.member_checks = size.target, size.predictions, size.checks
        pool.needed_by_hour = size.needed
        pool.marginal = {plan.traffic.region: pool.cost_per_hour - cost_of(key, [m for m in pool.members if m[0] is not plan])
                         for plan, _ in pool.members}
    return list(pools.values())


# ---------------------------------------------------------------- explanations


def _pct(a: float, b: float) -> str:
    if not b:
        return "n/a"
    change = (a / b - 1) * 100
    return f"{change:+.1f}%" if abs(change) < 1 else f"{change:+.0f}%"


def cheaper_words(ev: PoolDay, win: PoolDay, where: str = "") -> str:
    """How an estimate that ranks above the measured choice is worded, one model or a packing: it is never chosen
    while something measured serves (pick), and the report says what it would cost."""
    return (f"estimated only: would cost ${ev.cost_per_hour:.2f}/h{where} vs ${win.cost_per_hour:.2f}/h "
            f"({_pct(ev.cost_per_hour, win.cost_per_hour)}, {ev.source}); not chosen: benchmark it before choosing it")


def cheaper_estimates(ranked: list[P], winner: P, noun: str) -> list[str]:
    """The note naming the estimates that rank above a measured (or synthetic) choice, one model or a packing."""
    cheaper = [e for e in ranked if e.estimated and e.rank_key() < winner.rank_key()]
    if not cheaper or winner.estimated:
        return []
    return [f"{len(cheaper)} estimated {noun}(s) rank above the {winner.source} choice; the best, "
            f"{cheaper[0].label}: {cheaper_words(cheaper[0], winner)}"]


def loss_head(ev: PoolDay, win: PoolDay) -> tuple[bool, str]:
    """Why `ev` ranks below `win`, one model or a packing, in rank_key's order: (a tie on cost, the words). On a tie,
    the instance-hours when they differ, else the latency; otherwise the cost."""
    if round(ev.cost_per_hour, 2) == round(win.cost_per_hour, 2):
        head = f"same cost (${ev.cost_per_hour:.2f}/h); "
        if ev.instance_hours != win.instance_hours:
            return True, head + f"{ev.instance_hours} vs {win.instance_hours} instance-hours/day"
        (what, mine), (_, theirs) = ev.latency_words(), win.latency_words()
        return True, head + f"{what} {mine} vs {theirs}"
    return False, (f"costs ${ev.cost_per_hour:.2f}/h vs ${win.cost_per_hour:.2f}/h ({_pct(ev.cost_per_hour, win.cost_per_hour)}, "
                   f"${ev.usd_per_m_output:.3f} vs ${win.usd_per_m_output:.3f} per 1M output tokens)")


def _loss_reason(ev: Evaluation, win: Evaluation, traffic: ConsumerTraffic) -> str:
    capped = (f"{ev.first_failure.text()} caps its load at {ev.target:g} in-flight requests per instance, while "
              f"{ev.share_above_target:.0%} of {traffic.region}'s requests run at higher levels"
              if ev.first_failure and ev.share_above_target > 0 else None)
    return loss_reason(ev, win, cap=ev.measured_cap, capped=capped,
                       held=(ev.seconds_per_request, win.seconds_per_request),
                       regions=(ev.service_region, win.service_region), fixed=(ev.fixed_per_hour, win.fixed_per_hour))


def loss_reason(ev: PoolDay, win: PoolDay, *, cap: float | None, capped: str | None, held: tuple[float, float],
                regions: tuple[str, str], fixed: tuple[float, float]) -> str:
    """Why `ev` is not the pick `win`, one model or a packing: the cost or, on a tie, what broke it (loss_head),
    then what the cost rests on: a load capped by the measured range (`cap`) or by an SLO over part of the traffic
    (`capped`), the instance-seconds a request holds (`held`: ev's, win's), the price, the region served from
    (`regions`, with `fixed` costs per hour: ev's, win's)."""
    tie, head = loss_head(ev, win)
    if tie:
        if ev.instance_hours == win.instance_hours and overlap(ev.weighted_ttft_ci, win.weighted_ttft_ci):
            head += " (within noise at P99: the confidence intervals overlap)"
        return head
    parts = [head]
    if cap is not None:
        # Not a loss on price: the plan could not give it the load it might carry.
        parts.insert(0, f"measured only up to concurrency {cap:g}, lower than the load it could carry within the "
                        f"SLOs (it meets every SLO there): sized as if capped at {cap:g}, so its cost is an upper "
                        f"bound (benchmark it above {cap:g} before ruling it out)")
    parts += [capped] if capped else []
    if held[0] > held[1] * 1.005:
        parts.append(f"each request holds an instance {held[0] * 1000:.0f} ms vs {held[1] * 1000:.0f} ms at the "
                     "traffic's load levels")
    if ev.price_per_hour > win.price_per_hour * 1.005:
        parts.append(f"at ${ev.price_per_hour:.3f}/h per instance vs ${win.price_per_hour:.3f}/h")
    if regions[0] != regions[1]:
        text = f"served from {regions[0]}: RTT {ev.rtt_ms:g} ms vs {win.rtt_ms:g} ms"
        if fixed[0] > fixed[1] + 0.005:
            text += f", +${fixed[0] - fixed[1]:.2f}/h fixed and transfer costs"
        parts.append(text)
    return "; ".join(parts)


def _why_not(candidates: list[Candidate], evaluations: list[Evaluation], ranked: list[Evaluation],
             winner: Evaluation | None, traffic: ConsumerTraffic, ctx: PlanContext) -> list[tuple[str, str]]:
    out = []
    order = {id(e.candidate): i for i, e in enumerate(ranked)}
    candidates = sorted(candidates, key=lambda c: order.get(id(c), len(order)))
    for cand in candidates:
        mine = [e for e in evaluations if e.candidate is cand]
        feasible = [e for e in ranked if e.candidate is cand]
        if winner is not None and cand is winner.candidate:
            others = [e for e in feasible if e is not winner]
            if others:
                out.append((f"{cand.label} from other regions", "; ".join(
                    f"{e.service_region} {_pct(e.cost_per_hour, winner.cost_per_hour)} cost, RTT {e.rtt_ms:g} ms vs {winner.rtt_ms:g} ms"
                    for e in others)))
            continue
        if feasible:
            best = feasible[0]
            assert winner is not None  # something is feasible, so something was chosen
            if cand.estimated and best.rank_key() < winner.rank_key():
                out.append((cand.label, cheaper_words(best, winner, f" in {best.service_region}")))
                continue
            out.append((cand.label, f"best in {best.service_region}: " + _loss_reason(best, winner, traffic)))
            continue
        home = next(e for e in mine if e.service_region == traffic.region)
        text = f"ruled out: {home.rejected}"
        others = [e for e in mine if e.service_region != traffic.region]
        if others:
            # One reason given once: a support-matrix refusal is the same in every region that could serve.
            same = [e.service_region for e in others if e.rejected == home.rejected]
            text += "; cross-region: " + "; ".join(([f"the same in {', '.join(same)}"] if same else [])
                                                   + [f"{e.service_region}: {e.rejected}" for e in others
                                                      if e.rejected != home.rejected])
        elif traffic.region not in ctx.privatelink_regions and not (home.rejected or "").startswith(("quality", "measured")):
            text += (f"; cross-region is not an option: {traffic.region} is not in the cross-region PrivateLink table "
                     f"(so no other region can serve it)")
        out.append((cand.label, text))
    return out


@dataclass(frozen=True)
class Option:
    """One model's candidate curve (instance type x precision) as the notes read it, one model's candidate or the
    packings of one model on that type and precision: its best way to serve (feasible first; None: none evaluated,
    `refusal` says why), the curve, its scaling target and the fallback target where the pass is within noise."""

    label: str  # the candidate's, "g6e.xlarge int8_wo"
    instance_type: str
    curve: Curve
    best: PoolDay | None
    chosen: bool
    estimated: bool
    target: float | None = None
    noise_fallback: tuple[float, float] | None = None
    refusal: str | None = None


def _option(cand: Candidate, evaluations: list[Evaluation], winner: Evaluation | None) -> Option:
    mine = [e for e in evaluations if e.candidate is cand]
    best = min(mine, key=lambda e: (not e.feasible, e.rank_key() if e.feasible else ()))
    return Option(cand.label, cand.instance_type, cand.curve, best, winner is not None and cand is winner.candidate,
                  cand.estimated, best.target, best.noise_fallback)


def _peak_notes(candidates: list[Candidate], evaluations: list[Evaluation], winner: Evaluation | None,
                traffic: ConsumerTraffic, ctx: PlanContext) -> list[str]:
    if winner is None:
        return []
    return peak_notes([_option(c, evaluations, winner) for c in candidates], winner, traffic, ctx)


def peak_notes(options: list[Option], winner: PoolDay | None, traffic: ConsumerTraffic, ctx: PlanContext) -> list[str]:
    """Why the benchmark's headline (peak throughput) is not the choice: one model's candidates or a packing of one
    model's instance types and precisions."""
    notes: list[str] = []
    peaks = [(peak, o) for o in options if (peak := o.curve.peak_output_tps())]
    if not peaks or winner is None:
        return notes
    overall = max(peaks, key=lambda x: x[0][0])
    offered = [x for x in peaks if ctx.availability.offered(x[1].instance_type, traffic.region)]
    local = max(offered, key=lambda x: x[0][0]) if offered else None
    weights = None if traffic.arrival_driven else traffic.level_weights()
    # Two scopes, each named: the highest peak of all candidates, and (when that type is not offered here) the highest
    # among those offered in the consumers' region; one unnamed "peak-throughput choice" read as two contradictory picks.
    for (tps, level), opt in [overall] + ([local] if local and local[1] is not overall[1] else []):
        scope = ("highest peak throughput of all candidates" if opt is overall[1] else
                 f"highest peak throughput of the types offered in {traffic.region}")
        head = f"{scope}: {opt.label}, {tps:,.0f} output tok/s at concurrency {level:g}"
        if opt.chosen:
            notes.append(f"{head}; it is also the choice")
            continue
        best = opt.best
        if best is None or not best.feasible:
            # Ruled out before any sizing (not offered, quality, measured range): the reason is the whole story.
            # Its first clause only: the full reason is under "Ruled out" a few lines up.
            reason = opt.refusal if best is None else best.rejected
            notes.append(f"{head}; not the choice: ruled out: {(reason or '').split(': ')[0]}")
            continue
        why = f"not the choice: {_pct(best.cost_per_hour, winner.cost_per_hour)} cost for this traffic"
        if weights is None:
            seen = (f"its instances would hold at most {best.max_load:g} requests in flight within the SLOs"
                    if best.max_load is not None else "it cannot serve them within the SLOs")
            notes.append(f"{head}; sized for {traffic.region}'s arrivals {seen}; {why}")
            continue
        share = sum(w for lv, w in weights.items() if lv >= level)
        notes.append(f"{head}, a load {share:.0%} of {traffic.region}'s requests run at; {why}")
    return notes


def overlap(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    return bool(a and b and a[0] <= b[1] and b[0] <= a[1])


def _stats_notes(ranked: list[Evaluation], winner: Evaluation | None, ctx: PlanContext) -> list[str]:
    if winner is None:
        return []
    best: dict[int, Evaluation] = {}
    for e in ranked:
        best.setdefault(id(e.candidate), e)  # each candidate at its best, in rank order
    return stats_notes(ranked, winner, [Option(e.candidate.label, e.candidate.instance_type, e.candidate.curve, e,
                                               e.candidate is winner.candidate, e.candidate.estimated, e.target,
                                               e.noise_fallback) for e in best.values()], ctx)


def stats_notes(ranked: list[P], winner: P | None, options: list[Option], ctx: PlanContext) -> list[str]:
    """How far noise reaches into the choice: estimates ranked above it, the pick against the next measured option on
    traffic-weighted P99 TTFT, an SLO inside a P99 CI at the target, thin tails. `options` each candidate (one
    model's, or a packing of one model's type and precision) at its best, in rank order, the pick's first."""
    notes: list[str] = []
    if winner is None:
        return notes
    notes += cheaper_estimates(ranked, winner, "candidate")
    chosen = next(o for o in options if o.chosen)
    rivals = [o for o in options if not o.estimated and not o.chosen]
    second = rivals[0] if rivals else None
    if second is not None and second.best is not None:
        a, b = winner.weighted_ttft_ci, second.best.weighted_ttft_ci
        if a and b and overlap(a, b):
            notes.append(f"{winner.label} and {second.best.label} are within noise on traffic-weighted P99 TTFT "
                         f"({a[0]:.0f}-{a[1]:.0f} vs {b[0]:.0f}-{b[1]:.0f} ms, 95% CI)")
        elif a and b:
            notes.append(f"{winner.label} vs {second.best.label}: traffic-weighted P99 TTFT differs beyond noise "
                         f"({_given(winner.weighted_ttft_p99):.0f} vs {_given(second.best.weighted_ttft_p99):.0f} ms; "
                         "CIs do not overlap)")
    for opt, ev in [(chosen, winner)] + ([(second, _given(second.best))] if second else []):
        net = ev.rtt_ms
        target = _given(opt.target)
        at = opt.curve.at(target)
        ci = at.ttft_p99_ci
        bench = at.bench_rtt_ms if at.bench_rtt_ms is not None else ctx.latency.same_region_ms
        if ci and ci[0] + net - bench <= ctx.slo.ttft_p99_ms <= ci[1] + net - bench:
            text = (f"{ev.label}: at its target load {target:g} the P99 TTFT CI "
                    f"({ci[0] + net - bench:.0f}-{ci[1] + net - bench:.0f} ms) contains the {ctx.slo.ttft_p99_ms:g} ms "
                    "SLO: the pass is within noise")
            if opt.noise_fallback:
                k2, cost2 = opt.noise_fallback
                others = [e for e in ranked if e is not ev and not e.estimated]
                cheaper = [e for e in others if round(e.cost_per_hour, 2) < round(cost2, 2)]
                text += (f"; if a longer run fails there, the target drops to {k2:g} and the cost to ${cost2:.2f}/h "
                         f"({_pct(cost2, ev.cost_per_hour)})")
                if ev is winner:
                    text += (f", and {cheaper[0].label} (${cheaper[0].cost_per_hour:.2f}/h) would be cheaper" if cheaper
                             else ", still the cheapest")
            notes.append(text)
        thin = [p for p in opt.curve.points if p.concurrency <= target and p.samples < MIN_P99_SAMPLES and not opt.estimated]
        if thin:
            counts = sorted({p.samples for p in thin})
            notes.append(f"{opt.label}: P99 at concurrency {', '.join(f'{p.concurrency:g}' for p in thin)} rests on "
                         f"{'/'.join(str(n) for n in counts)} samples (~{counts[0] // 100} above the P99): "
                         "treat those tails as rough and measure longer")
        if opt.estimated:
            notes.append(f"{ev.label} is estimated, not measured: its tails are model output")
    return notes
