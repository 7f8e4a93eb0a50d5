"""Consumer stacks: one interface endpoint per consumer, cross-region where configured, open only on the port."""

from __future__ import annotations

import pytest

from .synthesized import default_fleet, variant_fleet

VOICE = "fleetcast-consumer-voice-app"
ANALYTICS = "fleetcast-consumer-analytics"


@pytest.fixture(scope="module")
def fleet():
    return default_fleet()


def consumer(fleet, stack_name):
    return next(c for c in fleet.cfg.consumers if stack_name.endswith(c.name))


def endpoint(fleet, stack_name) -> dict:
    (resource,) = fleet.resources(stack_name, "AWS::EC2::VPCEndpoint").values()
    return resource["Properties"]


@pytest.mark.parametrize("stack_name", [VOICE, ANALYTICS])
def test_interface_endpoint_to_the_configured_service_in_the_consumers_subnets(fleet, stack_name):
    c = consumer(fleet, stack_name)
    props = endpoint(fleet, stack_name)
    assert props["VpcEndpointType"] == "Interface"
    assert props["ServiceName"] == c.endpoint_service_name
    assert props["VpcId"] == c.vpc_id
    assert sorted(props["SubnetIds"]) == sorted(s.id for s in c.subnets)
    # The service publishes no private DNS name; clients use the endpoint's own DNS names.
    assert props["PrivateDnsEnabled"] is False


def test_cross_region_consumer_sets_the_service_region(fleet):
    assert endpoint(fleet, ANALYTICS)["ServiceRegion"] == "us-east-1"
    assert "ServiceRegion" not in endpoint(fleet, VOICE)


@pytest.mark.parametrize("stack_name", [VOICE, ANALYTICS])
def test_endpoint_security_group_opens_only_the_serving_port_to_the_consumers_cidrs(fleet, stack_name):
    c = consumer(fleet, stack_name)
    port = fleet.cfg.engine.port
    (sg,) = fleet.resources(stack_name, "AWS::EC2::SecurityGroup").values()
    ingress = sg["Properties"]["SecurityGroupIngress"]
    assert sorted(r["CidrIp"] for r in ingress) == sorted(c.cidrs)
    assert all((r["IpProtocol"], r["FromPort"], r["ToPort"]) == ("tcp", port, port) for r in ingress)
    assert not fleet.resources(stack_name, "AWS::EC2::SecurityGroupIngress")


@pytest.mark.parametrize("stack_name", [VOICE, ANALYTICS])
def test_consumer_stack_is_bound_to_the_consumers_account_and_region(fleet, stack_name):
    c = consumer(fleet, stack_name)
    stack = fleet.stacks[stack_name]
    assert (stack.account, stack.region) == (c.account, c.region)
    assert {"EndpointId", "EndpointDnsEntries"} <= set(fleet.template_json(stack_name)["Outputs"])


def test_consumer_without_a_published_service_name_is_skipped_with_the_reason():
    variant = variant_fleet()
    assert "fleetcast-consumer-late-team" not in variant.stacks
    assert not (variant.outdir / "fleetcast-consumer-late-team.template.json").exists()
    (message,) = [m for m in variant.messages if "late-team" in m]
    assert "no endpoint_service_name yet" in message and "ap-northeast-2" in message
