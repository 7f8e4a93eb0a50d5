"""Names derived from the fleet's name: CloudFormation stacks (CLIs look them up by these)."""

from __future__ import annotations


def provider_stack_name(fleet: str, region: str) -> str:
    return f"{fleet}-provider-{region}"


def consumer_stack_name(fleet: str, consumer: str) -> str:
    return f"{fleet}-consumer-{consumer}"
