"""Rules that span fields or need the shipped tables; each names the path it blames.

They run on a structurally valid `FleetConfig` and return every problem found,
never stopping at the first.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetcast.contract import support

from . import catalog, spill_rules
from .model import LIST_FORM, Backend, ExistingVpc, FleetConfig, KvCacheDtype, Pool, Slo, SpotSpec

if TYPE_CHECKING:
    from .memory import PoolMemory

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class ConfigIssue:
    path: Path
    message: str

    @property
    def dotted(self) -> str:
        out = ""
        for part in self.path:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
        return out or "(top level)"


def check(cfg: FleetConfig) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    issues += _model_limits(cfg)
    issues += _models(cfg)
    issues += _served_models(cfg)
    issues += _regions(cfg)
    issues += _pools(cfg)
    issues += _serves(cfg)
    issues += _spot_tiers(cfg)
    issues += _consumers(cfg)
    issues += [ConfigIssue(path, message) for path, message in spill_rules.check(cfg, served_in(cfg))]
    for rule in AWS_LIMIT_RULES:
        issues += rule(cfg)
    return _unknown_regions_once(cfg, issues)


def _unknown_regions_once(cfg: FleetConfig, issues: list[ConfigIssue]) -> list[ConfigIssue]:
    """An unknown region is one problem, "unknown region", not the AZs, instance offers and PrivateLink pairs
    that follow from it: the other issues of the entry that names it (and those quoting it) are left out."""
    known = catalog.known_regions()
    unknown: list[ConfigIssue] = []
    entries: set[Path] = set()
    names: set[str] = set()

    def note(path: Path, region: str, entry: Path) -> None:
        if region in known:
            return
        close = difflib.get_close_matches(region, sorted(known), n=1, cutoff=0.8)
        unknown.append(ConfigIssue(path, f"{region!r} is an unknown region: no AWS partition has it (botocore's "
                                         "region list" + (f"; did you mean {close[0]}?)" if close else ")") +
                                         "; allowed: an AWS region code such as ap-northeast-2"))
        entries.add(entry)
        names.add(region)

    for i, region in enumerate(cfg.regions):
        note(("regions", i, "region"), region.region, ("regions", i))
        for j, other in enumerate(region.allowed_regions):
            note(("regions", i, "allowed_regions", j), other, ("regions", i, "allowed_regions", j))
    for i, consumer in enumerate(cfg.consumers):
        note(("consumers", i, "region"), consumer.region, ("consumers", i))
    for cert_region in cfg.network.tls_certificate_arns:
        note(("network", "tls_certificate_arns", cert_region), cert_region,
             ("network", "tls_certificate_arns", cert_region))
    if not unknown:
        return issues

    def follows(issue: ConfigIssue) -> bool:
        return any(tuple(issue.path[:len(e)]) == e for e in entries) or any(repr(n) in issue.message or
                                                                             f" {n}" in issue.message for n in names)
    return unknown + [i for i in issues if not follows(i)]


def _model_limits(cfg: FleetConfig) -> list[ConfigIssue]:
    out = []
    for i, m in enumerate(cfg.models):
        if m.max_input_len + m.max_output_len > m.context_length:
            out.append(ConfigIssue(("models", i, "max_output_len"),
                f"max_input_len + max_output_len = {m.max_input_len + m.max_output_len} exceeds the model's "
                f"context_length {m.context_length}; allowed: a sum <= {m.context_length}"))
    return out


def _models(cfg: FleetConfig) -> list[ConfigIssue]:
    """Model and adapter ids are unique OpenAI `model` values; entitlements name consumers that exist."""
    out: list[ConfigIssue] = []
    seen: dict[str, str] = {}
    consumers = [c.name for c in cfg.consumers]
    for i, model in enumerate(cfg.models):
        ids = [(("models", i, "id"), model.id, f"model {model.id}")] + [
            (("models", i, "adapters", k, "id"), a.id, f"an adapter of {model.id}") for k, a in enumerate(model.adapters)]
        for path, value, what in ids:
            if value in seen:
                out.append(ConfigIssue(path, f"{value!r} is already the id of {seen[value]}: consumers select a "
                                             "model or adapter by this id (the OpenAI `model` value), so each is "
                                             "unique among models and adapters"))
            else:
                seen[value] = what
        for k, name in enumerate(model.consumers or ()):
            if name not in consumers:
                out.append(ConfigIssue(("models", i, "consumers", k),
                    f"{name!r} is not a consumer of this fleet; allowed: {', '.join(consumers) or 'none (add it to consumers)'}"))
    for i, consumer in enumerate(cfg.consumers):
        allowed = cfg.models_for(consumer.name)
        for model_id in consumer.limits.models:
            if model_id not in allowed:
                out.append(ConfigIssue(("consumers", i, "limits", "models", model_id),
                    f"{consumer.name} may not call {model_id!r} (unknown, or not among its models' consumers), so a "
                    f"limit on it would never apply; allowed: {', '.join(allowed) or 'none'}"))
    return out
def served_in(cfg: FleetConfig) -> dict[str, set[str]]:
    """Region -> the ids of the models its pools serve (every pool of a region serves the same ones)."""
    known = {m.id for m in cfg.models}
    return {r.region: {s.model for p in r.pools for s in cfg.serves_of(p)} & known for r in cfg.regions}


def _served_models(cfg: FleetConfig) -> list[ConfigIssue]:
    """Every model is served somewhere, and an entitlement names a model its consumer's region serves: else the
    consumer's request answers model_not_found although the config grants it."""
    out: list[ConfigIssue] = []
    known = {m.id for m in cfg.models}
    if any(s.model not in known for r in cfg.regions for p in r.pools for s in p.serves):
        return out  # a serve names an unknown model (blamed by _serves, with the ids): likely the one unserved here
    served = served_in(cfg)
    anywhere = set().union(*served.values()) if served else set()
    service_region = {c.name: c.service_region for c in cfg.consumers}
    for i, model in enumerate(cfg.models):
        if model.id not in anywhere:
            adapters = f" (nor its adapters {', '.join(a.id for a in model.adapters)})" if model.adapters else ""
            out.append(ConfigIssue(("models", i, "id"),
                f"no pool serves {model.id}{adapters}: every pool names its models in `serves` and none names it, "
                f"so a request for it would answer model_not_found; allowed: add {{model: {model.id}}} to the "
                "serves of each pool of a region that should serve it, or remove the model"))
            continue  # its entitlements follow from this one mistake
        for k, name in enumerate(model.consumers or ()):
            region = service_region.get(name)
            if region is not None and region in served and model.id not in served[region]:
                out.append(ConfigIssue(("models", i, "consumers", k),
                    f"{name} reaches {region} (its service_region), where no pool serves {model.id}: its requests "
                    f"for it would answer model_not_found; allowed: serve {model.id} in {region}, or remove "
                    f"{name} from this list (models served there: {', '.join(sorted(served[region])) or 'none'})"))
    return out


