"""The NLB facts the stack sets and the runtime counts on (fleetcast/contract/nlb.py), checked against AWS's own
service model: botocore's elbv2 model carries the Elastic Load Balancing API Reference's TargetGroupAttribute
text (https://docs.aws.amazon.com/elasticloadbalancing/latest/APIReference/API_TargetGroupAttribute.html)."""

from __future__ import annotations

import re

import botocore.session
import pytest

from fleetcast.contract import nlb


def _attribute_docs() -> str:
    model = botocore.session.get_session().get_service_model("elbv2")
    return re.sub(r"<[^>]+>", "", model.shape_for("TargetGroupAttribute").members["Key"].documentation)


def _entry(docs: str, key: str) -> str:
    start = docs.index(key)
    following = re.search(r"\s[a-z_]+\.[a-z_.]+ - ", docs[start + len(key):])
    return docs[start: start + len(key) + (following.start() if following else len(docs))]


def test_unhealthy_connection_termination_is_on_by_default_so_the_stack_must_turn_it_off():
    entry = _entry(_attribute_docs(), nlb.UNHEALTHY_CONNECTION_TERMINATION)
    assert "terminates connections to unhealthy targets" in entry and "The default is true" in entry
    assert nlb.unhealthy_drain_attributes(300)[nlb.UNHEALTHY_CONNECTION_TERMINATION] == "false"


def test_the_draining_interval_range_is_aws_s_and_needs_termination_off():
    entry = _entry(_attribute_docs(), nlb.UNHEALTHY_DRAINING_INTERVAL)
    assert f"The range is 0-{nlb.DRAINING_INTERVAL_MAX_S} seconds" in entry and "The default value is 0" in entry
    assert "only be configured when target_health_state.unhealthy.connection_termination.enabled is false" in entry
    assert nlb.unhealthy_drain_attributes(300) == {nlb.UNHEALTHY_CONNECTION_TERMINATION: "false",
                                                   nlb.UNHEALTHY_DRAINING_INTERVAL: "300"}


def test_a_drain_budget_the_nlb_cannot_hold_is_refused():
    with pytest.raises(ValueError, match="0-360000"):
        nlb.unhealthy_drain_attributes(nlb.DRAINING_INTERVAL_MAX_S + 1)


def test_new_flows_stop_after_the_unhealthy_threshold_of_health_checks():
    assert nlb.STOP_ROUTING_S == nlb.HEALTH_INTERVAL_S * nlb.UNHEALTHY_THRESHOLD == 20
