"""First deploy order: no instance launches without its lifecycle hooks, and none before the region is staged.

1. Hooks: AWS CloudFormation, AWS::AutoScaling::AutoScalingGroup, property LifecycleHookSpecificationList:
   "One or more lifecycle hooks to add to the Auto Scaling group before instances are launched"
   (https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-autoscaling-autoscalinggroup.html;
   the CreateAutoScalingGroup API parameter of the same name says the same). A separate
   AWS::AutoScaling::LifecycleHook resource is created after the group it names (it references it),
   i.e. after the group's first instances launched: they would go InService with no engine.
2. Hold: `-c hold_capacity=<regions>` (fleetcast/contract/capacity_hold.py) gives every group of those regions
   MinSize = MaxSize = 0 and no warm pool, scaling policy or schedule, so nothing launches until `fleetcast deploy`'s
   capacity step deploys again without it; that second deploy changes only sizes (UpdateAutoScalingGroup:
   "If you specify a new value for MinSize without specifying a value for DesiredCapacity, and the new
   MinSize is larger than the current size of the group, this sets the group's DesiredCapacity to the new
   MinSize value", https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_UpdateAutoScalingGroup.html),
   never the launch template, so it rolls nothing.
"""

from __future__ import annotations

import pytest

from fleetcast.contract import telemetry
from fleetcast.contract.capacity_hold import HELD_OUTPUT, HOLD_CONTEXT, hold_context_args, parse_held_regions
from fleetcast.contract.errors import UserError
from tests.cfn_lint import assert_lint_clean

from .synthesized import (
    bench_mode_fleet,
    default_doc,
    default_fleet,
    nat_fleet,
    spot_doc,
    spot_fleet,
    synthesize,
    variant_doc,
    variant_fleet,
)

FLEETS = {"default": default_fleet, "variant": variant_fleet, "nat": nat_fleet, "bench": bench_mode_fleet,
          "spot": spot_fleet}
SEOUL, VIRGINIA = "fleetcast-provider-ap-northeast-2", "fleetcast-provider-us-east-1"


