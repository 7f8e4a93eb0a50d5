"""Fleet operations (issue 4) on a small fixture stack: one VPC, one ASG per pool, an NLB with one
target group, a KMS-encrypted topic. Each test states one operational property of the template.

The same constructs on the real provider stacks are covered in test_operations_provider.py.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from aws_cdk import (
    App,
    Duration,
    Environment,
    Stack,
    aws_autoscaling as autoscaling,
    aws_ec2 as ec2,
    aws_elasticloadbalancingv2 as elbv2,
    aws_kms as kms,
    aws_sns as sns,
)
from aws_cdk.assertions import Match, Template
from ruamel.yaml import YAML

from fleetcast.config import ConfigError, FleetConfig, parse_config
from fleetcast.contract import telemetry
from stacks.fleet_lifecycle import TERMINATE_HOOK_MARGIN_S
from stacks.fleet_operations import FleetOperations
from stacks.fleet_scaling import SCALE_IN_EVALUATION_MINUTES

ROOT = Path(__file__).resolve().parents[2]
SEOUL = 0  # index of ap-northeast-2 in config/fleet.yaml


@pytest.fixture(scope="module")
def base_doc() -> dict:
    return YAML(typ="safe").load((ROOT / "config" / "fleet.yaml").read_text())


class FixtureStack(Stack):
    """Env-bound like a provider stack, with its AZs pinned so nothing is looked up."""

    def __init__(self, scope, construct_id, *, azs: list[str], **kwargs) -> None:
        self._azs = azs
        super().__init__(scope, construct_id, **kwargs)

    @property
    def availability_zones(self) -> list[str]:
        return self._azs


def synth(cfg: FleetConfig, region_index: int = SEOUL) -> tuple[Template, FixtureStack]:
    region = cfg.regions[region_index]
    app = App(context=json.loads((ROOT / "cdk.json").read_text())["context"])
    stack = FixtureStack(app, "Fixture", azs=[az.name for az in region.availability_zones],
                         env=Environment(account=cfg.provider.account, region=region.region))
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=0,
                  subnet_configuration=[ec2.SubnetConfiguration(name="private", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)])
    fleets = {}
    for pool in region.pools:
        template = ec2.LaunchTemplate(stack, f"Lt-{pool.name}", instance_type=ec2.InstanceType(pool.instance_type),
                                      machine_image=ec2.MachineImage.generic_linux({region.region: region.ami.id}),
                                      require_imdsv2=True)
        asg = autoscaling.AutoScalingGroup(
            stack, f"Asg-{pool.name}", vpc=vpc, launch_template=template,
            auto_scaling_group_name=f"{cfg.name}-{region.region}-{pool.name}",
            min_capacity=pool.capacity.min, desired_capacity=pool.capacity.desired, max_capacity=pool.capacity.max,
        )
        fleets[pool.name] = SimpleNamespace(pool=pool, asg=asg)
    nlb = elbv2.NetworkLoadBalancer(stack, "Nlb", vpc=vpc, internet_facing=False)
    target_group = elbv2.NetworkTargetGroup(stack, "Tg", vpc=vpc, port=8000, protocol=elbv2.Protocol.TCP,
                                            deregistration_delay=Duration.seconds(cfg.operations.drain_timeout_s))
    nlb.add_listener("Listener", port=8000, default_target_groups=[target_group])
    for fleet in fleets.values():
        fleet.asg.attach_to_network_target_group(target_group)
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    topic = sns.Topic(stack, "Topic", master_key=key)
    FleetOperations(stack, "Operations", cfg=cfg, region=region, fleets=fleets,
                    service=SimpleNamespace(nlb=nlb, target_group=target_group),
                    notifications=SimpleNamespace(topic=topic, key=key))
    return Template.from_stack(stack), stack


def configure(base_doc: dict, **pool_changes) -> FleetConfig:
    """The default config with the Seoul pool changed."""
    doc = copy.deepcopy(base_doc)
    doc["regions"][SEOUL]["pools"][0].update(pool_changes)
    return parse_config(doc)


@pytest.fixture(scope="module")
def default(base_doc) -> tuple[FleetConfig, Template, FixtureStack]:
    cfg = parse_config(copy.deepcopy(base_doc))
    template, stack = synth(cfg)
    return cfg, template, stack


def logical_id(stack: Stack, template: Template, resource_type: str, **props) -> str:
    found = template.find_resources(resource_type, {"Properties": props} if props else None)
    assert len(found) == 1, f"expected one {resource_type} with {props}, found {list(found)}"
    return next(iter(found))


def alarm_named(template: Template, suffix: str) -> tuple[str, dict]:
    alarms = {k: v for k, v in template.find_resources("AWS::CloudWatch::Alarm").items()
              if v["Properties"].get("AlarmName", "").endswith(suffix)}
    assert len(alarms) == 1, f"expected one alarm named *{suffix}, found {list(alarms)}"
    return next(iter(alarms.items()))


# ---------------------------------------------------------------- 1. scaling on inference load


def test_scale_out_tracks_the_pools_per_instance_load_from_the_runtime(default):
    cfg, template, _ = default
    pool = cfg.regions[SEOUL].pools[0]
    template.has_resource_properties("AWS::AutoScaling::ScalingPolicy", {
        "PolicyType": "TargetTrackingScaling",
        "EstimatedInstanceWarmup": pool.scaling.scale_out_cooldown_s,
        "TargetTrackingConfiguration": {
            "TargetValue": 12,  # scaling.target in config/fleet.yaml
            "DisableScaleIn": True,
            "CustomizedMetricSpecification": {
                "Namespace": telemetry.NAMESPACE,
                "MetricName": telemetry.ACTIVE_REQUESTS,
                "Statistic": "Average",
                "Dimensions": [{"Name": "Fleet", "Value": cfg.name}, {"Name": "Pool", "Value": pool.name}],
            },
        },
    })


def test_scale_in_removes_one_instance_per_cooldown_only_if_the_rest_stay_under_target(default):
    cfg, template, stack = default
    pool = cfg.regions[SEOUL].pools[0]
    policy = logical_id(stack, template, "AWS::AutoScaling::ScalingPolicy", PolicyType="SimpleScaling")
    template.has_resource_properties("AWS::AutoScaling::ScalingPolicy", {
        "PolicyType": "SimpleScaling", "AdjustmentType": "ChangeInCapacity", "ScalingAdjustment": -1,
        "Cooldown": str(pool.scaling.scale_in_cooldown_s),
    })
    _, alarm = alarm_named(template, f"{pool.name}-scale-in")
    props = alarm["Properties"]
    assert props["AlarmActions"] == [{"Fn::GetAtt": [policy, "Arn"]}]
    assert props["ComparisonOperator"] == "LessThanThreshold" and props["Threshold"] == 12
    assert props["EvaluationPeriods"] == props["DatapointsToAlarm"] == SCALE_IN_EVALUATION_MINUTES
    queries = {q["Id"]: q for q in props["Metrics"]}
    expression = next(q["Expression"] for q in queries.values() if "Expression" in q)
    assert "load * inservice / (inservice - 1)" in expression
    assert queries["inservice"]["MetricStat"]["Metric"]["MetricName"] == "GroupInServiceInstances"
    assert queries["load"]["MetricStat"]["Metric"]["MetricName"] == telemetry.ACTIVE_REQUESTS


def test_group_metrics_are_collected_for_scaling_and_the_dashboard(default):
    _, template, _ = default
    template.has_resource_properties("AWS::AutoScaling::AutoScalingGroup",
                                     {"MetricsCollection": [{"Granularity": "1Minute"}]})


def test_kv_cache_scaling_and_daily_schedule_come_from_the_config(base_doc):
    cfg = configure(base_doc, scaling={"metric": "kv_cache_utilization", "target": 70},
                    schedule=[{"cron": "0 23 * * *", "min": 2, "max": 6, "desired": 3},
                              {"cron": "0 14 * * *", "min": 1, "max": 4}])
    template, _ = synth(cfg)
    template.has_resource_properties("AWS::AutoScaling::ScalingPolicy", {"TargetTrackingConfiguration": {
        "TargetValue": 70,
        "CustomizedMetricSpecification": Match.object_like({"MetricName": telemetry.KV_CACHE_UTILIZATION}),
    }})
    template.resource_count_is("AWS::AutoScaling::ScheduledAction", 2)
    template.has_resource_properties("AWS::AutoScaling::ScheduledAction", {
        "Recurrence": "0 23 * * *", "MinSize": 2, "MaxSize": 6, "DesiredCapacity": 3, "TimeZone": "Etc/UTC"})
    template.has_resource_properties("AWS::AutoScaling::ScheduledAction", {
        "Recurrence": "0 14 * * *", "MinSize": 1, "MaxSize": 4, "DesiredCapacity": Match.absent()})


# ---------------------------------------------------------------- 2. leaving cleanly


def test_termination_hook_gives_the_runtime_the_drain_timeout_and_then_continues(default):
    cfg, template, _ = default
    # In the group's own hook list (created with the group), not a separate resource.
    template.resource_count_is("AWS::AutoScaling::LifecycleHook", 0)
    template.has_resource_properties("AWS::AutoScaling::AutoScalingGroup", {
        "LifecycleHookSpecificationList": Match.array_with([{
            "LifecycleHookName": telemetry.TERMINATE_HOOK,
            "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
            "HeartbeatTimeout": cfg.operations.drain_timeout_s + TERMINATE_HOOK_MARGIN_S,
            "DefaultResult": "CONTINUE",
        }]),
    })


# ---------------------------------------------------------------- 3. warm pool


def test_warm_pool_is_exactly_the_configured_size_stopped_and_reused_on_scale_in(default):
    _, template, _ = default
    template.resource_count_is("AWS::AutoScaling::WarmPool", 1)
    template.has_resource_properties("AWS::AutoScaling::WarmPool", {
        "MinSize": 1, "MaxGroupPreparedCapacity": 1, "PoolState": "Stopped",
        "InstanceReusePolicy": {"ReuseOnScaleIn": True},
    })


def test_no_warm_pool_when_size_is_zero(base_doc):
    template, _ = synth(configure(base_doc, warm_pool={"size": 0}))
    template.resource_count_is("AWS::AutoScaling::WarmPool", 0)


def test_failed_launches_and_warm_pool_starts_reach_the_topic_with_their_cause(default):
    cfg, template, stack = default
    topic = logical_id(stack, template, "AWS::SNS::Topic")
    rules = template.find_resources("AWS::Events::Rule")
    assert len(rules) == 1
    rule = next(iter(rules.values()))["Properties"]
    pattern = rule["EventPattern"]
    assert pattern["source"] == ["aws.autoscaling"]
    assert "EC2 Instance Launch Unsuccessful" in pattern["detail-type"]
    assert len(pattern["detail"]["AutoScalingGroupName"]) == len(cfg.regions[SEOUL].pools)
    (target,) = rule["Targets"]
    assert target["Arn"] == {"Ref": topic}
    transformer = target["InputTransformer"]
    assert transformer["InputPathsMap"]["detail-Cause"] == "$.detail.Cause"
    assert transformer["InputPathsMap"]["detail-StatusMessage"] == "$.detail.StatusMessage"
    assert "<detail-Cause>" in transformer["InputTemplate"]
    # Plain dotted paths only: EventBridge rejects a rule whose input path it cannot parse.
    assert all(re.fullmatch(r"\$(\.[A-Za-z0-9_-]+)+", path) for path in transformer["InputPathsMap"].values())


# ---------------------------------------------------------------- 4. safe rollouts


def test_config_changes_roll_out_by_instance_refresh_watched_by_the_slo_alarms(default):
    cfg, template, _ = default
    rollout = cfg.regions[SEOUL].pools[0].rollout
    (group,) = template.find_resources("AWS::AutoScaling::AutoScalingGroup").values()
    policy = group["UpdatePolicy"]
    assert "AutoScalingRollingUpdate" not in policy and "AutoScalingReplacingUpdate" not in policy
    refresh = policy["AutoScalingInstanceRefresh"]
    assert refresh["Strategy"] == "Rolling"
    prefs = refresh["Preferences"]
    assert prefs["MinHealthyPercentage"] == rollout.min_healthy_percentage == 90
    assert prefs["MaxHealthyPercentage"] == rollout.max_healthy_percentage == 110
    assert prefs["CheckpointPercentages"] == [50, 100]
    assert prefs["CheckpointDelay"] == rollout.checkpoint_delay_s
    assert prefs["BakeTime"] == rollout.bake_time_s
    assert prefs["InstanceWarmup"] == rollout.instance_warmup_s
    watched = {ref["Ref"] for ref in prefs["AlarmSpecification"]["Alarms"]}
    for suffix in ("ttft-p99", "itl-p99", "error-rate", "engine-build-failures", "build-circuit-breaker",
                   "no-healthy-hosts"):
        assert alarm_named(template, suffix)[0] in watched, suffix
    assert policy["AutoScalingScheduledAction"] == {"IgnoreUnmodifiedGroupSizeProperties": True}


@pytest.mark.parametrize("rollout, complaint", [
    ({"min_healthy_percentage": 0, "max_healthy_percentage": 100}, "replaces every instance at once"),
    ({"min_healthy_percentage": 50, "max_healthy_percentage": 200}, "at most 100"),
])
def test_config_rejects_rollouts_that_could_replace_everything_at_once(base_doc, rollout, complaint):
    with pytest.raises(ConfigError) as caught:
        configure(base_doc, rollout=rollout)
    assert complaint in str(caught.value)
    assert "rollout" in str(caught.value)


# ---------------------------------------------------------------- 5. alarms


@pytest.fixture(scope="module")
def strict(base_doc) -> tuple[FleetConfig, Template, FixtureStack]:
    """Non-default SLOs, to show each threshold is read from the config."""
    doc = copy.deepcopy(base_doc)
    doc["slo"] = {"ttft_p99_ms": 250, "itl_p99_ms": 33, "error_rate": 0.005}
    doc["operations"]["alarm_email"] = "oncall@example.com"
    cfg = parse_config(doc)
    template, stack = synth(cfg)
    return cfg, template, stack


@pytest.mark.parametrize("suffix, metric, statistic, threshold", [
    ("ttft-p99", telemetry.TTFT_MS, "p99", 250),
    ("itl-p99", telemetry.ITL_MS, "p99", 33),
])
def test_p99_latency_alarms_read_raw_per_request_values_against_the_slo(strict, suffix, metric, statistic, threshold):
    cfg, template, stack = strict
    topic = logical_id(stack, template, "AWS::SNS::Topic")
    _, alarm = alarm_named(template, suffix)
    props = alarm["Properties"]
    assert props["Namespace"] == telemetry.NAMESPACE and props["MetricName"] == metric
    assert props["ExtendedStatistic"] == statistic and "Statistic" not in props
    assert props["Dimensions"] == [{"Name": "Fleet", "Value": cfg.name}, {"Name": "Pool", "Value": "l40s"}]
    assert props["Threshold"] == threshold and props["ComparisonOperator"] == "GreaterThanThreshold"
    assert props["TreatMissingData"] == "notBreaching"
    assert props["AlarmActions"] == [{"Ref": topic}] and props["OKActions"] == [{"Ref": topic}]


def test_error_rate_alarm_divides_runtime_errors_by_requests(strict):
    _, template, _ = strict
    _, alarm = alarm_named(template, "error-rate")
    props = alarm["Properties"]
    assert props["Threshold"] == 0.005
    queries = {q["Id"]: q for q in props["Metrics"]}
    (expression,) = [q for q in queries.values() if "Expression" in q]
    assert expression["Expression"] == "FILL(errors, 0) / requests" and expression["ReturnData"] is True
    assert queries["errors"]["MetricStat"]["Metric"]["MetricName"] == telemetry.ERRORS
    assert queries["requests"]["MetricStat"]["Metric"]["MetricName"] == telemetry.REQUESTS
    assert queries["errors"]["MetricStat"]["Stat"] == "Sum"


@pytest.mark.parametrize("suffix, metric, operator, threshold, missing", [
    ("unhealthy-hosts", "UnHealthyHostCount", "GreaterThanThreshold", 0, "notBreaching"),
    ("no-healthy-hosts", "HealthyHostCount", "LessThanThreshold", 1, "breaching"),
])
def test_target_health_alarms_watch_the_shared_target_group(default, suffix, metric, operator, threshold, missing):
    _, template, stack = default
    tg = logical_id(stack, template, "AWS::ElasticLoadBalancingV2::TargetGroup")
    _, alarm = alarm_named(template, suffix)
    props = alarm["Properties"]
    assert props["Namespace"] == "AWS/NetworkELB" and props["MetricName"] == metric
    assert props["Statistic"] == "Maximum"
    assert props["ComparisonOperator"] == operator and props["Threshold"] == threshold
    assert props["TreatMissingData"] == missing
    dims = {d["Name"]: d["Value"] for d in props["Dimensions"]}
    assert dims["TargetGroup"] == {"Fn::GetAtt": [tg, "TargetGroupFullName"]}


@pytest.mark.parametrize("suffix, metric", [
    ("engine-build-failures", telemetry.ENGINE_BUILD_FAILURE),
    ("build-circuit-breaker", telemetry.CIRCUIT_BREAKER_OPEN),
    ("model-not-staged", telemetry.STAGING_MISSING),
])
def test_bootstrap_failures_page_on_the_first_occurrence(default, suffix, metric):
    _, template, _ = default
    _, alarm = alarm_named(template, suffix)
    props = alarm["Properties"]
    assert props["MetricName"] == metric and props["Threshold"] == 1
    assert props["ComparisonOperator"] == "GreaterThanOrEqualToThreshold" and props["EvaluationPeriods"] == 1


def test_every_paging_alarm_notifies_the_topic(default):
    _, template, stack = default
    topic = {"Ref": logical_id(stack, template, "AWS::SNS::Topic")}
    alarms = template.find_resources("AWS::CloudWatch::Alarm")
    paging = {k: v for k, v in alarms.items() if not v["Properties"]["AlarmName"].endswith(("-scale-in", "-slo-scale-out"))}
    assert len(paging) == 2 + 6  # two per region, six per pool
    for logical, alarm in paging.items():
        assert alarm["Properties"]["AlarmActions"] == [topic], logical


def test_alarm_email_subscribes_only_when_configured(default, strict):
    default[1].resource_count_is("AWS::SNS::Subscription", 0)
    strict[1].has_resource_properties("AWS::SNS::Subscription",
                                      {"Protocol": "email", "Endpoint": "oncall@example.com"})


# ---------------------------------------------------------------- 6. dashboard


def test_dashboard_shows_traffic_latency_against_slo_capacity_gpu_and_engine_cache(strict):
    cfg, template, stack = strict
    (dashboard,) = template.find_resources("AWS::CloudWatch::Dashboard").values()
    assert dashboard["Properties"]["DashboardName"] == f"{cfg.name}-ap-northeast-2"
    body = json.dumps(stack.resolve(dashboard["Properties"]["DashboardBody"]))
    for name in (telemetry.REQUESTS, telemetry.OUTPUT_TOKENS, telemetry.TTFT_MS, telemetry.ITL_MS,
                 "GroupInServiceInstances", "GroupPendingInstances", "WarmPoolWarmedCapacity",
                 telemetry.GPU_UTILIZATION, telemetry.GPU_MEMORY_USED, telemetry.KV_CACHE_UTILIZATION,
                 telemetry.ENGINE_CACHE_HIT, telemetry.ENGINE_BUILD_SECONDS, "HealthyHostCount"):
        assert name in body, name
    assert '\\"value\\":250' in body and '\\"value\\":33' in body  # SLO lines from the config


# ---------------------------------------------------------------- 7. capacity


def test_capacity_reservations_are_targeted_first_with_on_demand_fallback(base_doc):
    ids = ["cr-0123456789abcdef0", "cr-0fedcba9876543210"]
    template, _ = synth(configure(base_doc, capacity_reservation_ids=ids))
    template.has_resource_properties("AWS::AutoScaling::AutoScalingGroup", {"CapacityReservationSpecification": {
        "CapacityReservationPreference": "capacity-reservations-first",
        "CapacityReservationTarget": {"CapacityReservationIds": ids},
    }})
    only, _ = synth(configure(base_doc, capacity_reservation_ids=ids[:1], capacity_reservations_only=True))
    only.has_resource_properties("AWS::AutoScaling::AutoScalingGroup", {"CapacityReservationSpecification": {
        "CapacityReservationPreference": "capacity-reservations-only",
        "CapacityReservationTarget": {"CapacityReservationIds": ids[:1]},
    }})


def test_no_reservation_targeting_without_ids(default):
    (group,) = default[1].find_resources("AWS::AutoScaling::AutoScalingGroup").values()
    assert "CapacityReservationSpecification" not in group["Properties"]


def test_reservations_only_without_ids_is_a_config_error(base_doc):
    with pytest.raises(ConfigError, match="capacity_reservation_ids is empty"):
        configure(base_doc, capacity_reservations_only=True)


def test_alarm_watch_can_be_dropped_for_an_emergency_fix(base_doc):
    template, _ = synth(configure(base_doc, rollout={"rollback_on_alarms": False}))
    (group,) = template.find_resources("AWS::AutoScaling::AutoScalingGroup").values()
    prefs = group["UpdatePolicy"]["AutoScalingInstanceRefresh"]["Preferences"]
    assert "AlarmSpecification" not in prefs
    assert prefs["MinHealthyPercentage"] == 90  # still never all at once
