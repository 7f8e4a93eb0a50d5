"""Where staging finds each region's bucket and image repository: the provider stack's outputs."""

from __future__ import annotations

from typing import Any

from fleetcast.errors import UserError


def stack_outputs(cfn: Any, stack_name: str) -> dict[str, str]:
    try:
        stacks = cfn.describe_stacks(StackName=stack_name)["Stacks"]
    except cfn.exceptions.ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        message = exc.response.get("Error", {}).get("Message", "")
        if "does not exist" in message:
            raise UserError(f"stack {stack_name} is not deployed in this account/region; deploy the provider "
                            f"stacks first (`npx cdk deploy {stack_name}`) or pass --bucket REGION=NAME") from None
        raise UserError(f"cannot read stack {stack_name} ({code}: {message})") from None
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}


def parse_region_map(values: list[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values or []:
        region, sep, name = value.partition("=")
        if not sep or not region or not name:
            raise UserError(f"{flag} takes REGION=VALUE, got {value!r}", exit_code=2)
        out[region] = name
    return out
