"""The config a provider region runs now: its config parameter, as the last deploy wrote it; and which
other Fleetcast fleets run in the region.

`fleetcast config diff --deployed NEW` compares NEW with it, region by region, to say
before a deploy which pools would roll there. A config whose fleet `name` changed finds no parameter
under its new name; `other_fleets` then names the fleet the region runs, since deploying the renamed
config would start a second fleet beside it (`fleetcast deploy` asks first).
"""

from __future__ import annotations

from typing import Any

from fleetcast.config import ConfigError, FleetConfig, config_from_json
from fleetcast.contract.errors import UserError


def other_fleets(access: Any, cfg: FleetConfig, region: str) -> list[str]:
    """The provider stacks of other Fleetcast fleets in `region` of the account `access` acts in, when `cfg`'s
    own provider stack is not there (deploying `cfg` would then create a fleet beside them); else [].

    A Fleetcast provider stack is one named `provider_stack_name(fleet, region)` that has the endpoint
    service output (fleetcast/contract/outputs.py). Needs cloudformation:DescribeStacks.
    """
    from fleetcast.contract.names import fleet_of_provider_stack, provider_stack_name
    from fleetcast.contract.outputs import ProviderOutput

    fleets = [stack["StackName"] for stack in access.paginate("cloudformation", region, "DescribeStacks", "Stacks")
              if fleet_of_provider_stack(stack["StackName"], region) is not None
              and any(o.get("OutputKey") == ProviderOutput.ENDPOINT_SERVICE_NAME for o in stack.get("Outputs", []))]
    return [] if provider_stack_name(cfg.name, region) in fleets else fleets


def deployed_config(access: Any, cfg: FleetConfig, region: str) -> FleetConfig | None:
    """The validated config in `region`'s parameter, or None when the region is not deployed yet.

    `access` is a fleetcast.connections.aws.Access (standard credentials, retries on
    throttling, a missing permission named as its IAM action).
    """
    from fleetcast.connections.aws import AwsCallError

    name = cfg.config_parameter_name
    try:
        value = access.call("ssm", region, "GetParameter", Name=name)["Parameter"]["Value"]
    except AwsCallError as exc:
        if exc.code == "ParameterNotFound":
            return None
        raise
    try:
        return config_from_json(value)
    except ConfigError as exc:
        raise UserError(f"{region}: the deployed {name} does not validate with this Fleetcast version, so it cannot be "
                        f"compared:\n{exc.render()}") from None
    except ValueError as exc:
        raise UserError(f"{region}: the deployed {name} is not JSON ({exc}); was it written by Fleetcast?") from None
