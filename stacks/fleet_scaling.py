"""Scaling of one pool's Auto Scaling group on the load the runtime measures.

GPU instances are slow to add (boot, image, engine) and each one is expensive, so
scale-out and scale-in are two policies with different tempers:

- Scale-out: target tracking on the pool's per-instance load (ActiveRequests or
  KvCacheUtilizationPercent), the average over the instances that report it, with
  scale-in switched off. `scaling.scale_out_cooldown_s` is the estimated instance
  warmup: a new instance counts as capacity for that long before its own metrics do.
- Scale-in: one instance at a time, at most once per `scaling.scale_in_cooldown_s`,
  and only when the load spread over one instance fewer would still stay under the
  target for 15 minutes (metric math over the group's InService count). EC2 target
  tracking has no scale-in cooldown of its own, hence the separate simple policy.
- SLO protection (`scaling.slo_protection`): a step scaling policy on an alarm over
  the pool's 1-minute SLO ratio, max(P99 TTFT / SLO, P99 ITL / SLO) from the
  per-request values the gateway publishes, adds capacity when the ratio passes
  `slo_scale_out_ratio` even while load is under target (+20%, at least one instance;
  +50% once the SLO itself is missed). The scale-in alarm only breaches while the ratio
  is at or below `slo_scale_in_ratio`, so nothing scales in while latency is high.
  Target tracking and step scaling on one group: EC2 Auto Scaling runs every policy
  whose alarm fires and takes the one giving the largest capacity ("Dynamic scaling
  for Amazon EC2 Auto Scaling", multiple dynamic scaling policies).
- Capacity coming: both scale-out policies set EstimatedInstanceWarmup. While a new
  instance warms up it counts toward the group's current capacity when the next
  scale-out is computed, and a repeated breach within the same step range adds nothing
  more ("Set the default instance warmup for an Auto Scaling group"), so a burst
  that keeps the alarm red while instances boot does not launch twice. An instance
  waiting on its launch hook is already in the group's desired capacity.
- Scheduled actions from the pool's daily profile (`schedule`, UTC cron).

The per-instance load is the average of a gauge rather than SUM / InService: the
average does not depend on how often each instance publishes, and instances that do
not report (still booting, or broken and about to be replaced) do not dilute it.
Metric scale-in never removes a pool's last instance; only a schedule may take a
pool to zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import jsii
from aws_cdk import aws_autoscaling as autoscaling, aws_cloudwatch as cloudwatch
from constructs import Construct

from fleetcast.config import FleetConfig, Pool
from fleetcast.contract import telemetry

from .fleet_metrics import ONE_MINUTE, asg_metric, runtime_metric, slo_ratio
from .launch_order import capacity_held

_LOAD_METRICS = {
    "active_requests": telemetry.ACTIVE_REQUESTS,
    "kv_cache_utilization": telemetry.KV_CACHE_UTILIZATION,
}
# Same patience as EC2 target tracking's own scale-in alarm: 15 one-minute points.
SCALE_IN_EVALUATION_MINUTES = 15
# SLO protection reacts to the first bad minute: a GPU instance takes minutes to serve, so waiting costs more.
SLO_SCALE_OUT_EVALUATION_MINUTES = 1
# (ratio above the threshold from, to, percent added): +20% near the SLO, +50% past it.
SLO_STEPS = ((0.0, "slo", 20), ("slo", None, 50))


def enable_group_metrics(asg: autoscaling.AutoScalingGroup) -> None:
    """Turn on one-minute group metrics (InService, Pending, warm pool...), used by scaling and the dashboard."""
    cfn_asg: autoscaling.CfnAutoScalingGroup = asg.node.default_child  # type: ignore[assignment]
    cfn_asg.add_property_override("MetricsCollection", [{"Granularity": "1Minute"}])


@jsii.implements(cloudwatch.IAlarmAction)
class _ScalingPolicyAction:
    """Alarm action that triggers an L1 scaling policy (the L2 actions only take L2 policies)."""

    def __init__(self, policy_arn: str) -> None:
        self._policy_arn = policy_arn

    def bind(self, _scope: Construct, _alarm: cloudwatch.IAlarm) -> cloudwatch.AlarmActionConfig:
        return cloudwatch.AlarmActionConfig(alarm_action_arn=self._policy_arn)


class PoolScaling(Construct):
    """Target-tracking scale-out, cautious scale-in and the daily schedule of one pool."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, region: str, pool: Pool,
                 asg: autoscaling.AutoScalingGroup, peers: Sequence[autoscaling.AutoScalingGroup] = (),
                 tier: str | None = None, track_load: bool = True) -> None:
        """`peers`: the pool's other group (a spot tier's sibling) that serves the same load; `tier` names this
        group's alarm (`<pool>-<tier>-scale-in`) when the pool has two. `track_load` False: no scale-out policy
        (a spot pool's On-Demand group, sized by its base and the Spot fallback, stacks/fleet_spot.py)."""
        super().__init__(scope, construct_id)
        spec = pool.scaling
        load_name = _LOAD_METRICS[spec.metric]
        enable_group_metrics(asg)
        if capacity_held(self):
            # Held at zero (first deploy, not staged): schedules would set sizes of their own, and target
            # tracking needs MaxSize > MinSize (cfn-lint E3712). They come with the release deploy.
            self.scale_out_policy = self.scale_in_policy = self.scale_in_alarm = None
            self.slo_policy = self.slo_alarm = None
            self.scheduled_actions = []
            return

        self.scale_out_policy = None if not track_load else autoscaling.CfnScalingPolicy(
            self, "TrackLoad",
            auto_scaling_group_name=asg.auto_scaling_group_name,
            policy_type="TargetTrackingScaling",
            estimated_instance_warmup=spec.scale_out_cooldown_s,
            target_tracking_configuration=autoscaling.CfnScalingPolicy.TargetTrackingConfigurationProperty(
                target_value=spec.target,
                disable_scale_in=True,
                customized_metric_specification=autoscaling.CfnScalingPolicy.CustomizedMetricSpecificationProperty(
                    namespace=telemetry.NAMESPACE,
                    metric_name=load_name,
                    dimensions=[
                        autoscaling.CfnScalingPolicy.MetricDimensionProperty(name=telemetry.DIM_FLEET, value=cfg.name),
                        autoscaling.CfnScalingPolicy.MetricDimensionProperty(name=telemetry.DIM_POOL, value=pool.name),
                    ],
                    statistic="Average",
                ),
            ),
        )

        self.scale_in_policy = autoscaling.CfnScalingPolicy(
            self, "ScaleInOne",
            auto_scaling_group_name=asg.auto_scaling_group_name,
            policy_type="SimpleScaling",
            adjustment_type="ChangeInCapacity",
            scaling_adjustment=-1,
            cooldown=str(spec.scale_in_cooldown_s),
        )
        # Load per instance if one instance left: below target means the rest can carry it. The load is the
        # pool's (both groups of a spot tier report under the same Pool dimension), so is the instance count.
        counts = {"inservice": asg_metric(asg, "GroupInServiceInstances")}
        counts |= {f"peer{k}": asg_metric(peer, "GroupInServiceInstances") for k, peer in enumerate(peers)}
        if peers:
            total = "(" + " + ".join(f"FILL({name}, 0)" for name in counts) + ")"
            expression = f"IF({total} > 1, load * {total} / ({total} - 1), {spec.target:g})"
        else:
            expression = f"IF(inservice > 1, load * inservice / (inservice - 1), {spec.target:g})"
        using = {"load": runtime_metric(cfg.name, pool.name, load_name, "Average"), **counts}
        if spec.slo_protection:
            # An SLO ratio above slo_scale_in_ratio reads as "at target": no scale-in while latency is high.
            expression = f"IF(slo > {spec.slo_scale_in_ratio:g}, {spec.target:g}, {expression})"
            using["slo"] = slo_ratio(cfg, pool.name)
        after_scale_in = cloudwatch.MathExpression(
            expression=expression,
            using_metrics=using,
            period=ONE_MINUTE,
            label=f"{load_name} per instance after removing one",
        )
        self.scale_in_alarm = cloudwatch.Alarm(
            self, "ScaleInAlarm",
            alarm_name=f"{cfg.name}-{region}-{pool.name}{'-' + tier if tier else ''}-scale-in",
            alarm_description=(f"Scaling only (not paged): {pool.name} would stay under {spec.target:g} "
                               f"{load_name} per instance with one instance fewer."),
            metric=after_scale_in,
            threshold=spec.target,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=SCALE_IN_EVALUATION_MINUTES,
            datapoints_to_alarm=SCALE_IN_EVALUATION_MINUTES,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        self.scale_in_alarm.add_alarm_action(_ScalingPolicyAction(self.scale_in_policy.attr_arn))

        self.slo_policy = self.slo_alarm = None
        # A group without a scale-out policy of its own (a spot pool's On-Demand base) gets none here either.
        if spec.slo_protection and track_load:
            out = spec.slo_scale_out_ratio
            # Step bounds are relative to the alarm threshold; "slo" is the ratio 1.0 (the SLO itself).
            def bound(b):
                return None if b is None else (round(1.0 - out, 6) if b == "slo" else b)
            steps = [(bound(lo), bound(hi), pct) for lo, hi, pct in SLO_STEPS]
            if out >= 1.0:  # the threshold is at or past the SLO: one step
                steps = [(0.0, None, SLO_STEPS[-1][2])]
            self.slo_policy = autoscaling.CfnScalingPolicy(
                self, "ProtectSlo",
                auto_scaling_group_name=asg.auto_scaling_group_name,
                policy_type="StepScaling",
                adjustment_type="PercentChangeInCapacity",
                min_adjustment_magnitude=1,
                metric_aggregation_type="Maximum",
                estimated_instance_warmup=spec.scale_out_cooldown_s,
                step_adjustments=[
                    autoscaling.CfnScalingPolicy.StepAdjustmentProperty(
                        scaling_adjustment=pct, metric_interval_lower_bound=lo, metric_interval_upper_bound=hi)
                    for lo, hi, pct in steps
                ],
            )
            self.slo_alarm = cloudwatch.Alarm(
                self, "SloRatioAlarm",
                alarm_name=f"{cfg.name}-{region}-{pool.name}{'-' + tier if tier else ''}-slo-scale-out",
                alarm_description=(f"Scaling only (not paged): {pool.name}'s 1-minute P99 TTFT or ITL is above "
                                   f"{out:g} of its SLO (scaling.slo_scale_out_ratio); adds capacity even under the "
                                   "load target."),
                metric=slo_ratio(cfg, pool.name),
                threshold=out,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                evaluation_periods=SLO_SCALE_OUT_EVALUATION_MINUTES,
                datapoints_to_alarm=SLO_SCALE_OUT_EVALUATION_MINUTES,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
            self.slo_alarm.add_alarm_action(_ScalingPolicyAction(self.slo_policy.attr_arn))

        self.scheduled_actions = [
            asg.scale_on_schedule(
                f"Schedule{k}",
                schedule=autoscaling.Schedule.expression(step.cron),
                min_capacity=step.min,
                max_capacity=step.max,
                desired_capacity=step.desired,
                time_zone="Etc/UTC",
            )
            for k, step in enumerate(pool.schedule)
        ]


__all__ = ["PoolScaling", "enable_group_metrics", "SCALE_IN_EVALUATION_MINUTES", "SLO_STEPS"]
