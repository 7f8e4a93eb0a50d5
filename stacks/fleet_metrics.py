"""CloudWatch metric definitions the operations constructs share (scaling, alarms, dashboard).

Names, namespace and dimensions come from fleetcast.contract.telemetry, so the runtime that
publishes and the stacks that read can never drift apart. Runtime metrics carry the
[Fleet, Pool] dimension set; Auto Scaling and NLB metrics carry AWS's own.
"""

from __future__ import annotations

from aws_cdk import (
    Duration,
    aws_autoscaling as autoscaling,
    aws_cloudwatch as cloudwatch,
    aws_elasticloadbalancingv2 as elbv2,
)

from fleetcast.contract import telemetry

ONE_MINUTE = Duration.minutes(1)


def runtime_metric(fleet: str, pool: str, name: str, statistic: str, *, period: Duration = ONE_MINUTE,
                   label: str | None = None, model: str | None = None) -> cloudwatch.Metric:
    """A metric the instance runtime publishes (EMF) for one pool, or for one model on it ([Fleet, Pool, Model])."""
    dimensions = {telemetry.DIM_FLEET: fleet, telemetry.DIM_POOL: pool}
    if model is not None:
        dimensions[telemetry.DIM_MODEL] = model
    return cloudwatch.Metric(
        namespace=telemetry.NAMESPACE,
        metric_name=name,
        dimensions_map=dimensions,
        statistic=statistic,
        period=period,
        label=label,
    )


def asg_metric(asg: autoscaling.IAutoScalingGroup, name: str, statistic: str = "Average", *,
               label: str | None = None) -> cloudwatch.Metric:
    """An AWS/AutoScaling group metric (needs group metrics collection on the ASG)."""
    return cloudwatch.Metric(
        namespace="AWS/AutoScaling",
        metric_name=name,
        dimensions_map={"AutoScalingGroupName": asg.auto_scaling_group_name},
        statistic=statistic,
        period=ONE_MINUTE,
        label=label,
    )


def target_group_metric(nlb: elbv2.INetworkLoadBalancer, target_group: elbv2.NetworkTargetGroup, name: str,
                        statistic: str, *, label: str | None = None) -> cloudwatch.Metric:
    """An AWS/NetworkELB metric of the service's target group behind its NLB."""
    return cloudwatch.Metric(
        namespace="AWS/NetworkELB",
        metric_name=name,
        dimensions_map={
            "LoadBalancer": nlb.load_balancer_full_name,
            "TargetGroup": target_group.target_group_full_name,
        },
        statistic=statistic,
        period=ONE_MINUTE,
        label=label,
    )


def slo_ratio(cfg, pool: str, *, label: str | None = None, suffix: str = "") -> cloudwatch.MathExpression:
    """The pool's 1-minute SLO ratio: max(P99 TTFT / slo.ttft_p99_ms, P99 ITL / slo.itl_p99_ms), 0 without requests.

    P99s over the per-request values the gateway publishes (never averages of per-instance
    percentiles); scaling and the dashboard read this one definition. `suffix` keeps metric ids unique where
    several pools share one graph."""
    t, i = cfg.slo.ttft_p99_ms, cfg.slo.itl_p99_ms
    ttft, itl = f"FILL(ttft{suffix}, 0) / {t:g}", f"FILL(itl{suffix}, 0) / {i:g}"
    return cloudwatch.MathExpression(
        expression=f"IF({ttft} > {itl}, {ttft}, {itl})",
        using_metrics={
            f"ttft{suffix}": runtime_metric(cfg.name, pool, telemetry.TTFT_MS, "p99"),
            f"itl{suffix}": runtime_metric(cfg.name, pool, telemetry.ITL_MS, "p99"),
        },
        period=ONE_MINUTE,
        label=label or f"{pool} SLO ratio (P99 / SLO)",
    )
