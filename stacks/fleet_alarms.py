"""On-call signals of one provider region, all delivered to the region's notification topic.

Three constructs, one per source of truth:
- PoolAlarms: what the runtime measures per request and per boot (P99 TTFT and
  inter-token latency against the config's SLOs, error rate, engine build failures,
  the build circuit breaker, unstaged model). A TCP NLB has no HTTP status metrics,
  so errors and latency come from the runtime's per-request EMF records; the P99s are
  CloudWatch percentiles over raw values, never averages of per-instance percentiles.
- ServiceAlarms: what the NLB sees of the shared target group (unhealthy hosts, no
  healthy host at all).
- LaunchFailureEvents: unsuccessful launches and terminations (GPU capacity errors
  such as InsufficientInstanceCapacity, quota errors, warm-pool starts) are events,
  not metrics: an EventBridge rule forwards each with its cause to the topic.
Alarm names are stable (`<fleet>-<region>-<pool>-<signal>`) so the runbook
(docs/runbook.md) and the instance-refresh rollback can name them.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import (
    Duration,
    aws_autoscaling as autoscaling,
    aws_cloudwatch as cloudwatch,
    aws_cloudwatch_actions as cw_actions,
    aws_elasticloadbalancingv2 as elbv2,
    aws_events as events,
    aws_events_targets as targets,
    aws_sns as sns,
)
from constructs import Construct

from fleetcast.config import FleetConfig, Pool
from fleetcast.contract import telemetry
from fleetcast.contract.names import model_alarm_name, pool_alarm_prefix

from .fleet_metrics import ONE_MINUTE, runtime_metric, target_group_metric

# Latency and error alarms: 3 bad minutes out of 5, so one slow burst pages nobody
# but a sustained breach pages within about five minutes.
SLO_EVALUATION_PERIODS = 5
SLO_DATAPOINTS_TO_ALARM = 3


def _notify(alarm: cloudwatch.Alarm, topic: sns.ITopic) -> cloudwatch.Alarm:
    action = cw_actions.SnsAction(topic)
    alarm.add_alarm_action(action)
    alarm.add_ok_action(action)
    return alarm


class PoolAlarms(Construct):
    """SLO, error and bootstrap alarms of one pool, from the runtime's metrics."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, region: str, pool: Pool,
                 topic: sns.ITopic) -> None:
        super().__init__(scope, construct_id)
        prefix = pool_alarm_prefix(cfg.name, region, pool.name)

        def metric(name: str, statistic: str, period: Duration = ONE_MINUTE) -> cloudwatch.Metric:
            return runtime_metric(cfg.name, pool.name, name, statistic, period=period)

        def slo_alarm(alarm_id: str, name: str, threshold: float, description: str,
                      watched: cloudwatch.IMetric, full_name: str | None = None) -> cloudwatch.Alarm:
            return _notify(cloudwatch.Alarm(
                self, alarm_id,
                alarm_name=full_name or f"{prefix}-{name}",
                alarm_description=description,
                metric=watched,
                threshold=threshold,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                evaluation_periods=SLO_EVALUATION_PERIODS,
                datapoints_to_alarm=SLO_DATAPOINTS_TO_ALARM,
                # No requests is not a breach; zero healthy hosts has its own alarm.
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            ), topic)

        self.ttft_p99 = slo_alarm(
            "TtftP99", "ttft-p99", cfg.slo.ttft_p99_ms,
            f"P99 time to first token of {pool.name} above the SLO (slo.ttft_p99_ms = {cfg.slo.ttft_p99_ms:g} ms).",
            metric(telemetry.TTFT_MS, "p99"),
        )
        self.itl_p99 = slo_alarm(
            "ItlP99", "itl-p99", cfg.slo.itl_p99_ms,
            f"P99 inter-token latency of {pool.name} above the SLO (slo.itl_p99_ms = {cfg.slo.itl_p99_ms:g} ms).",
            metric(telemetry.ITL_MS, "p99"),
        )
        self.error_rate = slo_alarm(
            "ErrorRate", "error-rate", cfg.slo.error_rate,
            f"Share of failed requests on {pool.name} above slo.error_rate = {cfg.slo.error_rate:g} "
            "(5xx, upstream failures, streams cut short).",
            cloudwatch.MathExpression(
                # Errors may be absent in a minute with no failure; Requests absent means no traffic.
                expression="FILL(errors, 0) / requests",
                using_metrics={
                    "errors": metric(telemetry.ERRORS, "Sum"),
                    "requests": metric(telemetry.REQUESTS, "Sum"),
                },
                period=ONE_MINUTE,
                label="error rate",
            ),
        )
        # A pool serving several models also watches each against its own SLO (models[].slo, else the fleet's).
        # fleetcast/contract/stack_size.py counts these alarms (MODEL_SLO_ALARMS) by the same rule.
        self.model_alarms: dict[str, tuple[cloudwatch.Alarm, cloudwatch.Alarm]] = {}
        served = cfg.served_by(pool)
        for k, s in enumerate(served if telemetry.alarmed_per_model(len(served)) else ()):
            slo = s.model.slo or cfg.slo
            where = f"models[{s.model.id}].slo" if s.model.slo else "slo"
            self.model_alarms[s.model.id] = (
                slo_alarm(f"Model{k}TtftP99", "", slo.ttft_p99_ms,
                          f"P99 time to first token of {s.model.id} on {pool.name} above its SLO "
                          f"({where}.ttft_p99_ms = {slo.ttft_p99_ms:g} ms).",
                          runtime_metric(cfg.name, pool.name, telemetry.TTFT_MS, "p99", model=s.model.id),
                          model_alarm_name(cfg.name, region, pool.name, s.model.id, "ttft-p99")),
                slo_alarm(f"Model{k}ItlP99", "", slo.itl_p99_ms,
                          f"P99 inter-token latency of {s.model.id} on {pool.name} above its SLO "
                          f"({where}.itl_p99_ms = {slo.itl_p99_ms:g} ms).",
                          runtime_metric(cfg.name, pool.name, telemetry.ITL_MS, "p99", model=s.model.id),
                          model_alarm_name(cfg.name, region, pool.name, s.model.id, "itl-p99")),
            )
        self.build_failures = _notify(cloudwatch.Alarm(
            self, "BuildFailures",
            alarm_name=f"{prefix}-engine-build-failures",
            alarm_description=f"An engine build failed on {pool.name}; after operations.build_failure_limit = "
                              f"{cfg.operations.build_failure_limit} failures per cache key the circuit breaker opens.",
            metric=metric(telemetry.ENGINE_BUILD_FAILURE, "Sum", Duration.minutes(5)),
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        ), topic)
        self.circuit_breaker = _notify(cloudwatch.Alarm(
            self, "CircuitBreaker",
            alarm_name=f"{prefix}-build-circuit-breaker",
            alarm_description=f"Engine builds for {pool.name} stopped: the circuit breaker is open, new instances "
                              "will not serve until the cause is fixed and the breaker is reset.",
            metric=metric(telemetry.CIRCUIT_BREAKER_OPEN, "Maximum"),
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        ), topic)
        self.staging_missing = _notify(cloudwatch.Alarm(
            self, "StagingMissing",
            alarm_name=f"{prefix}-model-not-staged",
            alarm_description=f"Instances of {pool.name} found no staged weights (or image) in the region's bucket: "
                              "run `fleetcast stage model` for this region.",
            metric=metric(telemetry.STAGING_MISSING, "Maximum", Duration.minutes(5)),
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        ), topic)

    @property
    def rollback_alarms(self) -> list[cloudwatch.Alarm]:
        """The alarms that fail (and so roll back) an instance refresh of this pool."""
        return [self.ttft_p99, self.itl_p99, self.error_rate, self.build_failures, self.circuit_breaker]


