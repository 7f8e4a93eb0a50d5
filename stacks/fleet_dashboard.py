"""The per-region CloudWatch dashboard: traffic, latency against the SLO lines, capacity, GPU, engine cache.

One line per pool on each graph, so pools of different GPUs sit side by side. The
SLO thresholds are drawn as horizontal annotations from the same config fields the
alarms use, and the alarm widget at the bottom lists every alarm of the region.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from aws_cdk import (
    Duration,
    aws_autoscaling as autoscaling,
    aws_cloudwatch as cloudwatch,
    aws_elasticloadbalancingv2 as elbv2,
)
from constructs import Construct

from fleetcast.config import FleetConfig
from fleetcast.contract import telemetry

from .fleet_metrics import ONE_MINUTE, asg_metric, runtime_metric, slo_ratio, target_group_metric

FIVE_MINUTES = Duration.minutes(5)
LIFECYCLE_METRICS = (
    ("GroupInServiceInstances", "in service"),
    ("GroupPendingInstances", "pending"),
    ("GroupTerminatingInstances", "terminating"),
    ("GroupDesiredCapacity", "desired"),
    ("WarmPoolWarmedCapacity", "warm pool (stopped)"),
    ("WarmPoolPendingCapacity", "warm pool pending"),
)


class FleetDashboard(Construct):
    """Dashboard `<fleet>-<region>` over every pool of the region."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, region: str,
                 groups: Mapping[str, autoscaling.IAutoScalingGroup], nlb: elbv2.INetworkLoadBalancer,
                 target_group: elbv2.NetworkTargetGroup, alarms: Sequence[cloudwatch.IAlarm],
                 spot_groups: Mapping[str, autoscaling.IAutoScalingGroup] | None = None) -> None:
        super().__init__(scope, construct_id)
        pools = list(groups)
        fleet = cfg.name

        def per_pool(name: str, statistic: str, what: str, period: Duration = ONE_MINUTE) -> list[cloudwatch.IMetric]:
            return [runtime_metric(fleet, p, name, statistic, period=period, label=f"{p} {what}") for p in pools]

        def per_second(name: str, what: str) -> list[cloudwatch.IMetric]:
            # Metric ids must be unique within a graph: one per metric name and pool.
            ids = [f"{name.lower()}{k}" for k in range(len(pools))]
            return [
                cloudwatch.MathExpression(
                    expression=f"{i} / PERIOD({i})",
                    using_metrics={i: runtime_metric(fleet, p, name, "Sum")},
                    label=f"{p} {what}/s",
                    period=ONE_MINUTE,
                )
                for i, p in zip(ids, pools)
            ]

        def percentiles(name: str) -> list[cloudwatch.IMetric]:
            return [runtime_metric(fleet, p, name, stat, label=f"{p} {stat}") for p in pools for stat in ("p50", "p90", "p99")]

        def slo_line(value: float, label: str) -> cloudwatch.HorizontalAnnotation:
            return cloudwatch.HorizontalAnnotation(value=value, label=label, color=cloudwatch.Color.RED)

        def graph(title: str, left: Sequence[cloudwatch.IMetric], *, width: int = 8, unit: str | None = None,
                  right: Sequence[cloudwatch.IMetric] = (), annotations: Sequence[cloudwatch.HorizontalAnnotation] = (),
                  stacked: bool = False) -> cloudwatch.GraphWidget:
            return cloudwatch.GraphWidget(
                title=title, left=list(left), right=list(right) or None, width=width, height=6,
                left_annotations=list(annotations) or None, stacked=stacked,
                left_y_axis=cloudwatch.YAxisProps(label=unit, show_units=False, min=0) if unit else None,
            )

        self.dashboard = cloudwatch.Dashboard(
            self, "Dashboard",
            dashboard_name=f"{fleet}-{region}",
            default_interval=Duration.hours(3),
        )
        self.dashboard.add_widgets(
            cloudwatch.TextWidget(
                markdown=f"# {fleet} in {region}\nSLO: P99 TTFT {cfg.slo.ttft_p99_ms:g} ms, P99 ITL "
                         f"{cfg.slo.itl_p99_ms:g} ms, errors <= {cfg.slo.error_rate:.2%}. Pools: {', '.join(pools)}. "
                         "Runbook: docs/runbook.md",
                width=24, height=2,
            )
        )
        self.dashboard.add_widgets(
            graph("Requests per second", per_second(telemetry.REQUESTS, "requests"),
                  right=per_second(telemetry.ERRORS, "errors") + per_second(telemetry.THROTTLED, "throttled")),
            graph("Tokens per second", per_second(telemetry.OUTPUT_TOKENS, "output tokens"),
                  right=per_second(telemetry.INPUT_TOKENS, "input tokens")),
            graph("Active and queued requests", per_pool(telemetry.ACTIVE_REQUESTS, "Average", "active / instance"),
                  right=per_pool(telemetry.QUEUED_REQUESTS, "Average", "queued / instance")),
        )
        # What scaling reads, side by side: load per instance against its target, the SLO ratio against its bands.
        scaling = {p.name: p.scaling for r in cfg.regions if r.region == region for p in r.pools}
        ratio_lines = []
        for name in pools:
            spec = scaling.get(name)
            if spec is not None and spec.slo_protection:
                ratio_lines += [
                    slo_line(spec.slo_scale_out_ratio, f"{name} scale out above (scaling.slo_scale_out_ratio)"),
                    cloudwatch.HorizontalAnnotation(value=spec.slo_scale_in_ratio, color=cloudwatch.Color.ORANGE,
                                                    label=f"{name} no scale-in above (scaling.slo_scale_in_ratio)"),
                ]
        self.dashboard.add_widgets(
            graph("Load per instance vs scaling target",
                  per_pool(telemetry.ACTIVE_REQUESTS, "Average", "active / instance"), width=12,
                  annotations=[cloudwatch.HorizontalAnnotation(value=scaling[p].target, label=f"{p} target")
                               for p in pools if p in scaling and scaling[p].metric == "active_requests"]),
            graph("SLO ratio (1-minute P99 / SLO; 1 = at the SLO)",
                  [slo_ratio(cfg, p, label=f"{p} SLO ratio", suffix=str(k)) for k, p in enumerate(pools)], width=12,
                  annotations=[slo_line(1.0, "SLO")] + ratio_lines),
        )
        self.dashboard.add_widgets(
            graph("Time to first token (ms)", percentiles(telemetry.TTFT_MS), unit="ms",
                  annotations=[slo_line(cfg.slo.ttft_p99_ms, "SLO P99 TTFT (slo.ttft_p99_ms)")]),
            graph("Inter-token latency (ms)", percentiles(telemetry.ITL_MS), unit="ms",
                  annotations=[slo_line(cfg.slo.itl_p99_ms, "SLO P99 ITL (slo.itl_p99_ms)")]),
            graph("End-to-end latency (ms)", percentiles(telemetry.E2E_MS), unit="ms"),
        )
        # Pools serving several models: the same latencies and load per model ([Fleet, Pool, Model]), each P99
        # against that model's own SLO (models[].slo, else slo).
        served = [(p.name, s.model) for r in cfg.regions if r.region == region for p in r.pools
                  for s in cfg.served_by(p) if telemetry.alarmed_per_model(len(cfg.served_by(p)))]
        if served:
            def per_model(name: str, stat: str, what: str) -> list[cloudwatch.IMetric]:
                return [runtime_metric(fleet, p, name, stat, model=m.id, label=f"{p} {m.id} {what}") for p, m in served]

            models = {m.id: m for _, m in served}
            self.dashboard.add_widgets(
                graph("Per model: P99 time to first token (ms)", per_model(telemetry.TTFT_MS, "p99", "p99"), unit="ms",
                      annotations=[slo_line((m.slo or cfg.slo).ttft_p99_ms, f"{m.id} SLO P99 TTFT")
                                   for m in models.values()]),
                graph("Per model: P99 inter-token latency (ms)", per_model(telemetry.ITL_MS, "p99", "p99"), unit="ms",
                      annotations=[slo_line((m.slo or cfg.slo).itl_p99_ms, f"{m.id} SLO P99 ITL")
                                   for m in models.values()]),
                graph("Per model: requests per minute", per_model(telemetry.REQUESTS, "Sum", "requests")),
            )
        self.dashboard.add_widgets(
            graph("Instances by lifecycle state",
                  [asg_metric(groups[p], name, label=f"{p} {what}") for p in pools for name, what in LIFECYCLE_METRICS],
                  width=12),
            graph("NLB target health",
                  [target_group_metric(nlb, target_group, "HealthyHostCount", "Maximum", label="healthy"),
                   target_group_metric(nlb, target_group, "UnHealthyHostCount", "Maximum", label="unhealthy")],
                  width=12),
        )
        self.dashboard.add_widgets(
            graph("GPU utilization (%)", per_pool(telemetry.GPU_UTILIZATION, "Average", "GPU util"), unit="%"),
            graph("GPU memory used (%)", per_pool(telemetry.GPU_MEMORY_USED, "Average", "GPU memory"), unit="%"),
            graph("KV cache utilization (%)", per_pool(telemetry.KV_CACHE_UTILIZATION, "Average", "KV cache"), unit="%"),
        )
        self.dashboard.add_widgets(
            graph("Engine cache hits and misses",
                  per_pool(telemetry.ENGINE_CACHE_HIT, "Sum", "hits", FIVE_MINUTES)
                  + per_pool(telemetry.ENGINE_CACHE_MISS, "Sum", "misses", FIVE_MINUTES)
                  + per_pool(telemetry.ENGINE_BUILD_FAILURE, "Sum", "build failures", FIVE_MINUTES)),
            graph("Engine build time (s)", per_pool(telemetry.ENGINE_BUILD_SECONDS, "Maximum", "build max", FIVE_MINUTES)
                  + per_pool(telemetry.ENGINE_BUILD_SECONDS, "Average", "build avg", FIVE_MINUTES), unit="s"),
            graph("Boot to healthy (s)",
                  per_pool(telemetry.START_TO_HEALTHY_SECONDS, "Maximum", "start to healthy", FIVE_MINUTES)
                  + per_pool(telemetry.STAGING_WAIT_SECONDS, "Maximum", "staging wait", FIVE_MINUTES), unit="s"),
        )
        if spot_groups:
            self._spot_row(cfg, groups, spot_groups, graph)
        self.dashboard.add_widgets(
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(alarms), width=24, height=4),
        )

    def _spot_row(self, cfg: FleetConfig, groups: Mapping[str, autoscaling.IAutoScalingGroup],
                  spot_groups: Mapping[str, autoscaling.IAutoScalingGroup],
                  graph: Callable[..., cloudwatch.GraphWidget]) -> None:
        """Spot pools only: On-Demand vs Spot instances, interruptions and drains, and the fallback, apart."""
        fleet, pools = cfg.name, list(spot_groups)
        bases = {p.name: p for r in cfg.regions for p in r.pools if p.name in spot_groups}
        self.dashboard.add_widgets(
            graph("Spot tier: instances in service",
                  [asg_metric(groups[p], "GroupInServiceInstances", label=f"{p} On-Demand") for p in pools]
                  + [asg_metric(spot_groups[p], "GroupInServiceInstances", label=f"{p} Spot") for p in pools]
                  + [asg_metric(spot_groups[p], "GroupPendingInstances", label=f"{p} Spot pending") for p in pools],
                  stacked=False),
            graph("Spot interruptions and drains",
                  [runtime_metric(fleet, p, telemetry.SPOT_INTERRUPTION, "Sum", label=f"{p} interruption notices")
                   for p in pools]
                  + [runtime_metric(fleet, p, telemetry.SPOT_REBALANCE, "Sum", label=f"{p} rebalance drains")
                     for p in pools]
                  + [runtime_metric(fleet, p, telemetry.SPOT_DRAIN_COMPLETED, "Sum", label=f"{p} drains completed")
                     for p in pools],
                  right=[runtime_metric(fleet, p, telemetry.SPOT_DRAIN_CUT, "Sum", label=f"{p} streams cut")
                         for p in pools]),
            graph("On-Demand fallback (max above base = Spot short)",
                  [asg_metric(groups[p], "GroupMaxSize", "Maximum", label=f"{p} On-Demand max") for p in pools]
                  + [asg_metric(groups[p], "GroupDesiredCapacity", label=f"{p} On-Demand desired") for p in pools],
                  annotations=[cloudwatch.HorizontalAnnotation(value=bases[p].on_demand_base,
                                                               label=f"{p} On-Demand base") for p in pools]),
        )
