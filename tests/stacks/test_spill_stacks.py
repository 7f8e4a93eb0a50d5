"""Cross-region spill and consumer failover in the stacks (issue 36, section 2), on examples/spill/fleet.yaml:
the home provider stack owns an interface endpoint to the remote region's service over cross-region
PrivateLink, reachable only from the fleet instances, and publishes its DNS name where the instances read it;
the remote service lets that endpoint in; a consumer with failover_region gets a second endpoint. The
templates pass cdk-nag (synthesis would raise) and cfn-lint.

Sources:
- CloudFormation, AWS::EC2::VPCEndpoint (https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/
  aws-resource-ec2-vpcendpoint.html): ServiceRegion, the Region of the endpoint service (interface endpoints,
  cross-region); DnsEntries, "hosted-zone-id:dns-name" pairs.
- AWS PrivateLink Guide, "Share your services through AWS PrivateLink", "Cross-Region access"
  (https://docs.aws.amazon.com/vpc/latest/privatelink/privatelink-share-your-services.html#endpoint-service-cross-region)
  and the launch post "Introducing Cross-Region Connectivity for AWS PrivateLink" (AWS Networking & Content
  Delivery blog, 2024-11): the provider lists the Regions consumers connect from (the service's
  SupportedRegions) and the principals allowed to connect; consumers use an interface endpoint whose service
  Region is the remote one, no peering or transit gateway.
- Route 53 Developer Guide, "Configuring failover in a private hosted zone"
  (https://docs.aws.amazon.com/Route53/latest/DeveloperGuide/dns-failover-private-hosted-zones.html): "Route 53
  health checkers are outside the VPC"; a CloudWatch-alarm health check is the documented way for private
  resources. The DNS failover built on it: tests/stacks/test_consumer_failover.py.
"""

from __future__ import annotations

import json

import pytest

from fleetcast.contract.outputs import ConsumerOutput
from fleetcast.contract.spill import peer_secret_name, spill_endpoint_parameter
from fleetcast.contract.stack_size import provider_stack_resources
from tests.cfn_lint import assert_lint_clean

from .synthesized import default_fleet, spill_fleet

HOME = "spillfleet-provider-us-east-1"
REMOTE = "spillfleet-provider-us-west-2"
CHECKOUT = "spillfleet-consumer-checkout"
REPORTS = "spillfleet-consumer-reports"


@pytest.fixture(scope="module")
def fleet():
    return spill_fleet()


def props(resource: dict) -> dict:
    return resource["Properties"]


def ref_id(value: dict) -> str:
    """The logical id a Ref or Fn::GetAtt points at."""
    return value["Ref"] if "Ref" in value else value["Fn::GetAtt"][0]


def instance_sg(fleet) -> str:
    (sg,) = [k for k in fleet.resources(HOME, "AWS::EC2::SecurityGroup") if k.startswith("InstanceSecurityGroup")]
    return sg


def test_the_home_stack_owns_one_interface_endpoint_to_the_remote_service_across_regions(fleet):
    (endpoint,) = [r for r in fleet.resources(HOME, "AWS::EC2::VPCEndpoint").values() if "ServiceRegion" in props(r)]
    p = props(endpoint)
    assert p["VpcEndpointType"] == "Interface"
    assert p["ServiceRegion"] == "us-west-2"
    assert p["ServiceName"] == fleet.cfg.region("us-west-2").endpoint_service_name
    assert p["PrivateDnsEnabled"] is False
    assert ref_id(p["VpcId"]).startswith("NetworkVpc")  # the provider VPC of the home region
    assert all(ref_id(s).startswith("NetworkVpcfleetSubnet") for s in p["SubnetIds"])  # its private subnets
    # The remote region has no spill endpoint of its own: nothing of its consumers spills.
    assert not [r for r in fleet.resources(REMOTE, "AWS::EC2::VPCEndpoint").values() if "ServiceRegion" in props(r)]


def test_no_peering_transit_gateway_or_public_path_in_any_template(fleet):
    forbidden = {"AWS::EC2::VPCPeeringConnection", "AWS::EC2::TransitGateway", "AWS::EC2::TransitGatewayAttachment",
                 "AWS::EC2::InternetGateway", "AWS::EC2::NatGateway", "AWS::EC2::EIP"}
    for path in fleet.template_files():
        types = {r["Type"] for r in json.loads(path.read_text())["Resources"].values()}
        assert not types & forbidden, path.name


