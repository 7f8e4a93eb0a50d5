"""Optional auto-approver (operations.auto_approve_connections): accepts connection requests from allowed accounts.

A Lambda function subscribed to the region's connection-notification topic.
Which accounts it accepts is decided here, at synth, by the same rule the CLI
uses (fleetcast.contract.connections.allowed_accounts): the function receives the
list and cannot widen it. Requests from any other account stay pending and are
reported on the topic (see stacks/lambdas/connection_approver/handler.py).

Least privilege: accept on this one endpoint service only (the function never
rejects, so it cannot), describe connections (an action without resource-level
permissions), publish to this topic (with its KMS key), write to its own log
group. The function runs outside the VPC: it only calls the regional EC2 and
SNS APIs, and the fleet VPC keeps no route to them.
"""

from __future__ import annotations

import json
from pathlib import Path

from aws_cdk import (
    RemovalPolicy,
    Stack,
    aws_ec2 as ec2,
    aws_iam as iam,
    aws_lambda as lambda_,
    aws_sns as sns,
    aws_sns_subscriptions as subscriptions,
)
from constructs import Construct

from fleetcast.config import FleetConfig, Region
from fleetcast.contract.connections import allowed_accounts

from . import nag
from .function import function_log_group, function_role, grant_own_logs, python_function
from .lambdas.connection_approver.handler import NOTICE_ATTRIBUTE

HANDLER_DIR = Path(__file__).resolve().parent / "lambdas" / "connection_approver"


class ConnectionApprover(Construct):
    """Lambda + role + log group + filtered topic subscription for one region's endpoint service."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, region: Region | str,
                 endpoint_service: ec2.IVpcEndpointService, topic: sns.ITopic) -> None:
        super().__init__(scope, construct_id)
        region_name = region if isinstance(region, str) else region.region
        stack = Stack.of(self)
        service_id = endpoint_service.vpc_endpoint_service_id
        self.allowed_accounts = sorted(allowed_accounts(cfg, region_name))

        # The log group is the auto-approver's audit trail.
        self.log_group = function_log_group(self, cfg, RemovalPolicy.RETAIN)
        self.role = function_role(
            self, f"{cfg.name} connection auto-approver in {region_name}: accept allowed accounts only")
        self.role.add_to_policy(iam.PolicyStatement(
            sid="AcceptOnThisServiceOnly",
            actions=["ec2:AcceptVpcEndpointConnections"],
            resources=[stack.format_arn(service="ec2", resource="vpc-endpoint-service", resource_name=service_id)],
        ))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ReadConnections", actions=["ec2:DescribeVpcEndpointConnections"], resources=["*"],
        ))
        grant_own_logs(self.role, self.log_group)
        # Publish to this topic only. Spelled out rather than topic.grant_publish(), whose KMS
        # grant uses kms:GenerateDataKey*: SNS needs exactly these two actions on the topic key.
        self.role.add_to_policy(iam.PolicyStatement(
            sid="PublishNotices", actions=["sns:Publish"], resources=[topic.topic_arn],
        ))
        if topic.master_key is not None:
            self.role.add_to_policy(iam.PolicyStatement(
                sid="EncryptNoticesWithTopicKey", actions=["kms:GenerateDataKey", "kms:Decrypt"],
                resources=[topic.master_key.key_arn],
            ))

        self.function = python_function(
            self,
            description=f"{cfg.name}: accept endpoint connections from allowed accounts in {region_name}",
            code=lambda_.Code.from_asset(str(HANDLER_DIR), exclude=["__pycache__", "*.pyc", "__init__.py"]),
            role=self.role,
            log_group=self.log_group,
            timeout_s=60,
            memory_mb=256,
            environment={
                "SERVICE_ID": service_id,
                "ALLOWED_ACCOUNTS": json.dumps(self.allowed_accounts),
                "TOPIC_ARN": topic.topic_arn,
                "FLEET": cfg.name,
            },
        )
        # The function's own notices carry NOTICE_ATTRIBUTE; dropping them here means a notice
        # can never trigger the function again (no loop through the shared topic).
        topic.add_subscription(subscriptions.LambdaSubscription(
            self.function,
            filter_policy={NOTICE_ATTRIBUTE: sns.SubscriptionFilter(conditions=[{"exists": False}])},
        ))

        nag.acknowledge(
            self.role, "AwsSolutions-IAM5[Resource::*]",
            "ec2:DescribeVpcEndpointConnections has no resource-level permissions in IAM; it is read-only and the "
            "function filters by its own service id.",
        )
