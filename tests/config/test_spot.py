"""The optional spot block of a pool: what it may say, and every refusal names its field and what is allowed."""

import json

import pytest

from fleetcast.config import parse_config
from fleetcast.config.model import SPOT_ALLOCATION_STRATEGIES, SpotSpec

from .conftest import problems


def seoul(doc) -> dict:
    return doc["regions"][0]["pools"][0]  # g6e.xlarge (L40S), capacity min 2 max 6, warm pool 1


def the_one(doc) -> str:
    found = problems(doc)
    assert len(found) == 1, found
    return found[0]


def test_a_spot_tier_with_defaults_is_valid_and_holds_the_baseline_on_demand(doc):
    seoul(doc)["spot"] = {"instance_types": ["g6e.xlarge", "g6e.2xlarge"]}
    pool = parse_config(doc).regions[0].pools[0]
    assert pool.spot.allocation_strategy == "price-capacity-optimized"
    assert pool.spot.capacity_rebalance is True and pool.spot.drain_on_rebalance is False
    assert pool.on_demand_base == 2  # capacity.min
    assert pool.on_demand_fallback_max == 6  # capacity.max
    assert pool.spot_instance_types == ("g6e.xlarge", "g6e.2xlarge")


def test_the_spot_types_default_to_the_pools_own_type(doc):
    seoul(doc)["spot"] = {}
    assert parse_config(doc).regions[0].pools[0].spot_instance_types == ("g6e.xlarge",)


def test_allocation_strategies_are_ec2_auto_scalings():
    # Source: Amazon EC2 Auto Scaling User Guide, "Allocation strategies for multiple instance types"
    # (Spot: price-capacity-optimized (recommended), capacity-optimized, capacity-optimized-prioritized,
    # lowest-price); the same values as InstancesDistribution.SpotAllocationStrategy in the API reference.
    assert set(SPOT_ALLOCATION_STRATEGIES) == {"price-capacity-optimized", "capacity-optimized",
                                               "capacity-optimized-prioritized", "lowest-price"}
    assert SpotSpec().allocation_strategy == "price-capacity-optimized"
    field = SpotSpec.model_json_schema()["properties"]["allocation_strategy"]
    assert set(field["enum"]) == set(SPOT_ALLOCATION_STRATEGIES)


def test_an_unknown_allocation_strategy_is_refused_naming_the_allowed_ones(doc):
    seoul(doc)["spot"] = {"allocation_strategy": "diversified"}  # an EC2 Fleet strategy, not Auto Scaling's
    msg = the_one(doc)
    assert msg.startswith("regions[0].pools[0].spot.allocation_strategy")
    assert "price-capacity-optimized" in msg


def test_spot_types_must_share_the_pools_gpu(doc):
    seoul(doc)["spot"] = {"instance_types": ["g6e.2xlarge", "g6.xlarge"]}  # L4, not L40S
    msg = the_one(doc)
    assert msg.startswith("regions[0].pools[0].spot.instance_types[1]:")
    assert "1x L4" in msg and "1x L40S" in msg and "allowed: g6e.2xlarge, g6e.xlarge" in msg


def test_an_unknown_spot_type_is_refused(doc):
    seoul(doc)["spot"] = {"instance_types": ["p9.huge"]}
    assert the_one(doc).startswith("regions[0].pools[0].spot.instance_types[0]: 'p9.huge' is not a supported")


def test_a_spot_tier_on_a_fixed_size_pool_is_an_error(doc):
    seoul(doc)["capacity"] = {"min": 3, "max": 3}
    seoul(doc)["spot"] = {}
    msg = the_one(doc)
    assert msg.startswith("regions[0].pools[0].spot:") and "min == max" in msg


def test_all_spot_needs_an_explicit_allow(doc):
    seoul(doc)["capacity"] = {"min": 0, "max": 4}
    seoul(doc)["warm_pool"] = {"size": 0}
    seoul(doc)["spot"] = {}
    msg = the_one(doc)
    assert msg.startswith("regions[0].pools[0].spot.allow_all_spot:") and "allow_all_spot: true" in msg
    seoul(doc)["spot"] = {"allow_all_spot": True}
    assert problems(doc) == []
    # An On-Demand base, or an On-Demand share above it, is not all-Spot.
    seoul(doc)["spot"] = {"on_demand_base": 1}
    assert problems(doc) == []
    seoul(doc)["spot"] = {"spot_percentage": 70}
    assert problems(doc) == []


def test_the_base_must_leave_room_for_spot(doc):
    seoul(doc)["spot"] = {"on_demand_base": 6}
    msg = the_one(doc)
    assert msg.startswith("regions[0].pools[0].spot.on_demand_base:") and "0..5" in msg


def test_the_fallback_ceiling_lies_between_base_and_max(doc):
    seoul(doc)["spot"] = {"on_demand_fallback_max": 7}
    msg = the_one(doc)
    assert msg.startswith("regions[0].pools[0].spot.on_demand_fallback_max:") and "between on_demand_base 2" in msg
    seoul(doc)["spot"] = {"on_demand_fallback_max": 1}
    assert the_one(doc).startswith("regions[0].pools[0].spot.on_demand_fallback_max:")


@pytest.mark.parametrize("field,value", [("spot_percentage", 0), ("spot_percentage", 101), ("bogus", 1)])
def test_out_of_range_or_unknown_spot_fields_are_refused(doc, field, value):
    seoul(doc)["spot"] = {field: value}
    assert the_one(doc).startswith(f"regions[0].pools[0].spot.{field}")


def test_desired_and_schedule_do_not_combine_with_a_spot_tier(doc):
    seoul(doc)["capacity"] = {"min": 2, "desired": 3, "max": 6}
    seoul(doc)["spot"] = {}
    assert the_one(doc).startswith("regions[0].pools[0].capacity.desired:")
    seoul(doc)["capacity"] = {"min": 2, "max": 6}
    seoul(doc)["schedule"] = [{"cron": "0 23 * * *", "min": 2, "max": 4}]
    assert the_one(doc).startswith("regions[0].pools[0].schedule:")


def test_a_pool_without_spot_dumps_as_before_the_field_existed(doc):
    cfg = parse_config(doc)
    dumped = json.loads(cfg.model_dump_json())
    assert all("spot" not in p for r in dumped["regions"] for p in r["pools"])
    seoul(doc)["spot"] = {}
    with_spot = json.loads(parse_config(doc).model_dump_json())
    assert with_spot["regions"][0]["pools"][0]["spot"]["spot_percentage"] == 100


def test_the_spot_block_does_not_roll_the_pool(doc):
    before = parse_config(doc).instance_digest("ap-northeast-2", "l40s")
    seoul(doc)["spot"] = {"instance_types": ["g6e.xlarge", "g6e.2xlarge"]}
    assert parse_config(doc).instance_digest("ap-northeast-2", "l40s") == before
