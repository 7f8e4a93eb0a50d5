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
from typing import TYPE_CHECKING, Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import SingleQuotedScalarString

from fleetcast.config import catalog
from fleetcast.config.edit import round_trip_yaml, validated_text
from fleetcast.contract import support
from fleetcast.contract.errors import UserError
from fleetcast.staging.calibration import STAGE_COMMAND

from .solver import PlannedPool, Served

if TYPE_CHECKING:
    from ruamel.yaml import YAML

    from fleetcast.config.model import FleetConfig

    from .spot import SpotAdvice


def _set(node: CommentedMap, key: str, value: Any) -> bool:
    if node.get(key) == value:
        return False
    node[key] = value
    return True


def _flow(mapping: dict[str, Any]) -> CommentedMap:
    m = CommentedMap(mapping)
    m.fa.set_flow_style()
    return m


def schedule_steps(hourly: list[int], peak: int) -> list[dict[str, Any]]:
    """One scheduled step (UTC cron) wherever the planned instance count changes over the day."""
    steps: list[dict[str, Any]] = []
    for hour, n in enumerate(hourly):
        if hour == 0 or n != hourly[hour - 1]:
            steps.append({"cron": SingleQuotedScalarString(f"0 {hour} * * *"), "min": n, "max": peak})
    return steps if len(steps) > 1 else []


def pool_for(pools: list[Any], family: str) -> Any:
    """The pool a plan for `family` updates: the region's pool of that instance family, else its first."""
    return next((p for p in pools if str(p.get("instance_type", "")).split(".")[0] == family), pools[0])


def pool_name_for(region: Any, family: str) -> str | None:
    """pool_for over a validated config's region (None without one): the name of the pool the write updates."""
    rows = [{"instance_type": p.instance_type, "name": p.name} for p in region.pools] if region is not None else []
    return str(pool_for(rows, family)["name"]) if rows else None


@dataclass(frozen=True)
class ConfigEdit:
    """What --write-config would write, computed and validated, nothing written yet."""

    path: Path
    changes: list[str]
    text: str | None  # the new file; None when the config already matches the plan
    cfg: Any = field(repr=False)  # the validated config after the edit (FleetConfig)
    notes: list[str] = field(default_factory=list)  # what was left unwritten and why (not a change)


def calibration_use(cfg: FleetConfig | None, pool: PlannedPool, served: Served, pool_name: str | None) -> tuple[bool, str] | None:
    """The one calibration rule of the planner, one model or several: a precision that needs a calibration set
    stays a candidate, and writing it is refused until the model names a staged set. None when writing `served`
    into that pool needs no set; else (blocking, what to say): blocking when the model (or, without a config,
    anything) names no set. The pool keeps its backend and KV-cache dtype (the model's, under the pool's
    override); only the precision comes from the plan."""
    from .packing import model_engine

    region = next((r for r in cfg.regions if r.region == pool.region), None) if cfg is not None else None
    config_pool = next((p for p in region.pools if p.name == pool_name), None) if region is not None else None
    model = None
    if cfg is not None:
        model = cfg.model_by_id(served.model) if len(cfg.models) > 1 and served.model else cfg.model
        engine = cfg.engine_for(config_pool, model.id) if config_pool is not None else model_engine(cfg, model.id)
        backend, kv = engine.backend.value, engine.kv_cache_dtype.value
    else:
        backend, kv = (pool.backend if pool.backend in support.BACKENDS else "tensorrt"), "auto"
    if not support.needs_calibration(backend, served.precision, kv):
        return None
    what = served.precision if kv == "auto" else f"{served.precision} with kv_cache_dtype {kv}"
    label = f"{served.model} {served.precision} on {pool.instance_type}" if pool.packed else pool.label
    where = f"{label} in {pool.region}: {what} is calibrated (its build reads a staged calibration set)"
    field_path = f"models[{model.id}].calibration.dataset" if pool.packed and model is not None else \
        "calibration.dataset"
    if model is not None and model.calibration is not None:
        return False, f"{where}; the config's {field_path} {model.calibration.dataset} is the set it reads"
    return True, (f"{where} and the config names none ({field_path}); stage one with `{STAGE_COMMAND}`, which "
                  "names it in the config")


