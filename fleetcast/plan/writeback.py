"""`--write-config`: put the plan's choice into the fleet YAML, keeping its
comments and layout (ruamel.yaml round-trip), and keep the file only if
`fleetcast.config.load_config` still accepts it.

What changes, per provider region the plan chose: the region's pool (the one
with the chosen instance family, else the first) gets the instance type, the
engine precision, capacity min/max (the day's lowest and highest instance
counts; `desired` only where the pool already fixes one, then the day's mean,
since a fixed desired is reset on every deploy) and the scaling target (the planned in-flight requests per
instance); a cross-region consumer region is added to `allowed_regions`, and
the consumers in that region point at the new service region. With
`--write-schedule` the pool also gets a daily capacity schedule (UTC cron
steps whose `min` is the planned instance count for those hours).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import SingleQuotedScalarString

from fleetcast.config import catalog
from fleetcast.config.edit import replace_files, round_trip_yaml, validated_text
from fleetcast.contract import support
from fleetcast.contract.errors import UserError
from fleetcast.staging.calibration import STAGE_COMMAND

from .solver import FleetPool, RegionPlan


def _set(node: CommentedMap, key: str, value) -> bool:
    if node.get(key) == value:
        return False
    node[key] = value
    return True


def _flow(mapping: dict) -> CommentedMap:
    m = CommentedMap(mapping)
    m.fa.set_flow_style()
    return m


def schedule_steps(hourly: list[int], peak: int) -> list[dict]:
    """One scheduled step (UTC cron) wherever the planned instance count changes over the day."""
    steps = []
    for hour, n in enumerate(hourly):
        if hour == 0 or n != hourly[hour - 1]:
            steps.append({"cron": SingleQuotedScalarString(f"0 {hour} * * *"), "min": n, "max": peak})
    return steps if len(steps) > 1 else []


def pool_for(pools: list, family: str):
    """The pool a plan for `family` updates: the region's pool of that instance family, else its first."""
    return next((p for p in pools if str(p.get("instance_type", "")).split(".")[0] == family), pools[0])


def pool_name_for(region, family: str) -> str | None:
    """pool_for over a validated config's region (None without one): the name of the pool the write updates."""
    rows = [{"instance_type": p.instance_type, "name": p.name} for p in region.pools] if region is not None else []
    return pool_for(rows, family)["name"] if rows else None


@dataclass(frozen=True)
class ConfigEdit:
    """What --write-config would write, computed and validated, nothing written yet."""

    path: Path
    changes: list[str]
    text: str | None  # the new file; None when the config already matches the plan
    cfg: object = field(repr=False)  # the validated config after the edit (FleetConfig)
    notes: list[str] = field(default_factory=list)  # what was left unwritten and why (not a change)


def calibration_use(cfg, region_name: str, pool_name: str | None, candidate) -> tuple[bool, str] | None:
    """None when writing `candidate` into that pool needs no calibration set; else (blocking, what to say):
    blocking when the config (or, without one, anything) names no set. The pool keeps its backend and
    KV-cache dtype; only the precision comes from the plan."""
    region = next((r for r in cfg.regions if r.region == region_name), None) if cfg is not None else None
    pool = next((p for p in region.pools if p.name == pool_name), None) if region is not None else None
    if cfg is not None:
        engine = cfg.engine_for(pool) if pool is not None else cfg.engine
        backend, kv = engine.backend.value, engine.kv_cache_dtype.value
    else:
        backend, kv = (candidate.backend if candidate.backend in support.BACKENDS else "tensorrt"), "auto"
    if not support.needs_calibration(backend, candidate.precision, kv):
        return None
    what = candidate.precision if kv == "auto" else f"{candidate.precision} with kv_cache_dtype {kv}"
    where = f"{candidate.label} in {region_name}: {what} is calibrated (its build reads a staged calibration set)"
    if cfg is not None and cfg.model.calibration is not None:
        return False, f"{where}; the config's calibration.dataset {cfg.model.calibration.dataset} is the set it reads"
    return True, (f"{where} and the config names none (calibration.dataset); stage one with `{STAGE_COMMAND}`, which "
                  "names it in the config")