def test_only_the_instances_reach_the_spill_endpoint_and_only_on_the_serving_port(fleet):
    port = fleet.cfg.engine.port
    (endpoint,) = [r for r in fleet.resources(HOME, "AWS::EC2::VPCEndpoint").values() if "ServiceRegion" in props(r)]
    (sg_ref,) = props(endpoint)["SecurityGroupIds"]
    sg_id = ref_id(sg_ref)
    sg = props(fleet.resources(HOME, "AWS::EC2::SecurityGroup")[sg_id])
    assert "SecurityGroupIngress" not in sg  # no CIDR rule: only the SG-to-SG rule below
    assert [e["CidrIp"] for e in sg["SecurityGroupEgress"]] == ["255.255.255.255/32"]  # CDK's "no egress"
    ingress = [props(r) for r in fleet.resources(HOME, "AWS::EC2::SecurityGroupIngress").values()
               if ref_id(props(r)["GroupId"]) == sg_id]
    assert [(ref_id(r["SourceSecurityGroupId"]), r["IpProtocol"], r["FromPort"], r["ToPort"]) for r in ingress] == [
        (instance_sg(fleet), "tcp", port, port)]
    egress = [props(r) for r in fleet.resources(HOME, "AWS::EC2::SecurityGroupEgress").values()
              if ref_id(props(r)["DestinationSecurityGroupId"]) == sg_id]
    assert [(ref_id(r["GroupId"]), r["FromPort"], r["ToPort"]) for r in egress] == [(instance_sg(fleet), port, port)]


def test_the_endpoints_dns_name_is_published_where_the_instances_may_read_it(fleet):
    (parameter,) = [props(r) for r in fleet.resources(HOME, "AWS::SSM::Parameter").values()
                    if props(r)["Name"] == spill_endpoint_parameter("spillfleet", "us-west-2")]
    # DnsEntries holds "hosted-zone-id:dns-name" pairs: the first pair's name.
    value = parameter["Value"]["Fn::Select"]
    assert value[0] == 1 and value[1]["Fn::Split"][0] == ":"
    assert value[1]["Fn::Split"][1]["Fn::Select"][1]["Fn::GetAtt"][1] == "DnsEntries"
    (param_id,) = [k for k, r in fleet.resources(HOME, "AWS::SSM::Parameter").items()
                   if props(r)["Name"] == spill_endpoint_parameter("spillfleet", "us-west-2")]
    pools = [k for k in fleet.resources(HOME, "AWS::IAM::Role") if k.startswith("Pooll40sInstanceRole")]
    assert pools
    granted = []
    for policy in fleet.resources(HOME, "AWS::IAM::Policy").values():
        for statement in props(policy)["PolicyDocument"]["Statement"]:
            if statement.get("Sid", "").startswith("ReadSpillEndpoint"):
                granted.append((statement["Action"], json.dumps(statement["Resource"])))
                assert param_id in json.dumps(statement["Resource"])
    assert granted and all(action == "ssm:GetParameter" for action, _ in granted)


def test_the_remote_service_admits_the_home_vpc_and_the_failover_consumer(fleet):
    port = fleet.cfg.engine.port
    (service,) = fleet.resources(REMOTE, "AWS::EC2::VPCEndpointService").values()
    assert props(service)["SupportedRegions"] == ["us-east-1"]
    nlb_sgs = [props(r) for k, r in fleet.resources(REMOTE, "AWS::EC2::SecurityGroup").items()
               if k.startswith("ServiceSecurityGroup")]
    (nlb_sg,) = nlb_sgs
    rules = {(r["CidrIp"], r["FromPort"], r["ToPort"]) for r in nlb_sg["SecurityGroupIngress"]}
    assert (fleet.cfg.region("us-east-1").vpc.cidr, port, port) in rules  # the spill endpoint's ENIs
    assert ("10.60.0.0/16", port, port) in rules  # checkout's failover endpoint
    assert ("10.70.0.0/16", port, port) not in rules  # reports neither spills nor fails over


