"""Fleet operations on the real provider stacks of the default config (config/fleet.yaml): every
region gets scaling, termination hook, warm pool, instance refresh, alarms, events and a dashboard,
wired to the provider's own target group, topic and key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aws_cdk import cx_api
from aws_cdk.assertions import Match, Template

from fleetcast.config import load_config
from fleetcast.contract import nlb, telemetry
from fleetcast.contract.names import provider_stack_name
from stacks.fleet_lifecycle import TERMINATE_HOOK_MARGIN_S
from tests.cfn_lint import assert_lint_clean

from .synthesized import default_fleet, operations_fleet

ROOT = Path(__file__).resolve().parents[2]
CFG = load_config(ROOT / "config" / "fleet.yaml")
REGIONS = [r.region for r in CFG.regions]


@pytest.fixture(scope="module")
def templates() -> dict[str, tuple[Template, object]]:
    # The default config's fleet every stack test shares (tests/stacks/synthesized.py: built and synthesized once
    # per run, cdk-nag on, an unacknowledged finding fails it), not a second synthesis of the same app.
    fleet = default_fleet()
    return {r: (Template.from_stack(fleet.stacks[provider_stack_name(CFG.name, r)]),
                fleet.stacks[provider_stack_name(CFG.name, r)]) for r in REGIONS}


def resources(template: Template, resource_type: str) -> dict:
    return template.find_resources(resource_type)


@pytest.mark.parametrize("region", REGIONS)
def test_each_pool_scales_on_runtime_load_with_a_termination_hook_and_a_warm_pool(templates, region):
    template, _ = templates[region]
    pools = CFG.region(region).pools
    # Per pool: load target tracking, one-at-a-time scale-in, SLO protection (step scaling).
    template.resource_count_is("AWS::AutoScaling::ScalingPolicy", 3 * len(pools))
    for pool in pools:
        template.has_resource_properties("AWS::AutoScaling::ScalingPolicy", {
            "PolicyType": "TargetTrackingScaling",
            "TargetTrackingConfiguration": Match.object_like({
                "TargetValue": pool.scaling.target,
                "CustomizedMetricSpecification": Match.object_like({
                    "Namespace": telemetry.NAMESPACE,
                    "Dimensions": [{"Name": "Fleet", "Value": CFG.name}, {"Name": "Pool", "Value": pool.name}],
                }),
            }),
        })
    assert not resources(template, "AWS::AutoScaling::LifecycleHook")
    (group,) = resources(template, "AWS::AutoScaling::AutoScalingGroup").values()
    hooks = {h["LifecycleHookName"]: h for h in group["Properties"]["LifecycleHookSpecificationList"]}
    assert set(hooks) == {telemetry.LAUNCH_HOOK, telemetry.TERMINATE_HOOK}
    assert hooks[telemetry.TERMINATE_HOOK]["HeartbeatTimeout"] == CFG.operations.drain_timeout_s + TERMINATE_HOOK_MARGIN_S
    assert hooks[telemetry.TERMINATE_HOOK]["DefaultResult"] == "CONTINUE"
    template.resource_count_is("AWS::AutoScaling::WarmPool", sum(1 for p in pools if p.warm_pool.size))


@pytest.mark.parametrize("region", REGIONS)
def test_deregistration_delay_lets_the_longest_request_finish_before_the_hook_drains(templates, region):
    template, _ = templates[region]
    (group,) = resources(template, "AWS::ElasticLoadBalancingV2::TargetGroup").values()
    attributes = {a["Key"]: a["Value"] for a in group["Properties"]["TargetGroupAttributes"]}
    assert int(attributes["deregistration_delay.timeout_seconds"]) >= CFG.operations.drain_timeout_s
    # Set on purpose, not left to the default: open streams are not cut at deregistration.
    assert attributes["deregistration_delay.connection_termination.enabled"] == "false"


@pytest.mark.parametrize("region", REGIONS)
def test_a_target_that_turns_unhealthy_because_it_drains_keeps_its_open_streams_for_the_whole_drain(templates, region):
    # A Spot notice or rebalance drain answers /health 503 while the target is still registered. The NLB resets
    # an unhealthy target's connections unless unhealthy connection termination is off (NLB User Guide, "Health
    # checks for Network Load Balancer target groups"; attribute semantics: tests/contract/test_nlb.py).
    template, _ = templates[region]
    (group,) = resources(template, "AWS::ElasticLoadBalancingV2::TargetGroup").values()
    attributes = {a["Key"]: a["Value"] for a in group["Properties"]["TargetGroupAttributes"]}
    assert attributes["target_health_state.unhealthy.connection_termination.enabled"] == "false"
    # The gateway drains at most drain_timeout_s (a notice only shortens it: runtime.spot.drain_budget_s).
    assert int(attributes["target_health_state.unhealthy.draining_interval_seconds"]) >= CFG.operations.drain_timeout_s
    # New flows stop after the unhealthy threshold the runtime's docs and the runbook quote (contract/nlb.py).
    checks = (group["Properties"]["HealthCheckIntervalSeconds"], group["Properties"]["UnhealthyThresholdCount"])
    assert checks == (nlb.HEALTH_INTERVAL_S, nlb.UNHEALTHY_THRESHOLD)


@pytest.mark.parametrize("region", REGIONS)
def test_every_group_rolls_out_by_instance_refresh_watched_by_its_own_alarms(templates, region):
    template, _ = templates[region]
    alarms = resources(template, "AWS::CloudWatch::Alarm")
    for group in resources(template, "AWS::AutoScaling::AutoScalingGroup").values():
        refresh = group["UpdatePolicy"]["AutoScalingInstanceRefresh"]
        watched = [ref["Ref"] for ref in refresh["Preferences"]["AlarmSpecification"]["Alarms"]]
        names = [alarms[w]["Properties"]["AlarmName"] for w in watched]
        pool = group["Properties"]["AutoScalingGroupName"].rsplit("-", 1)[-1]
        assert any(n.endswith(f"{pool}-ttft-p99") for n in names) and any(n.endswith("no-healthy-hosts") for n in names)
        assert refresh["Preferences"]["MinHealthyPercentage"] > 0


@pytest.mark.parametrize("region", REGIONS)
def test_alarms_events_and_dashboard_reach_the_providers_encrypted_topic(templates, region):
    template, stack = templates[region]
    (topic_id,) = resources(template, "AWS::SNS::Topic")
    pools = CFG.region(region).pools
    paging = {k: a for k, a in resources(template, "AWS::CloudWatch::Alarm").items()
              if a["Properties"]["AlarmActions"] == [{"Ref": topic_id}]}
    assert len(paging) == 2 + 6 * len(pools)
    (rule,) = resources(template, "AWS::Events::Rule").values()
    assert rule["Properties"]["Targets"][0]["Arn"] == {"Ref": topic_id}
    (dashboard,) = resources(template, "AWS::CloudWatch::Dashboard").values()
    assert dashboard["Properties"]["DashboardName"] == f"{CFG.name}-{region}"


@pytest.mark.parametrize("region", REGIONS)
def test_topic_key_lets_cloudwatch_and_eventbridge_publish(templates, region):
    template, _ = templates[region]
    (topic,) = resources(template, "AWS::SNS::Topic").values()
    key_id = topic["Properties"]["KmsMasterKeyId"]["Fn::GetAtt"][0]
    key = resources(template, "AWS::KMS::Key")[key_id]
    allowed = set()
    for statement in key["Properties"]["KeyPolicy"]["Statement"]:
        services = statement.get("Principal", {}).get("Service", [])
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if "kms:GenerateDataKey*" in actions and "kms:Decrypt" in actions:
            allowed.update([services] if isinstance(services, str) else services)
    assert {"cloudwatch.amazonaws.com", "events.amazonaws.com", "vpce.amazonaws.com"} <= allowed


@pytest.mark.parametrize("region", REGIONS)
def test_new_endpoint_connection_requests_are_notified_to_the_topic(templates, region):
    template, _ = templates[region]
    (topic_id,) = resources(template, "AWS::SNS::Topic")
    template.has_resource_properties("AWS::EC2::VPCEndpointConnectionNotification", {
        "ConnectionEvents": Match.array_with(["Connect"]),
        "ConnectionNotificationArn": {"Ref": topic_id},
    })



def test_every_operations_option_passes_cdk_nag_and_cfn_lint():
    """The default config leaves schedules, reservations, KV-cache scaling and email off: turn them on
    (tests/stacks/synthesized.py operations_fleet, synthesized with cdk-nag: a finding fails it)."""
    fleet = operations_fleet()
    cfg = fleet.cfg
    templates = [str(fleet.outdir / f"{provider_stack_name(cfg.name, r)}.template.json") for r in REGIONS]
    assert_lint_clean(*templates)
    seoul_template = json.loads(Path(templates[0]).read_text())
    types = [r["Type"] for r in seoul_template["Resources"].values()]
    assert types.count("AWS::AutoScaling::ScheduledAction") == 2 and "AWS::SNS::Subscription" in types
    assembly = cx_api.CloudAssembly(str(fleet.outdir))  # the assembly synth wrote, read back
    assert assembly.get_stack_by_name(provider_stack_name(cfg.name, REGIONS[1])) is not None