def _regions(cfg: FleetConfig) -> list[ConfigIssue]:
    out: list[ConfigIssue] = []
    counts = Counter(r.region for r in cfg.regions)
    seen_regions: set[str] = set()
    for i, region in enumerate(cfg.regions):
        here = ("regions", i)
        if region.region in seen_regions:
            out.append(ConfigIssue(here + ("region",), f"region {region.region!r} appears {counts[region.region]} times; one entry per region"))
        seen_regions.add(region.region)
        azs = region.availability_zones
        if len(azs) < 2:
            out.append(ConfigIssue(here + ("availability_zones",), f"{len(azs)} availability zone(s) given; at least 2 are required"))
        for j, az in enumerate(azs):
            if not az.name.startswith(region.region):
                out.append(ConfigIssue(here + ("availability_zones", j, "name"), f"{az.name!r} is not an AZ of {region.region}"))
            if not _az_id_in_region(az.id, region.region):
                out.append(ConfigIssue(here + ("availability_zones", j, "id"),
                    f"{az.id!r} is not an AZ ID of {region.region} (expected {az_id_prefix(region.region)}-azN)"))
        for field in ("name", "id"):
            dup = [v for v, n in Counter(getattr(a, field) for a in azs).items() if n > 1]
            if dup:
                out.append(ConfigIssue(here + ("availability_zones",), f"duplicate AZ {field}s: {', '.join(dup)}"))
        if isinstance(region.vpc, ExistingVpc) and len(region.vpc.subnet_ids) != len(azs):
            out.append(ConfigIssue(here + ("vpc", "subnet_ids"),
                f"{len(region.vpc.subnet_ids)} subnets for {len(azs)} availability zones; give one private subnet per AZ, in the same order"))
        for j, other in enumerate(region.allowed_regions):
            if other == region.region:
                out.append(ConfigIssue(here + ("allowed_regions", j), f"{other} is the service's own region; list only other regions"))
            elif not catalog.cross_region_supported(other, region.region):
                out.append(ConfigIssue(here + ("allowed_regions", j),
                    f"cross-region PrivateLink between {other} and {region.region} is not in the supported table "
                    f"(shipped data, overridable); supported regions: "
                    f"{', '.join(sorted(catalog.privatelink_cross_region()))}"))
        seen_pools: set[str] = set()
        for j, pool in enumerate(region.pools):
            if pool.name in seen_pools:
                out.append(ConfigIssue(here + ("pools", j, "name"), f"pool name {pool.name!r} is used twice in {region.region}"))
            seen_pools.add(pool.name)
    for region_name in cfg.network.tls_certificate_arns:
        if region_name not in counts:
            out.append(ConfigIssue(("network", "tls_certificate_arns", region_name), f"{region_name} has no provider region entry"))
    return out


def _pools(cfg: FleetConfig) -> list[ConfigIssue]:
    out: list[ConfigIssue] = []
    instances = catalog.instance_catalog()
    offered = catalog.availability()
    model_index = {m.id: k for k, m in enumerate(cfg.models)}
    for i, region in enumerate(cfg.regions):
        for j, pool in enumerate(region.pools):
            here: Path = ("regions", i, "pools", j)
            instance = instances.get(pool.instance_type)
            if instance is None:
                out.append(ConfigIssue(here + ("instance_type",),
                    f"{pool.instance_type!r} is not a supported GPU instance type; allowed: {', '.join(sorted(instances))}"))
                continue
            if region.region not in offered.get(instance.family, frozenset()):
                out.append(ConfigIssue(here + ("instance_type",),
                    f"{instance.family} instances are not offered in {region.region} (availability table as of "
                    f"{catalog.availability_as_of()}); offered in: {', '.join(sorted(offered.get(instance.family, [])))}"))
            for serve in cfg.serves_of(pool):
                if serve.model in model_index:
                    out += _served_engine(cfg, pool, here, model_index[serve.model], instance)
            if pool.warm_pool.size and pool.capacity_reservation_ids:
                pass  # allowed: reservations cover running instances, warm ones are stopped
            for k, step in enumerate(pool.schedule):
                desired = step.desired if step.desired is not None else step.min
                if not (step.min <= desired <= step.max):
                    out.append(ConfigIssue(here + ("schedule", k), "scheduled capacity must satisfy min <= desired <= max"))
                if step.max > pool.capacity.max:
                    out.append(ConfigIssue(here + ("schedule", k, "max"),
                        f"scheduled max {step.max} exceeds the pool's capacity.max {pool.capacity.max}"))
    return out


def _served_engine(cfg: FleetConfig, pool: Pool, here: Path, k: int, instance: catalog.InstanceType) -> list[ConfigIssue]:
    """One served model's resolved engine (fleet <- model <- pool) runs on the pool's GPU and backend."""
    out: list[ConfigIssue] = []
    model = cfg.models[k]
    engine = cfg.engine_for(pool, model.id)
    several = len(cfg.models) > 1
    suffix = f" (model {model.id})" if several else ""

    # Blame the pool's override when it set the value, the model's when it did, the fleet default otherwise.
    def where(field: str) -> Path:
        if getattr(pool.engine, field) is not None:
            return here + ("engine", field)
        if getattr(model.engine, field) is not None:
            return ("models", k, "engine", field)
        return ("engine", field)

    # One decision for validator, planner and instance (fleetcast/contract/support.py).
    refusal = support.check(model.family.value, engine.backend.value, engine.precision.value,
                            engine.kv_cache_dtype.value, instance.gpu.arch,
                            support.instance_where(pool.instance_type, instance.gpu.name, instance.gpu.arch))
    if refusal is not None:
        blamed = here + ("instance_type",) if refusal.field == "gpu" else where(refusal.field)
        out.append(ConfigIssue(blamed, refusal.reason + suffix))
    elif support.needs_calibration(engine.backend.value, engine.precision.value, engine.kv_cache_dtype.value) \
            and model.calibration is None:
        field = "calibration.dataset" if not several else f"models[{model.id}].calibration.dataset"
        out.append(ConfigIssue(where("precision") if engine.kv_cache_dtype == KvCacheDtype.AUTO else where("kv_cache_dtype"),
            f"{engine.precision.value} with kv_cache_dtype {engine.kv_cache_dtype.value} is calibrated: set "
            f"{field} to a staged s3:// dataset (isolated subnets cannot download one)"))
    if engine.max_num_tokens < model.max_input_len and engine.backend == Backend.TENSORRT:
        out.append(ConfigIssue(where("max_num_tokens"),
            f"max_num_tokens {engine.max_num_tokens} is below model.max_input_len {model.max_input_len}{suffix}: "
            "a full prompt could never be scheduled"))
    if model.adapters and engine.backend != Backend.PYTORCH:
        out.append(ConfigIssue(("models", k, "adapters"),
            f"{model.id} runs on the {engine.backend.value} backend in pool {pool.name}; LoRA adapters are served "
            "per request only by the pytorch backend; allowed: adapters on pytorch-backend families "
            f"({', '.join(f for f, b in support.BACKENDS_BY_FAMILY.items() if 'pytorch' in b)})"))
    return out


