"""What a config change does to a deployed fleet, before `cdk deploy`: which pools roll.

Every pool's launch template carries `FleetConfig.instance_digest(region, pool)`, so a
pool rolls (instance refresh) exactly when that digest changes. A new fleet `name` is no rollout:
every stack is named after the fleet, so a deploy creates a second, parallel fleet (new groups, NLBs,
endpoint services) and the old one keeps running; `diff_configs` says so instead of comparing pools. Consumers and who may call
which model (`models[].consumers`) reach running gateways through their config refresh; everything else in NOT_IN_INSTANCE_DIGEST is a
stack setting applied in place. `diff_configs` lists the changed fields (named list items
keyed by their name, so reordering is not a change) and says, per pool, what happens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from fleetcast.contract.instance_env import Var, default

from .model import LIST_FORM, FleetConfig, Pool, Serve

# How soon a running gateway applies consumer and entitlement changes: its config refresh period.
GATEWAY_REFRESH_S = default(Var.GATEWAY_REFRESH_S)

# Lists whose items have a name: compared item by item, addressed as list[name].
_KEYED_LISTS = {"regions": "region", "pools": "name", "consumers": "name", "availability_zones": "name",
                "models": "id", "serves": "model", "adapters": "id"}
_MISSING = object()


@dataclass(frozen=True)
class FieldChange:
    path: str
    before: Any
    after: Any

    @property
    def kind(self) -> str:
        if self.before is _MISSING:
            return "added"
        if self.after is _MISSING:
            return "removed"
        return "changed"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "kind": self.kind}
        if self.before is not _MISSING:
            out["before"] = self.before
        if self.after is not _MISSING:
            out["after"] = self.after
        return out


@dataclass(frozen=True)
class PoolImpact:
    region: str
    pool: str
    outcome: str  # "rolls", "kept", "new", "removed", "parallel" (in the renamed fleet's new stack)
    before_digest: str | None
    after_digest: str | None
    # What changes in what the pool's instances serve, e.g. "adds qwen2.5-3b (1 copy)"; empty when nothing does.
    models: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"region": self.region, "pool": self.pool, "outcome": self.outcome,
                "instance_digest_before": self.before_digest, "instance_digest_after": self.after_digest,
                "models": list(self.models)}


@dataclass(frozen=True)
class ConfigImpact:
    changes: list[FieldChange]
    pools: list[PoolImpact]
    consumers_changed: list[str] = field(default_factory=list)
    # Models whose `consumers` (who may call them and their adapters) changed.
    entitlements_changed: list[str] = field(default_factory=list)
    # (old, new) fleet name when it changed: a deploy makes a second fleet, the old one keeps running.
    renamed: tuple[str, str] | None = None
    # Changes of fleet `engine` defaults that no pool builds with, before or after (FleetConfig.unused_engine_defaults).
    no_effect: list[FieldChange] = field(default_factory=list)
    # (region, pool, what) of pools that gain a Spot tier: their capacity above the base may now be interrupted.
    spot_added: list[tuple[str, str, str]] = field(default_factory=list)

    def for_region(self, region: str) -> ConfigImpact:
        """The same changes, with only that region's pools (what a deploy there does)."""
        return ConfigImpact(self.changes, [p for p in self.pools if p.region == region], self.consumers_changed,
                            self.entitlements_changed, self.renamed, self.no_effect,
                            [s for s in self.spot_added if s[0] == region])

    @property
    def tags_changed(self) -> bool:
        return any(c.path == "tags" or c.path.startswith("tags.") for c in self.changes)

    @property
    def rolls(self) -> list[PoolImpact]:
        return [p for p in self.pools if p.outcome == "rolls"]

    def to_json(self) -> dict[str, Any]:
        return {"changes": [c.to_json() for c in self.changes], "pools": [p.to_json() for p in self.pools],
                "consumers_changed": self.consumers_changed, "entitlements_changed": self.entitlements_changed,
                "tags_changed": self.tags_changed,
                "rolls": bool(self.rolls),
                "renamed": None if self.renamed is None else {"before": self.renamed[0], "after": self.renamed[1]},
                "parallel_fleet": self.renamed is not None,
                "no_effect": [c.to_json() for c in self.no_effect]}


