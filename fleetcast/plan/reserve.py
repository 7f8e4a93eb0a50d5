"""A shared reserve for regions whose peaks do not coincide (issue 36 §2; docs/plan.md, "A shared reserve across
regions").

Each region's plan holds capacity for its own busiest hour. When one region is busy while another is quiet, the
quiet one can hold the busy one's overflow: with cross-region spill (consumers[].spill_regions), a home region keeps
a base B_r of its own and requests above it go to a host region s, whose pool then holds its own load plus every
spilling region's excess, hour by hour:

    C_s = max(floor_s, max_h (N_s(h) + sum_r max(0, N_r(h) - B_r)))

The reserve minimises the capacity held, priced by region: sum_r p_r B_r + p_s C_s, against sum_r p_r peak_r, every
region for its own peak. Instances a region has reserved already (--reserved, R_r) are billed whether used or not,
so only capacity held beyond them costs anything: p_r max(0, B_r - R_r) and p_s max(0, C_s - R_s). Keeping less than
its reservation at home saves a region nothing, and a host's reserved instances idle in its quiet hours take the
others' overflow for free; what the reserve saves never exceeds what the regions would pay beyond their reservations.
A region spills to s only when

  - residency allows it: every consumer served in that region lists s in its spill_regions (the profile gives a
    region's traffic, not each consumer's, so one strict consumer keeps the region home; default: none spills);
  - the SLO still holds for a spilled request: the worse of the two regions' planned P99 TTFT (network included)
    plus the round trip between them stays within the P99 TTFT SLO.

The bases are searched exactly (every combination) while there are at most EXACT_COMBINATIONS of them, else by
coordinate moves of one and two regions at a time (said in the result). Every region is tried as the host; the
cheapest wins. What it saves is capacity HELD (capacity reservations, a pool's capacity.max, the quota): the
instances RUN per hour are the same in total (the overflow runs in the host instead of at home).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Past this many combinations of bases the search moves one or two regions at a time instead of trying them all.
EXACT_COMBINATIONS = 200_000


@dataclass(frozen=True)
class RegionDemand:
    """One region's planned pool: what it runs per UTC hour, one instance's price, the floor it keeps, the regions
    its consumers allow it to spill to and its worst planned P99 TTFT (ms, network included) against its SLO."""

    region: str
    instances_by_hour: tuple[int, ...]
    price_per_hour: float
    floor: int
    spill_to: frozenset[str]
    worst_ttft_ms: float
    ttft_slo_ms: float
    label: str = ""
    reserved: int = 0  # instances already reserved there (--reserved): billed whether used or not

    @property
    def peak(self) -> int:
        return max(self.instances_by_hour)

    def paid(self, held: int) -> float:
        """$/h of holding `held` instances here beyond the reservation (which is paid whatever is held)."""
        return self.price_per_hour * max(0, held - self.reserved)


@dataclass
class ReservePlan:
    """The cheapest host and bases, against every region held at its own peak."""

    demands: list[RegionDemand]
    host: str | None = None
    bases: dict[str, int] = field(default_factory=dict)  # spilling region -> instances it keeps at home
    host_capacity: int = 0
    excluded: dict[str, str] = field(default_factory=dict)  # region -> why it cannot spill to the host
    method: str = "exact"
    rtts: dict[str, float] = field(default_factory=dict)  # spilling region -> its round trip to the host (ms)

    @property
    def separate_instances(self) -> int:
        return sum(d.peak for d in self.demands)

    @property
    def separate_cost_per_hour(self) -> float:
        return sum(d.paid(d.peak) for d in self.demands)

    def held(self) -> dict[str, int]:
        """Instances each region holds under the shared reserve (every region at its peak when none is shared)."""
        out = {d.region: d.peak for d in self.demands}
        if self.host is not None:
            out.update(self.bases)
            out[self.host] = self.host_capacity
        return out

    @property
    def shared_instances(self) -> int:
        return sum(self.held().values())

    @property
    def shared_cost_per_hour(self) -> float:
        by = {d.region: d for d in self.demands}
        return sum(by[r].paid(n) for r, n in self.held().items())

    @property
    def reserved(self) -> int:
        return sum(min(d.reserved, d.peak) for d in self.demands)

    def lines(self) -> list[str]:
        by = {d.region: d for d in self.demands}
        own = ", ".join(f"{d.region} {d.peak}" for d in self.demands)
        beyond = (f" beyond the {self.reserved} reserved (--reserved, billed whether used or not)"
                  if self.reserved else "")
        out = [f"each region for its own peak: {self.separate_instances} instances held ({own}), "
               f"${self.separate_cost_per_hour:.2f}/h if held all day{beyond}"]
        if len(self.demands) < 2:
            return out + ["one region: nothing to share"]
        if self.host is None or not self.bases:
            out.append("no shared reserve: " + ("; ".join(f"{r}: {why}" for r, why in self.excluded.items())
                                                or "no region's overflow may go to another"))
            return out
        host = by[self.host]
        saved = self.separate_instances - self.shared_instances
        cost = self.separate_cost_per_hour - self.shared_cost_per_hour
        kept = ", ".join(f"{r} keeps {b} of its peak {by[r].peak}" for r, b in self.bases.items())
        out.append(f"shared reserve in {self.host}: {kept}; {self.host} holds {self.host_capacity} (its own peak "
                   f"{host.peak}, {self.host_capacity - host.peak} more for the others' overflow, which comes in its "
                   f"quiet hours); {self.shared_instances} instances held, {saved} fewer "
                   f"({saved / self.separate_instances:.0%}), ${cost:.2f}/h less if held all day{beyond} "
                   f"(${cost * 730:,.0f} a month); bases searched {self.method}")
        for r, base in self.bases.items():
            d = by[r]
            over = [max(0, n - base) for n in d.instances_by_hour]
            hours = [h for h, x in enumerate(over) if x > 0]
            if not hours:
                out.append(f"{r}: never above its base; it keeps its whole day at home")
                continue
            share = sum(over) / sum(d.instances_by_hour)
            out.append(f"{r} spills to {self.host} above {base} instance(s): UTC hours {_hours_text(hours)}, up to "
                       f"{max(over)} instance(s)' load, {share:.0%} of its instance-hours; a spilled request's P99 "
                       f"TTFT up to {max(d.worst_ttft_ms, host.worst_ttft_ms) + self.rtts.get(r, 0.0):.0f} ms "
                       f"(SLO {d.ttft_slo_ms:g})")
        out += [f"{r} keeps its own peak: {why}" for r, why in self.excluded.items()]
        out.append("what this saves is capacity held (capacity reservations, capacity.max, the quota); the "
                   "instances run per hour are the same in total, the overflow running in the host instead of at home")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "bases": dict(self.bases), "host_capacity": self.host_capacity,
                "held": self.held(), "method": self.method, "excluded": dict(self.excluded),
                "separate": {"instances": self.separate_instances, "cost_per_hour": self.separate_cost_per_hour},
                "shared": {"instances": self.shared_instances, "cost_per_hour": self.shared_cost_per_hour},
                "regions": [{"region": d.region, "label": d.label, "instances_by_hour": list(d.instances_by_hour),
                             "price_per_hour": d.price_per_hour, "floor": d.floor, "spill_to": sorted(d.spill_to),
                             "worst_ttft_ms": d.worst_ttft_ms, "reserved": d.reserved} for d in self.demands]}


def _hours_text(hours: list[int]) -> str:
    runs: list[tuple[int, int]] = []
    for h in hours:
        if runs and runs[-1][1] == h:
            runs[-1] = (runs[-1][0], h + 1)
        else:
            runs.append((h, h + 1))
    return ", ".join(f"{a:02d}-{b:02d}" for a, b in runs)


def host_capacity(host: RegionDemand, spilling: list[RegionDemand], bases: tuple[int, ...]) -> int:
    """C_s: the host's own load plus each spilling region's excess over its base, at the worst hour."""
    worst = max(host.instances_by_hour[h] + sum(max(0, d.instances_by_hour[h] - b) for d, b in zip(spilling, bases))
                for h in range(len(host.instances_by_hour)))
    return max(host.floor, worst)


def _cost(host: RegionDemand, spilling: list[RegionDemand], bases: tuple[int, ...]) -> float:
    """$/h held beyond the reservations: what a base or the host's capacity adds to instances paid anyway."""
    return sum(d.paid(b) for d, b in zip(spilling, bases)) + host.paid(host_capacity(host, spilling, bases))


