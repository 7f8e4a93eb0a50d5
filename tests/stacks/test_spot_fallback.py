"""The Spot fallback Lambda (stacks/lambdas/spot_fallback/handler.py) against an Auto Scaling stand-in that
enforces what the real API does: min <= desired <= max, else a ValidationError, and the role's ceiling."""

from __future__ import annotations

import json

import pytest

from stacks.lambdas.spot_fallback import handler

SPOT, OD = "fleet-r-l40s-spot", "fleet-r-l40s"
POOLS = {SPOT: {"on_demand": OD, "base": 2, "ceiling": 5}}


class ValidationError(Exception):
    pass


class FakeAutoScaling:
    """Two groups, their instances, and UpdateAutoScalingGroup's validation and the IAM MaxSize condition."""

    def __init__(self, od: tuple[int, int, int], spot_desired: int, spot_held: int, ceiling: int = 5):
        self.groups = {
            OD: {"MinSize": od[0], "DesiredCapacity": od[1], "MaxSize": od[2], "Instances": []},
            SPOT: {"MinSize": 0, "DesiredCapacity": spot_desired, "MaxSize": 4,
                   "Instances": [{"LifecycleState": "InService"}] * spot_held},
        }
        self.ceiling = ceiling
        self.updates: list[dict] = []

    def describe_auto_scaling_groups(self, AutoScalingGroupNames):  # noqa: N803 - boto3's names
        return {"AutoScalingGroups": [dict(self.groups[n], AutoScalingGroupName=n) for n in AutoScalingGroupNames]}

    def update_auto_scaling_group(self, AutoScalingGroupName, **kwargs):  # noqa: N803
        if AutoScalingGroupName != OD or "MaxSize" not in kwargs or kwargs["MaxSize"] > self.ceiling:
            raise PermissionError("AccessDenied: not allowed by the role (resource or autoscaling:MaxSize)")
        group = dict(self.groups[OD], **kwargs)
        if not group["MinSize"] <= group["DesiredCapacity"] <= group["MaxSize"]:
            raise ValidationError(f"Desired capacity:{group['DesiredCapacity']} must be between the specified min "
                                  f"size:{group['MinSize']} and max size:{group['MaxSize']}")
        self.groups[OD] = group
        self.updates.append(kwargs)


@pytest.fixture
def asg(monkeypatch):
    monkeypatch.setenv("POOLS", json.dumps(POOLS))

    def make(*args, **kwargs) -> FakeAutoScaling:
        fake = FakeAutoScaling(*args, **kwargs)
        monkeypatch.setitem(handler._CLIENTS, "autoscaling", fake)
        return fake

    return make


def failure(message: str, group: str = SPOT) -> dict:
    return {"detail-type": handler.LAUNCH_FAILED,
            "detail": {"AutoScalingGroupName": group, "StatusCode": "Failed", "StatusMessage": message}}


def launched(group: str = SPOT) -> dict:
    return {"detail-type": handler.LAUNCHED, "detail": {"AutoScalingGroupName": group, "StatusCode": "InProgress"}}


# Messages as Auto Scaling writes them into the event's StatusMessage ("Troubleshoot Amazon EC2 Auto Scaling:
# EC2 instance launch failures"); the codes are the EC2 API's ("Error codes for the Amazon EC2 API").
NO_SPOT = "There is no Spot capacity available that matches your request. Launching EC2 instance failed."
ICE = ("We currently do not have sufficient g6e.xlarge capacity in the Availability Zone you requested "
       "(ap-northeast-2a). Launching EC2 instance failed. (InsufficientInstanceCapacity)")


@pytest.mark.parametrize("message", [NO_SPOT, ICE])
def test_a_spot_capacity_failure_sizes_on_demand_to_base_plus_the_spot_shortfall(asg, message):
    fake = asg(od=(2, 2, 2), spot_desired=3, spot_held=1)
    out = handler.handler(failure(message))
    assert out["action"] == "fallback"
    assert fake.groups[OD]["MaxSize"] == 4 and fake.groups[OD]["DesiredCapacity"] == 4  # base 2 + shortfall 2


def test_repeated_failures_of_the_same_shortage_do_not_grow_on_demand_further(asg):
    fake = asg(od=(2, 2, 2), spot_desired=3, spot_held=1)
    for _ in range(5):  # Auto Scaling retries the failed launch; each failure is an event
        handler.handler(failure(NO_SPOT))
    assert fake.groups[OD]["DesiredCapacity"] == 4


