"""Safe rollout of one pool: CloudFormation instance refresh with checkpoints and alarm-driven rollback.

Anything an instance uses (engine, precision, image, AMI, instance type) reaches the
launch template through the config digest in the user data, so a config change is a
new launch template version, which CloudFormation rolls out through the group's
`AutoScalingInstanceRefresh` update policy: `min_healthy_percentage` of the desired
capacity stays in service, replacements launch first while `max_healthy_percentage`
is above 100, the refresh pauses at each checkpoint, and the stack update only
succeeds after the bake time.

Rollback: the CloudFormation policy supports an alarm specification but not the
StartInstanceRefresh API's AutoRollback flag (checked against aws-cdk-lib 2.275's
CfnAutoScalingInstanceRefreshPreferences and cfn-lint's update-policy schema). An
alarm that goes to ALARM during the refresh, a checkpoint or the bake time fails
the refresh, which fails the stack update, and CloudFormation's stack rollback puts
the previous launch template version back and refreshes the replaced instances to
it. The alarms watched are the pool's latency, error, build and circuit-breaker
alarms and the service's zero-healthy alarm (at most 10, a CloudFormation limit).

An alarm already in ALARM when the deploy starts fails the refresh at once, so a fix
for an ongoing incident cannot roll out while it watches: `rollout.rollback_on_alarms:
false` drops the alarm specification for that one deploy (docs/runbook.md).

The `AutoScalingScheduledAction` policy keeps a deploy from resetting sizes that
schedules or scaling set (only sizes changed in the template are applied).
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import (
    CfnAutoScalingInstanceRefresh,
    CfnAutoScalingInstanceRefreshAlarmSpecification,
    CfnAutoScalingInstanceRefreshPreferences,
    CfnAutoScalingScheduledAction,
    CfnUpdatePolicy,
    aws_autoscaling as autoscaling,
    aws_cloudwatch as cloudwatch,
)
from constructs import Construct

from fleetcast.config import Pool

MAX_ROLLBACK_ALARMS = 10  # CloudFormation's AlarmSpecification limit


class PoolRollout(Construct):
    """Instance-refresh update policy of one pool's group, rolled back by its alarms."""

    def __init__(self, scope: Construct, construct_id: str, *, pool: Pool, asg: autoscaling.AutoScalingGroup,
                 rollback_alarms: Sequence[cloudwatch.IAlarm]) -> None:
        super().__init__(scope, construct_id)
        if len(rollback_alarms) > MAX_ROLLBACK_ALARMS:
            raise ValueError(f"an instance refresh watches at most {MAX_ROLLBACK_ALARMS} alarms, "
                             f"got {len(rollback_alarms)} for pool {pool.name}")
        spec = pool.rollout
        self.preferences = CfnAutoScalingInstanceRefreshPreferences(
            min_healthy_percentage=spec.min_healthy_percentage,
            max_healthy_percentage=spec.max_healthy_percentage,
            checkpoint_percentages=list(spec.checkpoint_percentages),
            checkpoint_delay=spec.checkpoint_delay_s,
            bake_time=spec.bake_time_s,
            instance_warmup=spec.instance_warmup_s,
            skip_matching=True,  # instances already on the new template are kept
            # A scale-in-protected or standby instance must not be silently left on the old version.
            scale_in_protected_instances="Wait",
            standby_instances="Wait",
            alarm_specification=CfnAutoScalingInstanceRefreshAlarmSpecification(
                alarms=[alarm.alarm_name for alarm in rollback_alarms],
            ) if spec.rollback_on_alarms else None,
        )
        cfn_asg: autoscaling.CfnAutoScalingGroup = asg.node.default_child  # type: ignore[assignment]
        # Replaces any rolling-update policy: the two are mutually exclusive.
        cfn_asg.cfn_options.update_policy = CfnUpdatePolicy(
            auto_scaling_instance_refresh=CfnAutoScalingInstanceRefresh(strategy="Rolling", preferences=self.preferences),
            auto_scaling_scheduled_action=CfnAutoScalingScheduledAction(ignore_unmodified_group_size_properties=True),
        )
