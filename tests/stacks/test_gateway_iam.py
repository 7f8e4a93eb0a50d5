"""What the instance gateway needs from the stacks: PROXY v2 on the target group, /health through the
gateway, and least-privilege reads of endpoint connections and of the consumers' API key secrets."""

from __future__ import annotations

import json
from functools import cache

from tests.cfn_lint import assert_lint_clean

from .synthesized import default_doc, default_fleet, synthesize

SEOUL = "fleetcast-provider-ap-northeast-2"


@cache
def keyed_fleet():
    """Seoul only; voice-app uses API keys under the default secret name, a second consumer a named one."""
    doc = default_doc()
    doc["regions"] = doc["regions"][:1]
    doc["consumers"] = [c for c in doc["consumers"] if c["service_region"] == "ap-northeast-2"]
    doc["consumers"][0]["api_keys"] = True
    doc["regions"][0]["allowed_principals"].append("arn:aws:iam::555566667777:root")  # no-keys' own account
    doc["consumers"].append({
        "name": "batch-team", "account": "444455556666", "region": "ap-northeast-2",
        "service_region": "ap-northeast-2", "vpc_id": "vpc-0a1b2c3d4e5f60719",
        "subnets": [{"id": "subnet-0a1b2c3d4e5f60713", "az_id": "apne2-az1"}], "cidrs": ["10.61.0.0/16"],
        "api_keys": True, "api_key_secret": "platform/keys/batch",
    })
    doc["consumers"].append({
        "name": "no-keys", "account": "555566667777", "region": "ap-northeast-2",
        "service_region": "ap-northeast-2", "vpc_id": "vpc-0a1b2c3d4e5f6071a",
        "subnets": [{"id": "subnet-0a1b2c3d4e5f60714", "az_id": "apne2-az1"}], "cidrs": ["10.62.0.0/16"],
        "api_key_secret": "platform/keys/unused",  # named, but api_keys is off: no grant
    })
    return synthesize(doc, "gateway-keys")


def _instance_statements(fleet):
    policies = fleet.resources(SEOUL, "AWS::IAM::Policy")
    roles = {k for k, v in fleet.resources(SEOUL, "AWS::IAM::Role").items()
             if "ec2.amazonaws.com" in json.dumps(v["Properties"]["AssumeRolePolicyDocument"])}
    for policy in policies.values():
        if any(r.get("Ref") in roles for r in policy["Properties"].get("Roles", [])):
            yield from policy["Properties"]["PolicyDocument"]["Statement"]


def _secret_arns(statement) -> list[str]:
    resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
    return [json.dumps(r) for r in resources]


def test_target_group_sends_proxy_protocol_v2_and_health_checks_the_gateway():
    template = default_fleet().template_json(SEOUL)
    (group,) = [r["Properties"] for r in template["Resources"].values()
                if r["Type"] == "AWS::ElasticLoadBalancingV2::TargetGroup"]
    attributes = {a["Key"]: a["Value"] for a in group["TargetGroupAttributes"]}
    assert attributes["proxy_protocol_v2.enabled"] == "true"
    assert group["HealthCheckProtocol"] == "HTTP" and group["HealthCheckPath"] == "/health"
    assert group.get("HealthCheckPort", "traffic-port") == "traffic-port"  # through the gateway, not around it


def test_instances_may_read_endpoint_connections():
    actions = [s["Action"] for s in _instance_statements(default_fleet())]
    assert "ec2:DescribeVpcEndpointConnections" in actions


def test_no_secret_access_when_no_consumer_uses_api_keys():
    for statement in _instance_statements(default_fleet()):
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert not any(a.startswith("secretsmanager:") for a in actions)


def test_gateway_reads_exactly_the_keyed_consumers_secrets():
    fleet = keyed_fleet()
    grants = [s for s in _instance_statements(fleet) if s.get("Sid") == "ReadConsumerApiKeys"]
    assert grants, "the instance role has no ReadConsumerApiKeys statement"
    for grant in grants:
        assert grant["Action"] == "secretsmanager:GetSecretValue" and grant["Effect"] == "Allow"
        arns = _secret_arns(grant)
        assert len(arns) == 2
        assert any(":secret:fleetcast/consumers/voice-app/api-keys-??????" in a for a in arns)
        assert any(":secret:platform/keys/batch-??????" in a for a in arns)
        assert not any("unused" in a or "*" in a.replace('"Fn::', "") for a in arns)


def test_keyed_fleet_template_passes_cfn_lint():
    """cdk-nag already ran inside synthesize(); cfn-lint checks the added statement's shape."""
    assert_lint_clean(keyed_fleet().outdir / f"{SEOUL}.template.json")
