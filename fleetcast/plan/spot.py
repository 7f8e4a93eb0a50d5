"""Spot for the planned fleet: an On-Demand baseline plus a Spot tier per pool, or a reasoned "no".

Inputs, each dated and overridable (docs/plan.md#spot):
- Spot prices per type and region (fleetcast/config/data/spot_prices.yaml, `--spot-prices FILE`);
- an interruption-rate ASSUMPTION per type, the monthly share of instances reclaimed, and the re-launch time
  (fleetcast/config/data/spot_interruptions.yaml, `--spot-interruptions FILE`, `--spot-relaunch-s`);
- the drain budget measured by `make bench-spot-drain` (fleetcast/config/data/spot_drain.yaml): the longest
  request, in seconds, that an interruption drain lets finish.

For each planned pool (hourly counts N_h from the on-demand plan, price p, Spot price s, target k in-flight
per instance, mean request time W, R instances of its type reserved there by --reserved) and each On-Demand base
b from the larger of the pool's minimum and R up to its peak:
  spot_h = max(0, N_h - b) instances run on Spot in hour h, the rest On-Demand;
  interruptions/day I = sum_h spot_h * rate, rate = monthly share / 730 h;
  per interruption: requests cut = k * sum_L w_L max(0, D_L - budget) / sum_L w_L D_L (the in-flight mix is
  length-biased, and a request of duration D in flight at a random moment has more than `budget` left with
  probability (D - budget) / D; D_L = W * L / mean output length for the traffic's output lengths L), and
  for `relaunch_s` one instance's load (k / W requests per second) runs on the others above the target:
  those requests are counted as SLO misses (conservative), the cut ones as errors; the replacement is billed
  for its re-launch without serving, and cut requests are served again;
  cost/h = (sum_h max(0, N_h - spot_h - R) p + spot_h s + I * (relaunch_h s + cut * S p)) / 24 + fixed;
  a reservation is billed at the On-Demand rate whether used or not, so the planner's pool cost leaves it out and
  Spot replaces only On-Demand paid above it: the saving never exceeds that spend, the cost never drops below fixed;
  SLO attainment = 1 - (cut + at-risk requests) / requests per day.
The recommendation is the cheapest b whose Spot-caused loss stays within SPOT_ERROR_BUDGET_SHARE of the
config's error budget (slo.error_rate), if it is cheaper than all On-Demand by at least MIN_SAVING; else the
planner says why Spot does not pay: the baseline or the reservation is the whole fleet, no Spot price, or
interruptions (long re-launches, long requests) eat the saving or the error budget.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetcast.config import catalog
from fleetcast.contract.errors import UserError
from fleetcast.contract.instance_env import Var

from .inputs import _read_yaml
from .solver import PlanContext, PlannedPool

DATA_DIR = catalog.DATA_DIR
HOURS_PER_MONTH = 730.0
# Spot may spend at most this share of the config's error budget (slo.error_rate) on interruptions.
SPOT_ERROR_BUDGET_SHARE = 0.5
MIN_SAVING = 0.01  # USD per hour: below this Spot is not worth a second group


@dataclass(frozen=True)
class SpotInputs:
    prices: dict[str, dict[str, float]]
    prices_as_of: str
    prices_source: str
    monthly_rate: dict[str, float]
    rates_as_of: str
    rates_source: str
    relaunch_s: float
    drain_safe_s: float
    drain_source: str

    def price(self, instance_type: str, region: str) -> float | None:
        return self.prices.get(instance_type, {}).get(region)

    def notes(self) -> list[str]:
        return [
            f"Spot prices as of {self.prices_as_of} ({self.prices_source})",
            f"interruption rates ASSUMED as of {self.rates_as_of} ({self.rates_source}); re-launch {self.relaunch_s:g} s "
            "assumed",
            f"drain budget {self.drain_safe_s:g} s per request ({self.drain_source})",
        ]


def _number(value: Any, where: str, flag: str, low: float = 0.0, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise UserError(f"{flag}: {where} = {value!r}; must be a number in [{low:g}, {high:g}]")
    return float(value)


def load_spot_inputs(prices: str | Path | None = None, interruptions: str | Path | None = None,
                     relaunch_s: float | None = None) -> SpotInputs:
    """The shipped tables, each replaced entry by entry by a FILE of the same shape."""
    raw_p = catalog.shipped_spot_prices()
    table = {k: dict(v) for k, v in raw_p["prices"].items()}
    p_as_of, p_source = str(raw_p.get("as_of", "unknown")), str(raw_p.get("source", "shipped"))
    if prices:
        over = _read_yaml(Path(prices), "--spot-prices")
        if not isinstance(over, dict) or not isinstance(over.get("prices"), dict):
            raise UserError(f"--spot-prices: {prices} must have a `prices: {{instance_type: {{region: usd_per_hour}}}}` "
                            "mapping and an `as_of` date")
        for name, regions in over["prices"].items():
            if not isinstance(regions, dict):
                raise UserError(f"--spot-prices: {prices}: prices.{name} must map region -> USD per hour")
            for region, value in regions.items():
                table.setdefault(name, {})[region] = _number(value, f"prices.{name}.{region}", "--spot-prices",
                                                             low=1e-9)
        p_as_of, p_source = str(over.get("as_of", "undated")), str(prices)

    raw_i = _read_yaml(DATA_DIR / "spot_interruptions.yaml", "spot_interruptions.yaml")
    rates = {k: float(v) for k, v in raw_i["monthly_interruption_rate"].items()}
    relaunch = float(raw_i.get("relaunch_s", 600))
    i_as_of, i_source = str(raw_i.get("as_of", "unknown")), str(raw_i.get("source", "shipped"))
    if interruptions:
        over = _read_yaml(Path(interruptions), "--spot-interruptions")
        if not isinstance(over, dict) or not isinstance(over.get("monthly_interruption_rate", {}), dict):
            raise UserError(f"--spot-interruptions: {interruptions} must have a `monthly_interruption_rate: "
                            "{instance_type: share}` mapping (and optionally relaunch_s) with an `as_of` date")
        for name, value in (over.get("monthly_interruption_rate") or {}).items():
            rates[name] = _number(value, f"monthly_interruption_rate.{name}", "--spot-interruptions", high=1.0)
        if "relaunch_s" in over:
            relaunch = _number(over["relaunch_s"], "relaunch_s", "--spot-interruptions", high=86400)
        i_as_of, i_source = str(over.get("as_of", "undated")), str(interruptions)
    if relaunch_s is not None:
        relaunch = _number(relaunch_s, "value", "--spot-relaunch-s", high=86400)
        i_source += "; re-launch from --spot-relaunch-s"

    drain = _read_yaml(Path(os.environ.get(Var.SPOT_DRAIN) or DATA_DIR / "spot_drain.yaml"), "spot_drain.yaml")
    safe = float(drain["safe_request_s"])
    source = f"measured {drain.get('as_of', 'undated')} by `{drain.get('command', 'make bench-spot-drain')}`"
    return SpotInputs(table, p_as_of, p_source, rates, i_as_of, i_source, relaunch, safe, source)


@dataclass
class SpotAdvice:
    """The spot verdict for one planned pool."""

    service_region: str
    candidate: str
    instance_type: str
    recommended: bool
    reason: str
    on_demand_cost_per_hour: float
    on_demand_usd_per_m_output: float
    on_demand_base: int | None = None
    spot_peak: int = 0
    instance_types: list[str] = field(default_factory=list)
    fallback_max: int = 0
    cost_per_hour: float | None = None
    usd_per_m_output: float | None = None
    slo_attainment: float | None = None
    interruptions_per_day: float = 0.0
    requests_cut_per_day: float = 0.0
    requests_at_risk_per_day: float = 0.0
    spot_price: float | None = None
    assumptions: list[str] = field(default_factory=list)
    interruption_rate_per_day: float = 0.0  # per Spot instance, the ASSUMED rate the verdict used
    reserved: int = 0  # of the pool's type there (--reserved), up to its peak: sunk, in the On-Demand base

    def spot_block(self) -> dict[str, Any] | None:
        """What --write-config writes under the pool (the On-Demand base is the pool's capacity.min)."""
        if not self.recommended:
            return None
        block: dict[str, Any] = {"on_demand_base": self.on_demand_base, "instance_types": list(self.instance_types),
                                 "allocation_strategy": "price-capacity-optimized", "capacity_rebalance": True,
                                 "on_demand_fallback_max": self.fallback_max}
        return block

    def line(self) -> str:
        where = f"{self.service_region} {self.candidate}"
        if not self.recommended:
            return f"{where}: Spot does not pay: {self.reason}"
        assert self.cost_per_hour is not None and self.slo_attainment is not None  # set with `recommended`
        saving = 1 - self.cost_per_hour / self.on_demand_cost_per_hour if self.on_demand_cost_per_hour else 0.0
        held = f" ({self.reserved} reserved, billed whether used or not)" if self.reserved else ""
        above = " above the reservation" if self.reserved else ""
        return (f"{where}: On-Demand base {self.on_demand_base}{held} + Spot up to {self.spot_peak} "
                f"({', '.join(self.instance_types)}): ${self.cost_per_hour:.2f}/h vs ${self.on_demand_cost_per_hour:.2f}/h "
                f"all On-Demand{above} ({saving:.0%} less), ${self.usd_per_m_output:.3f} vs "
                f"${self.on_demand_usd_per_m_output:.3f} per 1M output tokens; expected SLO attainment "
                f"{attainment_text(self.slo_attainment)} from ASSUMED interruption rates "
                f"({self.interruption_rate_per_day:.2g} interruptions per Spot instance a day assumed: "
                f"{self.interruptions_per_day:.2g} interruptions/day, "
                f"{self.requests_cut_per_day:.1f} requests cut, {self.requests_at_risk_per_day:.0f} at risk during "
                f"re-launch)")

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items()} | {"spot": self.spot_block()}


