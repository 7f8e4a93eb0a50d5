"""A pool with a spot tier synthesizes two groups behind one target group; a pool without one, one group.

Config: tests/stacks/synthesized.py spot_doc() (Seoul's l40s with spot on g6e.xlarge/g6e.2xlarge, an a10g pool
with an On-Demand base of 1, 80 % Spot, capacity-optimized, fallback ceiling 3). The gates (cdk-nag, cfn-lint,
no construct warnings, no lookups) run on it in test_gates.py.
"""

from __future__ import annotations

import json

import pytest

from fleetcast.contract import telemetry

from .synthesized import default_fleet, spot_fleet

STACK = "fleetcast-provider-ap-northeast-2"


@pytest.fixture(scope="module")
def fleet():
    return spot_fleet()


@pytest.fixture(scope="module")
def template(fleet) -> dict:
    return fleet.template_json(STACK)


def groups(template: dict) -> dict[str, dict]:
    return {r["Properties"]["AutoScalingGroupName"]: dict(r, id=k) for k, r in template["Resources"].items()
            if r["Type"] == "AWS::AutoScaling::AutoScalingGroup"}


def of_type(template: dict, type_: str) -> dict[str, dict]:
    return {k: r for k, r in template["Resources"].items() if r["Type"] == type_}


def test_each_spot_pool_has_an_on_demand_and_a_spot_group_behind_the_same_target_group(template):
    found = groups(template)
    assert set(found) == {"fleetcast-ap-northeast-2-l40s", "fleetcast-ap-northeast-2-l40s-spot",
                          "fleetcast-ap-northeast-2-a10g", "fleetcast-ap-northeast-2-a10g-spot"}
    (target_group,) = of_type(template, "AWS::ElasticLoadBalancingV2::TargetGroup")
    for group in found.values():
        assert group["Properties"]["TargetGroupARNs"] == [{"Ref": target_group}]


def test_both_groups_launch_from_the_pools_one_launch_template(template):
    found = groups(template)
    for pool in ("l40s", "a10g"):
        od = found[f"fleetcast-ap-northeast-2-{pool}"]["Properties"]
        spot = found[f"fleetcast-ap-northeast-2-{pool}-spot"]["Properties"]
        lt = od["LaunchTemplate"]["LaunchTemplateId"]
        assert spot["MixedInstancesPolicy"]["LaunchTemplate"]["LaunchTemplateSpecification"]["LaunchTemplateId"] == lt
        assert "LaunchTemplate" not in spot
        # The template's only volume is the encrypted root (the EC26 acknowledgment on the Spot group rests on it).
        (mapping,) = template["Resources"][lt["Ref"]]["Properties"]["LaunchTemplateData"]["BlockDeviceMappings"]
        assert mapping["Ebs"]["Encrypted"] is True


def test_the_spot_group_runs_the_configured_share_types_and_strategy_with_capacity_rebalance(template):
    found = groups(template)
    l40s = found["fleetcast-ap-northeast-2-l40s-spot"]["Properties"]
    dist = l40s["MixedInstancesPolicy"]["InstancesDistribution"]
    assert dist["OnDemandBaseCapacity"] == 0 and dist["OnDemandPercentageAboveBaseCapacity"] == 0
    assert dist["SpotAllocationStrategy"] == "price-capacity-optimized"
    assert [o["InstanceType"] for o in l40s["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"]] == [
        "g6e.xlarge", "g6e.2xlarge"]
    assert l40s["CapacityRebalance"] is True
    a10g = found["fleetcast-ap-northeast-2-a10g-spot"]["Properties"]
    dist = a10g["MixedInstancesPolicy"]["InstancesDistribution"]
    assert dist["OnDemandPercentageAboveBaseCapacity"] == 20 and dist["SpotAllocationStrategy"] == "capacity-optimized"


def test_the_on_demand_group_holds_the_base_and_the_spot_group_the_rest(template):
    found = groups(template)
    size = {name: (g["Properties"]["MinSize"], g["Properties"]["MaxSize"]) for name, g in found.items()}
    assert size["fleetcast-ap-northeast-2-l40s"] == ("2", "2")  # base = capacity.min 2
    assert size["fleetcast-ap-northeast-2-l40s-spot"] == ("0", "4")  # capacity.max 6 - base
    assert size["fleetcast-ap-northeast-2-a10g"] == ("1", "1")
    assert size["fleetcast-ap-northeast-2-a10g-spot"] == ("0", "4")