def write_config_notes(cfg, pools: list[FleetPool], allow_estimated: bool = False) -> list[tuple[bool, str]]:
    """What --write-config does with the planned fleet and `cfg` as it stands: (blocking, text) per finding; a
    blocking one makes it refuse before writing. The checks `compute_plan_edit` refuses on, so the report
    promises only what the write does. `cfg` None: the checks that need no config."""
    notes: list[tuple[bool, str]] = []
    by_region: dict[str, list[FleetPool]] = {}
    for fleet_pool in pools:
        by_region.setdefault(fleet_pool.service_region, []).append(fleet_pool)
        win = fleet_pool.evaluation
        if win.candidate.estimated and not allow_estimated:
            notes.append((True, f"the choice for {', '.join(fleet_pool.consumer_regions)} ({win.candidate.label}) "
                                "is estimated, not measured; benchmark it first (or pass --allow-estimated)"))
    for region_name, region_pools in by_region.items():
        served = [r for p in region_pools for r in p.consumer_regions]
        if len(region_pools) > 1:
            notes.append((True, f"consumers in {', '.join(served)} are best served from {region_name} by different "
                                f"candidates ({', '.join(sorted(p.candidate for p in region_pools))}); one pool per "
                                "region is written: plan them one at a time with separate pools"))
            continue
        region = next((r for r in cfg.regions if r.region == region_name), None) if cfg is not None else None
        if cfg is not None and region is None:
            notes.append((True, f"the plan serves {', '.join(served)} from {region_name}, which has no entry under "
                                "regions; add it (availability zones, VPC, AMI, allowed principals) and rerun"))
            continue
        (fleet_pool,) = region_pools
        name = pool_name_for(region, fleet_pool.evaluation.candidate.family)
        calibration = calibration_use(cfg, region_name, name, fleet_pool.evaluation.candidate)
        if calibration:
            notes.append(calibration)
    return notes


def apply_plan(path: str | Path, plans: list[RegionPlan], pools: list[FleetPool], allow_estimated: bool = False,
               write_schedule: bool = False, spot: list | None = None, write_spot: bool = False) -> list[str]:
    """Edit the config at `path` in place; returns what changed, then what was left unwritten and why. Refuses
    (file untouched) on any problem."""
    edit = compute_plan_edit(path, plans, pools, allow_estimated, write_schedule, spot, write_spot)
    if edit.text is not None:
        replace_files([(edit.path, edit.text)])
    return edit.changes + edit.notes


def compute_plan_edit(path: str | Path, plans: list[RegionPlan], pools: list[FleetPool], allow_estimated: bool = False,
                      write_schedule: bool = False, spot: list | None = None, write_spot: bool = False) -> ConfigEdit:
    """The config at `path` with the plan written in, validated; writes nothing. Refuses on any problem. A Spot tier
    is added only when asked (`write_spot`, `--write-spot`); a pool that has one already has it kept up to date."""

    path = Path(path)
    yaml, doc, current = _open_for_edit(path)

    for plan in plans:
        if plan.winner is None:
            raise UserError(f"--write-config: no candidate serves {plan.traffic.region}; nothing to write")
    blockers = [text for blocking, text in write_config_notes(current, pools, allow_estimated) if blocking]
    if blockers:
        raise UserError(f"--write-config: {path} was left untouched: " + "; ".join(blockers))
    by_region: dict[str, list[FleetPool]] = {}
    for fleet_pool in pools:
        by_region.setdefault(fleet_pool.service_region, []).append(fleet_pool)

    changes: list[str] = []
    for region_name, region_pools in by_region.items():
        entry = next(r for r in doc["regions"] if r.get("region") == region_name)
        (fleet_pool,) = region_pools
        win = fleet_pool.evaluation
        # One pool for every consumer region this provider region serves: their load adds up,
        # the pool's minimum counts once; it scales on the lowest member target.
        hourly = fleet_pool.instances_by_hour
        pools = entry.get("pools") or []
        if not pools:
            raise UserError(f"--write-config: regions[{region_name}] has no pools to update")
        pool = pool_for(pools, win.candidate.family)
        where = f"regions[{region_name}].pools[{pool.get('name')}]"
        if _set(pool, "instance_type", win.candidate.instance_type):
            changes.append(f"{where}.instance_type = {win.candidate.instance_type}")
        engine = pool.get("engine")
        if engine is None:
            pool["engine"] = _flow({"precision": win.candidate.precision})
            changes.append(f"{where}.engine.precision = {win.candidate.precision}")
        elif _set(engine, "precision", win.candidate.precision):
            changes.append(f"{where}.engine.precision = {win.candidate.precision}")
        changes += _write_capacity(pool, where, hourly)
        scaling = pool.get("scaling")
        target = int(fleet_pool.target) if float(fleet_pool.target).is_integer() else float(fleet_pool.target)
        if scaling is None:
            pool["scaling"] = _flow({"metric": "active_requests", "target": target})
            changes.append(f"{where}.scaling.target = {target} active requests")
        elif scaling.get("metric", "active_requests") == "active_requests" and _set(scaling, "target", target):
            changes.append(f"{where}.scaling.target = {target} active requests")
        if write_schedule:
            changes += _write_schedule(pool, where, hourly)
        changes += _write_spot(pool, where, [a for a in spot or [] if (a.service_region, a.candidate) ==
                                             (fleet_pool.service_region, fleet_pool.candidate)],
                               write_schedule, write_spot)
        for consumer_region in fleet_pool.consumer_regions:
            if consumer_region != region_name:
                allowed = entry.get("allowed_regions")
                if allowed is None:
                    entry["allowed_regions"] = allowed = []
                if consumer_region not in allowed:
                    allowed.append(consumer_region)
                    changes.append(f"regions[{region_name}].allowed_regions += {consumer_region}")
            for consumer in doc.get("consumers") or []:
                if consumer.get("region") == consumer_region and consumer.get("service_region") != region_name:
                    consumer["service_region"] = region_name
                    changes.append(f"consumers[{consumer.get('name')}].service_region = {region_name}")
                    if "endpoint_service_name" in consumer:
                        del consumer["endpoint_service_name"]
                        changes.append(f"consumers[{consumer.get('name')}].endpoint_service_name removed "
                                       f"(publish the {region_name} service's name after deploying)")
    return _validated_edit(path, yaml, doc, changes, current)