class ServiceAlarms(Construct):
    """Target health of the region's service, as the NLB sees it."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, region: str,
                 nlb: elbv2.INetworkLoadBalancer, target_group: elbv2.NetworkTargetGroup, topic: sns.ITopic) -> None:
        super().__init__(scope, construct_id)
        prefix = f"{cfg.name}-{region}"
        self.unhealthy_hosts = _notify(cloudwatch.Alarm(
            self, "UnhealthyHosts",
            alarm_name=f"{prefix}-unhealthy-hosts",
            alarm_description="At least one registered instance fails the NLB health check.",
            metric=target_group_metric(nlb, target_group, "UnHealthyHostCount", "Maximum"),
            threshold=0,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=3,
            datapoints_to_alarm=2,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        ), topic)
        # Maximum, not Minimum: with one instance per pool and several AZs, some AZ
        # always has zero healthy targets; "zero healthy" means none anywhere.
        self.no_healthy_hosts = _notify(cloudwatch.Alarm(
            self, "NoHealthyHosts",
            alarm_name=f"{prefix}-no-healthy-hosts",
            alarm_description="No instance passes the NLB health check: every consumer request fails.",
            metric=target_group_metric(nlb, target_group, "HealthyHostCount", "Maximum"),
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=2,
            datapoints_to_alarm=2,
            treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
        ), topic)


class LaunchFailureEvents(Construct):
    """EventBridge rule: unsuccessful launches/terminations of the region's groups, cause forwarded to the topic."""

    DETAIL_TYPES = ("EC2 Instance Launch Unsuccessful", "EC2 Instance Terminate Unsuccessful")

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, region: str,
                 groups: Sequence[autoscaling.IAutoScalingGroup], topic: sns.ITopic) -> None:
        super().__init__(scope, construct_id)
        field = events.EventField.from_path
        message = (
            f"[{cfg.name} {region}] {field('$.detail-type')} in group {field('$.detail.AutoScalingGroupName')} "
            # The AZ sits under a key with a space ("Availability Zone"), which is no safe input path;
            # capacity errors name the AZ in their status message anyway.
            f"({field('$.detail.Origin')} -> {field('$.detail.Destination')}): {field('$.detail.StatusMessage')} "
            f"| cause: {field('$.detail.Cause')} | runbook: docs/runbook.md#launch-failures"
        )
        self.rule = events.Rule(
            self, "Rule",
            description=f"Unsuccessful instance launches/terminations of {cfg.name} in {region} "
                        "(GPU capacity, quotas, warm-pool starts).",
            event_pattern=events.EventPattern(
                source=["aws.autoscaling"],
                detail_type=list(self.DETAIL_TYPES),
                detail={"AutoScalingGroupName": [g.auto_scaling_group_name for g in groups]},
            ),
            targets=[targets.SnsTopic(topic, message=events.RuleTargetInput.from_text(message))],
        )


