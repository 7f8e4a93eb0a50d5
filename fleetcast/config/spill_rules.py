"""Rules for cross-region spill (consumers[].spill_regions) and failover (consumers[].failover_region).

A region a consumer's requests may be served in must exist, be another region than its home, serve every
model the consumer may call at home (a spilled or failed-over request for a model the region lacks would
answer model_not_found), and be reachable from where the connection starts over cross-region PrivateLink.
The services' own permissions stay explicit in the config (allowed_principals, allowed_regions: the endpoint
service and the auto-approver read them, fleetcast/contract/connections.py), so each rule says what to add.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from . import catalog
from .model import Consumer, FleetConfig, Region

Path = tuple[str | int, ...]


class ConfigIssue(NamedTuple):
    """One refusal; fleetcast.config.rules turns it into its own ConfigIssue (this module sits below it)."""

    path: Path
    message: str


def check(cfg: FleetConfig, served: dict[str, set[str]]) -> list[ConfigIssue]:
    """`served`: region -> the ids of the models its pools serve (rules.served_in)."""
    out: list[ConfigIssue] = []
    regions = {r.region: r for r in cfg.regions}
    for i, consumer in enumerate(cfg.consumers):
        here: Path = ("consumers", i)
        if consumer.service_region not in regions:
            continue  # blamed on its own (rules._consumers)
        needed = _models_needed(cfg, consumer, served)
        counts = Counter(consumer.spill_regions)
        seen: set[str] = set()
        for j, remote in enumerate(consumer.spill_regions):
            where = here + ("spill_regions", j)
            if remote in seen:
                out.append(ConfigIssue(where, f"{remote} is listed {counts[remote]} times; list each region once"))
                continue
            seen.add(remote)
            out += _spill_region(cfg, consumer, remote, where, regions, served, needed)
        if consumer.failover_region is not None:
            out += _failover_region(cfg, consumer, here + ("failover_region",), regions, served, needed)
    for j, region in enumerate(cfg.regions):
        name = region.endpoint_service_name
        if name is not None and name.split(".")[3] != region.region:
            out.append(ConfigIssue(("regions", j, "endpoint_service_name"),
                f"{name} is an endpoint service in {name.split('.')[3]}, not {region.region}; allowed: the "
                f"EndpointServiceName output of the {region.region} provider stack "
                f"(com.amazonaws.vpce.{region.region}.vpce-svc-...)"))
    for i, consumer in enumerate(cfg.consumers):
        home = regions.get(consumer.service_region)
        if home is None or None in (home.endpoint_service_name, consumer.endpoint_service_name):
            continue
        if consumer.endpoint_service_name != home.endpoint_service_name:
            out.append(ConfigIssue(("consumers", i, "endpoint_service_name"),
                f"{consumer.endpoint_service_name} is not {consumer.service_region}'s endpoint service "
                f"(regions[{consumer.service_region}].endpoint_service_name is {home.endpoint_service_name}); "
                "allowed: the same name in both, the provider stack's EndpointServiceName output"))
    return out


def _models_needed(cfg: FleetConfig, consumer: Consumer, served: dict[str, set[str]]) -> list[str]:
    """The models the consumer may call that its home region serves: what another region must serve too."""
    entitled = {m.id for m in cfg.models if m.consumers is None or consumer.name in m.consumers}
    return sorted(entitled & served.get(consumer.service_region, set()))


def _serving_problem(remote: str, needed: list[str], served: dict[str, set[str]]) -> str | None:
    missing = [m for m in needed if m not in served.get(remote, set())]
    if missing:
        return (f"{remote} serves none of {', '.join(missing)}, which the consumer may call at home: its "
                "requests for them would answer model_not_found there")
    return None


def _candidates(cfg: FleetConfig, consumer: Consumer, needed: list[str], served: dict[str, set[str]]) -> str:
    """The provider regions that could take the consumer's requests, for the error's "allowed:"."""
    ok = [r.region for r in cfg.regions if r.region != consumer.service_region
          and _serving_problem(r.region, needed, served) is None]
    return ", ".join(ok) or "none (no other provider region serves all its models)"


def _target(cfg: FleetConfig, consumer: Consumer, region: str, where: Path, regions: dict[str, Region],
            served: dict[str, set[str]], needed: list[str], why: str) -> Region | ConfigIssue:
    """The provider region a spill or failover entry names, or the one refusal that makes it no candidate:
    the home region itself (`why` says what goes elsewhere), no provider region, or a model missing there."""
    allowed = f"allowed: {_candidates(cfg, consumer, needed, served)}"
    if region == consumer.service_region:
        return ConfigIssue(where, f"{region} is the consumer's service_region; {why}; {allowed}")
    target = regions.get(region)
    if target is None:
        return ConfigIssue(where, f"{region} is not a provider region of this fleet; {allowed}")
    problem = _serving_problem(region, needed, served)
    if problem:
        return ConfigIssue(where, f"{problem}; {allowed}")
    return target


def _spill_region(cfg: FleetConfig, consumer: Consumer, remote: str, where: Path, regions: dict[str, Region],
                  served: dict[str, set[str]], needed: list[str]) -> list[ConfigIssue]:
    home = consumer.service_region
    target = _target(cfg, consumer, remote, where, regions, served, needed,
                     "it is served there anyway: list only other provider regions")
    if isinstance(target, ConfigIssue):
        return [target]
    out = []
    if not catalog.cross_region_supported(home, remote):
        out.append(ConfigIssue(where,
            f"cross-region PrivateLink from {home} to {remote} is not in the supported table (shipped data, "
            f"overridable); supported regions: {', '.join(sorted(catalog.privatelink_cross_region()))}"))
    # The home region's provider-owned endpoint connects to the remote service: the provider's own account
    # must be allowed there, from the home region.
    if cfg.provider.account not in {arn.split(":")[4] for arn in target.allowed_principals}:
        out.append(ConfigIssue(where,
            f"the spill endpoint from {home} is the provider's own (account {cfg.provider.account}), which "
            f"regions[{remote}].allowed_principals does not name; allowed: add "
            f"arn:aws:iam::{cfg.provider.account}:root there"))
    if home not in target.allowed_regions:
        out.append(ConfigIssue(where,
            f"the spill endpoint lives in {home}, which regions[{remote}].allowed_regions (SupportedRegions) does "
            f"not list; allowed: add {home} there"))
    return out


def _failover_region(cfg: FleetConfig, consumer: Consumer, where: Path, regions: dict[str, Region],
                     served: dict[str, set[str]], needed: list[str]) -> list[ConfigIssue]:
    region = consumer.failover_region
    assert region is not None
    target = _target(cfg, consumer, region, where, regions, served, needed,
                     "a failover endpoint goes to another provider region")
    if isinstance(target, ConfigIssue):
        return [target]
    out = []
    if consumer.account not in {arn.split(":")[4] for arn in target.allowed_principals}:
        out.append(ConfigIssue(where,
            f"account {consumer.account} is not among regions[{region}].allowed_principals; add its principal "
            "there or the failover endpoint's connection can never be created"))
    if consumer.region != region:
        if consumer.region not in target.allowed_regions:
            out.append(ConfigIssue(where,
                f"the failover endpoint lives in {consumer.region}, which regions[{region}].allowed_regions "
                f"(SupportedRegions) does not list; allowed: add {consumer.region} there"))
        elif not catalog.cross_region_supported(consumer.region, region):
            out.append(ConfigIssue(where,
                f"cross-region PrivateLink between {consumer.region} and {region} is not supported"))
    return out