# What a note about a block left unwritten says (kept apart from the changes: it changes nothing).
NOT_WRITTEN = ".spot not written: "


def _write_schedule(pool: CommentedMap, where: str, hourly: list[int]) -> list[str]:
    """The pool's daily schedule (--write-schedule): a UTC cron step wherever the planned count changes."""
    steps = schedule_steps(hourly, max(hourly))
    if not steps or pool.get("schedule") == steps:
        return []
    pool["schedule"] = CommentedSeq([_flow(step) for step in steps])
    return [f"{where}.schedule = {len(steps)} daily steps (UTC): "
            + ", ".join(f"{s['cron'].split()[1]}h min {s['min']}" for s in steps)]


def _write_spot(pool: CommentedMap, where: str, advice: list, write_schedule: bool, write_spot: bool) -> list[str]:
    """The pool's spot: block from the planner's advice for it (fleetcast/plan/spot.py); removed where Spot does not
    pay. A pool without one gets one only when asked: Spot changes what an interruption does to the fleet."""
    verdict = advice[0] if advice else None
    if verdict is None:
        return []
    block = verdict.spot_block()
    if block is None:
        if "spot" in pool:
            del pool["spot"]
            return [f"{where}.spot removed: {verdict.reason}"]
        return []
    if "spot" not in pool and not write_spot:
        return [f"{where}{NOT_WRITTEN}Spot would pay (On-Demand base {block['on_demand_base']}); add "
                "--write-spot to write the tier"]
    if write_schedule or pool.get("schedule") or "desired" in (pool.get("capacity") or {}):
        return [f"{where}{NOT_WRITTEN}a fixed capacity.desired or a schedule sizes one group; the spot tier "
                "needs scaling to own the split"]
    current = pool.get("spot")
    wanted = {**(dict(current) if isinstance(current, dict) else {}), **block}
    if isinstance(current, dict) and dict(current) == wanted:
        return []
    pool["spot"] = _flow(wanted)  # one line, like capacity and scaling
    return [f"{where}.spot = On-Demand base {block['on_demand_base']}, Spot on {', '.join(block['instance_types'])} "
            f"above it, fallback up to {block['on_demand_fallback_max']} On-Demand"]


def throttling_notes(cfg, pools: list[FleetPool]) -> list[str]:
    """What a written scaling target means for each consumer's per-instance concurrency limit.

    Target tracking holds the pool's *average* in-flight requests per instance at the target, so
    some instances run above it; the gateway refuses a consumer's requests past its
    `limits.max_concurrency` on an instance with 429 (docs/gateway.md, Limits). A limit at or
    below the target therefore throttles that consumer at the planned load."""
    notes = []
    for fleet_pool in pools:
        target = fleet_pool.target
        for consumer in cfg.consumers:
            if consumer.region not in fleet_pool.consumer_regions:
                continue
            limit = consumer.limits.max_concurrency
            where = f"consumers[{consumer.name}].limits.max_concurrency"
            if limit == target:
                notes.append(
                    f"{where} is {limit}, equal to the scaling.target {target:g} of {fleet_pool.service_region}: target "
                    f"tracking keeps the average at {target:g} requests in flight per instance, so instances above the "
                    f"average refuse {consumer.name}'s requests past {limit} with 429 (concurrency_limit_exceeded) at "
                    f"the planned load; raise max_concurrency above the target (headroom for uneven spread and "
                    f"scale-out delay) or accept throttling at peak")
            elif limit < target:
                notes.append(
                    f"{where} is {limit}, below the scaling.target {target:g} of {fleet_pool.service_region}: "
                    f"{consumer.name}'s requests past {limit} per instance get 429 while the instance is still under "
                    f"its target, so the pool does not scale out for them; raise max_concurrency above the target "
                    f"or expect {consumer.name} to be throttled rather than served")
    return notes