def _search(host: RegionDemand, spilling: list[RegionDemand]) -> tuple[tuple[int, ...], str]:
    """The bases of least held cost (ties: the most kept at home), exactly or by coordinate moves."""
    ranges = [range(min(d.floor, d.peak), d.peak + 1) for d in spilling]
    combos = 1
    for r in ranges:
        combos *= len(r)

    def key(bases: tuple[int, ...]) -> tuple[float, int]:
        return (round(_cost(host, spilling, bases), 6), -sum(bases))

    if combos <= EXACT_COMBINATIONS:
        return min(itertools.product(*ranges), key=key), "exact"
    best = tuple(d.peak for d in spilling)
    moves = [(i, s) for i in range(len(spilling)) for s in (-1, 1)]
    moves2 = [((i, a), (j, b)) for i, j in itertools.combinations(range(len(spilling)), 2) for a in (-1, 1)
              for b in (-1, 1)]
    improved = True
    while improved:
        improved = False
        trials = [[m] for m in moves] + [list(m) for m in moves2]
        for trial in trials:
            cand = list(best)
            for i, step in trial:
                cand[i] += step
            if all(lo.start <= c < lo.stop for lo, c in zip(ranges, cand)) and key(tuple(cand)) < key(best):
                best, improved = tuple(cand), True
    return best, "by moves of one and two regions (too many combinations to try all)"


