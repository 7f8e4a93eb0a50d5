"""Optional scheduled plan drift check (operations.plan_drift_check): one Lambda per provider region.

An EventBridge schedule runs stacks/lambdas/plan_drift/handler.py, which reads the plan baseline
staged in the model bucket and the gateways' metrics, runs fleetcast.plan.drift's checks, publishes
`PlanDrift` per pool and, on drift, one notice with the reasons to the operations topic.

The code asset is the handler plus the import closure of fleetcast.plan.drift (standard library
only: fleetcast/__init__.py, fleetcast/plan/__init__.py, drift.py, telemetry.py, and the error
module its CLI-only loader names), built with stacks.runtime_bundle so the rules have one home.

Least privilege: read one object (the baseline key) of the model bucket; GetMetricData (no
resource-level permissions in IAM); PutMetricData only into the Fleetcast namespace (condition
cloudwatch:namespace); publish to this topic with its key; write its own log group; the network
interface actions Lambda needs to run in the VPC. It runs in the fleet's private subnets with a
security group that allows HTTPS out only: with `egress: none` the subnets have no route off the
VPC, so it reaches CloudWatch, SNS and S3 only through their VPC endpoints.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from aws_cdk import (
    RemovalPolicy,
    Stack,
    aws_ec2 as ec2,
    aws_events as events,
    aws_events_targets as targets,
    aws_iam as iam,
    aws_lambda as lambda_,
    aws_s3 as s3,
    aws_sns as sns,
)
from constructs import Construct

from fleetcast.config import FleetConfig, Region
from fleetcast.contract import telemetry
from fleetcast.contract.bucket import PLAN_BASELINE_KEY
from fleetcast.contract.names import plan_drift_description

from . import nag
from .function import (
    function_log_group,
    function_role,
    grant_own_logs,
    grant_vpc_network_interfaces,
    python_function,
)
from .runtime_bundle import BundleSpec, stage_bundle

HANDLER = Path(__file__).resolve().parent / "lambdas" / "plan_drift" / "handler.py"
BUNDLE = BundleSpec("plan-drift", ("fleetcast.plan.drift", "fleetcast.contract.telemetry"), ())
WINDOW_DAYS = 7


def stage_code(outdir: str | Path) -> Path:
    """The function's code as one directory under the cloud assembly (CDK hashes it by content): the bundle,
    built once per synth, and the handler at its top."""
    target = stage_bundle(outdir, BUNDLE)
    shutil.copy2(HANDLER, target / "handler.py")
    return target


class PlanDriftCheck(Construct):
    """Schedule + Lambda + role + log group + security group for one region's drift check."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, region: Region,
                 vpc: ec2.IVpc, subnets: ec2.SubnetSelection, bucket: s3.IBucket, topic: sns.ITopic) -> None:
        super().__init__(scope, construct_id)
        check = cfg.operations.plan_drift_check
        assert check is not None
        stack = Stack.of(self)

        self.log_group = function_log_group(self, cfg, RemovalPolicy.DESTROY)
        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=vpc, allow_all_outbound=False,
            description=f"{cfg.name} plan drift check: HTTPS out to the VPC endpoints only, nothing in",
        )
        self.security_group.add_egress_rule(
            ec2.Peer.any_ipv4(), ec2.Port.tcp(443),
            "HTTPS to the VPC endpoints and the S3 gateway (no route leaves the VPC with egress: none)")
        self.role = function_role(
            self, f"{cfg.name} plan drift check in {region.region}: read metrics and the baseline, publish drift")
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ReadTheBaselineOnly", actions=["s3:GetObject"], resources=[bucket.arn_for_objects(PLAN_BASELINE_KEY)]))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ReadGatewayMetrics", actions=["cloudwatch:GetMetricData"], resources=["*"]))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="PublishPlanDrift", actions=["cloudwatch:PutMetricData"], resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": telemetry.NAMESPACE}}))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="NotifyOperations", actions=["sns:Publish"], resources=[topic.topic_arn]))
        if topic.master_key is not None:
            self.role.add_to_policy(iam.PolicyStatement(
                sid="EncryptNoticesWithTopicKey", actions=["kms:GenerateDataKey", "kms:Decrypt"],
                resources=[topic.master_key.key_arn]))
        grant_own_logs(self.role, self.log_group)
        grant_vpc_network_interfaces(self.role)

        consumers = [[c.name, c.region] for c in cfg.consumers_of(region.region)]
        self.function = python_function(
            self,
            description=plan_drift_description(cfg.name, region.region, check.schedule),
            code=lambda_.Code.from_asset(str(stage_code(stack.node.root.outdir)),
                                         exclude=["__pycache__", "*.pyc"]),
            role=self.role,
            log_group=self.log_group,
            timeout_s=120,
            memory_mb=256,
            vpc=vpc,
            vpc_subnets=subnets,
            security_groups=[self.security_group],
            environment={
                "FLEET": cfg.name, "REGION": region.region, "BUCKET": bucket.bucket_name,
                "BASELINE_KEY": PLAN_BASELINE_KEY, "TOPIC_ARN": topic.topic_arn, "THRESHOLD": str(check.threshold),
                "WINDOW_DAYS": str(WINDOW_DAYS), "POOLS": json.dumps([p.name for p in region.pools]),
                "CONSUMERS": json.dumps(consumers),
            },
        )
        self.rule = events.Rule(self, "Schedule", schedule=events.Schedule.expression(check.schedule),
                                description=f"{cfg.name}: run the plan drift check in {region.region}")
        self.rule.add_target(targets.LambdaFunction(self.function, retry_attempts=2))

        nag.acknowledge(
            self.role, "AwsSolutions-IAM5[Resource::*]",
            "cloudwatch:GetMetricData/PutMetricData and the Lambda VPC network-interface actions have no "
            "resource-level permissions in IAM; PutMetricData is held to the Fleetcast namespace by condition.",
        )