def write_config_notes(cfg: FleetConfig | None, pools: list[PlannedPool], allow_estimated: bool = False) -> list[tuple[bool, str]]:
    """What --write-config does with the planned pools and `cfg` as it stands: (blocking, text) per finding; a
    blocking one makes it refuse before writing. The checks `compute_edit` refuses on, so the report promises only
    what the write does. `cfg` None: the checks that need no config."""
    notes: list[tuple[bool, str]] = []
    by_region: dict[str, list[PlannedPool]] = {}
    for pool in pools:
        by_region.setdefault(pool.region, []).append(pool)
        if pool.estimated and not allow_estimated:
            # One wording, one model or a packing: its source says how it was estimated.
            source = next((z.source for z in (x.sizing for x in pool.serves) if z and z.source.startswith("estimated")),
                          "estimated")
            notes.append((True, f"the choice for {', '.join(pool.consumer_regions)} ({pool.label}) is {source}, not "
                                "measured: benchmark it first (or pass --allow-estimated)"))
        if pool.instance_type not in catalog.instance_catalog():
            notes.append((True, f"the choice for {pool.region} runs on {pool.instance_type}, a lab machine (--lab), "
                                "not an instance type a fleet can launch: nothing to write"))
    precisions: dict[str, dict[str, str]] = {}
    for region_name, region_pools in by_region.items():
        served = [r for p in region_pools for r in p.consumer_regions]
        if len(region_pools) > 1:
            notes.append((True, f"consumers in {', '.join(served)} are best served from {region_name} by different "
                                f"candidates ({', '.join(sorted(p.label for p in region_pools))}); one pool per "
                                "region is written: plan them one at a time with separate pools"))
            continue
        region = next((r for r in cfg.regions if r.region == region_name), None) if cfg is not None else None
        if cfg is not None and region is None:
            notes.append((True, f"the plan serves {', '.join(served)} from {region_name}, which has no entry under "
                                "regions; add it (availability zones, VPC, AMI, allowed principals) and rerun"))
            continue
        (pool,) = region_pools
        name = pool_name_for(region, pool.instance_type.split(".")[0])
        notes += [c for s in pool.serves if (c := calibration_use(cfg, pool, s, name))]
        if not pool.packed:
            continue
        for s in pool.serves:
            precisions.setdefault(s.model, {})[region_name] = s.precision
        if cfg is not None:
            # The written pool serves only the packed models: one a consumer there may call must be in the plan.
            callable_here = {mid for c in cfg.consumers_of(region_name) for mid in cfg.models_for(c.name)}
            left_out = sorted(m.id for m in cfg.models if m.id in callable_here
                              and m.id not in {s.model for s in pool.serves})
            if left_out:
                notes.append((True, f"consumers served from {region_name} may call {', '.join(left_out)}, which the "
                                    "traffic profile gives no entry there, so the packing leaves it out and the pool "
                                    "would not serve it: add an entry for it (rate_rps 0 where it is idle)"))
    for model, chosen in precisions.items():
        if len(set(chosen.values())) > 1:
            notes.append((True, f"{model} is planned at {', '.join(f'{p} in {r}' for r, p in sorted(chosen.items()))}; "
                                "models[].engine.precision is one per model: plan the regions one at a time"))
    return notes


def compute_edit(path: str | Path, pools: list[PlannedPool], unserved: list[str], allow_estimated: bool = False,
                 write_schedule: bool = False, spot: list[SpotAdvice] | None = None,
                 write_spot: bool = False) -> ConfigEdit:
    """The config at `path` with the planned pools written in, validated; writes nothing. Refuses, file untouched,
    on any problem (write_config_notes).

    Per provider region: its pool (of the chosen instance family, else its first) gets the instance type, the
    capacity bounds, the scaling target, the schedule (--write-schedule) and the Spot tier (--write-spot, or kept
    up to date where it has one). One model: the pool's engine.precision. Several (a packing): `serves` (each
    model's copies and KV budget, GiB rounded down to 0.1 so the validator's memory sum still fits) and each
    model's precision in models[].engine.precision (a pool-level precision would apply to every model it serves,
    so it is removed). A consumer region served from another region is added to its allowed_regions and its
    consumers point at it."""
    path = Path(path)
    yaml, doc, current = _open_for_edit(path)
    packed = any(p.packed for p in pools) or len(current.models) > 1
    if packed and not isinstance(doc.get("models"), list):
        raise UserError(f"--write-config: {path} is not a fleet config of several models (no `models` list)")
    what = "no packing serves {} within every model's SLO" if packed else "no candidate serves {} within the SLO"
    blockers = [what.format(region) for region in unserved]
    blockers += [text for blocking, text in write_config_notes(current, pools, allow_estimated) if blocking]
    if blockers:
        raise UserError(f"--write-config: {path} was left untouched: " + "; ".join(blockers))
    changes: list[str] = []
    for model in doc.get("models") or [] if packed else []:
        chosen = {s.precision for p in pools for s in p.serves if s.model == model.get("id")}
        if chosen:
            (precision,) = chosen
            changes += _set_precision(model, f"models[{model.get('id')}]", precision)
    for planned in pools:
        entry = next(r for r in doc["regions"] if r.get("region") == planned.region)
        if not entry.get("pools"):
            raise UserError(f"--write-config: regions[{planned.region}] has no pools to update")
        pool = pool_for(entry["pools"], planned.instance_type.split(".")[0])
        where = f"regions[{planned.region}].pools[{pool.get('name')}]"
        hourly = list(planned.instances_by_hour)
        if _set(pool, "instance_type", planned.instance_type):
            changes.append(f"{where}.instance_type = {planned.instance_type}")
        changes += _write_serves(pool, where, planned.serves) if packed else \
            _set_precision(pool, where, planned.serves[0].precision)
        changes += _write_capacity(pool, where, hourly)
        target = int(planned.target) if float(planned.target).is_integer() else float(planned.target)
        scaling = pool.get("scaling")
        if scaling is None:
            pool["scaling"] = _flow({"metric": "active_requests", "target": target})
            changes.append(f"{where}.scaling.target = {target} active requests")
        elif scaling.get("metric", "active_requests") == "active_requests" and _set(scaling, "target", target):
            changes.append(f"{where}.scaling.target = {target} active requests")
        if write_schedule:
            # Per hour the largest over the models of the processes each needs / its copies (the floor included).
            changes += _write_schedule(pool, where, hourly)
        changes += _write_spot(pool, where, [a for a in spot or [] if (a.service_region, a.candidate) ==
                                             (planned.region, planned.label)], write_schedule, write_spot)
        changes += _route_consumers(doc, entry, planned)
    return _validated_edit(path, yaml, doc, changes, current)


