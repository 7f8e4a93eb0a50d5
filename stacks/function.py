"""What every Fleetcast Lambda in a provider stack shares: its log group, role, own-log grant and function.

Each caller builds these in its own construct (ids `Logs`, `Role`, `Function`), so templates keep the
logical ids they had; the role then gets the caller's least-privilege statements.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration, RemovalPolicy, aws_iam as iam, aws_lambda as lambda_, aws_logs as logs
from constructs import Construct

from fleetcast.config import FleetConfig

from .fleet_logs import _retention

RUNTIME = lambda_.Runtime.PYTHON_3_14


def function_log_group(scope: Construct, cfg: FleetConfig, removal_policy: RemovalPolicy) -> logs.LogGroup:
    return logs.LogGroup(scope, "Logs", retention=_retention(cfg.operations.log_retention_days),
                         removal_policy=removal_policy)


def function_role(scope: Construct, description: str) -> iam.Role:
    """The function's role: assumed by Lambda; callers add exactly what it needs."""
    return iam.Role(scope, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"), description=description)


def grant_own_logs(role: iam.IRole, log_group: logs.ILogGroup) -> None:
    """Its own log group only (not logs:* on every group, as AWSLambdaBasicExecutionRole would)."""
    role.add_to_principal_policy(iam.PolicyStatement(
        sid="WriteOwnLogs", actions=["logs:CreateLogStream", "logs:PutLogEvents"],
        resources=[log_group.log_group_arn],
    ))


def grant_vpc_network_interfaces(role: iam.Role) -> None:
    """What a function in a VPC needs for its network interfaces (Lambda developer guide, "Giving Lambda functions
    access to resources in an Amazon VPC": the AWSLambdaVPCAccessExecutionRole actions), spelled out instead of that
    managed policy, whose logs actions reach every log group. These actions take no resource-level permissions."""
    role.add_to_policy(iam.PolicyStatement(
        sid="VpcNetworkInterfaces",
        actions=["ec2:CreateNetworkInterface", "ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets",
                 "ec2:DeleteNetworkInterface", "ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses"],
        resources=["*"]))


def python_function(scope: Construct, *, description: str, code: lambda_.Code, role: iam.IRole,
                    log_group: logs.ILogGroup, timeout_s: int, memory_mb: int, **kwargs: Any) -> lambda_.Function:
    function = lambda_.Function(
        scope, "Function",
        description=description,
        runtime=RUNTIME,
        architecture=lambda_.Architecture.ARM_64,
        handler="handler.handler",
        code=code,
        role=role,
        log_group=log_group,
        timeout=Duration.seconds(timeout_s),
        memory_size=memory_mb,
        **kwargs,
    )
    # CDK makes the function depend on its role (so the role's policy exists before the first
    # invocation) although Role= already orders them; cfn-lint flags the duplicate (W3005).
    function.node.default_child.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3005"]}})
    return function
