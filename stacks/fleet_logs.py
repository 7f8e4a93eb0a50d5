"""The region's CloudWatch log groups (instance logs, VPC flow logs) and the key that encrypts them."""

from __future__ import annotations

from aws_cdk import ArnFormat, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct


# CloudWatch's retention values in days, in the order of the RetentionDays enum.
_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922,
                   3288, 3653)


def _retention(days: int) -> logs.RetentionDays:
    members = dict(zip(_RETENTION_DAYS, list(logs.RetentionDays)))
    if days not in members:
        raise ValueError(f"log_retention_days {days} is not a CloudWatch Logs retention value")
    return members[days]


class FleetLogs(Construct):
    """Instance and flow-log groups with the configured retention, encrypted with a rotating CMK."""

    def __init__(self, scope: Construct, construct_id: str, *, fleet: str, retention_days: int) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.key = kms.Key(
            self,
            "Key",
            description=f"{fleet}: encrypts instance and VPC flow logs",
            enable_key_rotation=True,
        )
        # CloudWatch Logs encrypts with the key on the log groups' behalf; the
        # encryption context pins it to this account's log groups in this region.
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchLogs",
                principals=[iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com")],
                actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
                resources=["*"],
                conditions={
                    "ArnLike": {
                        "kms:EncryptionContext:aws:logs:arn": stack.format_arn(
                            service="logs", resource="log-group", resource_name="*",
                            arn_format=ArnFormat.COLON_RESOURCE_NAME,
                        )
                    }
                },
            )
        )
        self.retention = retention = _retention(retention_days)
        self.instance_log_group = logs.LogGroup(
            self,
            "Instances",
            log_group_name=f"/{fleet}/instances",
            retention=retention,
            encryption_key=self.key,
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.flow_log_group = logs.LogGroup(
            self,
            "FlowLogs",
            log_group_name=f"/{fleet}/vpc-flow-logs",
            retention=retention,
            encryption_key=self.key,
            removal_policy=RemovalPolicy.RETAIN,
        )