def _walk(before: Any, after: Any, path: str, key: str | None, out: list[FieldChange]) -> None:
    if before == after:
        return
    if isinstance(before, dict) and isinstance(after, dict):
        for name in [*before, *[k for k in after if k not in before]]:
            _walk(before.get(name, _MISSING), after.get(name, _MISSING), f"{path}.{name}" if path else name, name, out)
        return
    item_key = _KEYED_LISTS.get(key or "")
    # Only lists of objects are keyed: models[].consumers is a list of names, compared as a whole.
    if item_key and isinstance(before, list) and isinstance(after, list) \
            and all(isinstance(item, dict) for item in [*before, *after]):
        old = {item.get(item_key): item for item in before if isinstance(item, dict)}
        new = {item.get(item_key): item for item in after if isinstance(item, dict)}
        for name in [*old, *[n for n in new if n not in old]]:
            _walk(old.get(name, _MISSING), new.get(name, _MISSING), f"{path}[{name}]", None, out)
        return
    out.append(FieldChange(path, before, after))


def _digests(cfg: FleetConfig) -> dict[tuple[str, str], str]:
    return {(r.region, p.name): cfg.instance_digest(r.region, p.name) for r in cfg.regions for p in r.pools}


def _copies(n: int) -> str:
    return f"{n} cop{'y' if n == 1 else 'ies'}"


def _served_changes(before: FleetConfig, after: FleetConfig, region: str, pool: str) -> tuple[str, ...]:
    """Which served models a pool adds, removes, re-packs (copies, KV budget) or rebuilds (model or engine)."""
    def served(cfg: FleetConfig) -> tuple[Pool, dict[str, Serve]]:
        p = cfg.region(region).pool(pool)
        return p, {s.model: s for s in cfg.serves_of(p)}

    (old_pool, old), (new_pool, new) = served(before), served(after)
    out = [f"adds {m} ({_copies(s.copies)})" for m, s in new.items() if m not in old]
    out += [f"removes {m}" for m in old if m not in new]
    for m in (m for m in new if m in old):
        a, b = old[m], new[m]
        repack = [f"{what} {x if x is not None else 'share'} -> {y if y is not None else 'share'}"
                  for what, x, y in (("copies", a.copies, b.copies), ("kv_cache_gb", a.kv_cache_gb, b.kv_cache_gb))
                  if x != y]
        if repack:
            out.append(f"re-packs {m}: {', '.join(repack)}")
        elif before.engine_for(old_pool, m) != after.engine_for(new_pool, m) or \
                _instance_fields(before, m) != _instance_fields(after, m):
            out.append(f"changes {m}")
    return tuple(out)


def _instance_fields(cfg: FleetConfig, model_id: str) -> dict[str, Any]:
    from .model import NOT_IN_INSTANCE_DIGEST

    return cfg.model_by_id(model_id).model_dump(mode="json", exclude=NOT_IN_INSTANCE_DIGEST["models"]["__all__"])


def diff_configs(before: FleetConfig, after: FleetConfig) -> ConfigImpact:
    found: list[FieldChange] = []
    # Both in the list form, so a move from `model:` to `models:` compares model by model.
    _walk(before.model_dump(mode="json", context=LIST_FORM), after.model_dump(mode="json", context=LIST_FORM), "",
          None, found)
    idle = {f"engine.{name}" for name in set(before.unused_engine_defaults()) & set(after.unused_engine_defaults())}
    changes = [c for c in found if c.path not in idle]
    no_effect = [c for c in found if c.path in idle]
    if before.name != after.name:
        # Every stack is named after the fleet: nothing of the old fleet is updated, the new one starts beside it.
        pools = [PoolImpact(r.region, p.name, "parallel", None, after.instance_digest(r.region, p.name))
                 for r in after.regions for p in r.pools]
        return ConfigImpact(changes, pools, renamed=(before.name, after.name), no_effect=no_effect)
    old, new = _digests(before), _digests(after)
    pools = []
    for region, pool in [*old, *[k for k in new if k not in old]]:
        a, b = old.get((region, pool)), new.get((region, pool))
        outcome = "new" if a is None else "removed" if b is None else "kept" if a == b else "rolls"
        models = _served_changes(before, after, region, pool) if a is not None and b is not None else ()
        pools.append(PoolImpact(region, pool, outcome, a, b, models))
    consumers = sorted({c.path.split("]")[0].removeprefix("consumers[") for c in changes
                        if c.path.startswith("consumers")})
    entitled = sorted({c.path.split("]")[0].removeprefix("models[") for c in changes
                       if c.path.startswith("models[") and c.path.split("]", 1)[1].startswith(".consumers")})
    return ConfigImpact(changes, pools, consumers, entitled, no_effect=no_effect, spot_added=_spot_added(before, after))


