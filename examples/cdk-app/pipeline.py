#!/usr/bin/env python3
"""A CDK Pipelines app that deploys a Fleetcast fleet account by account.

    cdk synth -a "python examples/cdk-app/pipeline.py"   (from the repository root, offline)

The pipeline lives in a tooling account (PIPELINE_ACCOUNT) and deploys one `FleetcastStage` per
account of the fleet: the provider account's stage first (its regions' fleets and endpoint
services), then one wave with every consumer account's stage (their interface endpoints). Each
target account is bootstrapped once to trust the pipeline account; `fleetcast deploy --dry-run
--trust PIPELINE_ACCOUNT --execution-policy ARN` prints those commands (docs/runbook.md,
"Deploying through CDK Pipelines").

Staging (model weights, serving image) and connection approval stay `fleetcast` commands run in
the provider account (`fleetcast stage`, `fleetcast connections sync`): they act on AWS, not on
CloudFormation, so they are pipeline steps of the team's choosing, not stacks.
"""

from __future__ import annotations

import sys
from pathlib import Path

from aws_cdk import App, Environment, Stack, aws_codebuild as codebuild, pipelines
from constructs import Construct

from fleetcast.config import FleetConfig, load_config
from fleetcast_cdk import nag
from fleetcast_cdk.fleet import FleetcastStage

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parents[1] / "config" / "fleet.yaml"
PIPELINE_ACCOUNT = "999988887777"  # the tooling account (an example id: replace it)
PIPELINE_REGION = "ap-northeast-2"
# The connection to the repository holding this app and its fleet.yaml (an example ARN; the codestar-connections
# form, which the UseConnection policy CDK Pipelines writes names).
SOURCE = ("example-org/platform-infra", "main",
          "arn:aws:codestar-connections:ap-northeast-2:999988887777:connection/11111111-2222-3333-4444-555555555555")


class FleetPipelineStack(Stack):
    """The pipeline: synthesize this app, then the provider account's stage, then every consumer account's."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        repo, branch, connection = SOURCE
        self.pipeline = pipeline = pipelines.CodePipeline(
            self, "Pipeline",
            cross_account_keys=True,  # target accounts read the artifacts through a KMS key they are granted
            enable_key_rotation=True,
            synth=pipelines.ShellStep(
                "Synth",
                input=pipelines.CodePipelineSource.connection(repo, branch, connection_arn=connection),
                commands=["make synth", "cdk synth -a 'python examples/cdk-app/pipeline.py'"],
            ),
            code_build_defaults=pipelines.CodeBuildOptions(
                build_environment=codebuild.BuildEnvironment(privileged=False)),
        )
        pipeline.add_stage(FleetcastStage(self, "Provider", cfg=cfg, account=cfg.provider.account,
                                          env=Environment(account=cfg.provider.account)))
        consumers = pipeline.add_wave("Consumers")
        for account in sorted({c.account for c in cfg.consumers if c.endpoint_service_name}):
            consumers.add_stage(FleetcastStage(self, f"Consumer-{account}", cfg=cfg, account=account,
                                               report=lambda line: print(line, file=sys.stderr)))
        pipeline.build_pipeline()
        acknowledge_pipeline_findings(pipeline)


# CDK Pipelines' generated IAM policies, by what their wildcards stand for (cdk-nag names each one).
_PIPELINE_WILDCARDS = {
    "object and bucket actions on the pipeline's artifact and cross-region replication buckets only":
        ("Action::s3:GetObject*", "Action::s3:GetBucket*", "Action::s3:List*", "Action::s3:DeleteObject*",
         "Action::s3:Abort*", "Resource::<PipelineArtifactsBucketAEA9A052.Arn>/*",
         "Resource::arn:<AWS::Partition>:s3:::fleetcast-pipeline-supporeplicationbuckete27f0f82d9a7da024573/*",
         "Resource::arn:<AWS::Partition>:s3:::fleetcast-pipeline-supporeplicationbuckete1e85370e00a70d5bd13/*"),
    "data-key actions on the pipeline's own artifact KMS keys":
        ("Action::kms:ReEncrypt*", "Action::kms:GenerateDataKey*"),
    "log streams and report groups of the pipeline's own CodeBuild projects":
        ("Resource::arn:<AWS::Partition>:logs:ap-northeast-2:999988887777:log-group:/aws/codebuild/<PipelineBuildSynthCdkBuildProject6BEFA8E6>:*",
         "Resource::arn:<AWS::Partition>:codebuild:ap-northeast-2:999988887777:report-group/<PipelineBuildSynthCdkBuildProject6BEFA8E6>-*",
         "Resource::arn:<AWS::Partition>:logs:ap-northeast-2:999988887777:log-group:/aws/codebuild/<PipelineUpdatePipelineSelfMutationDAA41400>:*",
         "Resource::arn:<AWS::Partition>:codebuild:ap-northeast-2:999988887777:report-group/<PipelineUpdatePipelineSelfMutationDAA41400>-*",
         "Resource::arn:<AWS::Partition>:logs:ap-northeast-2:999988887777:log-group:/aws/codebuild/*",
         "Resource::arn:<AWS::Partition>:codebuild:ap-northeast-2:999988887777:report-group/*"),
    "Resource::* to the pipeline's cross-region artifact KMS keys (named by alias in the support stacks, so "
    "no ARN exists to scope to), to read-only cloudformation:DescribeStacks and s3:ListBucket for the "
    "self-mutation step, and to start and watch the asset CodeBuild builds":
        ("Resource::*",),
    "the self-mutation step sts:AssumeRole of the CDK bootstrap roles (cdk-hnb659fds-*) in the accounts "
    "that trust the pipeline account (`cdk bootstrap --trust`)":
        ("Resource::arn:*:iam::999988887777:role/*",),
}


def acknowledge_pipeline_findings(pipeline: pipelines.CodePipeline) -> None:
    """The AwsSolutions findings of CDK Pipelines' own resources, each with why it is acceptable here.
    The Fleetcast stages need none: their stacks carry their own acknowledgments."""
    for why, findings in _PIPELINE_WILDCARDS.items():
        for finding in findings:
            nag.acknowledge(pipeline, f"AwsSolutions-IAM5[{finding}]", f"CDK Pipelines grants {why}.")
    nag.acknowledge(pipeline.pipeline.artifact_bucket, "AwsSolutions-S1",
                    "The artifact bucket holds the pipeline's KMS-encrypted templates and assets only; CloudTrail "
                    "data events are the account-wide audit trail for it.")
    app = pipeline.node.root
    for support in (c for c in app.node.children if c.node.id.startswith("cross-region-stack-")):
        nag.acknowledge(support, "AwsSolutions-S1",
                        "The cross-region replication bucket CDK Pipelines creates holds copies of the pipeline's "
                        "KMS-encrypted artifacts only; CloudTrail data events are the account-wide audit trail.")


def build(app: App, config_path: Path = CONFIG) -> FleetPipelineStack:
    cfg = load_config(str(config_path))
    stack = FleetPipelineStack(app, "fleetcast-pipeline", cfg=cfg,
                               env=Environment(account=PIPELINE_ACCOUNT, region=PIPELINE_REGION))
    nag.enable(app)
    return stack


if __name__ == "__main__":
    app = App()
    build(app)
    app.synth()