def attainment_text(attainment: float) -> str:
    """The attainment to the precision assumed interruption rates support: the loss rounded UP to one significant
    figure (the rates are bands a factor of two or more wide), so 0.0012% lost reads "about 99.998%", not 99.9988%."""
    loss = 1 - attainment
    if loss <= 0:
        return "100%"
    step = 10 ** math.floor(math.log10(loss))
    rounded = math.ceil(loss / step - 1e-9) * step
    digits = max(0, -math.floor(math.log10(step)) - 2)
    return f"about {100 - rounded * 100:.{digits}f}%"


def _same_gpu_types(instance_type: str, region: str, inputs: SpotInputs, on_demand_price: float) -> list[str]:
    instances = catalog.instance_catalog()
    own = instances.get(instance_type)
    if own is None:
        return [instance_type]
    same = [name for name, t in instances.items()
            if (t.gpu.name, t.gpus) == (own.gpu.name, own.gpus) and name != instance_type
            and (price := inputs.price(name, region)) is not None and price < on_demand_price]
    return [instance_type] + sorted(same, key=lambda n: inputs.price(n, region) or 0.0)


@dataclass(frozen=True)
class SpotPool:
    """What the Spot verdict reads of a planned pool, whatever planned it. A packing's pool is one: an interruption
    drains every process of the instance together, so the in-flight count is the packing's over every model, the
    request mix every model's, the error budget the strictest model's."""

    service_region: str
    candidate: str  # the pool's label (one model: its candidate; a packing: its instance type and packing)
    instance_type: str
    price_per_hour: float
    instances_by_hour: list[int]
    cost_per_hour: float
    target: float  # in-flight requests per instance (scaling target)
    mean_hold_s: float  # mean seconds a request holds its instance
    seconds_per_request: float  # instance-seconds per request
    traffics: list[Any]  # ConsumerTraffic per member (region or model)
    error_rate: float  # the error budget Spot may spend half of


