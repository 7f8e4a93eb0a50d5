"""One instance pool: its least-privilege role, launch template and Auto Scaling group.

Scaling policies, warm pool, termination hook and rollout policy are added by
the operations constructs (`stacks/fleet_operations.py`) on top of `.asg`.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import (
    ArnFormat,
    Duration,
    Stack,
    aws_autoscaling as autoscaling,
    aws_ec2 as ec2,
    aws_ecr as ecr,
    aws_iam as iam,
    aws_logs as logs,
    aws_s3_assets as s3_assets,
    aws_ssm as ssm,
)
from constructs import Construct

from fleetcast.config import FleetConfig, Pool, Region
from fleetcast.contract.ami import DLAMI_SSM_PARAMETER, LATEST
from fleetcast.contract.bucket import READ_ONLY_PREFIXES, READ_WRITE_PREFIXES
from fleetcast.contract.instance_env import HostEnv, Var
from fleetcast.contract.spill import PEER_DISCOVERY_ACTIONS, keyed_regions
from fleetcast.contract.telemetry import LAUNCH_HOOK, NAMESPACE

from . import nag
from .instance_userdata import render_user_data
from .launch_order import LAUNCHING, add_lifecycle_hook, capacity_held
from .session_manager import WILDCARD_REASON, grant_session_manager
from .storage import ModelStore

ROOT_DEVICE = "/dev/xvda"  # AL2023 DLAMI root device
# The health-check grace period starts at InService, i.e. after the launch hook
# completed on a healthy /health: it only needs to cover NLB registration.
HEALTH_CHECK_GRACE = Duration.seconds(120)



# What a launch template tags at launch (LaunchTemplateData.TagSpecifications), as ec2.LaunchTemplate renders it.
LAUNCHED_RESOURCE_TYPES = ("instance", "volume")
NAME_TAG = "Name"


def pin_launched_tags(launch_template: ec2.LaunchTemplate) -> None:
    """Only CDK's own `Name` tag (the construct path) goes into the template's data, whatever tags the app adds.

    ec2.LaunchTemplate renders every tag its TagManager holds into LaunchTemplateData.TagSpecifications for
    instances and volumes, and a team's `Tags.of(app).add(...)` reaches that TagManager as it reaches every
    taggable construct below the app (aws-cdk-lib 2.275.0, aws-ec2/lib/launch-template.ts: `tagsToken`;
    core/lib/tag-aspect.ts: Tag.applyTag). Launch template data is its version, and a new version starts an
    instance refresh, so each of the team's tag changes would replace every pool's instances. The override
    keeps the data fixed; the team's tags still reach instances through the group (PropagateAtLaunch) and
    still tag the launch template itself (its own TagSpecifications, outside the data)."""
    cfn = launch_template.node.default_child
    assert isinstance(cfn, ec2.CfnLaunchTemplate)
    tags = [{"Key": NAME_TAG, "Value": launch_template.node.path}]
    cfn.add_property_override("LaunchTemplateData.TagSpecifications",
                              [{"ResourceType": kind, "Tags": tags} for kind in LAUNCHED_RESOURCE_TYPES])


@dataclass(frozen=True)
class InstanceInputs:
    """Region-wide things every pool's instances are given."""

    model_store: ModelStore
    repository: ecr.IRepository
    image_uri: str
    config_parameter: ssm.IStringParameter
    runtime_bundle: s3_assets.Asset
    log_group: logs.ILogGroup


def asg_name(cfg: FleetConfig, region: Region, pool: Pool) -> str:
    """Explicit ASG name, so the role can be scoped to it without a reference cycle."""
    return cfg.asg_name_of(region.region, pool)


def asg_arn(scope: Construct, group_name: str) -> str:
    """ARN of an Auto Scaling group known by name; the group id part is unknown before creation."""
    return Stack.of(scope).format_arn(
        service="autoscaling",
        resource="autoScalingGroup",
        resource_name=f"*:autoScalingGroupName/{group_name}",
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )


