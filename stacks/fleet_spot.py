"""The Spot tier of a pool: how its sibling Spot group scales, leaves and rolls, and the On-Demand fallback.

A pool with a `spot:` block has two groups behind the same target group (stacks/gpu_fleet.py): the On-Demand
group holds the base (min = max = spot.on_demand_base), carries the warm pool and the capacity reservations;
the Spot group (mixed instances policy, capacity rebalance, no warm pool: EC2 Auto Scaling allows none on a
group with a mixed instances policy) takes the load above it.

- Scaling: the Spot group tracks the pool's per-instance load with the pool's target, so its desired capacity
  is the demand above the base. The On-Demand group has no scale-out policy (min = max = base; cfn-lint's
  E3712 would also refuse target tracking on a group with max == min). Scale-in on either group counts the
  instances of both.
- Leaving: the Spot group has the same terminate hook as the On-Demand group. An interruption notice (or a
  rebalance recommendation, with drain_on_rebalance) starts the same drain on the instance as a scale-in,
  bounded by the notice (runtime/spot.py); Capacity Rebalancing replaces an at-risk instance first and then
  terminates it through the hook.
- Rollout: the Spot group is refreshed on a launch template change like the On-Demand group, with the same
  rollback alarms, so no Spot instance keeps serving an old engine.
- Fallback (`SpotFallback`): when the Spot group cannot launch for lack of capacity (the region's existing
  launch-failure rule sees it), a small Lambda sizes the On-Demand group to base + the Spot group's shortfall
  (its desired minus what it holds), up to spot.on_demand_fallback_max. When Spot launches succeed again the
  max is lowered to what runs, and the cautious scale-in brings the On-Demand group back to its base. Least privilege: UpdateAutoScalingGroup on the pools' On-Demand groups
  only, with the request's MaxSize bounded by each ceiling (IAM condition key autoscaling:MaxSize);
  DescribeAutoScalingGroups has no resource-level permissions; logs to its own group. It runs outside the
  VPC: it calls only the regional Auto Scaling API.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from aws_cdk import (
    RemovalPolicy,
    Stack,
    aws_autoscaling as autoscaling,
    aws_events as events,
    aws_events_targets as targets,
    aws_iam as iam,
    aws_lambda as lambda_,
)
from constructs import Construct

from fleetcast.config import FleetConfig, Pool

from . import nag
from .function import function_log_group, function_role, grant_own_logs, python_function
from .gpu_fleet import asg_arn
from .lambdas.spot_fallback.handler import LAUNCHED

HANDLER_DIR = Path(__file__).resolve().parent / "lambdas" / "spot_fallback"


class SpotFallback(Construct):
    """One Lambda per region that lets each spot pool's On-Demand group cover missing Spot capacity."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, region: str,
                 pools: Sequence[tuple[Pool, autoscaling.AutoScalingGroup, autoscaling.AutoScalingGroup]],
                 launch_failure_rule: events.Rule) -> None:
        super().__init__(scope, construct_id)
        self.pools: Mapping[str, dict] = {
            cfg.spot_asg_name_of(region, pool): {
                "on_demand": cfg.asg_name_of(region, pool), "base": pool.on_demand_base,
                "ceiling": pool.on_demand_fallback_max,
            }
            for pool, _, _ in pools
        }
        self.log_group = function_log_group(self, cfg, RemovalPolicy.RETAIN)  # every fallback decision
        self.role = function_role(self, f"{cfg.name} Spot fallback in {region}: resize the spot pools' "
                                        "On-Demand groups within their ceilings")
        for k, (pool, _, _) in enumerate(pools):
            self.role.add_to_policy(iam.PolicyStatement(
                sid=f"ResizeOnDemandWithinCeiling{k}",
                actions=["autoscaling:UpdateAutoScalingGroup"],
                resources=[asg_arn(self, cfg.asg_name_of(region, pool))],
                conditions={"NumericLessThanEquals": {"autoscaling:MaxSize": pool.on_demand_fallback_max}},
            ))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ReadGroups", actions=["autoscaling:DescribeAutoScalingGroups"], resources=["*"],
        ))
        grant_own_logs(self.role, self.log_group)
        self.function = python_function(
            self,
            description=f"{cfg.name}: On-Demand fallback for Spot capacity shortfalls in {region}",
            code=lambda_.Code.from_asset(str(HANDLER_DIR), exclude=["__pycache__", "*.pyc", "__init__.py"]),
            role=self.role,
            log_group=self.log_group,
            timeout_s=30,
            memory_mb=128,
            # No reserved concurrency: an account at the default Lambda concurrency quota refuses any (the handler
            # makes concurrent events of one shortage converge instead: handler.py, "Concurrency").
            environment={"POOLS": json.dumps(self.pools, sort_keys=True)},
        )
        # Failures: the region's existing launch-failure rule (the function ignores other groups and causes).
        launch_failure_rule.add_target(targets.LambdaFunction(self.function, retry_attempts=2))
        # Recoveries: a Spot group launched again, so the fallback stops growing.
        self.recovered_rule = events.Rule(
            self, "SpotLaunched",
            description=f"Successful launches of {cfg.name}'s Spot groups in {region} (ends the On-Demand fallback).",
            event_pattern=events.EventPattern(
                source=["aws.autoscaling"], detail_type=[LAUNCHED],
                detail={"AutoScalingGroupName": [spot.auto_scaling_group_name for _, _, spot in pools]},
            ),
            targets=[targets.LambdaFunction(self.function, retry_attempts=2)],
        )
        policy = self.role.node.find_child("DefaultPolicy")
        nag.acknowledge(
            policy, "AwsSolutions-IAM5[Resource::*]",
            "autoscaling:DescribeAutoScalingGroups has no resource-level permissions in IAM; it is read-only.",
        )
        for pool, _, _ in pools:
            nag.acknowledge(
                policy,
                f"AwsSolutions-IAM5[Resource::{_resolved(self, cfg, region, pool)}]",
                "The ASG ARN embeds a group id unknown before creation; the explicit group name pins it to this "
                "pool's On-Demand group, and autoscaling:MaxSize bounds the request by the configured ceiling.",
            )


def _resolved(scope: Construct, cfg: FleetConfig, region: str, pool: Pool) -> object:
    return Stack.of(scope).resolve(asg_arn(scope, cfg.asg_name_of(region, pool)))