def spot_pool(pool: PlannedPool) -> SpotPool:
    """What the Spot verdict reads of a planned pool, one model or a packing: an interruption drains every process of
    the instance together, so the in-flight count is the pool's scaling target, the request mix every member's, a
    request held for the rate-weighted mean over the members at their planned batches, the strictest error budget."""
    held = weight = 0.0
    traffics: list[Any] = []
    spr = None
    for served in pool.serves:
        z = served.sizing
        assert z is not None  # a planned pool says how each model's processes were sized
        traffics += z.members
        for t in z.members:
            if z.hold_ms is not None:  # the histogram method: its weighted E2E, no predictions
                held, weight, spr = held + sum(t.hourly_rps()) * z.hold_ms / 1000.0, weight + sum(t.hourly_rps()), \
                    z.seconds_per_request
                continue
            for rate, p in zip(t.hourly_rps(), z.predictions):
                if p is not None:
                    held += rate * z.service.hold_ms(1.0 + p.in_flight, t.output_mean) / 1000.0
                    weight += rate
    requests = sum(sum(t.hourly_rps()) for t in traffics)
    busy = sum(n for h, n in enumerate(pool.instances_by_hour) if any(t.hourly_rps()[h] > 0 for t in traffics))
    return SpotPool(pool.region, pool.label, pool.instance_type, pool.price_per_hour, list(pool.instances_by_hour),
                    pool.cost_per_hour, pool.target, max(held / weight if weight else 0.0, 0.001),
                    spr if spr is not None else busy / requests if requests else 0.0, traffics,
                    min(s.sizing.limits.error_rate for s in pool.serves if s.sizing is not None))


