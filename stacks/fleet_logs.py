"""The region's CloudWatch log groups (instance logs, VPC flow logs) and the key that encrypts them."""

from __future__ import annotations

from aws_cdk import ArnFormat, RemovalPolicy, Stack, aws_iam as iam, aws_kms as kms, aws_logs as logs
from constructs import Construct

# CloudWatch's retention values in days, in the order of the RetentionDays enum.
_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922,
                   3288, 3653)


def _retention(days: int) -> logs.RetentionDays:
    members = dict(zip(_RETENTION_DAYS, list(logs.RetentionDays)))
    if days not in members:
        raise ValueError(f"log_retention_days {days} is not a CloudWatch Logs retention value")
    return members[days]


# CloudWatch Logs' key-policy statement for a customer managed key ("Encrypt log data in CloudWatch Logs using
# AWS Key Management Service", https://docs.aws.amazon.com/AmazonCloudWatch/latest/logs/encrypt-log-data-kms.html).
LOGS_KEY_ACTIONS = ("kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*")
LOGS_ENCRYPTION_CONTEXT_KEY = "kms:EncryptionContext:aws:logs:arn"


def logs_service_principal(region: str) -> str:
    """CloudWatch Logs signs as its regional principal: the global `logs.amazonaws.com` is refused."""
    return f"logs.{region}.amazonaws.com"


def allow_cloudwatch_logs(key: kms.Key) -> None:
    """Let CloudWatch Logs use `key` for this account's log groups in the key's region, and for nothing else.

    Every log group encrypted with a customer managed key needs this statement in the key policy, or
    CreateLogGroup fails with AccessDenied: one home for it, used by every such key.
    """
    stack = Stack.of(key)
    key.add_to_resource_policy(
        iam.PolicyStatement(
            sid="AllowCloudWatchLogs",
            principals=[iam.ServicePrincipal(logs_service_principal(stack.region))],
            actions=list(LOGS_KEY_ACTIONS),
            resources=["*"],
            conditions={
                # The encryption context pins the key to this account's log groups in this region.
                "ArnLike": {
                    LOGS_ENCRYPTION_CONTEXT_KEY: stack.format_arn(
                        service="logs", resource="log-group", resource_name="*",
                        arn_format=ArnFormat.COLON_RESOURCE_NAME,
                    )
                }
            },
        )
    )


class FleetLogs(Construct):
    """Instance and flow-log groups with the configured retention, encrypted with a rotating CMK."""

    def __init__(self, scope: Construct, construct_id: str, *, fleet: str, retention_days: int) -> None:
        super().__init__(scope, construct_id)
        self.key = kms.Key(
            self,
            "Key",
            description=f"{fleet}: encrypts instance and VPC flow logs",
            enable_key_rotation=True,
        )
        allow_cloudwatch_logs(self.key)
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