def _serves(cfg: FleetConfig) -> list[ConfigIssue]:
    """What each pool serves: known models, once each; the same models in every pool of a region (the NLB
    spreads a region's requests over all its pools' instances); processes that fit the GPU together; engine
    ports that exist."""
    from fleetcast.contract.serving import HIGHEST_PORT, MAX_PROCESSES, first_process_port

    from .memory import plan_pool

    out: list[ConfigIssue] = []
    known = {m.id for m in cfg.models}
    for i, region in enumerate(cfg.regions):
        first: tuple[str, set[str]] | None = None
        for j, pool in enumerate(region.pools):
            here: Path = ("regions", i, "pools", j, "serves")
            seen: set[str] = set()
            for k, serve in enumerate(pool.serves):
                if serve.model not in known:
                    out.append(ConfigIssue(here + (k, "model"), f"{serve.model!r} is not a model of this fleet; "
                                                                f"allowed: {', '.join(m.id for m in cfg.models)}"))
                elif serve.model in seen:
                    out.append(ConfigIssue(here + (k, "model"), f"{serve.model} is listed twice; give its copies "
                                                                "in one entry"))
                seen.add(serve.model)
            served = {s.model for s in cfg.serves_of(pool)} & known
            typo = any(s.model not in known for s in pool.serves)
            if first is None and not typo:
                first = (pool.name, served)
            elif first is not None and not typo and served != first[1]:  # a misnamed model is blamed above
                out.append(ConfigIssue(here, f"pool {pool.name} serves {', '.join(sorted(served)) or 'nothing'}, pool "
                    f"{first[0]} in the same region serves {', '.join(sorted(first[1]))}: the region's load balancer "
                    "spreads every request over all its pools' instances, so each pool of a region serves the same "
                    "models (copies and KV budgets may differ)"))
            processes = sum(s.copies for s in cfg.serves_of(pool))
            if processes > MAX_PROCESSES:
                out.append(ConfigIssue(here, f"{processes} engine processes per instance; allowed: at most "
                                             f"{MAX_PROCESSES}"))
                continue
            last = first_process_port(cfg.engine.port) + processes - 1
            if last > HIGHEST_PORT:
                out.append(ConfigIssue(("engine", "port"),
                    f"pool {pool.name}'s {processes} engine processes listen on the ports after {cfg.engine.port}, up "
                    f"to {last}; allowed: a port at most {HIGHEST_PORT - processes}"))
            plan = plan_pool(cfg, pool)
            if plan is None:
                continue  # an unknown instance type is blamed by _pools
            out += _memory_issues(cfg, pool, plan, processes, served, here)
    return out


def _memory_issues(cfg: FleetConfig, pool: Pool, plan: PoolMemory, processes: int, served: set[str],
                   here: Path) -> list[ConfigIssue]:
    """GPU and host memory of one instance of `pool`, by the one home of that arithmetic (config/memory.py).
    A pool of one process without a budget keeps the KV fraction: only its weights, overhead and host are
    checked, and only where its size is known."""
    single = processes == 1 and not pool.serves
    unknown = [k for k, m in enumerate(cfg.models) if m.id in served and m.parameters_b is None]
    if plan.fits is None:
        if not single and (processes > 1 or any(s.kv_cache_gb is not None for s in pool.serves)):
            return [ConfigIssue(("models", k, "parameters_b"),
                                f"pool {pool.name} runs {processes} engine processes on one {plan.gpu}: set "
                                f"parameters_b (billions of parameters of {cfg.models[k].id}) so their memory can "
                                "be checked") for k in unknown]
        return []
    out = [ConfigIssue(here, f"what pool {pool.name} serves {problem}") for problem in plan.problems()]
    if not out and not single and any(p.kv_bytes == 0 for p in plan.processes):
        out.append(ConfigIssue(here, f"pool {pool.name} leaves no KV cache for the copies without "
                                     f"kv_cache_gb: {plan.arithmetic()}; set kv_cache_gb on each serve"))
    return out


def _spot_tiers(cfg: FleetConfig) -> list[ConfigIssue]:
    """The spot block of each pool: its types share the pool's GPU, it has room above the base, it is explicit
    about an all-Spot pool, and its fallback ceiling lies between the base and the pool's max."""
    out: list[ConfigIssue] = []
    for i, region in enumerate(cfg.regions):
        for j, pool in enumerate(region.pools):
            if pool.spot is None:
                continue
            here: Path = ("regions", i, "pools", j, "spot")
            out += _spot_types(region.region, pool, pool.spot, here)
            out += _spot_sizes(pool, pool.spot, here)
    return out


def _spot_types(region: str, pool: Pool, spot: SpotSpec, here: Path) -> list[ConfigIssue]:
    out: list[ConfigIssue] = []
    instances = catalog.instance_catalog()
    offered = catalog.availability()
    own = instances.get(pool.instance_type)
    if own is None:
        return out  # the pool's own instance_type is already blamed by _pools
    seen: set[str] = set()
    for k, name in enumerate(spot.instance_types):
        where = here + ("instance_types", k)
        if name in seen:
            out.append(ConfigIssue(where, f"{name} is listed twice"))
        seen.add(name)
        other = instances.get(name)
        if other is None:
            out.append(ConfigIssue(where, f"{name!r} is not a supported GPU instance type; allowed: "
                                          f"{', '.join(sorted(instances))}"))
            continue
        # The engine cache key holds the GPU's compute capability and the engine is built for the pool's GPU
        # count: a Spot instance of another GPU would fetch (or build) another engine than its pool's.
        if (other.gpu.name, other.gpus) != (own.gpu.name, own.gpus):
            same = sorted(n for n, t in instances.items() if (t.gpu.name, t.gpus) == (own.gpu.name, own.gpus))
            out.append(ConfigIssue(where,
                f"{name} has {other.gpus}x {other.gpu.name}, the pool {pool.name} serves {own.gpus}x {own.gpu.name} "
                f"({pool.instance_type}): Spot types must share the pool's GPU so the engine cache key stays the "
                f"same; allowed: {', '.join(same)}"))
        elif region not in offered.get(other.family, frozenset()):
            out.append(ConfigIssue(where, f"{other.family} instances are not offered in {region} (availability "
                                          f"table as of {catalog.availability_as_of()})"))
    return out