@pytest.mark.parametrize("which", sorted(FLEETS))
def test_every_group_is_created_with_its_hooks(which):
    fleet = FLEETS[which]()
    groups = 0
    for name in fleet.stacks:
        assert not fleet.resources(name, "AWS::AutoScaling::LifecycleHook"), f"{name}: a hook created after its group"
        for group_id, group in fleet.resources(name, "AWS::AutoScaling::AutoScalingGroup").items():
            hooks = {h["LifecycleHookName"]: h for h in group["Properties"].get("LifecycleHookSpecificationList", [])}
            groups += 1
            if "BenchProbe" in group_id:
                continue  # the consumer probe joins no target group and runs no hooked runtime
            launch = hooks.get(telemetry.LAUNCH_HOOK)
            assert launch, f"{name}/{group_id}: no launch hook in the group's own list"
            assert (launch["LifecycleTransition"], launch["DefaultResult"]) == (
                "autoscaling:EC2_INSTANCE_LAUNCHING", "ABANDON")
            if "Bench" not in group_id:  # serving pools drain through the termination hook
                terminate = hooks[telemetry.TERMINATE_HOOK]
                assert terminate["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
    assert groups


@pytest.fixture(scope="module")
def held():
    """The default config with Seoul held, as `fleetcast deploy` synthesizes a region not staged yet."""
    return synthesize(default_doc(), "held", {HOLD_CONTEXT: "ap-northeast-2"})


def test_a_held_region_launches_nothing(held):
    (group,) = held.resources(SEOUL, "AWS::AutoScaling::AutoScalingGroup").values()
    props = group["Properties"]
    assert (props["MinSize"], props["MaxSize"]) == ("0", "0") and "DesiredCapacity" not in props
    assert not held.resources(SEOUL, "AWS::AutoScaling::WarmPool")
    assert not held.resources(SEOUL, "AWS::AutoScaling::ScheduledAction")
    assert not held.resources(SEOUL, "AWS::AutoScaling::ScalingPolicy")
    assert held.template_json(SEOUL)["Outputs"][HELD_OUTPUT]["Value"] == "true"
    # The hooks are there all the same: the released group's first instances get them.
    assert {h["LifecycleHookName"] for h in props["LifecycleHookSpecificationList"]} == {
        telemetry.LAUNCH_HOOK, telemetry.TERMINATE_HOOK}


def test_releasing_a_held_region_changes_sizes_only(held):
    fleet = default_fleet()
    released, holding = fleet.template_json(SEOUL)["Resources"], held.template_json(SEOUL)["Resources"]
    changed = {k for k in set(released) | set(holding) if released.get(k) != holding.get(k)}
    groups = {k for k, v in released.items() if v["Type"] in ("AWS::AutoScaling::AutoScalingGroup",
                                                              "AWS::AutoScaling::WarmPool")}
    scaling = {k for k, v in released.items() if v["Type"] == "AWS::AutoScaling::ScalingPolicy"
               or (v["Type"] == "AWS::CloudWatch::Alarm" and ("ScaleInAlarm" in k or "SloRatioAlarm" in k))}
    assert scaling and not any(released[k]["Type"] == "AWS::EC2::LaunchTemplate" for k in changed)
    # Only the group's sizes, its warm pool and its scaling differ: no launch template change.
    assert changed == groups | scaling, sorted(changed - groups - scaling)
    (group_id,) = (k for k in groups if released[k]["Type"] == "AWS::AutoScaling::AutoScalingGroup")
    diff = {k for k in released[group_id]["Properties"]
            if released[group_id]["Properties"][k] != holding[group_id]["Properties"].get(k)}
    assert diff == {"MinSize", "MaxSize"}
    # The region not named keeps its capacity: a hold is per region.
    assert held.template_json(VIRGINIA) == fleet.template_json(VIRGINIA)


def test_a_fixed_desired_size_is_held_at_zero_too():
    doc = variant_doc()
    fleet = synthesize(doc, "variant-held", {HOLD_CONTEXT: "ap-northeast-2,us-east-1"})
    for name in (SEOUL, VIRGINIA):
        for group in fleet.resources(name, "AWS::AutoScaling::AutoScalingGroup").values():
            props = group["Properties"]
            assert (props["MinSize"], props["MaxSize"], props.get("DesiredCapacity", "0")) == ("0", "0", "0")


def test_holding_a_region_the_config_lacks_is_refused():
    with pytest.raises(UserError, match="eu-west-1 is not a region of the config"):
        synthesize(default_doc(), "held-unknown", {HOLD_CONTEXT: "eu-west-1"})


def test_hold_context_round_trip():
    args = hold_context_args(["us-east-1", "ap-northeast-2", "us-east-1"])
    assert args == ["-c", f"{HOLD_CONTEXT}=ap-northeast-2,us-east-1"]
    assert parse_held_regions(args[1].split("=", 1)[1]) == {"ap-northeast-2", "us-east-1"}
    assert hold_context_args([]) == [] and parse_held_regions(None) == frozenset()


def test_a_held_spot_pool_holds_both_groups_at_zero():
    fleet = synthesize(spot_doc(), "spot-held", {HOLD_CONTEXT: "ap-northeast-2"})
    groups = fleet.resources(SEOUL, "AWS::AutoScaling::AutoScalingGroup").values()
    assert len(groups) == 4  # two spot pools, each an On-Demand and a Spot group
    assert {(g["Properties"]["MinSize"], g["Properties"]["MaxSize"]) for g in groups} == {("0", "0")}
    assert not fleet.resources(SEOUL, "AWS::AutoScaling::ScalingPolicy")
    assert_lint_clean(fleet.outdir / f"{SEOUL}.template.json")


def test_the_held_template_passes_cfn_lint(held):
    assert_lint_clean(held.outdir / f"{SEOUL}.template.json")
