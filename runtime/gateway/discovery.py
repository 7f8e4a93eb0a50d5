"""Which peer gateways of this region a gateway balances onto, learned from EC2 Auto Scaling (issue 36, section 1).

No new control plane: the fleet's Auto Scaling groups already know every instance. The group names are fixed by
the config each instance holds (FleetConfig.asg_name_of, spot_asg_name_of: one group per pool, a sibling for its
Spot tier), so one DescribeAutoScalingGroups call with those names lists the region's instances, and one
DescribeInstances call with their ids gives each one's private address, type and lifecycle (Spot or not).

Why the groups, not the NLB target group's healthy targets (elasticloadbalancing:DescribeTargetHealth): the
region has one target group for every pool, so its targets carry no pool (the pool, hence the price, would need
the instances' tags: the same DescribeInstances call and a third action); a group carries its pool in its name.
And "InService" already means ready here: the launch lifecycle hook keeps an instance in Pending:Wait until its
engine answered a real completion (stacks/launch_order.py), and the termination hook moves a scaled-in one to
Terminating:Wait before its drain; a warm-pool instance is not listed at all (DescribeAutoScalingGroups: "To
retrieve information about the instances in a warm pool, you must call the DescribeWarmPool API").

Each refresh runs every `period_s` with +/- JITTER so a fleet started at once does not call in step, reads at
most MAX_PEERS peers, and fails safe: a failed read keeps the last list until it is STALE_AFTER periods old, then
no peers, so every request is served at home; a peer that is listed but not answering is skipped by its
headroom read and breaker (spill.choose_peer). A peer is labelled with its pool and its price per hour: the
shipped Spot table's for a Spot instance (fleetcast/config/data/spot_prices.yaml), else the On-Demand table's.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .identity import log

if TYPE_CHECKING:
    from fleetcast.config import FleetConfig

DISCOVERY_PERIOD_S = 30.0
JITTER = 0.2  # each wait is period x uniform(1 - JITTER, 1 + JITTER)
STALE_AFTER = 4  # periods a failed source's last list is kept before balancing stops
MAX_PEERS = 64  # peers balanced onto: each is one headroom read every PEER_HEADROOM_TTL_S
GROUP_NAMES_PER_CALL = 50  # DescribeAutoScalingGroups: "By default, you can only specify up to 50 names"
IN_SERVICE = "InService"


@dataclass(frozen=True)
class Peer:
    instance_id: str
    address: tuple[str, int]  # private IPv4 and the gateway's port (every instance of the fleet listens on one)
    pool: str
    instance_type: str
    spot: bool
    price: float  # USD per hour; 0.0 when the shipped tables have no price (no preference)

    @property
    def name(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"


def fleet_groups(cfg: FleetConfig, region: str) -> dict[str, str]:
    """Auto Scaling group name -> pool, for every pool of `region` (its Spot group too)."""
    groups = {}
    for pool in cfg.region(region).pools:
        groups[cfg.asg_name_of(region, pool)] = pool.name
        if pool.spot is not None:
            groups[cfg.spot_asg_name_of(region, pool)] = pool.name
    return groups


def price_of(instance_type: str, region: str, spot: bool) -> float:
    from fleetcast.config.catalog import instance_catalog, spot_price

    if spot:
        found = spot_price(instance_type, region)
        if found is not None:
            return found
    catalog = instance_catalog()
    spec = catalog.get(instance_type) if instance_type in catalog else None
    return (spec.price_per_hour.get(region) if spec is not None else None) or 0.0


class AsgPeerSource:
    """One read of the region's peers from EC2 Auto Scaling and EC2 (boto3 clients, called in a thread)."""

    def __init__(self, autoscaling: Any, ec2: Any, groups: Mapping[str, str], region: str, port: int,
                 own_instance_id: str | None):
        self.autoscaling, self.ec2, self.groups, self.region = autoscaling, ec2, dict(groups), region
        self.port, self.own = port, own_instance_id

    def __call__(self) -> list[Peer]:
        pools: dict[str, str] = {}  # instance id -> pool
        names = sorted(self.groups)
        for i in range(0, len(names), GROUP_NAMES_PER_CALL):
            pages = self.autoscaling.get_paginator("describe_auto_scaling_groups").paginate(
                AutoScalingGroupNames=names[i:i + GROUP_NAMES_PER_CALL])
            for page in pages:
                for group in page["AutoScalingGroups"]:
                    pool = self.groups.get(group["AutoScalingGroupName"])
                    for instance in group.get("Instances", ()):
                        if (pool is not None and instance.get("LifecycleState") == IN_SERVICE
                                and instance.get("HealthStatus") == "Healthy" and instance["InstanceId"] != self.own):
                            pools[instance["InstanceId"]] = pool
        wanted = sorted(pools)[:MAX_PEERS]  # bounded before the second call: at most MAX_PEERS ids asked for
        if not wanted:
            return []
        peers = []
        # Filters, not InstanceIds: an id that just ended (or is not visible yet, EC2 is eventually consistent)
        # would fail the whole call ("If you specify an instance ID that is not valid, an error is returned"),
        # where a filter only leaves it out.
        pages = self.ec2.get_paginator("describe_instances").paginate(Filters=[
            {"Name": "instance-id", "Values": wanted}, {"Name": "instance-state-name", "Values": ["running"]}])
        for page in pages:
            for reservation in page["Reservations"]:
                for instance in reservation["Instances"]:
                    address = instance.get("PrivateIpAddress")
                    if not address or instance.get("State", {}).get("Name") != "running":
                        continue
                    kind = instance.get("InstanceType", "")
                    spot = instance.get("InstanceLifecycle") == "spot"
                    peers.append(Peer(instance["InstanceId"], (address, self.port), pools[instance["InstanceId"]],
                                      kind, spot, price_of(kind, self.region, spot)))
        return sorted(peers, key=lambda p: p.instance_id)