class SpotAlarms(Construct):
    """What a pool's Spot tier costs the SLO, apart from the pool's own alarms: interruptions, cut streams and
    the On-Demand fallback. None of them rolls back a refresh (an interruption says nothing about a new engine)."""

    # More than one instance of a pool reclaimed within this window is worth a look (one alone is routine).
    INTERRUPTION_WINDOW = Duration.minutes(15)

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, region: str, pool: Pool,
                 on_demand: autoscaling.IAutoScalingGroup, topic: sns.ITopic) -> None:
        super().__init__(scope, construct_id)
        prefix = pool_alarm_prefix(cfg.name, region, pool.name)

        def metric(name: str, statistic: str, period: Duration) -> cloudwatch.Metric:
            return runtime_metric(cfg.name, pool.name, name, statistic, period=period)

        self.interruptions = _notify(cloudwatch.Alarm(
            self, "Interruptions",
            alarm_name=f"{prefix}-spot-interruptions",
            alarm_description=f"More than one Spot instance of {pool.name} was reclaimed within 15 minutes "
                              "(SpotInterruption). The Spot group replaces them; the On-Demand fallback covers a "
                              "lasting shortage. Runbook: docs/runbook.md#spot-tier",
            metric=metric(telemetry.SPOT_INTERRUPTION, "Sum", self.INTERRUPTION_WINDOW),
            threshold=2,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        ), topic)
        self.drain_cut = _notify(cloudwatch.Alarm(
            self, "DrainCut",
            alarm_name=f"{prefix}-spot-drain-cut",
            alarm_description=f"An interruption drain on {pool.name} cut in-flight streams (SpotDrainCutRequests): "
                              "requests longer than the notice allows (make bench-spot-drain) reached a Spot "
                              "instance. Runbook: docs/runbook.md#spot-tier",
            metric=metric(telemetry.SPOT_DRAIN_CUT, "Sum", Duration.minutes(5)),
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        ), topic)
        self.fallback = _notify(cloudwatch.Alarm(
            self, "Fallback",
            alarm_name=f"{prefix}-on-demand-fallback",
            alarm_description=f"The On-Demand group of {pool.name} has been allowed above its base of "
                              f"{pool.on_demand_base} for 30 minutes: Spot capacity is short and On-Demand covers "
                              f"it (ceiling {pool.on_demand_fallback_max}). Runbook: docs/runbook.md#spot-tier",
            metric=cloudwatch.Metric(
                namespace="AWS/AutoScaling", metric_name="GroupMaxSize",
                dimensions_map={"AutoScalingGroupName": on_demand.auto_scaling_group_name},
                statistic="Maximum", period=Duration.minutes(5),
            ),
            threshold=pool.on_demand_base,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=6,
            datapoints_to_alarm=6,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        ), topic)

    @property
    def all(self) -> list[cloudwatch.Alarm]:
        return [self.interruptions, self.drain_cut, self.fallback]
