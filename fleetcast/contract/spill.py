"""Cross-region spill and consumer failover: which region pairs the config needs, and where an instance finds
the endpoint it spills through. Shared by the config rules, the stacks, the stack-size count and (later) the
gateway, so the pairs and the parameter name are derived in one place.

Spill (issue 36, section 2): a consumer's `spill_regions` let its home region (its `service_region`) send
its requests to another region's service. The home provider stack owns one interface endpoint per remote
region any of its consumers may spill to (cross-region PrivateLink: the endpoint's ServiceRegion), and writes
that endpoint's DNS name to `spill_endpoint_parameter(fleet, remote)` in the home region, which the home
instances may read. Failover: a consumer's `failover_region` gives its own stack a second endpoint there.

The config is described by the few attributes read here (fleetcast.config's models have them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class _Consumer(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def region(self) -> str: ...
    @property
    def service_region(self) -> str: ...
    @property
    def spill_regions(self) -> Sequence[str]: ...
    @property
    def failover_region(self) -> str | None: ...


class _Region(Protocol):
    @property
    def region(self) -> str: ...
    @property
    def endpoint_service_name(self) -> str | None: ...
    @property
    def pools(self) -> Sequence[object]: ...


class FleetConfig(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def regions(self) -> Sequence[_Region]: ...
    @property
    def consumers(self) -> Sequence[_Consumer]: ...


def spill_targets(cfg: FleetConfig, home: str) -> tuple[str, ...]:
    """The remote regions `home`'s provider stack needs a spill endpoint to: every region a consumer served
    in `home` lists in its spill_regions, each once, sorted (stable construct ids and template order)."""
    return tuple(sorted({r for c in cfg.consumers if c.service_region == home for r in c.spill_regions
                         if r != home}))


def spill_sources(cfg: FleetConfig, remote: str) -> tuple[str, ...]:
    """The home regions that spill into `remote`: their spill endpoints connect to `remote`'s service."""
    return tuple(sorted({c.service_region for c in cfg.consumers if remote in c.spill_regions
                         and c.service_region != remote}))


def service_name_of(cfg: FleetConfig, region: str) -> str | None:
    """`region`'s endpoint service name as published in the config (regions[].endpoint_service_name)."""
    return next((r.endpoint_service_name for r in cfg.regions if r.region == region), None)


def built_spill_targets(cfg: FleetConfig, home: str) -> tuple[str, ...]:
    """The spill targets the home stack builds an endpoint to now: those whose service name is published."""
    return tuple(r for r in spill_targets(cfg, home) if service_name_of(cfg, r) is not None)


def pending_spill_reason(cfg: FleetConfig, home: str, remote: str) -> str | None:
    """Why `home`'s stack has no spill endpoint to `remote` yet, or None when it has one."""
    if remote in spill_targets(cfg, home) and service_name_of(cfg, remote) is None:
        return (f"no spill endpoint from {home} to {remote} yet: deploy the {remote} provider stack, copy its "
                f"EndpointServiceName output into regions[{remote}].endpoint_service_name, deploy {home} again")
    return None


def failover_consumers(cfg: FleetConfig, region: str) -> tuple[_Consumer, ...]:
    """Consumers whose second (failover) endpoint connects to `region`'s service."""
    return tuple(c for c in cfg.consumers if c.failover_region == region)


def reached_regions(cfg: FleetConfig) -> frozenset[str]:
    """Regions some spill or failover endpoint connects to: their service name must be published in the
    region's entry (`fleetcast deploy`'s publish step writes it)."""
    return frozenset({r for c in cfg.consumers for r in c.spill_regions if r != c.service_region}
                     | {c.failover_region for c in cfg.consumers if c.failover_region is not None})


def spill_endpoint_parameter(fleet: str, remote: str) -> str:
    """The SSM parameter (in the home region) holding the DNS name of the home region's endpoint to
    `remote`'s service: the one place a gateway finds where to spill."""
    return f"/{fleet}/spill/{remote}"


def spill_endpoint_parameter_prefix(fleet: str) -> str:
    """What every spill parameter name of the fleet starts with (the instances' read grant)."""
    return spill_endpoint_parameter(fleet, "")


