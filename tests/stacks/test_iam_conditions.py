"""Every IAM condition in every synthesized template names a condition key AWS defines, with an operator of that
key's type. IAM does not refuse an unknown key or a mismatched operator when the policy is created: the condition
just never matches, so an Allow silently grants nothing (or a Deny never applies). cfn-lint checks actions and
resources (W3037, I3510), not condition keys.

The keys, as the primary sources list them (transcribed; a key used in a template and missing here fails the test,
so a new one is looked up and added with its source):
- Global keys: IAM User Guide, "AWS global condition context keys"
  (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_condition-keys.html).
- Service keys: Service Authorization Reference, each service's "Actions, resources, and condition keys" page,
  condition keys table (list_amazonec2autoscaling, list_amazoncloudwatch, list_amazons3, list_awskeymanagementservice).
- Operators by type: IAM User Guide, "IAM JSON policy elements: Condition operators"
  (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_condition_operators.html).
"""

from __future__ import annotations

import json
import re

import pytest

from .synthesized import bench_mode_fleet, default_fleet, nat_fleet, spill_fleet, spot_fleet, variant_fleet

CONDITION_KEY_TYPES = {
    # global keys
    "aws:SecureTransport": "Bool",
    "aws:SourceAccount": "String",
    "aws:SourceArn": "ARN",
    # "aws:RequestedRegion ... Value type: String" (the global keys page, above): the instance role's peer
    # discovery is limited to its own region with it (stacks/gpu_fleet.py).
    "aws:RequestedRegion": "String",
    # Amazon EC2 Auto Scaling: "autoscaling:MaxSize | The maximum scaling size | Numeric"; the EC2 Auto Scaling
    # User Guide's identity-based policy examples bound UpdateAutoScalingGroup's request with it
    # ("NumericLessThanEqualsIfExists": {"autoscaling:MaxSize": 10}).
    "autoscaling:MaxSize": "Numeric",
    # Amazon CloudWatch: PutMetricData's namespace.
    "cloudwatch:namespace": "String",
    # Amazon S3: ListBucket's prefix, PutObject's canned ACL.
    "s3:prefix": "String",
    "s3:x-amz-acl": "String",
    # AWS KMS: kms:EncryptionContext:${EncryptionContextKey} is a String key; CloudWatch Logs' own key-policy
    # statement compares its aws:logs:arn entry with ArnLike ("Encrypt log data in CloudWatch Logs using AWS KMS",
    # https://docs.aws.amazon.com/AmazonCloudWatch/latest/logs/encrypt-log-data-kms.html).
    "kms:EncryptionContext:aws:logs:arn": "String",
}

# Operator families (without the IfExists suffix and the ForAllValues:/ForAnyValue: set prefixes) and the key
# types each compares.
OPERATOR_TYPES = {
    "String": {"String"},
    "Numeric": {"Numeric"},
    "Date": {"Date"},
    "Bool": {"Bool"},
    "Binary": {"Binary"},
    "IpAddress": {"IPAddress"},
    "NotIpAddress": {"IPAddress"},
    "Arn": {"ARN"},
}
DOCUMENTED_PAIRS = {("ArnLike", "kms:EncryptionContext:aws:logs:arn")}  # CloudWatch Logs' statement, above


def operator_family(operator: str) -> str:
    bare = re.sub(r"^(ForAllValues|ForAnyValue):", "", operator).removesuffix("IfExists")
    for family in OPERATOR_TYPES:
        if bare.startswith(family):
            return family
    if bare == "Null":
        return "Null"
    raise AssertionError(f"{operator} is not an IAM condition operator")


def conditions(document) -> list[tuple[str, str, str]]:
    """(template-relative location, operator, key) for every condition in every policy document in `document`."""
    found = []

    def walk(node, where):
        if isinstance(node, dict):
            statements = node.get("Statement")
            if isinstance(statements, list) and "Version" in node:
                for statement in statements:
                    for operator, comparisons in (statement.get("Condition") or {}).items():
                        found.extend((where, operator, key) for key in comparisons)
            for name, value in node.items():
                walk(value, f"{where}/{name}")
        elif isinstance(node, list):
            for value in node:
                walk(value, where)

    walk(document, "")
    return found


@pytest.fixture(scope="module")
def every_condition():
    rows = []
    for fleet in (default_fleet(), variant_fleet(), nat_fleet(), spot_fleet(), bench_mode_fleet(), spill_fleet()):
        for path in fleet.template_files():
            rows += [(f"{path.name}{where}", op, key) for where, op, key in conditions(json.loads(path.read_text()))]
    return rows


def test_the_templates_use_conditions_including_the_spot_fallback_ceiling(every_condition):
    keys = {key for _, _, key in every_condition}
    assert {"autoscaling:MaxSize", "cloudwatch:namespace", "kms:EncryptionContext:aws:logs:arn"} <= keys


def test_every_condition_key_is_one_aws_defines(every_condition):
    unknown = sorted({(key, where) for where, _, key in every_condition if key not in CONDITION_KEY_TYPES})
    assert not unknown, f"condition keys without a source here (add each with its type and page): {unknown[:5]}"


def test_every_operator_compares_its_keys_type(every_condition):
    mismatched = []
    for where, operator, key in every_condition:
        family = operator_family(operator)
        if family == "Null" or (operator, key) in DOCUMENTED_PAIRS:
            continue
        if CONDITION_KEY_TYPES.get(key) not in OPERATOR_TYPES[family]:
            mismatched.append((operator, key, where))
    assert not mismatched, mismatched[:5]


@pytest.mark.parametrize("operator, key, ok", [
    ("NumericLessThanEquals", "autoscaling:MaxSize", True),
    ("StringEquals", "autoscaling:MaxSize", False),  # never matches a number: the fallback could not resize
    ("ForAnyValue:StringLikeIfExists", "s3:prefix", True),
    ("Bool", "aws:SecureTransport", True),
    ("ArnLike", "aws:SourceArn", True),
    ("ArnLike", "aws:SourceAccount", False),
])
def test_the_type_check_itself(operator, key, ok):
    assert (CONDITION_KEY_TYPES[key] in OPERATOR_TYPES[operator_family(operator)]) is ok
