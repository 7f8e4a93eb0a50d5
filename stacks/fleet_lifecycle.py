"""How instances of one pool enter and leave: termination hook, warm pool, capacity reservations.

- Termination hook (`fleetcast.contract.telemetry.TERMINATE_HOOK`, in the group's own hook list like the
  launch hook, so the group's first instances have it too): on scale-in or refresh the
  group first deregisters the instance from the target group (the deregistration
  delay lets open streams finish), then holds it in Terminating:Wait while the
  runtime drains whatever is left, flushes metrics and completes the hook. The
  heartbeat covers `operations.drain_timeout_s` plus a margin for that cleanup; the
  default result is CONTINUE, so a hung runtime can delay a termination but never
  keep a bad instance alive. With `warm_pool.reuse_on_scale_in`, an instance going
  back to the warm pool pauses for this same hook in Warmed:Pending:Wait (its IMDS
  target lifecycle state is then `Warmed:Stopped`, not `Terminated`).
- Warm pool: `warm_pool.size` stopped instances that already ran the launch path
  (image pulled, engine built or fetched from the cache) so a scale-out only boots
  and serves. MinSize and MaxGroupPreparedCapacity are both the configured size,
  which makes the warm pool an absolute size instead of "max minus desired" (that
  default would keep a stopped GPU instance, and its volume, for every unused slot).
- Capacity reservations: the group targets the pool's On-Demand Capacity
  Reservations first (or only, with `capacity_reservations_only`).
"""

from __future__ import annotations

from aws_cdk import aws_autoscaling as autoscaling
from constructs import Construct

from fleetcast.config import FleetConfig, Pool
from fleetcast.contract import telemetry

from .launch_order import TERMINATING, add_lifecycle_hook, capacity_held

# Time the runtime needs after the drain itself: final metrics flush and log upload.
TERMINATE_HOOK_MARGIN_S = 120


def add_terminate_hook(cfg: FleetConfig, asg: autoscaling.AutoScalingGroup) -> None:
    """Scale-in (and a Spot interruption's termination) pauses here while the runtime drains, then continues."""
    add_lifecycle_hook(
        asg,
        name=telemetry.TERMINATE_HOOK,
        transition=TERMINATING,
        heartbeat_timeout_s=cfg.operations.drain_timeout_s + TERMINATE_HOOK_MARGIN_S,
        default_result="CONTINUE",
    )


class PoolLifecycle(Construct):
    """Termination hook, warm pool and capacity reservation targeting of one pool's group."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, pool: Pool,
                 asg: autoscaling.AutoScalingGroup) -> None:
        super().__init__(scope, construct_id)
        add_terminate_hook(cfg, asg)

        self.warm_pool: autoscaling.WarmPool | None = None
        # A warm pool launches (and pulls, and builds) whatever the group's size: none while held.
        if pool.warm_pool.size > 0 and not capacity_held(self):
            self.warm_pool = asg.add_warm_pool(
                min_size=pool.warm_pool.size,
                max_group_prepared_capacity=pool.warm_pool.size,
                pool_state=autoscaling.PoolState.STOPPED,
                reuse_on_scale_in=pool.warm_pool.reuse_on_scale_in,
            )

        if pool.capacity_reservation_ids:
            cfn_asg: autoscaling.CfnAutoScalingGroup = asg.node.default_child  # type: ignore[assignment]
            cfn_asg.capacity_reservation_specification = (
                autoscaling.CfnAutoScalingGroup.CapacityReservationSpecificationProperty(
                    capacity_reservation_preference=(
                        "capacity-reservations-only" if pool.capacity_reservations_only
                        else "capacity-reservations-first"
                    ),
                    capacity_reservation_target=autoscaling.CfnAutoScalingGroup.CapacityReservationTargetProperty(
                        capacity_reservation_ids=list(pool.capacity_reservation_ids),
                    ),
                )
            )
