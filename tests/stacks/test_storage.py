"""The model bucket's lifecycle rules: nothing the engine cache leaves behind stays forever."""

import aws_cdk as cdk
from aws_cdk.assertions import Template

from stacks.app_builder import cdk_json_context
from stacks.storage import ABORT_INCOMPLETE_UPLOADS_DAYS, NONCURRENT_VERSION_DAYS, ModelStore


def _model_bucket_rules() -> list[dict]:
    app = cdk.App(context=cdk_json_context())
    stack = cdk.Stack(app, "StorageOnly", env=cdk.Environment(account="111111111111", region="ap-northeast-2"))
    store = ModelStore(stack, "Models")
    template = Template.from_stack(stack).to_json()
    logical = stack.get_logical_id(store.bucket.node.default_child)
    return template["Resources"][logical]["Properties"]["LifecycleConfiguration"]["Rules"]


def test_the_model_bucket_aborts_incomplete_multipart_uploads():
    """A holder killed mid-upload leaves multipart parts that no listing shows.
    Source: "Configuring a bucket lifecycle configuration to delete incomplete multipart uploads",
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/mpu-abort-incomplete-mpu-lifecycle-config.html
    (rule action AbortIncompleteMultipartUpload/DaysAfterInitiation; without a Prefix the rule
    covers every upload in the bucket)."""
    rules = [r for r in _model_bucket_rules() if r["Status"] == "Enabled" and "Prefix" not in r
             and not r.get("Filter")]
    assert any(r.get("AbortIncompleteMultipartUpload") == {"DaysAfterInitiation": ABORT_INCOMPLETE_UPLOADS_DAYS}
               for r in rules)


def test_replaced_builds_expire_and_their_delete_markers_go_too():
    """The runtime deletes a replaced build's files; in the versioned bucket they become noncurrent
    versions, which expire, and the delete markers left with no version behind them are removed.
    Source: "Lifecycle configuration elements" (Amazon S3 User Guide) and the API reference
    LifecycleExpiration: ExpiredObjectDeleteMarker "cannot be specified with Days or Date",
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_LifecycleExpiration.html; CloudFormation's
    rule property ExpiredObjectDeleteMarker,
    https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-properties-s3-bucket-rule.html"""
    rules = [r for r in _model_bucket_rules() if "Prefix" not in r and not r.get("Filter")]
    whole_bucket = [r for r in rules if r.get("NoncurrentVersionExpiration")]
    assert whole_bucket and whole_bucket[0]["NoncurrentVersionExpiration"] == {"NoncurrentDays": NONCURRENT_VERSION_DAYS}
    assert whole_bucket[0].get("ExpiredObjectDeleteMarker") is True
    assert "ExpirationInDays" not in whole_bucket[0] and "ExpirationDate" not in whole_bucket[0]
