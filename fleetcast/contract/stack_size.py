"""How many CloudFormation resources a provider region's stack holds, computed from the config.

CloudFormation takes at most 500 resources per template ("Resources: maximum number of resources that you
can declare in your CloudFormation template: 500", CloudFormation User Guide, "Understand CloudFormation
quotas"); a region with too many pools validated and then failed at synth or deploy. Validate counts them
with these figures, measured from synthesized templates: tests/stacks/test_stack_size.py synthesizes varied
regions (pools with and without Spot tiers, warm pools, schedules, NAT, an existing VPC, the optional
Lambdas) and checks that the count here equals the template's, so a stack change that adds a resource
fails there until the figure here follows it.

Duck-typed on the config (no import of fleetcast.config): the contract sits below it.
"""

from __future__ import annotations

from typing import Any

from .network import PROVIDER_INTERFACE_ENDPOINTS
from .spill import built_spill_targets, creates_peer_key
from .telemetry import alarmed_per_model

CLOUDFORMATION_MAX_RESOURCES = 500

# The region's own resources with one consumer-facing service and no optional feature: the NLB and its
# listener, buckets, keys, the config parameter, log groups, roles, the launch-failure rule, ...
REGION_CORE = 31
# A VPC Fleetcast creates: the VPC, its flow log, and CDK's restrict-default-SG custom resource (its
# provider function, roles and policy).
NEW_VPC = 7
PRIVATE_SUBNET_PER_AZ = 3  # subnet, route table, association
# egress nat on a created VPC: per AZ a public subnet, its route table, association and default route, an
# EIP, a NAT gateway and the private route to it; once, the internet gateway and its attachment.
NAT_PER_AZ = 7
NAT_SHARED = 2
# egress none: the interface endpoints, the S3 gateway endpoint and the endpoints' security group.
ENDPOINTS = len(PROVIDER_INTERFACE_ENDPOINTS) + 1 + 1

POOL = 14  # group, launch template, target group, hooks, scaling policies, alarms, instance refresh, ...
SLO_PROTECTION = 2  # the SLO scale-out policy and its alarm
# Per served model of a pool that serves several (telemetry.alarmed_per_model, the rule stacks/fleet_alarms.py
# builds by): its P99 time-to-first-token and inter-token-latency alarms against its own SLO.
MODEL_SLO_ALARMS = 2
WARM_POOL = 1
SCHEDULE_STEP = 1
SPOT_TIER = 6  # the Spot group, its hook, policies and alarms
SPOT_FALLBACK = 7  # once per region with a Spot tier: the fallback Lambda, its role, logs and rules
ALARM_EMAIL = 1  # the SNS subscription
PLAN_DRIFT_CHECK = 7  # the drift Lambda, its role and policy, logs, security group and schedule
PLAN_DRIFT_SNS_ENDPOINT = 1  # with VPC endpoints (egress none), the drift check adds an SNS one (stacks/provider.py)
AUTO_APPROVE = 6  # the connection approver Lambda, its role, logs and rule
# Per remote region this region spills to, once its service name is published (stacks/spill.py): the
# interface endpoint, its security group, its ingress rule and the instances' egress rule, the spill parameter.
SPILL_ENDPOINT = 5
# The fleet's peer key (stacks/spill.py): one secret, in the first of the regions that spill or are spilled to
# (replicated by Secrets Manager to the others, which only grant reading it), and one of its own in each region
# that only balances between its pools.
PEER_KEY = 1


def pool_resources(cfg: Any, pool: Any) -> int:  # a FleetConfig and one of its Pools, duck-typed (see above)
    served = len(cfg.serves_of(pool))
    n = POOL + len(pool.schedule) * SCHEDULE_STEP
    n += served * MODEL_SLO_ALARMS if alarmed_per_model(served) else 0
    n += SLO_PROTECTION if pool.scaling.slo_protection else 0
    n += WARM_POOL if pool.warm_pool.size else 0
    n += SPOT_TIER if pool.spot is not None else 0
    return n


def provider_stack_resources(cfg: Any, region: Any) -> int:  # a FleetConfig and one of its regions
    """Resources of `region`'s provider stack (the `fleetcast-provider-<region>` template)."""
    created = getattr(region.vpc, "vpc_id", None) is None
    nat = cfg.network.egress.value == "nat"
    azs = len(region.availability_zones)
    n = REGION_CORE
    if created:
        n += NEW_VPC + PRIVATE_SUBNET_PER_AZ * azs + ((NAT_PER_AZ * azs + NAT_SHARED) if nat else 0)
    endpoints = not nat and (created or region.vpc.create_endpoints)
    if endpoints:
        n += ENDPOINTS
    n += sum(pool_resources(cfg, p) for p in region.pools)
    n += SPOT_FALLBACK if any(p.spot is not None for p in region.pools) else 0
    n += ALARM_EMAIL if cfg.operations.alarm_email else 0
    if cfg.operations.plan_drift_check is not None:
        n += PLAN_DRIFT_CHECK + (PLAN_DRIFT_SNS_ENDPOINT if endpoints else 0)
    n += AUTO_APPROVE if cfg.operations.auto_approve_connections else 0
    n += SPILL_ENDPOINT * len(built_spill_targets(cfg, region.region))
    n += PEER_KEY if creates_peer_key(cfg, region.region) else 0
    return n