def peer_secret_name(fleet: str) -> str:
    """The Secrets Manager secret holding the fleet's peer key: the HMAC key a gateway signs a forwarded request's
    identity with and the receiving gateway checks it with (runtime/gateway/peer.py). The same value in every
    region that spills or is spilled to (a replicated secret); only the instances' roles may read it."""
    return f"{fleet}/spill/peer-key"


def balance_secret_name(fleet: str) -> str:
    """The peer key of a region that balances between its own pools but neither spills nor is spilled to
    (balanced_regions less peer_regions): a secret of that region alone, never replicated, since no claim signed
    there crosses a region. Its own name, not peer_secret_name's: when the region later joins spill, the spill key's
    replica must be created there while this one still exists, and a replica does not overwrite a secret of its
    name in its region (CreateSecret, ForceOverwriteReplicaSecret: "By default, secrets aren't overwritten")."""
    return f"{fleet}/balance/peer-key"


def may_serve_in(consumer: _Consumer, region: str) -> bool:
    """Residency: a consumer's requests are served in its home region and the regions its spill_regions list,
    nowhere else (the home gateway's spill decision and the receiving gateway's claim check both ask this)."""
    return region == consumer.service_region or region in consumer.spill_regions


def spill_consumers_into(cfg: FleetConfig, region: str) -> tuple[_Consumer, ...]:
    """Consumers served elsewhere whose requests may spill into `region`: its gateways meter those requests (the
    serving region meters, once), so `fleetcast usage` and `traffic export` read them there too."""
    return tuple(c for c in cfg.consumers if region in c.spill_regions and c.service_region != region)


# What a gateway calls to find its region's peers (runtime/gateway/discovery.py), granted by the instance role.
PEER_DISCOVERY_ACTIONS = ("autoscaling:DescribeAutoScalingGroups", "ec2:DescribeInstances")


def peer_regions(cfg: FleetConfig) -> tuple[str, ...]:
    """The provider regions whose gateways forward or receive spilled requests (config order): each holds the
    fleet's peer key (peer_secret_name), created in the first and replicated to the others."""
    return tuple(r.region for r in cfg.regions if spill_targets(cfg, r.region) or spill_sources(cfg, r.region))


def balanced_regions(cfg: FleetConfig) -> tuple[str, ...]:
    """The provider regions whose gateways balance between pools (issue 36, section 1; config order): those with
    two pools or more. Every pool of a region serves the same models (fleetcast/config/rules.py), so each pool's
    instances can take another pool's overflow, and pools differ in what an instance serves at the SLO and in
    price, which the NLB's flow hash ignores. One pool's instances (its Spot tier included) are of one type and
    one capacity, which the NLB already spreads evenly: no balancing there, hence no key."""
    return tuple(r.region for r in cfg.regions if len(r.pools) >= 2)


def keyed_regions(cfg: FleetConfig) -> tuple[str, ...]:
    """The provider regions whose gateways hold a peer key (config order): they forward and accept signed claims,
    and find their peers in the fleet's Auto Scaling groups (runtime/gateway/discovery.py)."""
    keyed = set(peer_regions(cfg)) | set(balanced_regions(cfg))
    return tuple(r.region for r in cfg.regions if r.region in keyed)


def peer_secret_of(cfg: FleetConfig, region: str) -> str | None:
    """The secret `region`'s gateways read their peer key from, or None where they need none: the replicated spill
    key where the region spills or is spilled to (its balancing uses the same key), else the region's own
    balancing key where it has several pools."""
    if region in peer_regions(cfg):
        return peer_secret_name(cfg.name)
    if region in balanced_regions(cfg):
        return balance_secret_name(cfg.name)
    return None


def creates_peer_key(cfg: FleetConfig, region: str) -> bool:
    """Whether `region`'s provider stack generates the secret its gateways read (the rest read a replica): the
    first of the spill regions, and every region that only balances."""
    peers = peer_regions(cfg)
    return peer_secret_of(cfg, region) is not None and (region not in peers or region == peers[0])