def test_only_the_on_demand_group_has_a_warm_pool(template):
    # "PutWarmPool ... cannot be called on an Auto Scaling group that has a mixed instances policy or a launch
    # template or launch configuration that requests Spot Instances" (Amazon EC2 Auto Scaling API Reference,
    # PutWarmPool; Warm pools for Amazon EC2 Auto Scaling, limitations).
    found = groups(template)
    pools = [w["Properties"]["AutoScalingGroupName"] for w in of_type(template, "AWS::AutoScaling::WarmPool").values()]
    assert pools == [{"Ref": found["fleetcast-ap-northeast-2-l40s"]["id"]}]


def test_both_groups_carry_the_same_launch_and_terminate_hooks(template):
    """In each group's own LifecycleHookSpecificationList, so the first instances launch with them
    (stacks/launch_order.py cites CloudFormation's AWS::AutoScaling::AutoScalingGroup reference)."""
    assert not of_type(template, "AWS::AutoScaling::LifecycleHook")
    for name, group in groups(template).items():
        specs = group["Properties"].get("LifecycleHookSpecificationList", [])
        assert {h["LifecycleHookName"] for h in specs} == {telemetry.LAUNCH_HOOK, telemetry.TERMINATE_HOOK}, name


def test_the_instance_role_completes_hooks_of_its_own_two_groups_only(template):
    policy = next(r for k, r in of_type(template, "AWS::IAM::Policy").items() if k.startswith("Pooll40sInstanceRole"))
    (statement,) = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s.get("Sid") == "OwnLifecycleHook"]
    text = json.dumps(statement["Resource"])
    assert text.count("autoScalingGroupName/") == 2
    assert "autoScalingGroupName/fleetcast-ap-northeast-2-l40s\"" in text
    assert "autoScalingGroupName/fleetcast-ap-northeast-2-l40s-spot\"" in text
    assert "a10g" not in text


def test_both_groups_roll_on_a_launch_template_change(template):
    for group in groups(template).values():
        refresh = group["UpdatePolicy"]["AutoScalingInstanceRefresh"]
        assert refresh["Preferences"]["AlarmSpecification"]["Alarms"]


def test_the_spot_group_scales_on_the_pools_load_and_scale_in_counts_both_groups(template):
    found = {g["id"]: name for name, g in groups(template).items()}
    tracked = {found[p["Properties"]["AutoScalingGroupName"]["Ref"]]
               for p in of_type(template, "AWS::AutoScaling::ScalingPolicy").values()
               if p["Properties"]["PolicyType"] == "TargetTrackingScaling"}
    # The On-Demand group's size is its base (and the fallback): only the Spot groups track load.
    assert tracked == {"fleetcast-ap-northeast-2-l40s-spot", "fleetcast-ap-northeast-2-a10g-spot"}
    alarms = {a["Properties"]["AlarmName"]: a for a in of_type(template, "AWS::CloudWatch::Alarm").values()}
    spot_scale_in = alarms["fleetcast-ap-northeast-2-l40s-spot-scale-in"]
    expression = next(m["Expression"] for m in spot_scale_in["Properties"]["Metrics"] if "Expression" in m)
    assert "FILL(inservice, 0) + FILL(peer0, 0)" in expression
    counted = {json.dumps(m["MetricStat"]["Metric"]["Dimensions"]) for m in spot_scale_in["Properties"]["Metrics"]
               if m.get("MetricStat", {}).get("Metric", {}).get("MetricName") == "GroupInServiceInstances"}
    assert len(counted) == 2
    assert "fleetcast-ap-northeast-2-l40s-scale-in" in alarms


def test_a_spot_capacity_failure_reaches_the_fallback_through_the_launch_failure_rule(template):
    rules = of_type(template, "AWS::Events::Rule").values()
    failure = next(r for r in rules if "EC2 Instance Launch Unsuccessful" in r["Properties"]["EventPattern"]["detail-type"])
    watched = failure["Properties"]["EventPattern"]["detail"]["AutoScalingGroupName"]
    assert len(watched) == 4  # both groups of both pools
    functions = of_type(template, "AWS::Lambda::Function")
    (fallback_id,) = [k for k in functions if k.startswith("OperationsSpotFallback")]
    target_arns = [t["Arn"] for t in failure["Properties"]["Targets"]]
    assert {"Fn::GetAtt": [fallback_id, "Arn"]} in target_arns
    pools = json.loads(functions[fallback_id]["Properties"]["Environment"]["Variables"]["POOLS"])
    assert pools == {
        "fleetcast-ap-northeast-2-a10g-spot": {"base": 1, "ceiling": 3, "on_demand": "fleetcast-ap-northeast-2-a10g"},
        "fleetcast-ap-northeast-2-l40s-spot": {"base": 2, "ceiling": 6, "on_demand": "fleetcast-ap-northeast-2-l40s"},
    }
    launched = next(r for r in rules if r["Properties"]["EventPattern"]["detail-type"] == ["EC2 Instance Launch Successful"])
    assert len(launched["Properties"]["EventPattern"]["detail"]["AutoScalingGroupName"]) == 2