def _spot_sizes(pool: Pool, spot: SpotSpec, here: Path) -> list[ConfigIssue]:
    out: list[ConfigIssue] = []
    capacity = pool.capacity
    base = pool.on_demand_base
    if capacity.min == capacity.max:
        out.append(ConfigIssue(here, f"capacity min == max ({capacity.min}): the pool never scales, so a Spot tier "
                                     "above its baseline would never run; raise capacity.max or drop the spot block"))
    elif base >= capacity.max:
        out.append(ConfigIssue(here + ("on_demand_base",),
            f"on_demand_base {base} leaves no room for Spot under capacity.max {capacity.max}; allowed: "
            f"0..{capacity.max - 1}"))
    if capacity.desired is not None:
        out.append(ConfigIssue(here[:-1] + ("capacity", "desired"),
            "capacity.desired fixes the group's size at every deploy; with a spot tier scaling owns the split "
            "between the On-Demand and the Spot group: leave desired out"))
    if pool.schedule:
        out.append(ConfigIssue(here[:-1] + ("schedule",),
            "a daily schedule sizes one group; with a spot tier the pool has two: drop the schedule or the spot block"))
    if base == 0 and spot.spot_percentage == 100 and not spot.allow_all_spot:
        out.append(ConfigIssue(here + ("allow_all_spot",),
            "spot_percentage 100 with no On-Demand base puts every instance on Spot, so one capacity event can take "
            "the whole pool: set on_demand_base (or capacity.min) above 0, lower spot_percentage, or set "
            "allow_all_spot: true"))
    ceiling = pool.on_demand_fallback_max
    if not base <= ceiling <= capacity.max:
        out.append(ConfigIssue(here + ("on_demand_fallback_max",),
            f"on_demand_fallback_max {ceiling} must lie between on_demand_base {base} and capacity.max "
            f"{capacity.max}"))
    return out


def _consumers(cfg: FleetConfig) -> list[ConfigIssue]:
    out: list[ConfigIssue] = []
    seen_names: set[str] = set()
    regions = {r.region: r for r in cfg.regions}
    for i, consumer in enumerate(cfg.consumers):
        here: Path = ("consumers", i)
        if consumer.name in seen_names:
            out.append(ConfigIssue(here + ("name",), f"consumer name {consumer.name!r} is used twice"))
        seen_names.add(consumer.name)
        service = regions.get(consumer.service_region)
        if service is None:
            out.append(ConfigIssue(here + ("service_region",),
                f"no provider region {consumer.service_region!r} in regions; allowed: {', '.join(regions) or 'none'}"))
            continue
        if consumer.cross_region:
            if consumer.region not in service.allowed_regions:
                out.append(ConfigIssue(here + ("region",),
                    f"{consumer.region} reaches {consumer.service_region} cross-region, but that region's allowed_regions "
                    f"does not list {consumer.region}"))
            elif not catalog.cross_region_supported(consumer.region, consumer.service_region):
                out.append(ConfigIssue(here + ("region",),
                    f"cross-region PrivateLink between {consumer.region} and {consumer.service_region} is not supported"))
        principals = {arn.split(":")[4] for arn in service.allowed_principals}
        if consumer.account not in principals:
            out.append(ConfigIssue(here + ("account",),
                f"account {consumer.account} is not among regions[{consumer.service_region}].allowed_principals; "
                "add its principal there or the endpoint connection can never be created"))
        if not consumer.cross_region:
            provider_azs = {az.id for az in service.availability_zones}
            if not provider_azs & {s.az_id for s in consumer.subnets}:
                out.append(ConfigIssue(here + ("subnets",),
                    f"none of the consumer's AZ IDs ({', '.join(s.az_id for s in consumer.subnets)}) is served by "
                    f"{consumer.service_region} ({', '.join(sorted(provider_azs))}): the endpoint could not be created"))
        for j, subnet in enumerate(consumer.subnets):
            if not _az_id_in_region(subnet.az_id, consumer.region):
                out.append(ConfigIssue(here + ("subnets", j, "az_id"), f"{subnet.az_id!r} is not an AZ ID of {consumer.region}"))
    return out


# AZ IDs carry a short region code (apne2-az1 for ap-northeast-2, use1-az4 for us-east-1).
_AREA = {"us": "us", "ap": "ap", "eu": "eu", "sa": "sa", "ca": "ca", "me": "me", "af": "af", "il": "il", "mx": "mx"}
_DIRECTION = {"east": "e", "west": "w", "north": "n", "south": "s", "central": "c", "northeast": "ne",
              "northwest": "nw", "southeast": "se", "southwest": "sw"}


def az_id_prefix(region: str) -> str:
    parts = region.split("-")
    area, direction, number = parts[0], parts[-2], parts[-1]
    return f"{_AREA.get(area, area)}{_DIRECTION.get(direction, direction[0])}{number}"


def _az_id_in_region(az_id: str, region: str) -> bool:
    return az_id.split("-az", 1)[0] == az_id_prefix(region)


# ---------------------------------------------------------------- AWS limits and cross-field rules
# Each refuses at validate what AWS (or synth) would refuse later, naming the limit and its source.


def _accounts(cfg: FleetConfig) -> list[ConfigIssue]:
    """A consumer is another account: the provider's own callers reach the NLB without PrivateLink."""
    return [ConfigIssue(("consumers", i, "account"),
                        f"account {c.account} is the provider account (provider.account); a consumer is another "
                        "AWS account that reaches the service through PrivateLink")
            for i, c in enumerate(cfg.consumers) if c.account == cfg.provider.account]


def _network_overlaps(cfg: FleetConfig) -> list[ConfigIssue]:
    """Provider VPCs do not overlap each other, and no consumer CIDR overlaps the VPC it connects to."""
    out: list[ConfigIssue] = []
    nets = [ipaddress.IPv4Network(r.vpc.cidr) for r in cfg.regions]
    for j, region in enumerate(cfg.regions):
        for k in range(j):
            if nets[j].overlaps(nets[k]):
                out.append(ConfigIssue(("regions", j, "vpc", "cidr"),
                    f"{region.vpc.cidr} overlaps {cfg.regions[k].region}'s VPC {cfg.regions[k].vpc.cidr}; give each "
                    "provider region its own range (allowed: non-overlapping CIDRs, so the fleets can ever be routed "
                    "to one another)"))
    by_region = {r.region: (j, nets[j]) for j, r in enumerate(cfg.regions)}
    for i, consumer in enumerate(cfg.consumers):
        if consumer.service_region not in by_region:
            continue
        _, provider = by_region[consumer.service_region]
        for k, cidr in enumerate(consumer.cidrs):
            if ipaddress.IPv4Network(cidr).overlaps(provider):
                out.append(ConfigIssue(("consumers", i, "cidrs", k),
                    f"{cidr} overlaps the {consumer.service_region} fleet VPC {provider}: the NLB would admit the "
                    "fleet's own addresses as this consumer; allowed: the consumer's ranges, outside the fleet VPC"))
    return out