def test_a_failover_consumer_gets_a_second_endpoint_behind_the_same_security_group(fleet):
    # The fleet's services only (the failover probe's own CloudWatch endpoint: tests/stacks/test_consumer_failover.py).
    endpoints = [props(r) for r in fleet.resources(CHECKOUT, "AWS::EC2::VPCEndpoint").values()
                 if "vpce-svc-" in str(props(r)["ServiceName"])]
    assert sorted(e.get("ServiceRegion", "home") for e in endpoints) == ["home", "us-west-2"]
    failover = next(e for e in endpoints if "ServiceRegion" in e)
    assert failover["ServiceName"] == fleet.cfg.region("us-west-2").endpoint_service_name
    assert len({json.dumps(e["SecurityGroupIds"]) for e in endpoints}) == 1
    assert len({json.dumps(sorted(e["SubnetIds"])) for e in endpoints}) == 1
    assert ConsumerOutput.FAILOVER_ENDPOINT_DNS_ENTRIES.value in fleet.template_json(CHECKOUT)["Outputs"]
    # A consumer without failover_region keeps its one endpoint.
    assert len(fleet.resources(REPORTS, "AWS::EC2::VPCEndpoint")) == 1
    assert ConsumerOutput.FAILOVER_ENDPOINT_DNS_ENTRIES.value not in fleet.template_json(REPORTS)["Outputs"]


def test_the_computed_resource_count_is_the_templates(fleet):
    for region in fleet.cfg.regions:
        template = fleet.template_json(f"spillfleet-provider-{region.region}")
        assert provider_stack_resources(fleet.cfg, region) == len(template["Resources"]), region.region


def test_cfn_lint_reports_nothing(fleet):
    assert_lint_clean(*fleet.template_files())


def test_strict_residency_by_default_builds_no_spill_endpoint():
    default = default_fleet()
    for path in default.template_files():
        resources = json.loads(path.read_text())["Resources"].values()
        assert not [r for r in resources if r["Type"] == "AWS::SSM::Parameter" and "/spill/" in str(r["Properties"])]
        assert not [r for r in resources if r["Type"] == "AWS::SecretsManager::Secret"
                    and "/spill/" in str(r["Properties"])]  # no peer key either
    for region in default.cfg.regions:
        assert not [r for r in default.resources(f"fleetcast-provider-{region.region}", "AWS::EC2::VPCEndpoint").values()
                    if "ServiceRegion" in props(r)]


def test_the_peer_key_is_generated_in_the_first_peer_region_replicated_to_the_other_and_readable_by_instances(fleet):
    """The gateways sign and check forwarded identity with one key (runtime/gateway/peer.py): a Secrets Manager
    secret generated in the template's first spill region, with a replica in the other (CloudFormation,
    AWS::SecretsManager::Secret, ReplicaRegions: "a custom type that specifies a Region and the KmsKeyId for a
    replica secret", https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/
    aws-resource-secretsmanager-secret.html); each region's instance roles read the copy in their own region."""
    name = peer_secret_name("spillfleet")
    (secret,) = [props(r) for r in fleet.resources(HOME, "AWS::SecretsManager::Secret").values()
                 if props(r)["Name"] == name]
    assert secret["ReplicaRegions"] == [{"Region": "us-west-2"}]
    assert secret["GenerateSecretString"]["PasswordLength"] >= 32 and "SecretString" not in secret
    assert not [r for r in fleet.resources(REMOTE, "AWS::SecretsManager::Secret").values()
                if props(r)["Name"] == name]
    for stack in (HOME, REMOTE):
        grants = [statement for policy in fleet.resources(stack, "AWS::IAM::Policy").values()
                  for statement in props(policy)["PolicyDocument"]["Statement"] if statement.get("Sid") == "ReadPeerKey"]
        assert grants and all(g["Action"] == "secretsmanager:GetSecretValue" for g in grants)
        assert all(f":secret:{name}-??????" in json.dumps(g["Resource"]) for g in grants)


def test_the_peer_keys_one_cdk_nag_finding_is_the_acknowledged_rotation_rule(monkeypatch):
    """Synthesized with acknowledgments recorded but not applied, the spill fleet's findings on the peer key are
    exactly AwsSolutions-SMG4 (no rotation), the one acknowledged (stacks/spill.py says why)."""

    from ruamel.yaml import YAML

    from stacks import nag
    from tests.stacks.synthesized import SPILL_CONFIG
    from tests.stacks.test_gates import unacknowledged_findings

    findings = unacknowledged_findings(monkeypatch, YAML(typ="safe").load(SPILL_CONFIG.read_text()), "spill-unacknowledged")
    on_key = {(path, rule) for path, rule in findings if "/Spill/PeerKey" in path}
    assert {rule for _, rule in on_key} == {"AwsSolutions-SMG4"}
    assert [r for p, r in nag.RECORDED if p.endswith("/Spill/PeerKey")] == ["AwsSolutions-SMG4"]
    assert all(path.startswith(p) for path, _ in on_key for p, r in nag.RECORDED if p.endswith("/Spill/PeerKey"))
