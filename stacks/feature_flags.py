"""The CDK feature flags Fleetcast's stacks are written and tested against, set on each Fleetcast stack.

A flag is read from the construct tree's context, nearest node first (`FeatureFlags.of(scope)`), so a
stack that sets these on itself before it adds a child synthesizes the same template in any app: ours
(`cdk synth` of app.py), a platform team's app with its own cdk.json, or a CDK Pipelines stage. They
are not in cdk.json, so this is their one home.
"""

from __future__ import annotations

from aws_cdk import Stack

FEATURE_FLAGS: dict[str, bool] = {
    "@aws-cdk/core:enablePartitionLiterals": True,
    "@aws-cdk/aws-iam:minimizePolicies": True,
    "@aws-cdk/core:validateSnapshotRemovalPolicy": True,
    "@aws-cdk/aws-ec2:restrictDefaultSecurityGroup": True,
    "@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy": True,
    "@aws-cdk/aws-kms:reduceCrossAccountRegionPolicyScope": True,
    "@aws-cdk/aws-ec2:launchTemplateDefaultUserData": True,
    "@aws-cdk/aws-autoscaling:generateLaunchTemplateInsteadOfLaunchConfig": True,
}


def pin(stack: Stack) -> None:
    """Set the flags on `stack`; call first in its constructor (context cannot change once it has children)."""
    for flag, value in FEATURE_FLAGS.items():
        stack.node.set_context(flag, value)
