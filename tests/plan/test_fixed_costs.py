"""The planner's fixed costs price what the stacks create: the provider's interface endpoints are counted from the
one list the network construct builds (fleetcast/contract/network.py), checked here against the synthesized
provider template."""

from __future__ import annotations

from fleetcast.contract.network import PROVIDER_INTERFACE_ENDPOINTS
from fleetcast.plan.inputs import load_fixed_costs
from tests.stacks.synthesized import default_fleet


def test_the_planner_prices_every_interface_endpoint_the_provider_stack_creates():
    fleet = default_fleet()
    for region in fleet.cfg.regions:  # config/fleet.yaml: egress none, no drift check
        endpoints = fleet.resources(f"fleetcast-provider-{region.region}", "AWS::EC2::VPCEndpoint").values()
        interface = [e for e in endpoints if e["Properties"].get("VpcEndpointType") == "Interface"]
        assert len(interface) == len(PROVIDER_INTERFACE_ENDPOINTS) == 11
        assert load_fixed_costs(None).assumptions.provider_interface_endpoints == len(interface)


def test_each_endpoint_is_the_service_the_list_names():
    fleet = default_fleet()
    stack = f"fleetcast-provider-{fleet.cfg.regions[0].region}"
    names = {str(e["Properties"]["ServiceName"]) for e in fleet.resources(stack, "AWS::EC2::VPCEndpoint").values()
             if e["Properties"].get("VpcEndpointType") == "Interface"}
    for service in PROVIDER_INTERFACE_ENDPOINTS.values():
        assert any(f".{service}'" in name or name.endswith(f".{service}") for name in names), (service, names)