def advise(pool: SpotPool, ctx: PlanContext, inputs: SpotInputs) -> SpotAdvice:
    """Recommend a base + Spot tier for one planned pool, or say why not."""
    region, itype = pool.service_region, pool.instance_type
    counts = list(pool.instances_by_hour)
    od_price = pool.price_per_hour
    # Reserved instances (--reserved) are billed at the On-Demand rate whether used or not: sunk, they are out of
    # the pool's cost (the planner's) and Spot can only replace the On-Demand instances above them.
    reserved = min(ctx.reserved.get((itype, region), 0), max(counts))
    fixed = pool.cost_per_hour - on_demand_paid(counts, [0] * len(counts), reserved) / 24 * od_price
    traffics = pool.traffics
    rates = [sum(t.hourly_rps()[h] for t in traffics) for h in range(24)]
    requests = sum(rates) * 3600
    out_tokens = sum(sum(t.hourly_rps()) * 3600 * t.output_mean for t in traffics)

    def per_m(cost_per_hour: float) -> float:
        return cost_per_hour * 24 / out_tokens * 1e6 if out_tokens else math.inf

    advice = SpotAdvice(region, pool.candidate, itype, False, "", pool.cost_per_hour, per_m(pool.cost_per_hour),
                        assumptions=inputs.notes(), reserved=reserved)
    n_min = max(1, ctx.n_min(region))
    s_price = inputs.price(itype, region)
    advice.spot_price = s_price
    if max(counts) <= n_min:
        advice.reason = (f"the On-Demand baseline is the whole fleet: the plan never needs more than {max(counts)} "
                         f"instance(s), the pool's minimum of {n_min} (capacity.min), so no capacity lies above it")
        return advice
    if max(counts) <= reserved:
        advice.reason = (f"the reservation is the whole fleet: the plan never needs more than {max(counts)} "
                         f"instance(s) and {reserved} {itype} in {region} are reserved (--reserved), billed whether "
                         "used or not, so no On-Demand spend lies above them for Spot to replace")
        return advice
    if min(counts) == max(counts):
        advice.reason = (f"the plan holds {max(counts)} instances every hour (capacity min == max): a fixed-size pool "
                         "has no load above a baseline to move, and the config refuses a spot tier on it")
        return advice
    if s_price is None:
        advice.reason = f"no Spot price for {itype} in {region} (spot price table as of {inputs.prices_as_of})"
        return advice
    if s_price >= od_price:
        advice.reason = f"the Spot price ${s_price:.3f}/h is not below On-Demand ${od_price:.3f}/h"
        return advice

    k = pool.target
    w_s = pool.mean_hold_s
    rate = inputs.monthly_rate.get(itype, max(inputs.monthly_rate.values(), default=0.2)) / HOURS_PER_MONTH
    advice.interruption_rate_per_day = rate * 24
    cut_share = _cut_share(traffics, w_s, inputs.drain_safe_s)
    cut_per_interruption = k * cut_share
    at_risk_per_interruption = k / w_s * inputs.relaunch_s
    budget = SPOT_ERROR_BUDGET_SHARE * pool.error_rate

    best: tuple[float, int, list[int], float, float, float, float] | None = None
    binding = None
    # A base below the reservation would leave reserved instances idle, still billed, while Spot ran in their place.
    for base in range(max(n_min, reserved), max(counts)):
        spot = [max(0, n - base) for n in counts]
        interruptions = sum(spot) * rate  # instance-hours x interruptions per instance-hour
        cut = interruptions * cut_per_interruption
        at_risk = interruptions * at_risk_per_interruption
        extra = interruptions * (inputs.relaunch_s / 3600 * s_price + cut_per_interruption * pool.seconds_per_request
                                 / 3600 * od_price)
        cost = (on_demand_paid(counts, spot, reserved) * od_price + sum(spot) * s_price + extra) / 24 + fixed
        loss = (cut + at_risk) / requests if requests else 0.0
        option = (cost, base, spot, interruptions, cut, at_risk, loss)
        if loss > budget:
            binding = binding or option
            continue
        if best is None or cost < best[0] - 1e-9:
            best = option
    if best is None:
        assert binding is not None  # a base was tried (max(counts) > n_min) and refused
        _, base, _, interruptions, cut, at_risk, loss = binding
        advice.reason = (f"interruptions would cost {loss:.3%} of requests ({cut:.1f} cut, {at_risk:.0f} served "
                         f"above target during {inputs.relaunch_s:g} s re-launches per day), more than "
                         f"{SPOT_ERROR_BUDGET_SHARE:.0%} of the error budget slo.error_rate = {pool.error_rate:g}; "
                         "long cold starts or long requests make Spot a risk to the SLO here")
        return advice
    cost, base, spot, interruptions, cut, at_risk, loss = best
    if pool.cost_per_hour - cost < MIN_SAVING:
        advice.reason = (f"the saving (${pool.cost_per_hour - cost:.3f}/h) does not cover the interruptions "
                         f"({interruptions:.2g}/day at an assumed {rate * 24:.2g} per Spot instance a day, each a {inputs.relaunch_s:g} s re-launch billed without serving)")
        return advice
    advice.recommended = True
    advice.reason = "cheaper within the error budget"
    advice.on_demand_base = base
    advice.spot_peak = max(spot)
    advice.instance_types = _same_gpu_types(itype, region, inputs, od_price)
    advice.fallback_max = max(counts)
    advice.cost_per_hour = cost
    advice.usd_per_m_output = per_m(cost)
    advice.slo_attainment = 1 - loss
    advice.interruptions_per_day = interruptions
    advice.requests_cut_per_day = cut
    advice.requests_at_risk_per_day = at_risk
    return advice


