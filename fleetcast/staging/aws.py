"""Where staging finds each region's bucket and image repository: the provider stack's outputs."""

from __future__ import annotations

from typing import Any

from fleetcast.contract.errors import EXIT_AWS_ACCESS, EXIT_USAGE, UserError


def stack_outputs(cfn: Any, stack_name: str) -> dict[str, str]:
    from fleetcast.aws_session import is_aws_error, translate

    try:
        stacks = cfn.describe_stacks(StackName=stack_name)["Stacks"]
    except Exception as exc:
        if not is_aws_error(exc):
            raise
        error = getattr(exc, "response", {}).get("Error", {})
        if "does not exist" in error.get("Message", ""):
            raise UserError(f"stack {stack_name} is not deployed in this account/region; deploy the provider "
                            f"stacks first (`npx cdk deploy {stack_name}`) or pass --bucket REGION=NAME") from None
        # Missing access is one line and exit 4 like every AWS-touching command; the rest names the stack.
        mapped = translate(exc, service="cloudformation", operation="DescribeStacks", region=cfn.meta.region_name)
        if mapped.exit_code == EXIT_AWS_ACCESS:
            raise mapped from None
        raise UserError(f"cannot read stack {stack_name} ({mapped})") from None
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}


def parse_region_map(values: list[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values or []:
        region, sep, name = value.partition("=")
        if not sep or not region or not name:
            raise UserError(f"{flag} takes REGION=VALUE, got {value!r}", exit_code=EXIT_USAGE)
        out[region] = name
    return out