def _subnet_space(cfg: FleetConfig) -> list[ConfigIssue]:
    """A created VPC holds the subnets the network stack carves (else synth fails: 'exceeds remaining space')."""
    from .model import EgressMode, NewVpc
    from .subnets import FLEET_SUBNET_MASK, PUBLIC_SUBNET_MASK, plan_subnets, smallest_prefix

    out: list[ConfigIssue] = []
    nat = cfg.network.egress == EgressMode.NAT
    for j, region in enumerate(cfg.regions):
        if not isinstance(region.vpc, NewVpc):
            continue
        azs = len(region.availability_zones)
        if plan_subnets(region.vpc.cidr, azs, nat) is None:
            carved = f"one /{FLEET_SUBNET_MASK} per AZ" + (f" and one public /{PUBLIC_SUBNET_MASK} per AZ (egress nat)" if nat else "")
            out.append(ConfigIssue(("regions", j, "vpc", "cidr"),
                f"{region.vpc.cidr} is too small for the subnets the stack carves ({carved}, {azs} AZs); "
                f"allowed: /{smallest_prefix(azs, nat)} or larger (a smaller prefix length)"))
    return out


def _subnets(cfg: FleetConfig) -> list[ConfigIssue]:
    """Subnet ids are listed once; an interface endpoint takes at most one subnet per AZ."""
    out: list[ConfigIssue] = []
    for j, region in enumerate(cfg.regions):
        if isinstance(region.vpc, ExistingVpc):
            seen: set[str] = set()
            for k, subnet_id in enumerate(region.vpc.subnet_ids):
                if subnet_id in seen:
                    out.append(ConfigIssue(("regions", j, "vpc", "subnet_ids", k),
                                           f"{subnet_id} is listed twice; give one private subnet per AZ"))
                seen.add(subnet_id)
    for i, consumer in enumerate(cfg.consumers):
        ids: set[str] = set()
        zones: dict[str, str] = {}
        for k, subnet in enumerate(consumer.subnets):
            if subnet.id in ids:
                out.append(ConfigIssue(("consumers", i, "subnets", k, "id"), f"{subnet.id} is listed twice"))
            elif subnet.az_id in zones:
                out.append(ConfigIssue(("consumers", i, "subnets", k, "az_id"),
                    f"{subnet.id} is in {subnet.az_id}, like {zones[subnet.az_id]}: an interface endpoint has one "
                    "network interface per Availability Zone (AWS PrivateLink: 'you can select one subnet per "
                    "Availability Zone'); allowed: at most one subnet per AZ ID"))
            ids.add(subnet.id)
            zones.setdefault(subnet.az_id, subnet.id)
    return out


def _warm_pools(cfg: FleetConfig) -> list[ConfigIssue]:
    out: list[ConfigIssue] = []
    for j, region in enumerate(cfg.regions):
        for k, pool in enumerate(region.pools):
            # The warm pool belongs to the On-Demand group; with a spot tier that group holds at most the
            # On-Demand fallback ceiling (stacks/gpu_fleet.py, stacks/fleet_spot.py), not capacity.max.
            ceiling, what = ((pool.on_demand_fallback_max, "the On-Demand ceiling of this Spot pool "
                              "(spot.on_demand_fallback_max, default capacity.max)") if pool.spot is not None
                             else (pool.capacity.max, "capacity.max"))
            if pool.warm_pool.size > ceiling:
                out.append(ConfigIssue(("regions", j, "pools", k, "warm_pool", "size"),
                    f"warm pool of {pool.warm_pool.size} is larger than {what} {ceiling}: instances "
                    f"beyond it could never be put in service; allowed: 0..{ceiling}"))
    return out


def _scaling_targets(cfg: FleetConfig) -> list[ConfigIssue]:
    """Targets an instance can reach: a percentage for KV-cache use, at most max_batch_size requests in flight."""
    out: list[ConfigIssue] = []
    for j, region in enumerate(cfg.regions):
        for k, pool in enumerate(region.pools):
            here: Path = ("regions", j, "pools", k, "scaling", "target")
            target = pool.scaling.target
            if pool.scaling.metric == "kv_cache_utilization":
                if target > 100:
                    out.append(ConfigIssue(here, f"kv_cache_utilization is a percentage; {target:g} is above 100; "
                                                 "allowed: 1..100 (e.g. 70)"))
                elif target <= 1:
                    out.append(ConfigIssue(here, f"kv_cache_utilization is a percentage; {target:g} looks like a "
                                                 f"fraction: write {target * 100:g} for {target * 100:g}%; allowed: "
                                                 "above 1, up to 100"))
            else:
                # Each engine process runs at most its max_batch_size requests at once.
                batch = sum(s.copies * cfg.engine_for(pool, s.model).max_batch_size for s in cfg.serves_of(pool)
                            if s.model in {m.id for m in cfg.models})
                if target > batch:
                    out.append(ConfigIssue(here,
                        f"active_requests target {target:g} is above the engine's max_batch_size {batch}: an instance "
                        f"runs at most {batch} requests at once, so the group would scale out only once requests "
                        f"queue; allowed: up to {batch}"))
    return out


# "Maximum number of tags per resource - 50", "Maximum key length - 128", "Maximum value length - 256",
# letters, numbers, spaces and + - = . _ : / @, and no aws: prefix (AWS API Reference, Tag; the same
# text in every service model: tests/config/test_aws_limits.py reads it from botocore's ECS model).
MAX_TAGS_PER_RESOURCE = 50
TAG_PUNCTUATION = "+-=._:/@"
# Tags the stacks add to resources themselves (CDK's Name on VPC and subnets; fleetcast:fleet on the
# endpoint service): they share the 50.
STACK_TAGS = ("Name", "fleetcast:fleet")


def _tag_text_ok(text: str) -> bool:
    return all(ch.isalnum() or unicodedata.category(ch) == "Zs" or ch in TAG_PUNCTUATION for ch in text)


def _tags(cfg: FleetConfig) -> list[ConfigIssue]:
    out: list[ConfigIssue] = []
    room = MAX_TAGS_PER_RESOURCE - len(STACK_TAGS)
    if len(cfg.tags) > room:
        out.append(ConfigIssue(("tags",), f"{len(cfg.tags)} tags; AWS allows {MAX_TAGS_PER_RESOURCE} per resource and "
                                          f"the stacks add {len(STACK_TAGS)} ({', '.join(STACK_TAGS)}): allowed: at most {room}"))
    for key, value in cfg.tags.items():
        for what, text in (("key", key), ("value", value)):
            if text.lower().startswith("aws:"):
                out.append(ConfigIssue(("tags", key), f"tag {what} {text!r} starts with 'aws:', which AWS reserves "
                                                      "for its own tags; allowed: any other prefix"))
            elif not _tag_text_ok(text):
                bad = "".join(sorted({ch for ch in text if not _tag_text_ok(ch)}))
                out.append(ConfigIssue(("tags", key), f"tag {what} {text!r} has characters AWS refuses ({bad!r}); "
                                                      f"allowed: letters, digits, spaces and {' '.join(TAG_PUNCTUATION)}"))
        if key in STACK_TAGS:
            out.append(ConfigIssue(("tags", key), f"tag {key!r} is set by the stacks themselves; choose another key"))
    return out