def _spot_added(before: FleetConfig, after: FleetConfig) -> list[tuple[str, str, str]]:
    """Pools with a spot block in `after` and none in `before` (a new pool with one counts too)."""
    had = {(r.region, p.name) for r in before.regions for p in r.pools if p.spot is not None}
    out = []
    for region in after.regions:
        for pool in region.pools:
            if pool.spot is not None and (region.region, pool.name) not in had:
                out.append((region.region, pool.name, f"On-Demand base {pool.on_demand_base}, Spot on "
                                                      f"{', '.join(pool.spot_instance_types)} above it"))
    return out


def _short(value: Any) -> str:
    if value is _MISSING:
        return "(absent)"
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= 60 else text[:57] + "..."


_OUTCOME_TEXT = {
    "rolls": "ROLLS: new launch template version, replaced by instance refresh",
    "kept": "kept: no instance replaced",
    "new": "new group: launches its instances",
    "removed": "removed: its group and instances are deleted",
    "parallel": "NEW FLEET: a new group in the renamed fleet's stack launches its instances",
}


def _no_effect_line(impact: ConfigImpact) -> list[str]:
    if not impact.no_effect:
        return []
    return [f"Without effect ({', '.join(f'{c.path} {_short(c.before)} -> {_short(c.after)}' for c in impact.no_effect)}"
            "): every model sets its own (models[].engine or pools[].engine), so no pool builds with it."]


def render_impact(impact: ConfigImpact) -> str:
    if not impact.changes:
        return "\n".join(["No change: the two configs are the same once validated (defaults filled in).",
                          *_no_effect_line(impact)]) + "\n"
    lines = [f"Changed ({len(impact.changes)}):"]
    width = min(64, max(len(c.path) for c in impact.changes))
    for c in impact.changes:
        detail = {"added": f"added {_short(c.after)}", "removed": "removed"}.get(
            c.kind, f"{_short(c.before)} -> {_short(c.after)}")
        lines.append(f"  {c.path:<{width}}  {detail}")
    lines += _no_effect_line(impact)
    if impact.renamed is not None:
        from fleetcast.contract.names import provider_stack_name

        old, new = impact.renamed
        regions = list(dict.fromkeys(p.region for p in impact.pools))
        lines.append(f"FLEET RENAMED ({old} -> {new}): NOT a rollout. Every stack name changes "
                     f"({', '.join(f'{provider_stack_name(old, r)} -> {provider_stack_name(new, r)}' for r in regions)}"
                     f", and each consumer stack), so a deploy creates a second, parallel fleet: new groups, NLBs and "
                     f"endpoint service names (consumers must connect to the new ones), while fleet {old} keeps "
                     f"running and billing until it is torn down (`fleetcast teardown` with the old config). "
                     f"`fleetcast deploy` asks before creating it.")
    lines.append("Pools:")
    for p in impact.pools:
        digests = f" (instance digest {p.before_digest[:12]})" if p.outcome == "kept" and p.before_digest else \
            f" (instance digest {p.before_digest[:12]} -> {p.after_digest[:12]})" \
            if p.outcome == "rolls" and p.before_digest and p.after_digest else ""
        lines.append(f"  {p.region}/{p.pool}: {_OUTCOME_TEXT[p.outcome]}{digests}")
        lines += [f"    {change}" for change in p.models]
    for region, pool, what in impact.spot_added:
        lines.append(f"NEW SPOT GROUP {region}/{pool}: {what}; instances above the base may be interrupted "
                     "(docs/runbook.md#spot-tier)")
    if impact.renamed is not None:  # what follows describes running gateways and groups: none are kept
        return "\n".join(lines) + "\n"
    if impact.consumers_changed:
        lines.append(f"Consumers changed ({', '.join(impact.consumers_changed)}): running gateways apply them from "
                     f"the config parameter within their refresh period ({GATEWAY_REFRESH_S:.0f} s); no restart.")
    if impact.entitlements_changed:
        lines.append(f"Entitlements changed ({', '.join(f'models[{m}].consumers' for m in impact.entitlements_changed)}"
                     f"): no rollout; gateways pick it up within {GATEWAY_REFRESH_S:.0f} s.")
    if impact.tags_changed:
        # EC2 Auto Scaling applies a changed group tag only to instances launched after the change (API
        # reference, TagDescription.PropagateAtLaunch); the launch templates carry no config tag.
        lines.append("Tags changed: each stack's resources and Auto Scaling groups are re-tagged in place; instances "
                     "launched from now on carry the new tags, running instances keep the ones they launched with "
                     "(EC2 Auto Scaling propagates a group's tags at launch only); no instance is replaced.")
    lines.append("A new Fleetcast version (runtime bundle) or a newer `latest` AMI also changes launch templates; "
                 "this compares configs only.")
    return "\n".join(lines) + "\n"
