"""`fleetcast plan --check`: re-plan from the traffic production serves and say what would change.

Two kinds of findings, each one line with what and why:
- the re-plan against the config: the pick (instance type, precision), the capacity bounds or the
  scaling target of a planned pool differ from the config by more than the threshold (a pick
  always counts);
- the baseline written with the config (fleetcast.plan.drift): throughput past max capacity, the
  mix moved to larger batches, observed P99 above the SLO at planned load, cost per token off.
Any finding: exit 3 (EXIT_REFUSED); none: 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetcast.contract.errors import UserError

from .drift import DEFAULT_THRESHOLD, SCHEMA, Finding, Observation, check_pool, planned_usd_per_m_output, share_above
from .solver import PlanContext, PlannedPool, Served, pooled_day
from .traffic import ConsumerTraffic

if TYPE_CHECKING:
    from fleetcast.config.model import FleetConfig


def _relative(old: float, new: float) -> float:
    if old == new:
        return 0.0
    return abs(new - old) / max(abs(old), 1e-9)


def replan_findings(cfg: FleetConfig, pools: list[PlannedPool], threshold: float) -> list[Finding]:
    """Planned pools against the config's pools they would be written to: the instance type, each model's
    precision (and copies, where the pool serves several), the capacity bounds and the scaling target."""
    from .writeback import pool_for

    findings = []
    for planned in pools:
        region = planned.region
        try:
            entry = cfg.region(region)
        except KeyError:
            findings.append(Finding("pick", region, f"the plan serves {', '.join(planned.consumer_regions)} from "
                                    f"{region}, which the config has no region for"))
            continue
        dumped = [{"instance_type": p.instance_type, "_pool": p} for p in entry.pools]
        pool = pool_for(dumped, planned.instance_type.split(".")[0])["_pool"]
        # One comparison, one model or a packing: the config's pool named as the plan names its pick (a packing of
        # one by its candidate, "TYPE PRECISION"), so a changed type, precision or copy count reads on one line.
        served = {x.model: x.copies for x in cfg.serves_of(pool)}
        runs = [(s.model or cfg.models[0].id, cfg.engine_for(pool, s.model or cfg.models[0].id).precision.value,
                 served.get(s.model or cfg.models[0].id, 0)) for s in planned.serves]
        if pool.instance_type != planned.instance_type or \
                [(p, c) for _, p, c in runs] != [(s.precision, s.copies) for s in planned.serves]:
            current = " + ".join(f"{m} {p} x{c}" for m, p, c in runs)
            current = f"{pool.instance_type} {runs[0][1]}" if not planned.packed else f"{pool.instance_type} [{current}]"
            findings.append(Finding("pick", region, f"pool {pool.name}: the plan picks {planned.label} "
                                    f"({planned.cost_text}), the config runs {current}"))
        lo, hi = planned.capacity
        for name, old, new in (("capacity.max", pool.capacity.max, hi), ("capacity.min", pool.capacity.min, lo)):
            if _relative(old, new) > threshold:
                findings.append(Finding("capacity", region, (
                    f"pool {pool.name}: {name} would change {old} -> {new} ({(new - old) / max(old, 1):+.0%}, "
                    f"threshold {threshold:.0%})")))
        # The plan writes the target only for in-flight scaling (writeback.py); a KV-cache target is the owner's.
        target = pool.scaling.target if pool.scaling.metric == "active_requests" else None
        if target is not None and _relative(float(target), planned.target) > threshold:
            findings.append(Finding("target", region, (
                f"pool {pool.name}: scaling.target would change {target:g} -> {planned.target:g} in-flight "
                f"requests per instance (threshold {threshold:.0%})")))
    return findings


def observation(consumers: list[ConsumerTraffic], regions: list[str]) -> Observation | None:
    """What the traffic says about the consumer regions one pool serves; None if it has none of them."""
    mine = [c for c in consumers if c.region in regions]
    if not mine:
        return None
    hourly = [sum(c.hourly_rps()[h] for c in mine) for h in range(24)]
    volume = sum(sum(c.hourly_rps()) for c in mine) or 1.0
    in_flight: dict[str, float] = {}
    for c in mine:
        weight = sum(c.hourly_rps())
        if c.observed is not None and c.observed.in_flight:
            counts = c.observed.in_flight
            total = sum(counts.values())
            shares = {k: v / total for k, v in counts.items()}
        elif c.concurrency:
            shares = dict(c.concurrency)
        else:
            continue
        for key, share in shares.items():
            in_flight[key] = in_flight.get(key, 0.0) + share * weight
    output_mean = sum(sum(c.hourly_rps()) * c.output_mean for c in mine) / volume
    obs = Observation(hourly, in_flight, output_mean)
    observed = [c.observed for c in mine if c.observed is not None]
    if len(observed) == len(mine) and len({len(o.arrivals) for o in observed}) == 1:
        n = len(observed[0].arrivals)
        obs.arrivals = [sum(o.arrivals[i] for o in observed) for i in range(n)]

        def worst(name: str) -> list[float | None]:
            out: list[float | None] = [None] * n
            for o in observed:
                for i, v in enumerate(getattr(o, name) or []):
                    if v is not None and (out[i] is None or v > out[i]):
                        out[i] = v
            return out
        obs.ttft_p99_ms, obs.itl_p99_ms = worst("ttft_p99_ms"), worst("itl_p99_ms")
    return obs


def _members_day(served: Served) -> tuple[list[float], float, float]:
    """(rates per UTC hour summed over the consumer regions, their rate-weighted mean output length, the busiest
    minute's highest ratio to its hour's mean over the hours with traffic) of one model's processes on a pool."""
    assert served.sizing is not None  # every planned pool records how each model was sized
    members = served.sizing.members
    # The pool's busiest minutes are its members' summed (solver.pooled_day, the rule its target and sizing read),
    # not its burstiest member's alone.
    rates, bursts = pooled_day(members)
    volume = sum(rates)
    output_mean = sum(sum(t.hourly_rps()) * t.output_mean for t in members) / volume if volume else \
        members[0].output_mean
    busiest = max((b for r, b in zip(rates, bursts) if r > 0), default=1.0)
    return rates, output_mean, busiest


