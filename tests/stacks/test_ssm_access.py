"""No role in any template can read SSM parameters beyond its own fleet's.

Instances run third-party model code, so a parameter read on `*` would hand them every parameter of
the account. Checked over every template of every synthesized variant (default, variant, NAT, bench
mode), over everything a role gets: inline policies, AWS::IAM::Policy / ManagedPolicy resources
attached to it, and AWS managed policies (whose documents are quoted below from the AWS Managed Policy
Reference; an unknown managed policy fails the test until its document is added here).
"""

from __future__ import annotations

import fnmatch
import json
import re

import pytest

from .synthesized import bench_mode_fleet, default_fleet, nat_fleet, variant_fleet

# The Parameter Store reads (Service Authorization Reference, "Actions, resources, and condition keys for
# AWS Systems Manager": GetParameter, GetParameters, GetParametersByPath, GetParameterHistory).
PARAMETER_READS = ("ssm:GetParameter", "ssm:GetParameters", "ssm:GetParametersByPath", "ssm:GetParameterHistory")

# AWS managed policies' actions, from their pages in the AWS Managed Policy Reference
# (https://docs.aws.amazon.com/aws-managed-policy/latest/reference/<name>.html), all on Resource "*".
AWS_MANAGED_ACTIONS = {
    "service-role/AWSLambdaBasicExecutionRole": ("logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"),
    # v2: the Systems Manager agent's core actions, ssm:GetParameter and ssm:GetParameters among them.
    "AmazonSSMManagedInstanceCore": (
        "ssm:DescribeAssociation", "ssm:GetDeployablePatchSnapshotForInstance", "ssm:GetDocument",
        "ssm:DescribeDocument", "ssm:GetManifest", "ssm:GetParameter", "ssm:GetParameters",
        "ssm:ListAssociations", "ssm:ListInstanceAssociations", "ssm:PutInventory", "ssm:PutComplianceItems",
        "ssm:PutConfigurePackageResult", "ssm:UpdateAssociationStatus", "ssm:UpdateInstanceAssociationStatus",
        "ssm:UpdateInstanceInformation", "ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel",
        "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel", "ec2messages:AcknowledgeMessage",
        "ec2messages:DeleteMessage", "ec2messages:FailMessage", "ec2messages:GetEndpoint",
        "ec2messages:GetMessages", "ec2messages:SendReply"),
}
FLEETS = {"default": default_fleet, "variant": variant_fleet, "nat": nat_fleet, "bench": bench_mode_fleet}


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _resolve(value, template: dict) -> str:
    """A policy resource as a string; a reference to a parameter of this template becomes its name."""
    if isinstance(value, str):
        return value
    pseudo = {"AWS::Partition": "aws", "AWS::URLSuffix": "amazonaws.com"}
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(_resolve(p, template) for p in parts)
    if isinstance(value.get("Fn::Sub"), str):
        return re.sub(r"\$\{([^}]+)\}", lambda m: pseudo.get(m.group(1), f"<{m.group(1)}>"), value["Fn::Sub"])
    if "Ref" in value:
        if value["Ref"] in pseudo:
            return pseudo[value["Ref"]]
        resource = template["Resources"].get(value["Ref"], {})
        if resource.get("Type") == "AWS::SSM::Parameter" and isinstance(resource["Properties"].get("Name"), str):
            return resource["Properties"]["Name"]
    return f"<{json.dumps(value)}>"


def _reads_parameters(actions) -> bool:
    return any(fnmatch.fnmatchcase(read.lower(), pattern.lower()) for pattern in _as_list(actions)
               for read in PARAMETER_READS)