def _endpoint_service_names(cfg: FleetConfig) -> list[ConfigIssue]:
    """com.amazonaws.vpce.<region>.vpce-svc-...: the service lives in the consumer's service_region."""
    out: list[ConfigIssue] = []
    for i, consumer in enumerate(cfg.consumers):
        name = consumer.endpoint_service_name
        if name is None or consumer.service_region not in {r.region for r in cfg.regions}:
            continue  # an unknown service_region is reported on its own
        region = name.split(".")[3]
        if region != consumer.service_region:
            out.append(ConfigIssue(("consumers", i, "endpoint_service_name"),
                f"{name} is an endpoint service in {region}, but service_region is {consumer.service_region}; "
                f"allowed: the EndpointServiceName output of the {consumer.service_region} provider stack "
                f"(com.amazonaws.vpce.{consumer.service_region}.vpce-svc-...)"))
    return out


def _s3_key_problem(uri: str) -> str | None:
    bucket, _, key = uri[len("s3://"):].partition("/")
    if ".." in bucket:
        return f"bucket name {bucket!r} has two adjacent periods, which S3 bucket names may not"
    segments = key.rstrip("/").split("/") if key.rstrip("/") else []
    if any(s in (".", "..") for s in segments):
        return "a '.' or '..' segment would climb out of the staged prefix"
    if any(s == "" for s in segments):
        return "an empty segment ('//') names a different S3 key than intended"
    return None


def _path_segments(cfg: FleetConfig) -> list[ConfigIssue]:
    """Values that become S3 keys or local paths (models/<id>/<revision>/, staged prefixes) stay inside them."""
    out: list[ConfigIssue] = []
    uris: list[tuple[Path, str]] = []
    for i, model in enumerate(cfg.models):
        revisions: list[tuple[Path, str]] = [(("models", i, "revision"), model.revision)]
        revisions += [(("models", i, "adapters", k, "revision"), a.revision) for k, a in enumerate(model.adapters)]
        for where, revision in revisions:
            if ".." in revision or revision.startswith("/") or any(ch.isspace() for ch in revision) or "\\" in revision:
                out.append(ConfigIssue(where,
                    f"{revision!r} cannot be a revision: it becomes part of the S3 key models/<id>/<revision>/; allowed: "
                    "a commit sha, tag or branch name without '..', whitespace, backslashes or a leading '/'"))
        if model.staged:
            uris.append((("models", i, "source"), model.source))
        uris += [(("models", i, "adapters", k, "source"), a.source) for k, a in enumerate(model.adapters)
                 if a.source.startswith("s3://")]
        if model.calibration is not None:
            uris.append((("models", i, "calibration", "dataset"), model.calibration.dataset))
    for path, uri in uris:
        problem = _s3_key_problem(uri)
        if problem:
            out.append(ConfigIssue(path, f"{uri}: {problem}; allowed: s3://bucket/prefix/ with plain segments"))
    return out


def _config_parameter_size(cfg: FleetConfig) -> list[ConfigIssue]:
    """The config reaches instances as one SSM parameter: refuse here what Parameter Store would refuse at deploy."""
    from .parameter import ADVANCED_TIER_LIMIT, config_parameter

    value, tier = config_parameter(cfg)
    if tier is not None:
        return []
    path, size = _heaviest(cfg.model_dump(mode="json", context=LIST_FORM))
    here = f", {size} of them here" if path else ""
    return [ConfigIssue(path, f"the config is {len(cfg.model_dump_json())} bytes as JSON, {len(value)} even "
                              f"compressed{here}; it travels to instances as one SSM parameter, which holds at most "
                              f"{ADVANCED_TIER_LIMIT} bytes (advanced tier, AWS Systems Manager PutParameter); "
                              "allowed: less here, fewer consumers or pools, or split the fleet into several configs")]


def _heaviest(data: object, path: Path = ()) -> tuple[Path, int]:
    """The path that holds most of the JSON's bytes: down from the top while one entry holds over half of its
    parent's, so an oversized config blames the list that made it so (models[0].stage_patterns), not the file."""
    import json

    size = len(json.dumps(data, separators=(",", ":")))
    children: list[tuple[str | int, object]] = list(data.items()) if isinstance(data, dict) else \
        list(enumerate(data)) if isinstance(data, list) else []
    for key, child in children:
        if len(json.dumps(child, separators=(",", ":"))) * 2 > size:
            return _heaviest(child, path + (key,))
    return path, size


# Below a millisecond no served model answers through a network hop, and the SLO alarms would fire on every
# request (blocking every instance refresh): such a value is seconds written where milliseconds belong.
SLO_FLOOR_MS = 1.0


def _slo_units(cfg: FleetConfig) -> list[ConfigIssue]:
    """The one floor for every SLO: the fleet's and each model's own."""
    slos: list[tuple[Path, Slo]] = [(("slo",), cfg.slo)]
    slos += [(("models", i, "slo"), m.slo) for i, m in enumerate(cfg.models) if m.slo is not None]
    out = []
    for where, slo in slos:
        for field in ("ttft_p99_ms", "itl_p99_ms"):
            value = getattr(slo, field)
            if value < SLO_FLOOR_MS:
                out.append(ConfigIssue(where + (field,),
                    f"{value:g} ms is below {SLO_FLOOR_MS:g} ms, faster than any model answers across a network: is "
                    f"it seconds? {value:g} s is {value * 1000:g} ms; allowed: milliseconds, at least "
                    f"{SLO_FLOOR_MS:g}"))
    return out


def _calibration_dataset(cfg: FleetConfig) -> list[ConfigIssue]:
    """The dataset is the prefix `fleetcast stage calibration --name NAME` writes (calibration/NAME/, with its
    manifest): instances read that key prefix in their own region's bucket (runtime/staged.py), so a bare
    bucket or one file of the set is a prefix with no manifest, which they would wait on forever."""
    from fleetcast.contract.bucket import calibration_prefix

    out: list[ConfigIssue] = []
    for i, model in enumerate(cfg.models):
        if model.calibration is None or _s3_key_problem(model.calibration.dataset):
            continue  # a malformed key is blamed once, by _path_segments
        uri = model.calibration.dataset
        bucket, _, key = uri[len("s3://"):].partition("/")
        segments = key.strip("/").split("/") if key.strip("/") else []
        if len(segments) == 2 and key.rstrip("/") + "/" == calibration_prefix(segments[1]):
            continue
        name = segments[1] if len(segments) > 1 and segments[0] == "calibration" else "NAME"
        shown = "the bucket alone" if not segments else (f"the file {segments[-1]!r} of a set"
                                                          if "." in segments[-1] else f"the prefix {key!r}")
        out.append(ConfigIssue(("models", i, "calibration", "dataset"),
            f"{uri} names {shown}; instances read the staged set's prefix, which `fleetcast stage calibration "
            f"--name NAME` writes: allowed: s3://{bucket}/{calibration_prefix(name)}"))
    return out