def test_the_fallback_reserves_no_concurrency_so_a_low_quota_account_can_deploy_it(template):
    # Lambda API Reference, PutFunctionConcurrency (botocore's lambda model): "You can reserve concurrency ... as
    # long as you leave at least 100 simultaneous executions unreserved". An account whose quota is at or near
    # 100 (new accounts start lower) rejects any reservation, and the stack with it.
    import re

    import botocore.session

    doc = botocore.session.get_session().get_service_model("lambda").operation_model("PutFunctionConcurrency")
    assert "leave at least 100 simultaneous executions unreserved" in re.sub(r"<[^>]+>", "", doc.documentation)
    for function in of_type(template, "AWS::Lambda::Function").values():
        assert "ReservedConcurrentExecutions" not in function["Properties"]


def test_the_fallback_may_resize_only_the_on_demand_groups_and_only_up_to_their_ceilings(template):
    # autoscaling:MaxSize is a Numeric condition key of UpdateAutoScalingGroup (Service Authorization Reference,
    # "Actions, resources, and condition keys for Amazon EC2 Auto Scaling").
    policy = next(r for k, r in of_type(template, "AWS::IAM::Policy").items() if k.startswith("OperationsSpotFallback"))
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    updates = [s for s in statements if s["Action"] == "autoscaling:UpdateAutoScalingGroup"]
    ceilings = {}
    for s in updates:
        (name,) = [part for part in json.dumps(s["Resource"]).split("autoScalingGroupName/")[1:]]
        ceilings[name.split('"')[0]] = s["Condition"]["NumericLessThanEquals"]["autoscaling:MaxSize"]
    assert ceilings == {"fleetcast-ap-northeast-2-l40s": 6, "fleetcast-ap-northeast-2-a10g": 3}
    others = {a for s in statements if s not in updates for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert others == {"autoscaling:DescribeAutoScalingGroups", "logs:CreateLogStream", "logs:PutLogEvents"}


def test_spot_alarms_and_dashboard_show_spot_interruptions_and_fallback_apart(template):
    alarms = {a["Properties"]["AlarmName"] for a in of_type(template, "AWS::CloudWatch::Alarm").values()}
    for pool in ("l40s", "a10g"):
        assert {f"fleetcast-ap-northeast-2-{pool}-spot-interruptions", f"fleetcast-ap-northeast-2-{pool}-spot-drain-cut",
                f"fleetcast-ap-northeast-2-{pool}-on-demand-fallback"} <= alarms
    (dashboard,) = of_type(template, "AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for text in ("Spot tier: instances in service", "Spot interruptions and drains", "On-Demand fallback",
                 telemetry.SPOT_INTERRUPTION, telemetry.SPOT_DRAIN_CUT, telemetry.SPOT_DRAIN_COMPLETED, "l40s Spot"):
        assert text in body


def test_a_config_without_spot_synthesizes_no_spot_resources():
    fleet = default_fleet()
    for stack in ("fleetcast-provider-ap-northeast-2", "fleetcast-provider-us-east-1"):
        template = fleet.template_json(stack)
        assert len(groups(template)) == 1
        assert not [k for k in template["Resources"] if "Spot" in k]
        assert not any(g["Properties"].get("MixedInstancesPolicy") for g in groups(template).values())
        assert "Spot" not in json.dumps(of_type(template, "AWS::CloudWatch::Dashboard"))


def test_every_spot_acknowledgment_matches_a_real_finding_and_covers_it(monkeypatch):
    """The acknowledgment gate of test_gates.py, on the spot config: no finding of the Spot group or the
    fallback hides behind a broad acknowledgment, and none of theirs is stale."""

    from stacks import nag

    from .synthesized import spot_doc
    from .test_gates import unacknowledged_findings, uncovered_and_stale

    findings = unacknowledged_findings(monkeypatch, spot_doc(), "spot-unacknowledged")
    acknowledged = set(nag.RECORDED)
    uncovered, stale = uncovered_and_stale(findings, acknowledged)
    assert not uncovered, f"findings without an acknowledgment: {sorted(uncovered)}"
    assert not stale, f"acknowledgments that match no finding: {sorted(stale)}"
    assert any("SpotGroup" in p for p, _ in acknowledged) and any("SpotFallback" in p for p, _ in acknowledged)