def on_demand_paid(counts: Sequence[int], spot: Sequence[int], reserved: int) -> int:
    """On-Demand instance-hours billed beyond a reservation of `reserved` instances: each hour the instances not on
    Spot run in the reservation first (it is billed whether used or not, so it is out of the pool's cost), and only
    those above it are paid. A base at or above the reservation puts Spot only where On-Demand was paid."""
    return sum(max(0, n - s - reserved) for n, s in zip(counts, spot))


def _cut_share(traffics: Sequence[Any], mean_s: float, budget_s: float) -> float:
    """Share of in-flight requests an interruption cuts: those whose remaining time exceeds the budget."""
    num = den = 0.0
    for t in traffics:
        weight = sum(t.hourly_rps())
        lengths = t.output_tokens if isinstance(t.output_tokens, dict) else {str(t.output_mean): 1.0}
        for tokens, share in lengths.items():
            d = mean_s * float(tokens) / t.output_mean if t.output_mean else mean_s
            num += weight * share * max(0.0, d - budget_s)
            den += weight * share * d
    return num / den if den else 0.0


def lines(advice: list[SpotAdvice]) -> list[str]:
    if not advice:
        return []
    out = [a.line() for a in advice]
    out += [f"assumption: {n}" for n in advice[0].assumptions]
    return out