def compute_packing_edit(path: str | Path, result, allow_estimated: bool = False,
                         write_schedule: bool = False, write_spot: bool = False) -> ConfigEdit:
    """The config at `path` with a packing plan (fleetcast/plan/packing.py) written in, validated; writes nothing.

    Per consumer region (served from its own region): the region's pool (of the chosen instance family, else
    its first) gets the instance type, `serves` (each model's copies and KV budget, GiB rounded down to 0.1
    so the validator's memory sum still fits), capacity min/max and the scaling target (the planned in-flight
    requests per instance over every model at the day's busiest planned minute, over the burst headroom);
    each model's precision goes to models[].engine.precision (a pool-level precision would apply to every
    model it serves, so it is removed). Refuses, file untouched, on any problem."""

    from .packing import scaling_target

    path = Path(path)
    yaml, doc, current = _open_for_edit(path)
    if not isinstance(doc.get("models"), list):
        raise UserError(f"--write-config: {path} is not a fleet config of several models (no `models` list)")
    blockers = []
    precisions: dict[str, dict[str, str]] = {}
    for plan in result.regions:
        if plan.winner is None:
            blockers.append(f"no packing serves {plan.region} within every model's SLO")
        elif plan.winner.estimated and not allow_estimated:
            blockers.append(f"the choice for {plan.region} ({plan.winner.label}) is estimated from solo curves; "
                            "measure it co-located first (or pass --allow-estimated)")
        elif plan.winner.instance_type not in catalog.instance_catalog():
            blockers.append(f"the choice for {plan.region} runs on {plan.winner.instance_type}, a lab machine (--lab), "
                            "not an instance type a fleet can launch: nothing to write")
        elif not any(r.get("region") == plan.region for r in doc["regions"]):
            blockers.append(f"the plan serves {plan.region} from {plan.region}, which has no entry under regions; "
                            "add it (availability zones, VPC, AMI, allowed principals) and rerun")
        if plan.winner is not None:
            for m in plan.winner.loads:
                precisions.setdefault(m.model, {})[plan.region] = m.precision
            # The written pool serves only the packed models: one a consumer there may call must be in the plan.
            callable_here = {mid for c in current.consumers_of(plan.region) for mid in current.models_for(c.name)}
            left_out = sorted(m.id for m in current.models if m.id in callable_here
                              and m.id not in {ld.model for ld in plan.winner.loads})
            if left_out:
                blockers.append(f"consumers served from {plan.region} may call {', '.join(left_out)}, which the "
                                "traffic profile gives no entry there, so the packing leaves it out and the pool would "
                                "not serve it: add an entry for it (rate_rps 0 where it is idle)")
    for model, by_region in precisions.items():
        if len(set(by_region.values())) > 1:
            blockers.append(f"{model} is planned at {', '.join(f'{p} in {r}' for r, p in sorted(by_region.items()))}; "
                            "models[].engine.precision is one per model: plan the regions one at a time")
    if blockers:
        raise UserError(f"--write-config: {path} was left untouched: " + "; ".join(blockers))

    changes: list[str] = []
    for model in doc["models"]:
        chosen = precisions.get(model.get("id"), {})
        if not chosen:
            continue
        (precision,) = set(chosen.values())
        engine = model.get("engine")
        if engine is None:
            model["engine"] = _flow({"precision": precision})
            changes.append(f"models[{model.get('id')}].engine.precision = {precision}")
        elif _set(engine, "precision", precision):
            changes.append(f"models[{model.get('id')}].engine.precision = {precision}")
    for plan in result.regions:
        w = plan.winner
        entry = next(r for r in doc["regions"] if r.get("region") == plan.region)
        pools = entry.get("pools") or []
        if not pools:
            raise UserError(f"--write-config: regions[{plan.region}] has no pools to update")
        pool = pool_for(pools, w.instance_type.split(".")[0])
        where = f"regions[{plan.region}].pools[{pool.get('name')}]"
        if _set(pool, "instance_type", w.instance_type):
            changes.append(f"{where}.instance_type = {w.instance_type}")
        engine = pool.get("engine")
        if engine is not None and "precision" in engine:
            del engine["precision"]
            changes.append(f"{where}.engine.precision removed (each model's precision is in models[].engine)")
            if not engine:
                del pool["engine"]
        wanted = [{"model": m.model, "copies": m.copies,
                   **({} if m.kv_cache_gb is None else {"kv_cache_gb": m.kv_cache_gb})} for m in w.loads]
        present = pool.get("serves")
        if [dict(s) for s in present or []] != wanted:
            if isinstance(present, CommentedSeq) and [s.get("model") for s in present] == [x["model"] for x in wanted]:
                for item, want in zip(present, wanted):  # in place: the entries keep their comments and layout
                    item.pop("kv_cache_gb", None)
                    item.update(want)
            else:
                pool["serves"] = CommentedSeq([_flow(x) for x in wanted])
            changes.append(f"{where}.serves = " + ", ".join(
                f"{s['model']} x{s['copies']}" + (f" ({s['kv_cache_gb']} GiB KV each)" if "kv_cache_gb" in s else "")
                for s in wanted))
        changes += _write_capacity(pool, where, w.instances_by_hour)
        if write_schedule:
            # Per hour the largest over the models of the processes each needs / its copies (the floor included).
            changes += _write_schedule(pool, where, w.instances_by_hour)
        verdicts = [a for a in result.spot if (a.service_region, a.candidate) == (plan.region, w.label)]
        changes += _write_spot(pool, where, verdicts, write_schedule, write_spot)
        target = scaling_target(plan.winner)
        target_value = int(target) if target.is_integer() else target
        scaling = pool.get("scaling")
        if scaling is None:
            pool["scaling"] = _flow({"metric": "active_requests", "target": target_value})
            changes.append(f"{where}.scaling.target = {target_value} active requests")
        elif scaling.get("metric", "active_requests") == "active_requests" and _set(scaling, "target", target_value):
            changes.append(f"{where}.scaling.target = {target_value} active requests")
    return _validated_edit(path, yaml, doc, changes, current)


