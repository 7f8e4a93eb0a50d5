"""Every KMS key that encrypts a CloudWatch log group lets CloudWatch Logs use it, the way the service requires.

Source: AWS, "Encrypt log data in CloudWatch Logs using AWS Key Management Service"
(https://docs.aws.amazon.com/AmazonCloudWatch/latest/logs/encrypt-log-data-kms.html), step 2 "Set
permissions on the KMS key": the key policy allows the principal `logs.<region>.amazonaws.com` the actions
kms:Encrypt*, kms:Decrypt*, kms:ReEncrypt*, kms:GenerateDataKey*, kms:Describe*, under a condition on
`kms:EncryptionContext:aws:logs:arn` (the log group's ARN). Without it CreateLogGroup with that key fails
(AccessDenied) and the stack rolls back; the global `logs.amazonaws.com` does not count.

Checked on every synthesized template of every config variant, so a log group added anywhere later, with
any key, is held to the same rule.
"""

from __future__ import annotations

import json

import pytest

from .synthesized import default_fleet, nat_fleet, variant_fleet

DOC_ACTIONS = {"kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"}
CONTEXT_KEY = "kms:EncryptionContext:aws:logs:arn"
FLEETS = {"default": default_fleet, "variant": variant_fleet, "nat": nat_fleet}


def _resolve(value, partition: str = "aws"):
    """The few intrinsics a key-policy ARN uses, resolved as CloudFormation would in the commercial partition."""
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(_resolve(p, partition) for p in parts)
    if value == {"Ref": "AWS::Partition"}:
        return partition
    if isinstance(value, str):
        return value
    raise AssertionError(f"cannot resolve {json.dumps(value)} offline")


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _services(statement: dict) -> list[str]:
    principal = statement.get("Principal", {})
    return [_resolve(s) for s in _as_list(principal.get("Service", []))] if isinstance(principal, dict) else []


def key_policy_problems(template: dict, key_id: str, *, region: str, account: str) -> list[str]:
    """What keeps CloudWatch Logs in `region` from using `key_id` for this account's log groups ([] = nothing)."""
    key = template["Resources"].get(key_id)
    if key is None or key["Type"] != "AWS::KMS::Key":
        return [f"{key_id} is not a KMS key of this template; its policy cannot be checked"]
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    problems = [f"{key_id}: statement {s.get('Sid')} names the global logs.amazonaws.com principal"
                for s in statements if "logs.amazonaws.com" in _services(s)]
    regional = [s for s in statements if s["Effect"] == "Allow" and f"logs.{region}.amazonaws.com" in _services(s)]
    if not regional:
        return problems + [f"{key_id}: no statement allows logs.{region}.amazonaws.com"]
    expected_arn = f"arn:aws:logs:{region}:{account}:log-group:"
    for statement in regional:
        missing = DOC_ACTIONS - set(_as_list(statement["Action"]))
        if missing:
            problems.append(f"{key_id}: logs principal lacks {sorted(missing)}")
        conditions = statement.get("Condition", {})
        arns = [_resolve(v) for op in ("ArnLike", "ArnEquals") for v in _as_list(conditions.get(op, {}).get(CONTEXT_KEY, []))]
        if not arns:
            problems.append(f"{key_id}: logs principal is not bound by {CONTEXT_KEY}")
        elif not all(a.startswith(expected_arn) for a in arns):
            problems.append(f"{key_id}: {CONTEXT_KEY} {arns} is not this account's log groups in {region}")
    return problems


@pytest.mark.parametrize("which", sorted(FLEETS))
def test_every_log_group_key_lets_regional_cloudwatch_logs_use_it(which):
    fleet = FLEETS[which]()
    checked = 0
    for name, stack in fleet.stacks.items():
        template = fleet.template_json(name)
        for group_id, group in template["Resources"].items():
            if group["Type"] != "AWS::Logs::LogGroup" or "KmsKeyId" not in group["Properties"]:
                continue
            reference = group["Properties"]["KmsKeyId"]
            assert isinstance(reference, dict) and "Fn::GetAtt" in reference, f"{name}/{group_id}: key {reference}"
            problems = key_policy_problems(template, reference["Fn::GetAtt"][0], region=stack.region,
                                           account=stack.account)
            assert not problems, f"{name}/{group_id}: {problems}"
            checked += 1
    # Instance logs, flow logs and the image-mirror build logs in each region at least.
    assert checked >= 3 * len(fleet.cfg.regions)


def test_the_check_refuses_the_global_principal_and_a_missing_condition():
    """The check itself, on the two ways a key policy goes wrong (the first is what image_mirror.py had)."""
    def template(statement):
        return {"Resources": {"Key": {"Type": "AWS::KMS::Key", "Properties": {"KeyPolicy": {"Statement": [statement]}}}}}

    global_principal = {"Effect": "Allow", "Principal": {"Service": "logs.amazonaws.com"},
                        "Action": ["kms:Decrypt", "kms:Encrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*"],
                        "Resource": "*"}
    assert key_policy_problems(template(global_principal), "Key", region="us-east-1", account="123412341234")
    unbound = {"Effect": "Allow", "Principal": {"Service": "logs.us-east-1.amazonaws.com"},
               "Action": sorted(DOC_ACTIONS), "Resource": "*"}
    assert key_policy_problems(template(unbound), "Key", region="us-east-1", account="123412341234") == [
        f"Key: logs principal is not bound by {CONTEXT_KEY}"]
    bound = {**unbound, "Condition": {"ArnLike": {CONTEXT_KEY: "arn:aws:logs:us-east-1:123412341234:log-group:*"}}}
    assert key_policy_problems(template(bound), "Key", region="us-east-1", account="123412341234") == []
