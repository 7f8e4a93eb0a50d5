"""Fleet operations of one provider region: what makes the GPU pools operable, layered on the provider stack.

Per pool: scaling on the runtime's load (stacks/fleet_scaling.py), termination hook,
warm pool and capacity reservations (stacks/fleet_lifecycle.py), SLO/error/bootstrap
alarms (stacks/fleet_alarms.py) and the instance-refresh rollout that those alarms
roll back (stacks/fleet_rollout.py). Per region: target-health alarms, the
EventBridge rule for failed launches, the dashboard (stacks/fleet_dashboard.py) and
the optional email subscription of the operations topic.

Inputs are the provider stack's pieces, typed by what is used (see the Protocols),
so the constructs can be tested on a small fixture stack as well as on the real one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from aws_cdk import (
    aws_autoscaling as autoscaling,
    aws_elasticloadbalancingv2 as elbv2,
    aws_sns as sns,
    aws_sns_subscriptions as subscriptions,
)
from constructs import Construct

from fleetcast.config import FleetConfig, Pool, Region

from .fleet_alarms import LaunchFailureEvents, PoolAlarms, ServiceAlarms, SpotAlarms
from .fleet_dashboard import FleetDashboard
from .fleet_lifecycle import PoolLifecycle, add_terminate_hook
from .fleet_rollout import PoolRollout
from .fleet_scaling import PoolScaling
from .fleet_spot import SpotFallback


class FleetLike(Protocol):
    """One pool's group (stacks.gpu_fleet.GpuFleet); `spot_asg` (optional) is its Spot tier's sibling group."""

    pool: Pool
    asg: autoscaling.AutoScalingGroup


def spot_group(fleet: FleetLike) -> autoscaling.AutoScalingGroup | None:
    return getattr(fleet, "spot_asg", None)


class ServiceLike(Protocol):
    """The region's NLB and shared target group (stacks.endpoint_service.EndpointService)."""

    nlb: elbv2.INetworkLoadBalancer
    target_group: elbv2.NetworkTargetGroup


class NotificationsLike(Protocol):
    """The region's operations topic, encrypted with a key CloudWatch and EventBridge may use."""

    topic: sns.ITopic


class PoolOperations(Construct):
    """Everything operational about one pool."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, region: str, fleet: FleetLike,
                 topic: sns.ITopic, service_alarms: ServiceAlarms) -> None:
        super().__init__(scope, construct_id)
        pool, asg = fleet.pool, fleet.asg
        spot = spot_group(fleet)
        self.scaling = PoolScaling(self, "Scaling", cfg=cfg, region=region, pool=pool, asg=asg,
                                   peers=[spot] if spot else (), track_load=spot is None)
        self.lifecycle = PoolLifecycle(self, "Lifecycle", cfg=cfg, pool=pool, asg=asg)
        self.alarms = PoolAlarms(self, "Alarms", cfg=cfg, region=region, pool=pool, topic=topic)
        rollback_alarms = [*self.alarms.rollback_alarms, service_alarms.no_healthy_hosts]
        self.rollout = PoolRollout(self, "Rollout", pool=pool, asg=asg, rollback_alarms=rollback_alarms)
        self.spot_alarms: SpotAlarms | None = None
        if spot is not None:
            # The Spot tier: scaling on the same load, the same terminate hook, the same refresh (fleet_spot.py).
            self.spot_scaling = PoolScaling(self, "SpotScaling", cfg=cfg, region=region, pool=pool, asg=spot,
                                            peers=[asg], tier="spot")
            add_terminate_hook(cfg, spot)
            self.spot_rollout = PoolRollout(self, "SpotRollout", pool=pool, asg=spot, rollback_alarms=rollback_alarms)
            self.spot_alarms = SpotAlarms(self, "SpotAlarms", cfg=cfg, region=region, pool=pool, on_demand=asg,
                                          topic=topic)


class FleetOperations(Construct):
    """Scaling, lifecycle, rollouts, alarms, events and dashboard of every pool in one region."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, region: Region,
                 fleets: Mapping[str, FleetLike], service: ServiceLike, notifications: NotificationsLike) -> None:
        super().__init__(scope, construct_id)
        name = region.region
        topic = notifications.topic
        if cfg.operations.alarm_email:
            topic.add_subscription(subscriptions.EmailSubscription(cfg.operations.alarm_email))

        self.service_alarms = ServiceAlarms(
            self, "ServiceAlarms", cfg=cfg, region=name, nlb=service.nlb, target_group=service.target_group,
            topic=topic,
        )
        self.pools = {
            pool_name: PoolOperations(self, f"Pool-{pool_name}", cfg=cfg, region=name, fleet=fleet, topic=topic,
                                      service_alarms=self.service_alarms)
            for pool_name, fleet in fleets.items()
        }
        spot_pools = [(f.pool, f.asg, spot_group(f)) for f in fleets.values() if spot_group(f) is not None]
        self.launch_failures = LaunchFailureEvents(
            self, "LaunchFailures", cfg=cfg, region=name,
            groups=[f.asg for f in fleets.values()] + [spot for _, _, spot in spot_pools], topic=topic,
        )
        self.spot_fallback = SpotFallback(
            self, "SpotFallback", cfg=cfg, region=name, pools=spot_pools, launch_failure_rule=self.launch_failures.rule,
        ) if spot_pools else None
        alarms = [self.service_alarms.no_healthy_hosts, self.service_alarms.unhealthy_hosts]
        for ops in self.pools.values():
            alarms += [*ops.alarms.rollback_alarms, ops.alarms.staging_missing]
            alarms += ops.spot_alarms.all if ops.spot_alarms else []
        self.dashboard = FleetDashboard(
            self, "Dashboard", cfg=cfg, region=name, groups={n: f.asg for n, f in fleets.items()},
            nlb=service.nlb, target_group=service.target_group, alarms=alarms,
            spot_groups={n: spot_group(f) for n, f in fleets.items() if spot_group(f) is not None},
        )
