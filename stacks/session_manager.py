"""Session Manager access for instance roles, instead of SSH (no key pair, no open port).

The actions are AWS's minimum for an instance profile that only serves Session Manager: "Create a
custom IAM instance profile for Session Manager" / "Step 2: Verify or add instance permissions for
Session Manager" (https://docs.aws.amazon.com/systems-manager/latest/userguide/getting-started-create-iam-instance-profile.html).
Not `AmazonSSMManagedInstanceCore`: that managed policy also grants ssm:GetParameter(s) on every
parameter of the account to hosts that run third-party model code; instances read their own fleet's
config parameter through a separate, scoped statement. The S3/KMS statements of that page are only for
session logs to an encrypted bucket or KMS-encrypted sessions, which the fleet does not configure.
"""

from __future__ import annotations

from aws_cdk import aws_iam as iam

SESSION_MANAGER_ACTIONS = (
    "ssm:UpdateInstanceInformation",
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
)
SID = "SessionManagerOnly"
# Why these actions get Resource "*" (a cdk-nag IAM5 acknowledgment quotes it).
WILDCARD_REASON = ("the Session Manager agent actions (ssm:UpdateInstanceInformation, ssmmessages:*Channel), which "
                   "AWS documents on Resource '*' for an instance profile")


def grant_session_manager(role: iam.Role) -> None:
    role.add_to_policy(iam.PolicyStatement(sid=SID, actions=list(SESSION_MANAGER_ACTIONS), resources=["*"]))
