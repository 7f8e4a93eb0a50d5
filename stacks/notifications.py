"""The region's operations topic: endpoint connection requests now, alarms and events later.

AWS services publish to an encrypted topic only when the topic's key lets them
use it, and the AWS-managed `alias/aws/sns` key cannot be shared: hence a
customer-managed key whose policy names each publishing service.
"""

from __future__ import annotations

from aws_cdk import Stack, aws_iam as iam, aws_kms as kms, aws_sns as sns
from constructs import Construct

# Services that publish here: PrivateLink connection notifications, CloudWatch
# alarm actions and EventBridge rules (capacity failures, lifecycle events).
PUBLISHERS = ("vpce.amazonaws.com", "cloudwatch.amazonaws.com", "events.amazonaws.com")


class NotificationTopic(Construct):
    """SNS topic encrypted with a rotating customer-managed KMS key that AWS services may publish with."""

    def __init__(self, scope: Construct, construct_id: str, *, fleet: str) -> None:
        super().__init__(scope, construct_id)
        account = Stack.of(self).account
        publishers = [iam.ServicePrincipal(p) for p in PUBLISHERS]

        self.key = kms.Key(
            self,
            "Key",
            description=f"{fleet}: encrypts the operations topic (endpoint connections, alarms, events)",
            enable_key_rotation=True,
        )
        # In a key policy "*" means this key. The services only encrypt data keys
        # for messages they publish to this account's topic.
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowAwsServicesToPublishEncrypted",
                principals=publishers,
                actions=["kms:GenerateDataKey*", "kms:Decrypt"],
                resources=["*"],
            )
        )

        self.topic = sns.Topic(
            self,
            "Topic",
            display_name=f"{fleet} operations",
            master_key=self.key,
            enforce_ssl=True,
        )
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowAwsServicesFromThisAccount",
                principals=publishers,
                actions=["sns:Publish"],
                resources=[self.topic.topic_arn],
                conditions={"StringEquals": {"aws:SourceAccount": account}},
            )
        )