def role_statements(template: dict) -> dict[str, list[dict]]:
    """role logical id -> every Allow statement it gets, managed policies expanded."""
    resources = template["Resources"]
    out: dict[str, list[dict]] = {k: [] for k, v in resources.items() if v["Type"] == "AWS::IAM::Role"}
    for role_id in out:
        props = resources[role_id]["Properties"]
        for policy in props.get("Policies", []):
            out[role_id] += policy["PolicyDocument"]["Statement"]
        for arn in props.get("ManagedPolicyArns", []):
            text = _resolve(arn, template)
            if ":iam::aws:policy/" in text:
                name = text.split(":iam::aws:policy/", 1)[1]
                if name not in AWS_MANAGED_ACTIONS:
                    raise AssertionError(f"{role_id}: AWS managed policy {name} is not in AWS_MANAGED_ACTIONS; "
                                         "add its documented actions to check it")
                out[role_id].append({"Effect": "Allow", "Action": list(AWS_MANAGED_ACTIONS[name]),
                                     "Resource": "*", "Sid": f"managed:{name}"})
            elif isinstance(arn, dict) and "Ref" in arn and resources.get(arn["Ref"], {}).get("Type") == "AWS::IAM::ManagedPolicy":
                out[role_id] += resources[arn["Ref"]]["Properties"]["PolicyDocument"]["Statement"]
            else:
                raise AssertionError(f"{role_id}: managed policy {arn} cannot be checked offline")
    for resource in resources.values():
        if resource["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            for role in resource["Properties"].get("Roles", []):
                if isinstance(role, dict) and role.get("Ref") in out:
                    out[role["Ref"]] += resource["Properties"]["PolicyDocument"]["Statement"]
    return out


def parameter_read_problems(template: dict, *, fleet: str, region: str, account: str) -> list[str]:
    own = f"arn:aws:ssm:{region}:{account}:parameter/{fleet}/"
    problems = []
    for role_id, statements in role_statements(template).items():
        for statement in statements:
            if statement["Effect"] != "Allow":
                continue
            if "NotAction" in statement or "NotResource" in statement:
                problems.append(f"{role_id}: {statement.get('Sid')} uses NotAction/NotResource")
                continue
            if not _reads_parameters(statement["Action"]):
                continue
            for resource in _as_list(statement["Resource"]):
                arn = _resolve(resource, template)
                if not arn.startswith(own) or "*" in arn or "?" in arn:
                    problems.append(f"{role_id}: {statement.get('Sid')} reads parameters on {arn}")
    return problems


@pytest.mark.parametrize("which", sorted(FLEETS))
def test_no_role_reads_parameters_beyond_its_fleets_own(which):
    fleet = FLEETS[which]()
    roles = 0
    for name, stack in fleet.stacks.items():
        template = fleet.template_json(name)
        roles += len(role_statements(template))
        problems = parameter_read_problems(template, fleet=fleet.cfg.name, region=stack.region, account=stack.account)
        assert not problems, f"{name}: {problems}"
    assert roles, "the templates have roles to check"


def test_instances_still_read_their_own_config_and_keep_session_manager():
    from stacks.session_manager import SESSION_MANAGER_ACTIONS

    fleet = default_fleet()
    for name in (n for n in fleet.stacks if "-provider-" in n):
        template = fleet.template_json(name)
        statements = [s for role, ss in role_statements(template).items() if "InstanceRole" in role for s in ss]
        reads = [s for s in statements if _reads_parameters(s["Action"])]
        assert [_resolve(r, template) for s in reads for r in _as_list(s["Resource"])] == [
            f"arn:aws:ssm:{fleet.stacks[name].region}:{fleet.cfg.provider.account}:parameter/{fleet.cfg.name}/config"]
        (session,) = [s for s in statements if "ssmmessages:OpenControlChannel" in _as_list(s["Action"])]
        assert sorted(_as_list(session["Action"])) == sorted(SESSION_MANAGER_ACTIONS)


def test_the_check_catches_the_managed_core_policy_and_a_wildcard_read():
    role = {"Type": "AWS::IAM::Role", "Properties": {"ManagedPolicyArns": [
        {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":iam::aws:policy/AmazonSSMManagedInstanceCore"]]}]}}
    template = {"Resources": {"Role": role}}
    assert parameter_read_problems(template, fleet="fleetcast", region="us-east-1", account="123412341234") == [
        "Role: managed:AmazonSSMManagedInstanceCore reads parameters on *"]
    other = {"Type": "AWS::IAM::Policy", "Properties": {"Roles": [{"Ref": "Bare"}], "PolicyDocument": {"Statement": [
        {"Effect": "Allow", "Action": "ssm:Get*", "Resource": "arn:aws:ssm:us-east-1:123412341234:parameter/other/x"}]}}}
    template = {"Resources": {"Bare": {"Type": "AWS::IAM::Role", "Properties": {}}, "Policy": other}}
    assert parameter_read_problems(template, fleet="fleetcast", region="us-east-1", account="123412341234")
