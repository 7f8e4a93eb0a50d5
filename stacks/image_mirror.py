"""In-AWS mirror of the serving image: a CodeBuild project that copies it into the region's ECR.

nvcr.io cannot be an ECR pull-through-cache upstream, and the 40-60 GB
TensorRT-LLM image should not cross an operator's laptop once per region.
`fleetcast stage image` (default `--method codebuild`) starts this project;
it pulls the pinned upstream image, builds the derived serving image on it
(docker/Dockerfile: the runtime's Python dependencies; or mirrors it plain),
pushes it under an immutable tag, and prints the digest that staging pins in
the config.

CodeBuild runs in its own AWS-managed network, so the fleet VPC keeps no
internet egress.
"""

from __future__ import annotations

from aws_cdk import (
    CfnOutput,
    Duration,
    RemovalPolicy,
    Stack,
    Stage,
    aws_codebuild as codebuild,
    aws_ecr as ecr,
    aws_iam as iam,
    aws_kms as kms,
    aws_logs as logs,
    aws_s3_assets as s3_assets,
)
from constructs import Construct

from fleetcast.contract.image import DERIVED_RECIPE
from fleetcast.contract.outputs import ProviderOutput

from . import nag
from .fleet_logs import allow_cloudwatch_logs
from .runtime_bundle import stage_files

# The build context is the derived image's recipe (the Dockerfile and the one file it copies in), staged from the
# repository or the installed wheel: what the build reads is what the image tag's digest covers, and nothing else
# travels (the whole fleetcast/ and runtime/ trees did: 188 files uploaded, hashed and copied at every synthesis,
# and re-uploaded whenever a file the build never reads changed).

_BUILDSPEC = {
    "version": "0.2",
    "env": {"shell": "bash"},
    "phases": {
        "pre_build": {"commands": [
            "REGISTRY=${REPOSITORY_URI%%/*}",
            "aws ecr get-login-password --region $AWS_REGION | docker login --username AWS --password-stdin $REGISTRY",
        ]},
        "build": {"commands": [
            # Tags are immutable: a tag already mirrored is left alone (idempotent re-runs).
            "if aws ecr describe-images --repository-name $REPOSITORY_NAME --image-ids imageTag=$IMAGE_TAG >/dev/null 2>&1; "
            "then echo \"$IMAGE_TAG already mirrored\"; exit 0; fi",
            "docker pull $UPSTREAM_IMAGE",
            "if [ \"$DERIVED\" = 1 ]; then docker build --file docker/Dockerfile --build-arg BASE=$UPSTREAM_IMAGE "
            "--tag $REPOSITORY_URI:$IMAGE_TAG .; else docker tag $UPSTREAM_IMAGE $REPOSITORY_URI:$IMAGE_TAG; fi",
            "docker push $REPOSITORY_URI:$IMAGE_TAG",
        ]},
        "post_build": {"commands": [
            "aws ecr describe-images --repository-name $REPOSITORY_NAME --image-ids imageTag=$IMAGE_TAG "
            "--query 'imageDetails[0].imageDigest' --output text",
        ]},
    },
}


class ImageMirror(Construct):
    """CodeBuild project (privileged Docker, KMS-encrypted, logs retained) that mirrors the serving image."""

    def __init__(self, scope: Construct, construct_id: str, *, repository: ecr.IRepository, upstream_image: str,
                 image_tag: str, log_retention: logs.RetentionDays) -> None:
        super().__init__(scope, construct_id)
        key = kms.Key(self, "Key", enable_key_rotation=True, removal_policy=RemovalPolicy.DESTROY,
                      description="Encrypts the image-mirror build artifacts and logs")
        log_group = logs.LogGroup(self, "Logs", retention=log_retention, encryption_key=key,
                                  removal_policy=RemovalPolicy.DESTROY)
        allow_cloudwatch_logs(key)
        context = s3_assets.Asset(self, "BuildContext",
                                  path=str(stage_files(Stage.of(self).outdir, "image-context", DERIVED_RECIPE)))
        self.project = codebuild.Project(
            self,
            "Project",
            description="fleetcast stage image: mirror the TensorRT-LLM serving image into private ECR",
            source=codebuild.Source.s3(bucket=context.bucket, path=context.s3_object_key),
            build_spec=codebuild.BuildSpec.from_object(_BUILDSPEC),
            environment=codebuild.BuildEnvironment(
                build_image=codebuild.LinuxBuildImage.STANDARD_7_0,
                # LARGE: 128 GB of disk for a 40-60 GB image plus its layers during push.
                compute_type=codebuild.ComputeType.LARGE,
                privileged=True,
            ),
            environment_variables={
                "UPSTREAM_IMAGE": codebuild.BuildEnvironmentVariable(value=upstream_image),
                "IMAGE_TAG": codebuild.BuildEnvironmentVariable(value=image_tag),
                "DERIVED": codebuild.BuildEnvironmentVariable(value="1"),
                "REPOSITORY_URI": codebuild.BuildEnvironmentVariable(value=repository.repository_uri),
                "REPOSITORY_NAME": codebuild.BuildEnvironmentVariable(value=repository.repository_name),
            },
            encryption_key=key,
            timeout=Duration.hours(2),
            logging=codebuild.LoggingOptions(cloud_watch=codebuild.CloudWatchLoggingOptions(log_group=log_group)),
        )
        repository.grant_pull_push(self.project)
        # describe-images for the idempotency check and the digest read-back.
        self.project.add_to_role_policy(iam.PolicyStatement(actions=["ecr:DescribeImages"],
                                                            resources=[repository.repository_arn]))
        nag.acknowledge(
            self.project,
            "AwsSolutions-IAM5[Resource::*]",
            "ecr:GetAuthorizationToken has no resource-level permissions.",
        )
        for action in ("s3:GetObject*", "s3:GetBucket*", "s3:List*"):
            nag.acknowledge(self.project, f"AwsSolutions-IAM5[Action::{action}]",
                            "CDK's read grant on the build-context asset: scoped to that one asset object and bucket.")
        for action in ("kms:GenerateDataKey*", "kms:ReEncrypt*"):
            nag.acknowledge(self.project, f"AwsSolutions-IAM5[Action::{action}]",
                            "Encrypt/decrypt grant on this project's own customer-managed key only.")
        project_ref = nag.arn_ref(self.project, "Ref")[:-len(".Ref>")] + ">"
        stack = Stack.of(self)
        # cdk-nag names the partition as the template holds it: a literal with enablePartitionLiterals.
        partition = stack.resolve(stack.partition)
        partition = partition if isinstance(partition, str) else "<AWS::Partition>"
        for resource in (
            f"arn:{partition}:logs:{stack.region}:{stack.account}:log-group:/aws/codebuild/{project_ref}:*",
            f"arn:{partition}:codebuild:{stack.region}:{stack.account}:report-group/{project_ref}-*",
        ):
            nag.acknowledge(self.project, f"AwsSolutions-IAM5[Resource::{resource}]",
                            "CodeBuild's default log-stream and report-group grants, limited to this project's name.")
        CfnOutput(self, ProviderOutput.IMAGE_MIRROR_PROJECT.value, value=self.project.project_name,
                  description="CodeBuild project run by `fleetcast stage image`",
                  ).override_logical_id(ProviderOutput.IMAGE_MIRROR_PROJECT.value)
