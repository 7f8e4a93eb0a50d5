"""First deploy order, on the stack side: hooks that exist before the first instance, and the capacity hold.

- `add_lifecycle_hook`: a hook in the group's own `LifecycleHookSpecificationList`.
- `capacity_held`: whether this synthesis holds the scope's region at zero instances
  (`-c hold_capacity=<regions>`, fleetcast/contract/capacity_hold.py; `fleetcast deploy` sets it).
"""

from __future__ import annotations

from aws_cdk import Stack, aws_autoscaling as autoscaling
from constructs import Construct

from fleetcast.contract.capacity_hold import HOLD_CONTEXT, parse_held_regions


def capacity_held(scope: Construct) -> bool:
    """Whether this deploy holds `scope`'s region at zero instances (`-c hold_capacity=<regions>`)."""
    return Stack.of(scope).region in parse_held_regions(scope.node.try_get_context(HOLD_CONTEXT))


LAUNCHING = "autoscaling:EC2_INSTANCE_LAUNCHING"
TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"


def add_lifecycle_hook(asg: autoscaling.AutoScalingGroup, *, name: str, transition: str, default_result: str,
                       heartbeat_timeout_s: int) -> None:
    """A lifecycle hook in the group's own `LifecycleHookSpecificationList`, not a separate
    AWS::AutoScaling::LifecycleHook resource: CloudFormation creates such a resource only after the
    group, whose first instances have launched by then without the hook. The list's hooks are added
    "to the Auto Scaling group before instances are launched" (CloudFormation, AWS::AutoScaling::AutoScalingGroup,
    LifecycleHookSpecificationList; the CreateAutoScalingGroup API's LifecycleHookSpecificationList)."""
    cfn_asg: autoscaling.CfnAutoScalingGroup = asg.node.default_child  # type: ignore[assignment]
    cfn_asg.lifecycle_hook_specification_list = [
        *(cfn_asg.lifecycle_hook_specification_list or []),
        autoscaling.CfnAutoScalingGroup.LifecycleHookSpecificationProperty(
            lifecycle_hook_name=name,
            lifecycle_transition=transition,
            default_result=default_result,
            heartbeat_timeout=heartbeat_timeout_s,
        ),
    ]
