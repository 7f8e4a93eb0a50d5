"""operations.plan_drift_check: validated schedule and threshold; turning it on rolls no instance."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from fleetcast.config import ConfigError, parse_config

ROOT = Path(__file__).resolve().parents[2]
DOC = YAML(typ="safe").load((ROOT / "config" / "fleet.yaml").read_text())


def with_check(value) -> dict:
    doc = copy.deepcopy(DOC)
    doc["operations"]["plan_drift_check"] = value
    return doc


def test_off_by_default_and_on_with_defaults():
    assert parse_config(copy.deepcopy(DOC), "<t>").operations.plan_drift_check is None
    check = parse_config(with_check({}), "<t>").operations.plan_drift_check
    assert (check.schedule, check.threshold) == ("rate(1 day)", 0.2)


# EventBridge User Guide, "Rate expressions reference": "If the value is equal to 1, then the unit must be
# singular. If the value is greater than 1, the unit must be plural"; "Cron expressions have six required fields".
@pytest.mark.parametrize("schedule", ["rate(1 hour)", "rate(5 minutes)", "rate(2 days)", "cron(0 6 * * ? *)"])
def test_eventbridge_schedule_expressions_are_accepted(schedule):
    assert parse_config(with_check({"schedule": schedule}), "<t>").operations.plan_drift_check.schedule == schedule


@pytest.mark.parametrize("schedule", ["rate(1 hours)", "rate(5 hour)", "rate(0 days)", "daily", "cron(0 6 * * ?)"])
def test_anything_else_is_refused_naming_the_field(schedule):
    with pytest.raises(ConfigError) as err:
        parse_config(with_check({"schedule": schedule}), "<t>")
    assert "plan_drift_check.schedule" in err.value.render()


def test_threshold_must_be_positive():
    with pytest.raises(ConfigError, match="threshold"):
        parse_config(with_check({"threshold": 0}), "<t>")


def test_turning_it_on_rolls_no_instance():
    before, after = parse_config(copy.deepcopy(DOC), "<t>"), parse_config(with_check({}), "<t>")
    for region in before.regions:
        for pool in region.pools:
            assert before.instance_digest(region.region, pool.name) == after.instance_digest(region.region, pool.name)