def _open_for_edit(path: Path):
    """(round-trip YAML, its document, the config as it validates now) of the config `--write-config` edits."""
    from fleetcast.config import ConfigError, load_config

    yaml = round_trip_yaml()
    try:
        original = path.read_text()
    except OSError as exc:
        raise UserError(f"--write-config: cannot read {path}: {exc.strerror}") from None
    doc = yaml.load(original)
    if not isinstance(doc, CommentedMap) or not isinstance(doc.get("regions"), list):
        raise UserError(f"--write-config: {path} is not a fleet config (no `regions` list)")
    try:
        current = load_config(path)
    except ConfigError as exc:
        details = exc.render().split("\n", 1)[-1]
        raise UserError(f"--write-config: {path} is not a valid config now; fix it first:\n{details}") from None
    return yaml, doc, current


def _validated_edit(path: Path, yaml, doc, changes: list[str], current) -> ConfigEdit:
    """The edit, validated by the config loader; nothing written. Refuses when the edited config is invalid."""
    from fleetcast.config import ConfigError

    notes = [c for c in changes if NOT_WRITTEN in c]
    changes = [c for c in changes if NOT_WRITTEN not in c]
    if not changes:
        return ConfigEdit(path, [], None, current, notes)
    try:
        text, cfg = validated_text(path, yaml, doc)
    except ConfigError as exc:
        details = exc.render().split("\n", 1)[-1]
        raise UserError(f"--write-config: the updated config would be invalid, so {path} was left untouched:\n"
                        f"{details}") from None
    return ConfigEdit(path, changes, text, cfg, notes)


def _write_capacity(pool: CommentedMap, where: str, hourly: list[int]) -> list[str]:
    """capacity min/max from the day's lowest and highest instance counts (desired, where the pool fixes one:
    the day's mean, rounded up)."""
    from .solver import capacity_bounds

    lo, desired, hi = capacity_bounds(hourly)
    capacity = pool.get("capacity")
    if capacity is None:
        pool["capacity"] = _flow({"min": lo, "max": hi})
        return [f"{where}.capacity = min {lo}, max {hi}"]
    if "desired" in capacity:
        # The owner fixed a size deploys reset to: keep that choice, at the day's mean.
        if any([_set(capacity, "min", lo), _set(capacity, "desired", desired), _set(capacity, "max", hi)]):
            return [f"{where}.capacity = min {lo}, desired {desired}, max {hi}"]
        return []
    if any([_set(capacity, "min", lo), _set(capacity, "max", hi)]):
        # No fixed size: scaling owns it between the day's lowest and highest counts.
        return [f"{where}.capacity = min {lo}, max {hi}"]
    return []
