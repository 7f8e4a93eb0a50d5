"""On-Demand fallback for a pool's Spot tier (runs in AWS Lambda; boto3 + stdlib only).

Targets of the region's launch-failure rule (and of a rule for the Spot groups' successful launches):

- A Spot group's launch failed for lack of capacity (the EC2 error codes InsufficientInstanceCapacity,
  UnfulfillableCapacity, InsufficientCapacity, or Auto Scaling's "no Spot capacity available" message): the
  pool's On-Demand group covers the Spot group's shortfall. The Spot group's desired capacity is the demand
  above the base (its target tracking sets it from the pool's load), so the shortfall is that desired minus
  the instances it holds, and the On-Demand group is sized to base + shortfall (MaxSize and DesiredCapacity),
  never above the configured ceiling and never below what it already runs. Auto Scaling retries a failed
  launch, so each retry that fails again re-applies the cover for the shortfall of that moment.
- A Spot group launched an instance again: the On-Demand group's MaxSize is lowered to what it runs now (never
  below the base), so it grows no further; its cautious scale-in (one instance per cooldown) then returns it
  to the base while the Spot tier takes the load back. Lowering max never terminates an instance here.

Any other event (another group, another cause such as a quota or a bad launch template) changes nothing.

Concurrency: the function reserves none (an account at the default low Lambda concurrency quota rejects any
reservation), so two events of one shortage can run at once, and UpdateAutoScalingGroup has no conditional
write. Each cover therefore re-reads both groups after it writes and writes again while the On-Demand group is
below the cover of the state it just read (COVER_ROUNDS at most). A cover that finishes last read a state at
least as fresh as any other's, so the group ends at the freshest cover; an older, lower write by a concurrent
invocation is undone within its rounds. A settle computed from a stale read sets a MaxSize below the desired
capacity a concurrent cover set, which the API refuses (ValidationError): the event's retry re-reads.
POOLS maps each Spot group to {"on_demand": name, "base": n, "ceiling": n}, computed at synth; the role may
update only those On-Demand groups, with MaxSize at most their ceiling (IAM condition autoscaling:MaxSize),
so neither a bug here nor a crafted event can grow a group past what the config allows.
"""

from __future__ import annotations

import json
import os

LAUNCH_FAILED = "EC2 Instance Launch Unsuccessful"
LAUNCHED = "EC2 Instance Launch Successful"
# Capacity, not configuration: EC2 API error codes (Amazon EC2 API Reference, "Error codes for the Amazon EC2
# API") and the status message EC2 Auto Scaling writes for an unfulfilled Spot request.
CAPACITY_SIGNS = ("InsufficientInstanceCapacity", "UnfulfillableCapacity", "InsufficientCapacity",
                  "no Spot capacity available", "not have sufficient")
_HELD = ("Pending", "Pending:Wait", "Pending:Proceed", "InService")
COVER_ROUNDS = 3
_CLIENTS: dict = {}


def _client(name: str):
    if name not in _CLIENTS:  # once per warm container; tests put a fake here
        import boto3

        _CLIENTS[name] = boto3.client(name)
    return _CLIENTS[name]


def _pools() -> dict[str, dict]:
    return json.loads(os.environ["POOLS"])


def is_capacity_failure(detail: dict) -> bool:
    text = f"{detail.get('StatusMessage', '')} {detail.get('Cause', '')} {detail.get('StatusCode', '')}"
    return any(sign.lower() in text.lower() for sign in CAPACITY_SIGNS)


def _group(name: str) -> dict:
    groups = _client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    if not groups:
        raise LookupError(f"Auto Scaling group {name} not found")
    return groups[0]


def _held(group: dict) -> int:
    return sum(1 for i in group.get("Instances", []) if i.get("LifecycleState") in _HELD)


def _log(**fields: object) -> dict:
    print(json.dumps({"event": "spot_fallback", **fields}, sort_keys=True))
    return fields


def handler(event: dict, _context: object = None) -> dict:
    detail = event.get("detail") or {}
    spot_name = detail.get("AutoScalingGroupName", "")
    pool = _pools().get(spot_name)
    kind = event.get("detail-type")
    if pool is None:
        return _log(action="ignored", reason="not a Spot group of this fleet", group=spot_name)
    if kind == LAUNCH_FAILED:
        if not is_capacity_failure(detail):
            return _log(action="ignored", reason="launch failure not for capacity", group=spot_name,
                        status=detail.get("StatusMessage"))
        return _cover(spot_name, pool)
    if kind == LAUNCHED:
        return _settle(spot_name, pool)
    return _log(action="ignored", reason=f"event {kind!r}", group=spot_name)


def _cover(spot_name: str, pool: dict) -> dict:
    result: dict = {}
    for _ in range(COVER_ROUNDS):  # write, then check the write was not overtaken by a concurrent, older one
        spot, od = _group(spot_name), _group(pool["on_demand"])
        shortfall = max(1, int(spot["DesiredCapacity"]) - _held(spot))
        current_max, desired = int(od["MaxSize"]), int(od["DesiredCapacity"])
        cover = min(int(pool["ceiling"]), int(pool["base"]) + shortfall)
        # Never lowered: a maximum a person raised past the ceiling stays as they set it.
        new_max, new_desired = max(current_max, cover), max(desired, cover)
        if new_max == current_max and new_desired == desired:
            return result or _log(action="at-ceiling", group=pool["on_demand"], max=current_max,
                                  ceiling=pool["ceiling"], spot_shortfall=shortfall)
        _client("autoscaling").update_auto_scaling_group(
            AutoScalingGroupName=pool["on_demand"], MaxSize=new_max, DesiredCapacity=new_desired)
        result = _log(action="fallback", group=pool["on_demand"], max=new_max, desired=new_desired,
                      spot_shortfall=shortfall, ceiling=pool["ceiling"])
    return result


def _settle(spot_name: str, pool: dict) -> dict:
    od = _group(pool["on_demand"])
    current_max, desired = int(od["MaxSize"]), int(od["DesiredCapacity"])
    new_max = max(int(pool["base"]), desired)
    if new_max >= current_max:
        return _log(action="unchanged", group=pool["on_demand"], max=current_max)
    _client("autoscaling").update_auto_scaling_group(AutoScalingGroupName=pool["on_demand"], MaxSize=new_max)
    return _log(action="settle", group=pool["on_demand"], max=new_max, spot_group=spot_name)