class GpuFleet(Construct):
    """Auto Scaling group of one GPU instance type behind the region's target group."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cfg: FleetConfig,
        region: Region,
        pool: Pool,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
        security_group: ec2.ISecurityGroup,
        inputs: InstanceInputs,
        extra_env: dict[Var, str] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.pool = pool
        self.asg_name = asg_name(cfg, region, pool)
        # A pool with a spot tier gets a sibling Spot group (same launch template and hooks, no warm pool).
        self.spot_asg_name = cfg.spot_asg_name_of(region.region, pool) if pool.spot is not None else None
        self.role = self._role(cfg, inputs)
        self._grant_consumer_api_keys(cfg, region)
        self._grant_peer_discovery(cfg, region)

        # The pool whose engine these instances serve: the bench groups run a real pool's engine
        # under their own group (extra_env names it).
        serving_pool = (extra_env or {}).get(Var.POOL, pool.name)
        env = HostEnv(
            fleet=cfg.name,
            region=region.region,
            pool=pool.name,
            bucket=inputs.model_store.bucket.bucket_name,
            config_param=inputs.config_parameter.parameter_name,
            # A change to what this pool's instances are built from changes this line, hence
            # the launch template version; consumers, sizes and other regions' pools do not.
            config_digest=cfg.instance_digest(region.region, serving_pool),
            image=inputs.image_uri,
            runtime_bundle=inputs.runtime_bundle.s3_object_url,
            log_group=inputs.log_group.log_group_name,
        ).render(extra_env)  # set by callers that reuse this launch path for another job (bench instances)
        self.launch_template = ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            instance_type=ec2.InstanceType(pool.instance_type),
            machine_image=_machine_image(region),
            role=self.role,
            security_group=security_group,
            user_data=ec2.UserData.custom(render_user_data(env)),
            require_imdsv2=True,
            # Containers on the host reach IMDS through one extra hop.
            http_put_response_hop_limit=2,
            instance_metadata_tags=True,
            associate_public_ip_address=False,
            block_devices=[
                ec2.BlockDevice(
                    device_name=ROOT_DEVICE,
                    volume=ec2.BlockDeviceVolume.ebs(
                        pool.root_volume_gib,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                        encrypted=True,
                        delete_on_termination=True,
                    ),
                )
            ],
        )

        pin_launched_tags(self.launch_template)

        # Held (first deploy, nothing staged yet): no instance may launch; fleetcast/contract/capacity_hold.py.
        self.held = held = capacity_held(self)
        self.asg = autoscaling.AutoScalingGroup(
            self,
            "Group",
            auto_scaling_group_name=self.asg_name,
            vpc=vpc,
            vpc_subnets=subnets,
            launch_template=self.launch_template,
            # With a spot tier the On-Demand group holds the base; the fallback Lambda may raise its max
            # toward spot.on_demand_fallback_max while Spot capacity is unavailable (stacks/fleet_spot.py).
            min_capacity=0 if held else (pool.on_demand_base if pool.spot is not None else pool.capacity.min),
            desired_capacity=(0 if held else pool.capacity.desired) if pool.capacity.desired is not None else None,
            max_capacity=0 if held else (pool.on_demand_base if pool.spot is not None else pool.capacity.max),
            health_checks=_health_checks(),
        )
        # Serving starts only after the engine is built or fetched and a real
        # completion worked; a build that never reports in must not serve.
        self._launch_hook(cfg, self.asg)
        self.spot_asg: autoscaling.AutoScalingGroup | None = None
        if pool.spot is not None:
            self.spot_asg = self._spot_group(vpc, subnets)
            self._launch_hook(cfg, self.spot_asg)
        if pool.capacity.desired is not None:
            nag.acknowledge_warning(
                self.asg,
                "@aws-cdk/aws-autoscaling:desiredCapacitySet",
                "the desired size is fixed on purpose (capacity.desired in the config, documented there; or the "
                "single run of a bench group): every deploy that updates the group resets it to that size. Leave "
                "it out and the group starts at min, then scales on load.",
            )
        nag.acknowledge(
            self.asg,
            "AwsSolutions-AS3",
            "Scaling and launch events reach the operations topic through EventBridge rules (fleet operations), "
            "which can use the topic's customer-managed key; ASG notifications would need the Auto Scaling "
            "service-linked role in that key policy.",
        )

    @staticmethod
    def _launch_hook(cfg: FleetConfig, group: autoscaling.AutoScalingGroup) -> None:
        add_lifecycle_hook(
            group,
            name=LAUNCH_HOOK,
            transition=LAUNCHING,
            default_result="ABANDON",
            heartbeat_timeout_s=cfg.operations.launch_hook_timeout_s,
        )

    def _spot_group(self, vpc: ec2.IVpc, subnets: ec2.SubnetSelection) -> autoscaling.AutoScalingGroup:
        """The Spot tier: load above the On-Demand base, on the pool's GPU-matched instance types.

        A separate group because EC2 Auto Scaling refuses a warm pool on a group with a mixed instances
        policy (PutWarmPool, EC2 Auto Scaling API reference); the same launch template, so the same engine,
        user data, role and hooks.
        """
        pool, spot = self.pool, self.pool.spot
        assert spot is not None and self.spot_asg_name is not None
        group = autoscaling.AutoScalingGroup(
            self,
            "SpotGroup",
            auto_scaling_group_name=self.spot_asg_name,
            vpc=vpc,
            vpc_subnets=subnets,
            mixed_instances_policy=autoscaling.MixedInstancesPolicy(
                launch_template=self.launch_template,
                instances_distribution=autoscaling.InstancesDistribution(
                    # The On-Demand base lives in the On-Demand group; above it this share runs on Spot.
                    on_demand_base_capacity=0,
                    on_demand_percentage_above_base_capacity=100 - spot.spot_percentage,
                    on_demand_allocation_strategy=autoscaling.OnDemandAllocationStrategy.PRIORITIZED,
                    spot_allocation_strategy=autoscaling.SpotAllocationStrategy(
                        spot.allocation_strategy.upper().replace("-", "_")),
                ),
                launch_template_overrides=[
                    autoscaling.LaunchTemplateOverrides(instance_type=ec2.InstanceType(t))
                    for t in pool.spot_instance_types
                ],
            ),
            min_capacity=0 if self.held else max(0, pool.capacity.min - pool.on_demand_base),
            max_capacity=0 if self.held else pool.capacity.max - pool.on_demand_base,
            health_checks=_health_checks(),
        )
        cfn_group: autoscaling.CfnAutoScalingGroup = group.node.default_child  # type: ignore[assignment]
        cfn_group.capacity_rebalance = spot.capacity_rebalance
        nag.acknowledge(
            group,
            "AwsSolutions-AS3",
            "Scaling, launch and Spot capacity events reach the operations topic through EventBridge rules (fleet "
            "operations), which can use the topic's customer-managed key; ASG notifications would need the Auto "
            "Scaling service-linked role in that key policy.",
        )
        nag.acknowledge(
            group,
            "AwsSolutions-EC26",
            "The rule cannot follow a mixed instances policy's reference to the launch template; that template is "
            "the On-Demand group's, whose only volume is the encrypted gp3 root (tests/stacks/test_spot_stacks.py "
            "checks both groups launch from it).",
        )
        return group

    def _role(self, cfg: FleetConfig, inputs: InstanceInputs) -> iam.Role:
        bucket = inputs.model_store.bucket
        role = iam.Role(
            self,
            "InstanceRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description=f"{self.asg_name} instances: model bucket prefixes, own hook, metrics, logs, config",
        )
        grant_session_manager(role)
        statements = [
            iam.PolicyStatement(
                sid="ReadStagedModelsAndCalibration",
                actions=["s3:GetObject"],
                resources=inputs.model_store.object_arns(READ_ONLY_PREFIXES),
            ),
            iam.PolicyStatement(
                sid="EngineCacheLocksAndFailures",
                actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                resources=inputs.model_store.object_arns(READ_WRITE_PREFIXES),
            ),
            iam.PolicyStatement(
                sid="ListOwnPrefixes",
                actions=["s3:ListBucket"],
                resources=[bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{p}*" for p in READ_ONLY_PREFIXES + READ_WRITE_PREFIXES]}},
            ),
            iam.PolicyStatement(
                sid="RuntimeBundle",
                actions=["s3:GetObject"],
                resources=[inputs.runtime_bundle.bucket.arn_for_objects(inputs.runtime_bundle.s3_object_key)],
            ),
            iam.PolicyStatement(
                sid="OwnLifecycleHook",
                # SetInstanceHealth: an instance whose model server cannot be revived asks to be replaced.
                actions=["autoscaling:CompleteLifecycleAction", "autoscaling:RecordLifecycleActionHeartbeat",
                         "autoscaling:SetInstanceHealth"],
                resources=[self._asg_arn()] + ([asg_arn(self, self.spot_asg_name)] if self.spot_asg_name else []),
            ),
            iam.PolicyStatement(
                sid="FleetcastMetricsOnly",
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringEquals": {"cloudwatch:namespace": NAMESPACE}},
            ),
            iam.PolicyStatement(
                sid="OwnLogGroup",
                actions=["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                resources=[inputs.log_group.log_group_arn],
            ),
            iam.PolicyStatement(
                sid="ReadFleetConfig",
                actions=["ssm:GetParameter"],
                resources=[inputs.config_parameter.parameter_arn],
            ),
            iam.PolicyStatement(
                sid="MapEndpointsToConsumers",
                actions=["ec2:DescribeVpcEndpointConnections"],
                resources=["*"],
            ),
        ]
        for statement in statements:
            role.add_to_policy(statement)
        inputs.repository.grant_pull(role)

        policy = role.node.find_child("DefaultPolicy")
        acks = {
            f"AwsSolutions-IAM5[Resource::{nag.arn_ref(bucket)}/{READ_ONLY_PREFIXES[0]}*]":
                "Read-only on the staged-model prefix: every object under it is a model file the instance serves.",
            f"AwsSolutions-IAM5[Resource::{nag.arn_ref(bucket)}/{READ_ONLY_PREFIXES[1]}*]":
                "Read-only on the calibration prefix, needed by calibrated precisions' engine builds.",
            **{
                f"AwsSolutions-IAM5[Resource::{nag.arn_ref(bucket)}/{prefix}*]":
                    f"Read/write confined to the {prefix} prefix: engine cache keys, build locks and failure "
                    "records are named at run time."
                for prefix in READ_WRITE_PREFIXES
            },
            "AwsSolutions-IAM5[Resource::*]":
                "Only actions without resource-level permissions use '*': cloudwatch:PutMetricData (limited by "
                "the cloudwatch:namespace condition), ec2:DescribeVpcEndpointConnections (read-only), "
                "autoscaling:DescribeAutoScalingGroups and ec2:DescribeInstances (read-only peer discovery, "
                "limited to this region by aws:RequestedRegion; the Service Authorization Reference lists no "
                f"resource type for either), ecr:GetAuthorizationToken and {WILDCARD_REASON}.",
            f"AwsSolutions-IAM5[Resource::{Stack.of(self).resolve(self._asg_arn())}]":
                "The ASG ARN embeds a group id unknown before creation; the explicit group name pins it to this pool.",
        }
        if self.spot_asg_name:
            acks[f"AwsSolutions-IAM5[Resource::{Stack.of(self).resolve(asg_arn(self, self.spot_asg_name))}]"] = (
                "The Spot group's ARN embeds a group id unknown before creation; the explicit group name pins it "
                "to this pool's Spot tier.")
        for rule, reason in acks.items():
            nag.acknowledge(policy, rule, reason)
        return role

    def _grant_consumer_api_keys(self, cfg: FleetConfig, region: Region) -> None:
        """The gateway reads the API keys of this region's consumers that use them, and nothing else."""
        names = [cfg.api_key_secret_of(c) for c in cfg.consumers_of(region.region) if c.api_keys]
        if not names:
            return
        # Secrets Manager appends "-" and six random characters to a secret's ARN.
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ReadConsumerApiKeys",
            actions=["secretsmanager:GetSecretValue"],
            resources=[Stack.of(self).format_arn(service="secretsmanager", resource="secret",
                                                 resource_name=f"{name}-??????",
                                                 arn_format=ArnFormat.COLON_RESOURCE_NAME) for name in names],
        ))

    def _grant_peer_discovery(self, cfg: FleetConfig, region: Region) -> None:
        """The gateway finds its region's peer instances in the fleet's Auto Scaling groups and their addresses in
        EC2 (runtime/gateway/discovery.py), where it holds the peer key to forward with (keyed_regions). Neither
        action has a resource type or a service condition key (Service Authorization Reference: Amazon EC2 Auto
        Scaling, Amazon EC2), so '*' limited to this region by the global aws:RequestedRegion key."""
        if region.region not in keyed_regions(cfg):
            return
        self.role.add_to_policy(iam.PolicyStatement(
            sid="DiscoverPeerInstances",
            actions=list(PEER_DISCOVERY_ACTIONS),
            resources=["*"],
            conditions={"StringEquals": {"aws:RequestedRegion": region.region}},
        ))

    def _asg_arn(self) -> str:
        return asg_arn(self, self.asg_name)


def _machine_image(region: Region) -> ec2.IMachineImage:
    if region.ami.id == LATEST:  # resolved by CloudFormation at deploy time
        return ec2.MachineImage.from_ssm_parameter(DLAMI_SSM_PARAMETER, os=ec2.OperatingSystemType.LINUX)
    return ec2.MachineImage.generic_linux({region.region: region.ami.id})


def _health_checks() -> autoscaling.HealthChecks:
    return autoscaling.HealthChecks.with_additional_checks(
        additional_types=[autoscaling.AdditionalHealthCheckType.ELB],
        grace_period=HEALTH_CHECK_GRACE,
    )
