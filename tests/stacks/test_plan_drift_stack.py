"""The scheduled plan drift check on the real provider stacks: off by default; on with
operations.plan_drift_check, one least-privilege Lambda per region in the fleet VPC (nag-gated synth,
cfn-lint clean), reaching AWS only through VPC endpoints."""

from __future__ import annotations

from pathlib import Path

from fleetcast.contract import telemetry
from fleetcast.contract.bucket import PLAN_BASELINE_KEY
from tests.cfn_lint import assert_lint_clean

from .synthesized import default_fleet, operations_fleet, synthesize

ROOT = Path(__file__).resolve().parents[2]
STACKS = ("fleetcast-provider-ap-northeast-2", "fleetcast-provider-us-east-1")


def drift_fleet():
    """operations.plan_drift_check every 6 hours, threshold 0.25, beside the other operations options (one
    synthesis for them all); a cdk-nag finding fails it."""
    return operations_fleet()


def _drift_functions(fleet, stack: str) -> list[dict]:
    return [f for f in fleet.resources(stack, "AWS::Lambda::Function").values()
            if f["Properties"].get("Environment", {}).get("Variables", {}).get("BASELINE_KEY")]


def test_off_by_default():
    assert all(_drift_functions(default_fleet(), s) == [] for s in STACKS)


def test_on_each_region_runs_it_on_the_schedule_inside_the_vpc():
    fleet = drift_fleet()
    for stack in STACKS:
        [fn] = _drift_functions(fleet, stack)
        props = fn["Properties"]
        env = props["Environment"]["Variables"]
        assert env["BASELINE_KEY"] == PLAN_BASELINE_KEY and env["THRESHOLD"] == "0.25"
        assert props["VpcConfig"]["SubnetIds"] and props["VpcConfig"]["SecurityGroupIds"]
        rules = [r["Properties"] for r in fleet.resources(stack, "AWS::Events::Rule").values()
                 if r["Properties"].get("ScheduleExpression")]
        assert [r["ScheduleExpression"] for r in rules] == ["rate(6 hours)"]
        # The only way out is HTTPS; with egress: none no route leaves the VPC, and SNS gets an endpoint.
        groups = [g["Properties"] for g in fleet.resources(stack, "AWS::EC2::SecurityGroup").values()
                  if "plan drift" in g["Properties"]["GroupDescription"]]
        [group] = groups
        assert [(e["IpProtocol"], e["FromPort"], e["ToPort"]) for e in group["SecurityGroupEgress"]] == [("tcp", 443, 443)]
        services = [str(e["Properties"]["ServiceName"]) for e in fleet.resources(stack, "AWS::EC2::VPCEndpoint").values()]
        assert any(".sns" in s for s in services) and any(".monitoring" in s for s in services)


def test_its_role_reads_one_object_and_writes_only_the_fleetcast_namespace():
    fleet = drift_fleet()
    for stack in STACKS:
        [fn] = _drift_functions(fleet, stack)
        role_id = fn["Properties"]["Role"]["Fn::GetAtt"][0]
        policies = [p["Properties"] for p in fleet.resources(stack, "AWS::IAM::Policy").values()
                    if {"Ref": role_id} in p["Properties"]["Roles"]]
        statements = {s["Sid"]: s for p in policies for s in p["PolicyDocument"]["Statement"]}
        assert statements["ReadTheBaselineOnly"]["Action"] == "s3:GetObject"
        assert PLAN_BASELINE_KEY in str(statements["ReadTheBaselineOnly"]["Resource"])
        assert statements["PublishPlanDrift"]["Condition"] == {
            "StringEquals": {"cloudwatch:namespace": telemetry.NAMESPACE}}
        assert not fleet.template_json(stack)["Resources"][role_id]["Properties"].get("ManagedPolicyArns")
        assert all("*" != s.get("Action") for s in statements.values())


def test_drift_templates_pass_cfn_lint():
    fleet = drift_fleet()
    assert_lint_clean(*(fleet.outdir / f"{s}.template.json" for s in STACKS))


def test_with_nat_egress_it_synthesizes_without_adding_an_endpoint():
    from .synthesized import nat_doc

    doc = nat_doc()
    doc["operations"]["plan_drift_check"] = {}
    fleet = synthesize(doc, "plan-drift-nat")  # nag-gated
    stack = STACKS[0]
    [fn] = _drift_functions(fleet, stack)
    assert fn["Properties"]["VpcConfig"]["SubnetIds"]
    assert fleet.resources(stack, "AWS::EC2::VPCEndpoint") == {}  # egress: nat has none, and gets none
