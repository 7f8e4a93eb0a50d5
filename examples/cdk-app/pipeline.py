#!/usr/bin/env python3
"""A CDK Pipelines app that deploys a Fleetcast fleet account by account.

    npx cdk synth -a ".venv/bin/python examples/cdk-app/pipeline.py"   (from the repository root, offline)

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

from aws_cdk import App, Environment, Stack, Token, aws_codebuild as codebuild, pipelines
from constructs import Construct

from fleetcast.config import FleetConfig, load_config
from fleetcast_cdk import nag
from fleetcast_cdk.fleet import FleetcastStage

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parents[1] / "config" / "fleet.yaml"
PIPELINE_ACCOUNT = "999988887777"  # the tooling account (an example id: replace it)
PIPELINE_REGION = "ap-northeast-2"
# The repository holding this app and its fleet.yaml (a Fleetcast checkout), and the id of the pipeline account's
# connection to it (examples; the ARN takes the codestar-connections form, which the UseConnection policy CDK
# Pipelines writes names).
SOURCE_REPO, SOURCE_BRANCH = "example-org/platform-infra", "main"
CONNECTION_ID = "11111111-2222-3333-4444-555555555555"
# The Synth step runs in a bare CodeBuild image (python3, pip, node/npm; no cdk, no venv), so it installs what it
# runs, as the AWS CDK guide's Python pipeline does ("npm install -g aws-cdk", "python -m pip install -r
# requirements.txt", "cdk synth": https://docs.aws.amazon.com/cdk/v2/guide/cdk_pipeline.html): here the CLI is
# the one package-lock.json pins (npm ci, run by npx) and Fleetcast with its pinned dependencies goes into a venv
# whose Python runs the app. tests/examples/test_pipeline_synth.py runs these commands in such a shell.
SYNTH_COMMANDS = (
    "npm ci",
    "python3 -m venv .venv",
    ".venv/bin/pip install .",
    "npx cdk synth --no-notices -a '.venv/bin/python examples/cdk-app/pipeline.py'",
)


class FleetPipelineStack(Stack):
    """The pipeline: synthesize this app, then the provider account's stage, then every consumer account's."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        connection = f"arn:aws:codestar-connections:{self.region}:{self.account}:connection/{CONNECTION_ID}"
        self.pipeline = pipeline = pipelines.CodePipeline(
            self, "Pipeline",
            cross_account_keys=True,  # target accounts read the artifacts through a KMS key they are granted
            enable_key_rotation=True,
            synth=pipelines.ShellStep(
                "Synth",
                input=pipelines.CodePipelineSource.connection(SOURCE_REPO, SOURCE_BRANCH, connection_arn=connection),
                commands=list(SYNTH_COMMANDS),
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


def _pipeline_wildcards(pipeline: pipelines.CodePipeline) -> dict[str, tuple[str, ...]]:
    """CDK Pipelines' generated IAM policies, by what their wildcards stand for (cdk-nag names each one), written
    for the pipeline's own account, region and cross-region replication buckets (whose generated names hash the
    account), so the acknowledgments follow PIPELINE_ACCOUNT when it is replaced."""
    stack = Stack.of(pipeline)
    account, region = stack.account, stack.region
    if Token.is_unresolved(account) or Token.is_unresolved(region):
        raise ValueError("the pipeline stack needs a concrete account and region (env=Environment(...))")
    # The support stacks' bucket names, as the pipeline stack (another region) resolves them: literal names.
    replication = sorted(stack.resolve(support.replication_bucket.bucket_name)
                         for support in pipeline.pipeline.cross_region_support.values())
    logs = f"arn:<AWS::Partition>:logs:{region}:{account}:log-group:/aws/codebuild"
    reports = f"arn:<AWS::Partition>:codebuild:{region}:{account}:report-group"
    projects = ("<PipelineBuildSynthCdkBuildProject6BEFA8E6>", "<PipelineUpdatePipelineSelfMutationDAA41400>")
    return {
        "object and bucket actions on the pipeline's artifact and cross-region replication buckets only":
            ("Action::s3:GetObject*", "Action::s3:GetBucket*", "Action::s3:List*", "Action::s3:DeleteObject*",
             "Action::s3:Abort*", "Resource::<PipelineArtifactsBucketAEA9A052.Arn>/*",
             *(f"Resource::arn:<AWS::Partition>:s3:::{bucket}/*" for bucket in replication)),
        "data-key actions on the pipeline's own artifact KMS keys":
            ("Action::kms:ReEncrypt*", "Action::kms:GenerateDataKey*"),
        "log streams and report groups of the pipeline's own CodeBuild projects":
            (*(f"Resource::{logs}/{p}:*" for p in projects), *(f"Resource::{reports}/{p}-*" for p in projects),
             f"Resource::{logs}/*", f"Resource::{reports}/*"),
        "Resource::* to the pipeline's cross-region artifact KMS keys (named by alias in the support stacks, so "
        "no ARN exists to scope to), to read-only cloudformation:DescribeStacks and s3:ListBucket for the "
        "self-mutation step, and to start and watch the asset CodeBuild builds":
            ("Resource::*",),
        "the self-mutation step sts:AssumeRole of the CDK bootstrap roles (cdk-hnb659fds-*) in the accounts "
        "that trust the pipeline account (`cdk bootstrap --trust`)":
            (f"Resource::arn:*:iam::{account}:role/*",),
    }


def acknowledge_pipeline_findings(pipeline: pipelines.CodePipeline) -> None:
    """The AwsSolutions findings of CDK Pipelines' own resources, each with why it is acceptable here.
    The Fleetcast stages need none: their stacks carry their own acknowledgments."""
    for why, findings in _pipeline_wildcards(pipeline).items():
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


def build(app: App, config_path: Path = CONFIG, account: str = PIPELINE_ACCOUNT) -> FleetPipelineStack:
    cfg = load_config(str(config_path))
    stack = FleetPipelineStack(app, "fleetcast-pipeline", cfg=cfg,
                               env=Environment(account=account, region=PIPELINE_REGION))
    nag.enable(app)
    return stack


if __name__ == "__main__":
    app = App()
    build(app)
    app.synth()