def _rps_per_instance(served: Served) -> float:
    """The hourly mean rate of this model one instance serves within its SLOs: with an in-flight histogram, Little's
    law at the target (one over the instance-seconds a request costs); from arrivals, copies x each process's
    SLO-safe rate in the busiest minute over that minute's ratio to the hour's mean."""
    from .queueing import max_safe_rate

    sizing = served.sizing
    assert sizing is not None
    if sizing.seconds_per_request is not None:
        return served.copies / sizing.seconds_per_request if sizing.seconds_per_request else 0.0
    _, output_mean, busiest = _members_day(served)
    safe = max_safe_rate(sizing.service, output_mean, sizing.limits)
    return safe[0] * served.copies / busiest if safe else 0.0


def levels_at_arrival(pool: PlannedPool) -> dict[str, float]:
    """Requests per day by the in-flight count on their instance at arrival (itself included) as planned: the
    histogram the gateways meter (fleetcast.traffic/v1 observed.in_flight), one model or a packing.

    A member with an in-flight histogram contributes its own shares. Arrivals: each hour, each model's arrivals
    spread over its planned processes (random routing); a process holds k with the occupancy queueing.py derives from
    its curve at the hour's mean rate, an instance the sum over its processes, and an arrival finding k joins k + 1
    (PASTA). An hour beyond what a process's highest measured batch drains counts above every process's top."""
    from .queueing import occupancy

    levels: dict[str, float] = {}

    def add(level: int, weight: float) -> None:
        levels[str(level)] = levels.get(str(level), 0.0) + weight

    arrivals: list[tuple[Served, list[ConsumerTraffic]]] = []
    for served in pool.serves:
        assert served.sizing is not None
        for t in served.sizing.members:
            if not t.arrival_driven:
                day = sum(t.hourly_rps())
                for level, share in t.level_weights().items():
                    add(level, share * day)
        mine = [t for t in served.sizing.members if t.arrival_driven]
        if mine:
            arrivals.append((served, mine))
    tops = sum(int(s.sizing.service.top) * s.copies for s, _ in arrivals if s.sizing is not None)
    for h in range(24):
        pmf, total, beyond = [1.0], 0.0, False
        for served, mine in arrivals:
            assert served.sizing is not None
            rate = sum(t.hourly_rps()[h] for t in mine)
            if rate <= 0:
                continue
            total += rate
            out_mean = sum(t.hourly_rps()[h] * t.output_mean for t in mine) / rate
            one = occupancy(served.sizing.service, rate / (max(pool.instances_by_hour[h], 1) * served.copies), out_mean)
            if one is None:
                beyond = True
                continue
            for _ in range(served.copies):
                # The convolution: for each k, the i whose pmf[i] * one[k - i] exist (the same terms, in the same
                # order, as summing over every i and skipping the others, which was twice the work).
                n, m = len(pmf), len(one)
                pmf = [sum(pmf[i] * one[k - i] for i in range(max(0, k - m + 1), min(k, n - 1) + 1))
                       for k in range(n + m - 1)]
        if beyond:
            add(tops + 1, total)
        elif total > 0:
            for k, share in enumerate(pmf):
                if share > 1e-9:
                    add(k + 1, share * total)
    return levels


