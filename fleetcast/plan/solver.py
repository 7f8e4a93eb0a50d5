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

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fleetcast.config import catalog

from .curves import MIN_P99_SAMPLES, Curve, LoadPoint
from .inputs import Availability, FixedCosts, Latency, Prices, QualityFile
from .queueing import (
    Limits,
    Prediction,
    ServiceModel,
    Stream,
    instances_needed,
    max_safe_rate,
    predict,
)
from .traffic import ConsumerTraffic

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
    # Instances already paid for (On-Demand Capacity Reservations): (instance type, region) -> count. A plan
    # pays only for the instances above them; the reservation itself is paid whatever the plan picks.
    reserved: dict[tuple[str, str], int] = field(default_factory=dict)
    # Where each region's floor comes from, for explanations (e.g. "capacity.min of pool main").
    min_instances_source: dict[str, str] = field(default_factory=dict)

    def n_min(self, region: str) -> int:
        return self.min_instances.get(region, self.default_min_instances)


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


# ---------------------------------------------------------------- one candidate


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
    """A pool of one process per instance sized by the histogram method (steps 2-5): a packing of one process
    (packing.size_packing)."""

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
    # Each candidate target reads the curve at every traffic level below it, twice (cost and TTFT), and the chosen
    # one four times more: the points interpolated once each (a LoadPoint is frozen, the same values either way).
    at = functools.cache(curve.at)
    lowest = curve.points[0].concurrency
    if min(weights) < lowest:
        day.notes.append(f"traffic levels below {lowest:g} use the latencies measured at {lowest:g} (conservative)")

    def seconds_per_request(k: float) -> float:
        return sum(w * (e2e(at(min(level, k))) / 1000.0) / min(level, k) for level, w in weights.items())
    day.seconds_at = seconds_per_request

    def weighted(k: float, fn: Callable[[LoadPoint], float]) -> float:
        return sum(w * fn(at(min(level, k))) for level, w in weights.items())

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
    served = [(w, at(min(level, k))) for level, w in weights.items()]
    cis = [(w, p.ttft_p99_ci, network(p)) for w, p in served if p.ttft_p99_ci]
    if len(cis) == len(served):
        day.weighted_ttft_ci = (sum(w * (ci[0] + net) for w, ci, net in cis),
                                sum(w * (ci[1] + net) for w, ci, net in cis))
    at_k = at(k)
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


def _streams(traffics: Sequence[ConsumerTraffic]) -> list[list[Stream]]:
    """Per UTC hour, the busiest-minute arrivals of one model's processes, one stream per consumer region: each keeps
    its own output length, so an hour's mix of long and short requests is the mix that hour has. (Each profile's
    hourly figures are read once for the 24 hours.)"""
    days = [(t.hourly_rps(), t.hourly_burstiness(), t.output_mean) for t in traffics]
    return [[Stream(rps[h] * burst[h], out) for rps, burst, out in days] for h in range(24)]


def processes_by_hour(model: ServiceModel, traffics: Sequence[ConsumerTraffic], limits: Limits) -> list[int | None]:
    """Per UTC hour, the fewest processes (instances, for one process per instance) meeting `limits` at the hour's
    busiest-minute arrivals of every member (one model's consumer regions), spread at random over them
    (queueing.instances_needed); None where none does."""
    out: list[int | None] = []
    for streams in _streams(traffics):
        sized = instances_needed(model, streams, limits, 0)
        out.append(None if sized is None else sized[0])
    return out


def predictions_by_hour(model: ServiceModel, traffics: Sequence[ConsumerTraffic],
                        processes: list[int]) -> list[Prediction | None]:
    """Per UTC hour, the prediction at the busiest minute over that hour's processes (None: no traffic)."""
    out: list[Prediction | None] = []
    hours = _streams(traffics)
    for h, n in enumerate(processes):
        streams = hours[h]
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


# ---------------------------------------------------------------- one consumer region


def service_regions(instance_type: str, consumer: str, ctx: PlanContext) -> list[str]:
    """The consumer's own region, plus every other region that could serve it on `instance_type` (offered, priced,
    reachable by cross-region PrivateLink): where a packing of one model may be served from."""
    out = [consumer]
    if consumer not in ctx.privatelink_regions:
        return out
    for region in sorted(ctx.availability.regions_for(instance_type)):
        if region != consumer and region in ctx.privatelink_regions \
                and ctx.prices.price(instance_type, region) is not None \
                and ctx.latency.between(consumer, region) is not None:
            out.append(region)
    return out


def pick(ranked: list[P]) -> P | None:
    """The choice among ranked feasible ways to serve, one model or a packing: the first measured (or synthetic) one;
    an estimate wins only when nothing measured fits, one from measured solo curves before a roofline one."""
    return next((e for e in ranked if not e.estimated), None) or \
        next((e for e in ranked if not e.roofline), ranked[0] if ranked else None)


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


def cost_words(cost_per_hour: float, usd_per_m_output: float) -> str:
    """A planned pool's cost as `plan --check` names the pick, one model or a packing."""
    return f"${cost_per_hour:.2f}/h, ${usd_per_m_output:.3f} per 1M output tokens"


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