def _set_precision(node: CommentedMap, where: str, precision: str) -> list[str]:
    """`node`'s engine.precision (a pool's, one model; a model's, several)."""
    engine = node.get("engine")
    if engine is None:
        node["engine"] = _flow({"precision": precision})
    elif not _set(engine, "precision", precision):
        return []
    return [f"{where}.engine.precision = {precision}"]


def _write_serves(pool: CommentedMap, where: str, serves: tuple[Served, ...]) -> list[str]:
    """A packed pool's `serves`; a pool-level precision goes (each model's is in models[].engine)."""
    changes = []
    engine = pool.get("engine")
    if engine is not None and "precision" in engine:
        del engine["precision"]
        changes.append(f"{where}.engine.precision removed (each model's precision is in models[].engine)")
        if not engine:
            del pool["engine"]
    wanted = [{"model": s.model, "copies": s.copies, **({} if s.kv_cache_gb is None else {"kv_cache_gb": s.kv_cache_gb})}
              for s in serves]
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
    return changes


def _route_consumers(doc: CommentedMap, entry: CommentedMap, planned: PlannedPool) -> list[str]:
    """Each consumer region the pool serves from another region: allowed there, its consumers pointed at it."""
    changes = []
    for consumer_region in planned.consumer_regions:
        if consumer_region != planned.region:
            allowed = entry.get("allowed_regions")
            if allowed is None:
                entry["allowed_regions"] = allowed = []
            if consumer_region not in allowed:
                allowed.append(consumer_region)
                changes.append(f"regions[{planned.region}].allowed_regions += {consumer_region}")
        for consumer in doc.get("consumers") or []:
            if consumer.get("region") == consumer_region and consumer.get("service_region") != planned.region:
                consumer["service_region"] = planned.region
                changes.append(f"consumers[{consumer.get('name')}].service_region = {planned.region}")
                if "endpoint_service_name" in consumer:
                    del consumer["endpoint_service_name"]
                    changes.append(f"consumers[{consumer.get('name')}].endpoint_service_name removed "
                                   f"(publish the {planned.region} service's name after deploying)")
    return changes


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


def _write_spot(pool: CommentedMap, where: str, advice: list[SpotAdvice], write_schedule: bool, write_spot: bool) -> list[str]:
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


def throttling_notes(cfg: FleetConfig, pools: list[PlannedPool]) -> list[str]:
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
                    f"{where} is {limit}, equal to the scaling.target {target:g} of {fleet_pool.region}: target "
                    f"tracking keeps the average at {target:g} requests in flight per instance, so instances above the "
                    f"average refuse {consumer.name}'s requests past {limit} with 429 (concurrency_limit_exceeded) at "
                    f"the planned load; raise max_concurrency above the target (headroom for uneven spread and "
                    f"scale-out delay) or accept throttling at peak")
            elif limit < target:
                notes.append(
                    f"{where} is {limit}, below the scaling.target {target:g} of {fleet_pool.region}: "
                    f"{consumer.name}'s requests past {limit} per instance get 429 while the instance is still under "
                    f"its target, so the pool does not scale out for them; raise max_concurrency above the target "
                    f"or expect {consumer.name} to be throttled rather than served")
    return notes


def _open_for_edit(path: Path) -> tuple[YAML, CommentedMap, FleetConfig]:
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


def _validated_edit(path: Path, yaml: YAML, doc: CommentedMap, changes: list[str], current: FleetConfig) -> ConfigEdit:
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