def size_shared_reserve(demands: list[RegionDemand], rtt_ms: Callable[[str, str], float | None]) -> ReservePlan:
    """The cheapest shared reserve over `demands` (module docstring); `rtt_ms(a, b)` the round trip between two
    regions, None when unknown (then no spill between them)."""
    best = ReservePlan(list(demands))
    best.excluded = {d.region: "its consumers allow no spill region (strict residency)"
                     for d in demands if not d.spill_to}
    if len(demands) < 2:
        return best
    best_cost = best.separate_cost_per_hour
    reasons: dict[str, list[str]] = {}  # region -> why it could spill to none of the hosts (when none is chosen)
    for host in demands:
        spilling: list[RegionDemand] = []
        excluded: dict[str, str] = {}
        rtts: dict[str, float] = {}
        for d in demands:
            if d is host:
                continue
            rtt = rtt_ms(d.region, host.region)
            if host.region not in d.spill_to:
                excluded[d.region] = (f"its consumers do not all allow {host.region} (spill_regions: "
                                      f"{', '.join(sorted(d.spill_to)) or 'none, strict residency'})")
            elif rtt is None:
                excluded[d.region] = f"no round-trip figure between {d.region} and {host.region}"
            elif max(d.worst_ttft_ms, host.worst_ttft_ms) + rtt > d.ttft_slo_ms:
                excluded[d.region] = (f"a spilled request would miss its P99 TTFT SLO: planned "
                                      f"{max(d.worst_ttft_ms, host.worst_ttft_ms):.0f} ms + {rtt:.0f} ms round trip "
                                      f"> {d.ttft_slo_ms:g} ms")
            else:
                spilling.append(d)
                rtts[d.region] = rtt
        for region, why in excluded.items():
            reasons.setdefault(region, []).append(why)
        if not spilling:
            continue
        bases, method = _search(host, spilling)
        cost = _cost(host, spilling, bases)
        if round(cost, 6) < round(best_cost, 6):
            best_cost = cost
            best = ReservePlan(list(demands), host.region, {d.region: b for d, b in zip(spilling, bases)},
                               host_capacity(host, spilling, bases), excluded, method, rtts)
    if best.host is None:
        # Say why for every region, against every host it could have used.
        for d in demands:
            if d.spill_to:
                best.excluded[d.region] = "; ".join(reasons.get(d.region, [])) or (
                    "sharing a reserve saves nothing beyond the reservations (--reserved), which are billed whether "
                    "used or not" if best.reserved
                    else "sharing a reserve saves no capacity: its peak overlaps the host's")
    return best


def spill_targets(cfg: Any, service_region: str) -> frozenset[str]:
    """The regions every consumer served in `service_region` allows (consumers[].spill_regions); none when a region
    serves no configured consumer (strict residency is the default)."""
    served = [c for c in cfg.consumers if c.service_region == service_region]
    if not served:
        return frozenset()
    allowed = frozenset(served[0].spill_regions)
    for c in served[1:]:
        allowed &= frozenset(c.spill_regions)
    return allowed


def demands_of(planned: Any, cfg: Any) -> list[RegionDemand]:
    """Each service region's planned pool as the reserve reads it, one model or a packing: the consumer regions'
    own choices (PoolDay: each region's winner), summed per region serving them, the worst planned P99 TTFT against
    its SLO that of the one with the least headroom (it decides whether a spilled request still meets its SLO), and
    the instances reserved there (--reserved) of each type the region runs, each up to that type's own peak."""
    ctx = planned.ctx
    groups: dict[str, list[Any]] = {}
    for winner, serving in planned.result.winners():
        groups.setdefault(serving, []).append(winner)
    out = []
    for region, wins in groups.items():
        hours = tuple(sum(w.instances_by_hour[h] for w in wins) for h in range(24))
        worst, slo = min((w.worst_ttft(ctx) for w in wins), key=lambda r: r[1] - r[0])
        peaks: dict[str, int] = {}
        for w in wins:
            itype = getattr(w, "instance_type", None) or w.candidate.instance_type
            peaks[itype] = peaks.get(itype, 0) + max(w.instances_by_hour)
        reserved = sum(min(ctx.reserved.get((t, region), 0), peak) for t, peak in peaks.items())
        out.append(RegionDemand(region, hours, float(wins[0].price_per_hour), int(ctx.n_min(region)),
                                spill_targets(cfg, region), float(worst), float(slo), " + ".join(w.label for w in wins),
                                reserved))
    return out