# Lambda CreateFunction, Description: "Maximum length of 256" (botocore's lambda model, shape Description).
LAMBDA_DESCRIPTION_MAX = 256


def _lambda_descriptions(cfg: FleetConfig) -> list[ConfigIssue]:
    """The drift check's Lambda description quotes the schedule: a long one overflows it only at deploy."""
    from fleetcast.contract.names import plan_drift_description

    check = cfg.operations.plan_drift_check
    if check is None:
        return []
    longest = max(len(plan_drift_description(cfg.name, r.region, check.schedule)) for r in cfg.regions)
    if longest <= LAMBDA_DESCRIPTION_MAX:
        return []
    room = len(check.schedule) - (longest - LAMBDA_DESCRIPTION_MAX)
    return [ConfigIssue(("operations", "plan_drift_check", "schedule"),
        f"the drift check's Lambda description quotes the schedule and would be {longest} characters; Lambda takes "
        f"at most {LAMBDA_DESCRIPTION_MAX}: allowed: a schedule of at most {room} characters for this fleet name")]


def _stack_resources(cfg: FleetConfig) -> list[ConfigIssue]:
    """Each provider region is one CloudFormation stack: its resources must fit the template limit."""
    from fleetcast.contract.stack_size import CLOUDFORMATION_MAX_RESOURCES, pool_resources, provider_stack_resources

    out = []
    for i, region in enumerate(cfg.regions):
        count = provider_stack_resources(cfg, region)
        if count > CLOUDFORMATION_MAX_RESOURCES:
            per_pool = max(pool_resources(cfg, p) for p in region.pools)
            out.append(ConfigIssue(("regions", i, "pools"),
                f"{region.region}'s provider stack would hold {count} CloudFormation resources ({len(region.pools)} "
                f"pools, up to {per_pool} resources each); a template holds at most {CLOUDFORMATION_MAX_RESOURCES} "
                f"(CloudFormation quotas): allowed: {count - CLOUDFORMATION_MAX_RESOURCES} fewer resources, e.g. "
                f"{-(-(count - CLOUDFORMATION_MAX_RESOURCES) // per_pool)} pool(s) fewer, or a second fleet config"))
    return out


# Amazon VPC User Guide, "VPC CIDR blocks" (https://docs.aws.amazon.com/vpc/latest/userguide/vpc-cidr-blocks.html):
# "You can't specify the following CIDR blocks for your VPCs: 0.0.0.0/8, 127.0.0.0/8, 169.254.0.0/16,
# 224.0.0.0/4"; "we recommend that you specify a CIDR block from the private IPv4 address ranges as specified in
# RFC 1918"; its association table also permits 100.64.0.0/10 (RFC 6598 shared space) and 198.19.0.0/16
# beside "any publicly routable IPv4 CIDR block (non-RFC 1918)". Fleetcast's networks are private by design
# (PrivateLink, no internet path): a publicly routable block here is a typo or a pasted public range, and its
# addresses would shadow the real internet hosts for the VPC. Allowed: the private ranges AWS names.
# The IPv4 blocks reserved for documentation (RFC 5737), which `fleetcast config init` writes for the consumer
# ranges it cannot know: validate lets them pass, `validate --deploy` refuses them (config/readiness.py).
DOCUMENTATION_NETWORKS = tuple(ipaddress.IPv4Network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"))
VPC_FORBIDDEN_NETWORKS = tuple(ipaddress.IPv4Network(n) for n in ("0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16",
                                                                  "224.0.0.0/4"))
PRIVATE_NETWORKS = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                                            "100.64.0.0/10", "198.19.0.0/16"))


def cidr_range_problem(cidr: str) -> str | None:
    """Why `cidr` is no private network range a VPC can have, or None."""
    net = ipaddress.IPv4Network(cidr)
    allowed = "allowed: a private range, within " + ", ".join(map(str, PRIVATE_NETWORKS))
    for reserved in VPC_FORBIDDEN_NETWORKS:
        if net.overlaps(reserved):
            return f"{cidr} overlaps {reserved}, which Amazon VPC refuses for any VPC; {allowed}"
    if any(net.subnet_of(n) for n in PRIVATE_NETWORKS):
        return None
    if any(net.subnet_of(n) for n in DOCUMENTATION_NETWORKS):
        return None  # RFC 5737: `config init` writes it; `validate --deploy` refuses it as a placeholder
    return (f"{cidr} is a publicly routable range, not a private one (RFC 1918): AWS permits it in a VPC but "
            f"recommends the private ranges, and a PrivateLink fleet has no public addresses; {allowed}")


def _private_ranges(cfg: FleetConfig) -> list[ConfigIssue]:
    out = []
    cidrs: list[tuple[Path, str]] = [(("regions", j, "vpc", "cidr"), r.vpc.cidr) for j, r in enumerate(cfg.regions)]
    cidrs += [(("consumers", i, "cidrs", k), cidr) for i, c in enumerate(cfg.consumers) for k, cidr in enumerate(c.cidrs)]
    for path, cidr in cidrs:
        problem = cidr_range_problem(cidr)
        if problem:
            out.append(ConfigIssue(path, problem))
    return out


def _certificates(cfg: FleetConfig) -> list[ConfigIssue]:
    """A listener's ACM certificate lives in the provider account and in the listener's region: "Certificates in
    ACM are regional resources ... You cannot copy a certificate between regions" (AWS Certificate Manager User
    Guide, acm-regions.html), and the provider stack's NLB listener reads it with the provider account's
    credentials (ACM shares no certificate with another account)."""
    out = []
    for region, arn in cfg.network.tls_certificate_arns.items():
        parts = arn.split(":")
        if len(parts) < 6:
            continue  # the shape is blamed by the model
        where = ("network", "tls_certificate_arns", region)
        if parts[3] != region:
            out.append(ConfigIssue(where, f"{arn} is a certificate in {parts[3]}, not {region}: ACM certificates are "
                                          f"regional; allowed: a certificate ARN of {region} (arn:aws:acm:{region}:...)"))
        elif parts[4] != cfg.provider.account:
            out.append(ConfigIssue(where, f"{arn} belongs to account {parts[4]}, not provider.account "
                                          f"{cfg.provider.account}, whose load balancer serves it; allowed: a "
                                          f"certificate of account {cfg.provider.account} in {region}"))
    return out


def _allowed_regions_once(cfg: FleetConfig) -> list[ConfigIssue]:
    """SupportedRegions lists each region once (cfn-lint E3037 on the synthesized endpoint service)."""
    out = []
    for j, region in enumerate(cfg.regions):
        seen: set[str] = set()
        for k, other in enumerate(region.allowed_regions):
            if other in seen:
                out.append(ConfigIssue(("regions", j, "allowed_regions", k),
                    f"{other} is listed twice; the endpoint service's SupportedRegions takes each region once "
                    "(CloudFormation refuses duplicates: cfn-lint E3037)"))
            seen.add(other)
    return out