def test_the_fallback_never_passes_the_ceiling(asg):
    fake = asg(od=(2, 2, 2), spot_desired=4, spot_held=0)
    handler.handler(failure(NO_SPOT))
    assert fake.groups[OD]["MaxSize"] == 5 and fake.groups[OD]["DesiredCapacity"] == 5  # not base 2 + 4
    assert handler.handler(failure(NO_SPOT))["action"] == "at-ceiling"


def test_failures_for_other_causes_or_groups_change_nothing(asg):
    fake = asg(od=(2, 2, 2), spot_desired=3, spot_held=1)
    quota = "You have requested more vCPU capacity than your current vCPU limit of 8 allows (VcpuLimitExceeded)."
    assert handler.handler(failure(quota))["action"] == "ignored"
    assert handler.handler(failure(NO_SPOT, group=OD))["action"] == "ignored"  # the On-Demand group's own failure
    assert handler.handler(failure(NO_SPOT, group="someone-elses-group"))["action"] == "ignored"
    assert fake.updates == []


def test_spot_launching_again_stops_the_fallback_without_terminating_anything(asg):
    fake = asg(od=(2, 4, 5), spot_desired=3, spot_held=3)
    out = handler.handler(launched())
    assert out["action"] == "settle"
    assert fake.groups[OD]["MaxSize"] == 4 and fake.groups[OD]["DesiredCapacity"] == 4  # max down to what runs
    assert fake.updates == [{"MaxSize": 4}]  # desired untouched: scale-in returns it to the base, one at a time
    fake.groups[OD]["DesiredCapacity"] = 2  # scale-in did its work
    handler.handler(launched())
    assert fake.groups[OD]["MaxSize"] == 2  # back at the base: no fallback headroom left


def test_at_the_base_a_spot_launch_changes_nothing(asg):
    fake = asg(od=(2, 2, 2), spot_desired=1, spot_held=1)
    assert handler.handler(launched())["action"] == "unchanged"
    assert fake.updates == []


def test_every_update_names_max_size_so_the_iam_ceiling_condition_applies(asg):
    # IAM evaluates a Numeric condition on an absent key as false: an update without MaxSize would be denied.
    fake = asg(od=(2, 2, 2), spot_desired=3, spot_held=0)
    handler.handler(failure(ICE))
    fake.groups[OD]["DesiredCapacity"] = 3
    handler.handler(launched())
    assert fake.updates and all("MaxSize" in u for u in fake.updates)


def test_concurrent_covers_of_one_shortage_end_at_the_freshest_cover(asg):
    # No reserved concurrency: another invocation that read the groups earlier (shortfall 1) writes its lower
    # cover right after this one's write, as two events of one shortage can. This invocation's re-read sees it and
    # writes the cover again; without that check the On-Demand group would stay a whole instance short.
    fake = asg(od=(2, 2, 2), spot_desired=3, spot_held=1)
    real_update = fake.update_auto_scaling_group
    stale = [{"MaxSize": 3, "DesiredCapacity": 3}]  # base 2 + the shortfall 1 it saw

    def update(AutoScalingGroupName, **kwargs):  # noqa: N803
        real_update(AutoScalingGroupName, **kwargs)
        if stale:
            real_update(AutoScalingGroupName, **stale.pop())

    fake.update_auto_scaling_group = update
    out = handler.handler(failure(NO_SPOT))
    assert out["action"] == "fallback"
    assert (fake.groups[OD]["MaxSize"], fake.groups[OD]["DesiredCapacity"]) == (4, 4)


def test_a_cover_that_keeps_being_overtaken_stops_after_its_rounds(asg):
    fake = asg(od=(2, 2, 2), spot_desired=3, spot_held=1)
    real_update = fake.update_auto_scaling_group

    def update(AutoScalingGroupName, **kwargs):  # noqa: N803 - every write undone at once
        real_update(AutoScalingGroupName, **kwargs)
        real_update(AutoScalingGroupName, MaxSize=2, DesiredCapacity=2)

    fake.update_auto_scaling_group = update
    handler.handler(failure(NO_SPOT))
    assert len(fake.updates) == 2 * handler.COVER_ROUNDS
