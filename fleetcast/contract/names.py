"""Names derived from the fleet's name: CloudFormation stacks (CLIs look them up by these)."""

from __future__ import annotations


def provider_stack_name(fleet: str, region: str) -> str:
    return f"{fleet}-provider-{region}"


def consumer_stack_name(fleet: str, consumer: str) -> str:
    return f"{fleet}-consumer-{consumer}"


def plan_drift_description(fleet: str, region: str, schedule: str) -> str:
    """The drift-check Lambda's description (stacks/plan_drift.py); validate checks it fits Lambda's limit."""
    return f"{fleet}: plan drift check in {region} ({schedule})"
