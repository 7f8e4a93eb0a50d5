"""Scaling on the SLO (issue 16 item 4): target tracking on per-instance load stays, an SLO ratio alarm adds
capacity even under target, and scale-in waits while the ratio is high.

Sources: "Dynamic scaling for Amazon EC2 Auto Scaling" (several dynamic policies on one group: the one giving
the largest capacity wins); "Step and simple scaling policies for Amazon EC2 Auto Scaling" (step bounds are
relative to the alarm threshold; PercentChangeInCapacity with MinAdjustmentMagnitude); "Set the default
instance warmup for an Auto Scaling group" (instances warming up count toward current capacity on scale-out,
so repeated breaches in one step range do not add more); AWS::AutoScaling::ScalingPolicy
TargetTrackingConfiguration.DisableScaleIn.
"""

from __future__ import annotations

import json

import pytest

from fleetcast.config import ConfigError
from fleetcast.contract import telemetry
from stacks.fleet_scaling import SLO_STEPS

from .test_operations import SEOUL, alarm_named, base_doc, configure, default, logical_id, synth  # noqa: F401


def _queries(alarm: dict) -> dict:
    return {q["Id"]: q for q in alarm["Properties"]["Metrics"]}


def test_slo_ratio_alarm_drives_a_step_policy_that_scales_out_even_under_target(default):
    cfg, template, stack = default
    spec = cfg.regions[SEOUL].pools[0].scaling
    policy = logical_id(stack, template, "AWS::AutoScaling::ScalingPolicy", PolicyType="StepScaling")
    template.has_resource_properties("AWS::AutoScaling::ScalingPolicy", {
        "PolicyType": "StepScaling", "AdjustmentType": "PercentChangeInCapacity", "MinAdjustmentMagnitude": 1,
        "EstimatedInstanceWarmup": spec.scale_out_cooldown_s,  # warming instances count as capacity coming
        "StepAdjustments": [
            {"MetricIntervalLowerBound": 0, "MetricIntervalUpperBound": round(1 - spec.slo_scale_out_ratio, 6),
             "ScalingAdjustment": SLO_STEPS[0][2]},
            {"MetricIntervalLowerBound": round(1 - spec.slo_scale_out_ratio, 6), "ScalingAdjustment": SLO_STEPS[1][2]},
        ],
    })
    _, alarm = alarm_named(template, f"{cfg.regions[SEOUL].pools[0].name}-slo-scale-out")
    props = alarm["Properties"]
    assert props["AlarmActions"] == [{"Fn::GetAtt": [policy, "Arn"]}]
    assert props["Threshold"] == spec.slo_scale_out_ratio and props["ComparisonOperator"] == "GreaterThanThreshold"
    assert props["EvaluationPeriods"] == props["DatapointsToAlarm"] == 1
    q = _queries(alarm)
    expression = next(v["Expression"] for v in q.values() if "Expression" in v and v.get("ReturnData", True))
    t, i = cfg.slo.ttft_p99_ms, cfg.slo.itl_p99_ms
    assert expression == f"IF(FILL(ttft, 0) / {t:g} > FILL(itl, 0) / {i:g}, FILL(ttft, 0) / {t:g}, FILL(itl, 0) / {i:g})"
    # P99 over the raw per-request values the gateway publishes, the same metrics the SLO alarms page on.
    assert q["ttft"]["MetricStat"]["Metric"]["MetricName"] == telemetry.TTFT_MS and q["ttft"]["MetricStat"]["Stat"] == "p99"
    assert q["itl"]["MetricStat"]["Metric"]["MetricName"] == telemetry.ITL_MS and q["itl"]["MetricStat"]["Stat"] == "p99"
    # Load tracking is still there, with its own scale-in switched off.
    template.has_resource_properties("AWS::AutoScaling::ScalingPolicy", {
        "PolicyType": "TargetTrackingScaling",
        "TargetTrackingConfiguration": {"DisableScaleIn": True, "TargetValue": spec.target}})


def test_no_scale_in_while_the_slo_ratio_is_above_the_lower_threshold(default):
    cfg, template, _ = default
    spec = cfg.regions[SEOUL].pools[0].scaling
    _, alarm = alarm_named(template, f"{cfg.regions[SEOUL].pools[0].name}-scale-in")
    q = _queries(alarm)
    expression = next(v["Expression"] for v in q.values() if v.get("ReturnData", True) and "Expression" in v)
    # A high ratio reads as "at target", which never breaches the LessThanThreshold alarm.
    assert expression.startswith(f"IF(slo > {spec.slo_scale_in_ratio:g}, {spec.target:g}, ")
    assert alarm["Properties"]["Threshold"] == spec.target
    assert "FILL(ttft, 0)" in q["slo"]["Expression"]


def test_slo_protection_can_be_switched_off(base_doc):
    cfg = configure(base_doc, scaling={"target": 12, "slo_protection": False})
    template, _ = synth(cfg)
    assert not template.find_resources("AWS::AutoScaling::ScalingPolicy", {"Properties": {"PolicyType": "StepScaling"}})
    _, alarm = alarm_named(template, f"{cfg.regions[SEOUL].pools[0].name}-scale-in")
    assert not any("slo >" in v.get("Expression", "") for v in alarm["Properties"]["Metrics"])


def test_the_scale_in_ratio_must_be_below_the_scale_out_ratio(base_doc):
    with pytest.raises(ConfigError, match="slo_scale_in_ratio must be below scaling.slo_scale_out_ratio"):
        configure(base_doc, scaling={"target": 12, "slo_scale_out_ratio": 0.8, "slo_scale_in_ratio": 0.8})


def test_dashboard_shows_the_slo_ratio_next_to_load(default):
    cfg, template, stack = default
    (dashboard,) = template.find_resources("AWS::CloudWatch::Dashboard").values()
    body = json.loads(json.dumps(stack.resolve(dashboard["Properties"]["DashboardBody"])))
    text = body if isinstance(body, str) else json.dumps(body)
    assert "Load per instance vs scaling target" in text and "SLO ratio (1-minute P99 / SLO" in text
    assert "scaling.slo_scale_out_ratio" in text and "scaling.slo_scale_in_ratio" in text
    # The two graphs sit in one row (12 + 12 wide), load first.
    assert text.index("Load per instance vs scaling target") < text.index("SLO ratio (1-minute P99 / SLO")