def baseline_document(pools: list[PlannedPool], ctx: PlanContext, config_pools: dict[str, str | None], written: str,
                      adapters: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The one drift baseline (fleetcast.plan.drift, schema fleetcast.plan-baseline/v2) of the planned pools, one model
    or a packing: per pool its pick, target, bounds, floor, price, planned in-flight mix and instance cost per 1M
    output tokens; per model its copies, rates, lengths, SLO and `rps_per_instance`, which the checks read
    (drift.check_pool). `adapters` (model -> its adapter ids) go into each model's entry: the gateway meters a
    request by the id it named, and an adapter's requests load its base model's processes, so the drift Lambda
    counts them for the base model."""
    out = []
    for pool in pools:
        models: list[dict[str, Any]] = []
        for served in pool.serves:
            assert served.sizing is not None
            rates, output_mean, _ = _members_day(served)
            limits, network = served.sizing.limits, served.sizing.network_ms
            models.append({"model": served.model, "adapters": list((adapters or {}).get(served.model, [])),
                           "precision": served.precision, "copies": served.copies, "source": served.sizing.source,
                           "hourly_rps": rates, "peak_rps": max(rates), "output_mean": output_mean,
                           "rps_per_instance": _rps_per_instance(served),
                           "slo": {"ttft_p99_ms": limits.ttft_ms + network, "itl_p99_ms": limits.itl_ms}})
        lo, hi = pool.capacity
        rates = [sum(m["hourly_rps"][h] for m in models) for h in range(24)]
        entry: dict[str, Any] = {
            "region": pool.region, "pool": config_pools.get(pool.region), "candidate": pool.label,
            "instance_type": pool.instance_type, "consumer_regions": list(pool.consumer_regions),
            "target": pool.target, "capacity": {"min": lo, "max": hi}, "n_min": ctx.n_min(pool.region),
            "hourly_rps": rates, "peak_rps": max(rates), "price_per_hour": pool.price_per_hour,
            "share_above_target": share_above(levels_at_arrival(pool), pool.target), "models": models}
        entry["usd_per_m_output"] = planned_usd_per_m_output(entry)
        out.append(entry)
    return {"schema": SCHEMA, "written": written,
            "slo": {"ttft_p99_ms": ctx.slo.ttft_p99_ms, "itl_p99_ms": ctx.slo.itl_p99_ms}, "pools": out}


def baseline_findings(baseline: dict[str, Any], consumers: list[ConsumerTraffic], threshold: float,
                      cost_threshold: float) -> list[Finding]:
    findings = []
    for base in baseline["pools"]:
        obs = observation(consumers, base["consumer_regions"])
        if obs is None:
            findings.append(Finding("throughput", base["region"], (
                f"the traffic has none of the consumer regions this pool was planned for "
                f"({', '.join(base['consumer_regions'])})")))
            continue
        if len(base["models"]) > 1:
            # A packed pool: each model's own rates (the profile's entries per model); one model's are the pool's.
            mine = [c for c in consumers if c.region in base["consumer_regions"]]
            obs.by_model = {m["model"]: [sum(c.hourly_rps()[h] for c in mine if c.model == m["model"])
                                         for h in range(24)] for m in base["models"]}
        findings += check_pool(base, obs, baseline["slo"], threshold, cost_threshold)
    return findings


def drift_settings(cfg: Any, threshold: float | None) -> float:
    """--threshold, else the config's operations.plan_drift_check.threshold, else the default."""
    if threshold is not None:
        return threshold
    check = getattr(getattr(cfg, "operations", None), "plan_drift_check", None)
    return check.threshold if check is not None else DEFAULT_THRESHOLD


def render(findings: list[Finding], profile_name: str) -> str:
    if not findings:
        return f"plan check: traffic {profile_name} fits the plan the config was written from; nothing to change"
    lines = [f"plan check: traffic {profile_name} no longer fits the plan ({len(findings)} finding(s)):"]
    lines += [f"  - {f.line()}" for f in findings]
    lines.append("re-plan (`fleetcast plan --write-config`) and review the change with `fleetcast config diff`")
    return "\n".join(lines)


def config_path_required(path: str | None) -> Path:
    if not path or not Path(path).exists():
        raise UserError(f"--check needs the fleet config the plan was written into (--config {path}: not found)")
    return Path(path)