def _consumer_identities(cfg: FleetConfig) -> list[ConfigIssue]:
    """The gateway tells consumers apart by the endpoint's owner account and region (runtime/gateway/identity.py):
    two consumers sharing both are one caller unless each carries API keys, and without keys every request of
    that account is refused as ambiguous_consumer."""
    out = []
    first: dict[tuple[str, str], int] = {}
    groups: dict[tuple[str, str], list[int]] = {}
    for i, consumer in enumerate(cfg.consumers):
        groups.setdefault((consumer.account, consumer.region), []).append(i)
        first.setdefault((consumer.account, consumer.region), i)
    for (account, region), members in groups.items():
        if len(members) < 2 or all(cfg.consumers[i].api_keys for i in members):
            continue
        head = cfg.consumers[members[0]].name
        for i in members[1:]:
            out.append(ConfigIssue(("consumers", i, "account"),
                f"{cfg.consumers[i].name} has the account {account} and region {region} of {head}: the gateway "
                "knows a caller by its endpoint's account and region, so their requests could not be told apart; "
                "allowed: one consumer per account and region, or api_keys: true on each of them"))
    return out


def _regional_amis(cfg: FleetConfig) -> list[ConfigIssue]:
    """"AMIs are a regional resource ... To make an AMI available in a different Region, copy the AMI to the
    Region" (Amazon EC2 User Guide, "Share an AMI with specific AWS accounts"), and a copy has its own id: one
    id pinned in two regions names no image in at least one of them."""
    out = []
    first: dict[str, str] = {}
    for j, region in enumerate(cfg.regions):
        ami = region.ami.id
        if ami == "latest":
            continue
        if ami in first:
            out.append(ConfigIssue(("regions", j, "ami", "id"),
                f"{ami} is also pinned in {first[ami]}; AMI ids are regional (a copied image gets a new id), so one "
                f"id cannot name an image in both; allowed: this region's own id (`fleetcast ami pin --region "
                f"{region.region}` writes it) or latest"))
        first.setdefault(ami, region.region)
    return out


# A stage pattern is an fnmatch glob (fleetcast/contract/selection.py matches with fnmatchcase, and the hub
# download takes them as allow_patterns): * ? [seq] [!seq]. These characters are a regular expression's and
# match only themselves in a glob; a leading .* is a regex's "anything" (a glob's would be a dotfile).
REGEX_CHARACTERS = "^$\\()|+{}"


def _stage_patterns(cfg: FleetConfig) -> list[ConfigIssue]:
    out = []
    for i, model in enumerate(cfg.models):
        for k, pattern in enumerate(model.stage_patterns):
            marks = sorted({ch for ch in pattern if ch in REGEX_CHARACTERS}) + ([".*"] if pattern.startswith(".*") else [])
            if marks:
                out.append(ConfigIssue(("models", i, "stage_patterns", k),
                    f"{pattern!r} looks like a regular expression ({' '.join(marks)}); stage_patterns are fnmatch "
                    "globs matched against repository paths, where these characters match only themselves; "
                    "allowed: * ? [abc] [!abc], e.g. '*.bin' or 'original/*.safetensors'"))
    return out


def _model_alarm_names(cfg: FleetConfig) -> list[ConfigIssue]:
    """A pool serving several models alarms on each (stacks/fleet_alarms.py): its name holds the model's slug,
    which a long id with many escaped characters can push past CloudWatch's 255."""
    from fleetcast.contract.names import ALARM_NAME_MAX, model_alarm_name

    out: list[ConfigIssue] = []
    blamed: set[str] = set()
    index = {m.id: k for k, m in enumerate(cfg.models)}
    for region in cfg.regions:
        for pool in region.pools:
            served = [s.model for s in cfg.serves_of(pool) if s.model in index]
            for model_id in served if len(served) > 1 else ():
                name = model_alarm_name(cfg.name, region.region, pool.name, model_id, "ttft-p99")
                if len(name) > ALARM_NAME_MAX and model_id not in blamed:  # once per model: its id is the fix
                    blamed.add(model_id)
                    out.append(ConfigIssue(("models", index[model_id], "id"),
                        f"the SLO alarm of {model_id} on pool {pool.name} in {region.region} would be named "
                        f"{name!r}, {len(name)} characters; CloudWatch alarm names hold at most {ALARM_NAME_MAX} "
                        "(characters other than letters, digits and . _ - count 3 each); allowed: a shorter id "
                        "or pool name"))
    return out


# Declared apart: the assignment below is the line every new rule edits.
AWS_LIMIT_RULES: tuple[Callable[[FleetConfig], list[ConfigIssue]], ...]
AWS_LIMIT_RULES = (_slo_units, _lambda_descriptions, _stack_resources, _calibration_dataset, _accounts, _network_overlaps, _subnet_space, _subnets, _warm_pools, _scaling_targets, _tags,
                   _endpoint_service_names, _path_segments, _config_parameter_size)


# The image reference grammar of github.com/distribution/reference (reference.go), which docker and
# containerd parse `engine.image` with on the instance: name [":" tag] ["@" digest], name <= 255 chars.
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*"
_IMAGE_NAME = re.compile(rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?/)?"
                         rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*", re.ASCII)
_IMAGE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", re.ASCII)
_IMAGE_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}", re.ASCII)
IMAGE_NAME_MAX = 255


def _image_reference(cfg: FleetConfig) -> list[ConfigIssue]:
    """engine.image is pulled on every instance: a reference docker would refuse fails only there."""
    image = cfg.engine.image
    rest, _, digest = image.partition("@")
    name, tag = rest, ""
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = rest.rsplit(":", 1)
    problem = None
    if not _IMAGE_NAME.fullmatch(name):
        problem = "the repository part uses lower-case letters, digits and . _ - separators between path components"
    elif len(name) > IMAGE_NAME_MAX:
        problem = f"the repository name is {len(name)} characters; at most {IMAGE_NAME_MAX}"
    elif tag and not _IMAGE_TAG.fullmatch(tag):
        problem = "a tag is 1-128 of letters, digits, _ . - and does not start with . or -"
    elif digest and not _IMAGE_DIGEST.fullmatch(digest):
        problem = "a digest is algorithm:hex, e.g. sha256:<64 hex digits>"
    if problem is None:
        return []
    return [ConfigIssue(("engine", "image"), f"{image!r} is not an image reference docker can pull: {problem}; "
                                             "allowed: e.g. nvcr.io/nvidia/tensorrt-llm/release:1.2.1")]


AWS_LIMIT_RULES = AWS_LIMIT_RULES + (_image_reference, _private_ranges, _certificates, _allowed_regions_once,
                                     _consumer_identities, _regional_amis, _stage_patterns, _model_alarm_names)