class PeerDiscovery:
    """Runs a source every period (with jitter) and hands each list to `apply`; fails safe (module docstring)."""

    def __init__(self, source: Callable[[], list[Peer]], apply: Callable[[list[Peer]], None],
                 period_s: float = DISCOVERY_PERIOD_S, clock: Callable[[], float] = time.monotonic,
                 rand: Callable[[float, float], float] = random.uniform,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self.source, self.apply, self.period_s = source, apply, period_s
        self.clock, self.rand, self.sleep = clock, rand, sleep
        self.peers: list[Peer] = []
        self.ok_at: float | None = None  # when the source last answered
        self.failures = 0

    async def refresh(self) -> list[Peer]:
        """One read; on failure the last list stands until STALE_AFTER periods after the last good read."""
        try:
            found = await asyncio.get_running_loop().run_in_executor(None, self.source)
        except Exception as exc:  # noqa: BLE001 - any failure of the source means fewer peers, never no serving
            self.failures += 1
            stale = self.ok_at is None or self.clock() - self.ok_at > STALE_AFTER * self.period_s
            log("peer_discovery_failed", error=f"{type(exc).__name__}: {exc}", failures=self.failures,
                keeping=0 if stale else len(self.peers))
            if stale and self.peers:
                self._set([])
            return self.peers
        self.failures, self.ok_at = 0, self.clock()
        if found != self.peers:
            log("peer_discovery", peers=[f"{p.name}={p.pool}" for p in found])
        self._set(found[:MAX_PEERS])
        return self.peers

    def _set(self, peers: list[Peer]) -> None:
        self.peers = peers
        self.apply(peers)

    def next_wait_s(self) -> float:
        return self.period_s * self.rand(1 - JITTER, 1 + JITTER)

    async def run(self) -> None:
        while True:
            await self.refresh()
            await self.sleep(self.next_wait_s())


def links_of(peers: Iterable[Peer], cool_s: float | None) -> dict[str, Any]:
    """The spill.RegionLink of each peer, keyed by HOST:PORT as `--peer` names them."""
    from .spill import Breaker, RegionLink

    return {p.name: RegionLink(p.name, p.address, Breaker(cool_s=cool_s) if cool_s else Breaker(), pool=p.pool,
                               price=p.price, direct=True) for p in peers}
