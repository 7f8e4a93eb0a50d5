"""The auto-approver on the real provider stacks: off by default, on with the config flag (nag-gated synth)."""

from __future__ import annotations

import json

from tests.cfn_lint import assert_lint_clean
from tests.stacks.synthesized import default_fleet, operations_fleet

SEOUL_STACK = "fleetcast-provider-ap-northeast-2"
VIRGINIA_STACK = "fleetcast-provider-us-east-1"


def approving_fleet():
    """operations.auto_approve_connections on, beside the other operations options (one synthesis for them all)."""
    return operations_fleet()


def _approvers(fleet, stack: str) -> list[dict]:
    return [f for f in fleet.resources(stack, "AWS::Lambda::Function").values()
            if f["Properties"].get("Environment", {}).get("Variables", {}).get("ALLOWED_ACCOUNTS")]


def test_off_by_default():
    fleet = default_fleet()
    assert _approvers(fleet, SEOUL_STACK) == [] and _approvers(fleet, VIRGINIA_STACK) == []


def test_endpoint_service_carries_the_fleet_tag_for_discovery():
    [service] = default_fleet().resources(SEOUL_STACK, "AWS::EC2::VPCEndpointService").values()
    assert {"Key": "fleetcast:fleet", "Value": "fleetcast"} in service["Properties"]["Tags"]
    outputs = default_fleet().template_json(SEOUL_STACK)["Outputs"]
    assert "EndpointServiceId" in outputs  # the key `fleetcast connections` reads first


def test_flag_deploys_one_approver_per_region_with_that_regions_accounts():
    fleet = approving_fleet()  # synthesis itself fails on any cdk-nag finding
    for stack, account in ((SEOUL_STACK, "444455556666"), (VIRGINIA_STACK, "777788889999")):
        [fn] = _approvers(fleet, stack)
        variables = fn["Properties"]["Environment"]["Variables"]
        assert json.loads(variables["ALLOWED_ACCOUNTS"]) == [account]
        [service_id] = fleet.resources(stack, "AWS::EC2::VPCEndpointService")
        assert variables["SERVICE_ID"] == {"Ref": service_id}
        subscriptions = [s["Properties"] for s in fleet.resources(stack, "AWS::SNS::Subscription").values()
                         if s["Properties"]["Protocol"] == "lambda"]
        assert [s["FilterPolicy"] for s in subscriptions] == [{"fleetcast_notice": [{"exists": False}]}]


def test_approving_templates_pass_cfn_lint():
    fleet = approving_fleet()
    assert_lint_clean(*(fleet.outdir / f"{name}.template.json" for name in (SEOUL_STACK, VIRGINIA_STACK)))
