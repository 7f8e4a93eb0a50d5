"""Where the region's artifacts live: the model/engine bucket and the private serving-image repository."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, aws_ecr as ecr, aws_s3 as s3
from constructs import Construct

from fleetcast.contract.bucket import LOCKS

# A killed uploader (engine builder, `fleetcast stage`) leaves the parts of its multipart upload,
# billed and invisible to listings, until the upload is aborted. No legitimate upload of the
# runtime runs longer than the launch hook's longest window (2 h), so a day is a safe bound.
ABORT_INCOMPLETE_UPLOADS_DAYS = 1
# Replaced engine builds, discarded uploads and rewritten locks become noncurrent versions
# (the bucket is versioned); they are kept this long for forensics, then expire.
NONCURRENT_VERSION_DAYS = 30


def private_bucket(
    scope: Construct,
    construct_id: str,
    *,
    lifecycle_rules: list[s3.LifecycleRule],
    server_access_logs_bucket: s3.IBucket | None = None,
    server_access_logs_prefix: str | None = None,
) -> s3.Bucket:
    """Fleetcast's bucket recipe: private, TLS-only, SSE-S3, versioned, kept when its stack is deleted.

    SSE-S3 because server access log delivery supports SSE-S3 only; RETAIN so
    that deleting a stack never deletes data.
    """
    return s3.Bucket(
        scope,
        construct_id,
        encryption=s3.BucketEncryption.S3_MANAGED,
        enforce_ssl=True,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
        versioned=True,
        server_access_logs_bucket=server_access_logs_bucket,
        server_access_logs_prefix=server_access_logs_prefix,
        lifecycle_rules=lifecycle_rules,
        removal_policy=RemovalPolicy.RETAIN,
    )


class ModelStore(Construct):
    """Versioned, TLS-only, private S3 bucket for staged weights, calibration data and built engines.

    A second bucket receives the server access logs (of this bucket and of the
    NLB); it is the log destination, so it does not log itself (cdk-nag's S1
    recognizes a log destination).
    """

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.access_logs = private_bucket(
            self,
            "AccessLogs",
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(365), noncurrent_version_expiration=Duration.days(30))],
        )
        self.bucket = private_bucket(
            self,
            "Bucket",
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="model-bucket/",
            # Engines and locks are rewritten often; old versions only cost money. The runtime
            # deletes a replaced or discarded build's files (runtime/engine_cache.py); here their
            # noncurrent versions expire, the delete markers left alone afterwards are removed,
            # and incomplete multipart uploads are aborted.
            lifecycle_rules=[
                s3.LifecycleRule(
                    noncurrent_version_expiration=Duration.days(NONCURRENT_VERSION_DAYS),
                    abort_incomplete_multipart_upload_after=Duration.days(ABORT_INCOMPLETE_UPLOADS_DAYS),
                    expired_object_delete_marker=True,
                ),
                s3.LifecycleRule(prefix=LOCKS, expiration=Duration.days(7)),
            ],
        )

    def object_arns(self, prefixes: tuple[str, ...]) -> list[str]:
        return [self.bucket.arn_for_objects(f"{prefix}*") for prefix in prefixes]


class ImageRepository(Construct):
    """Private ECR repository holding the mirrored TensorRT-LLM serving image (`fleetcast stage image`).

    nvcr.io cannot be an ECR pull-through-cache upstream, and a fleet without
    internet egress can only pull from ECR through its VPC endpoints.
    """

    def __init__(self, scope: Construct, construct_id: str, *, fleet: str) -> None:
        super().__init__(scope, construct_id)
        self.repository = ecr.Repository(
            self,
            "Repository",
            repository_name=f"{fleet}/tensorrt-llm",
            image_scan_on_push=True,
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,
            encryption=ecr.RepositoryEncryption.KMS,
            removal_policy=RemovalPolicy.RETAIN,
        )
