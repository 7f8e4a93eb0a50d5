"""The config a provider region runs now: its config parameter, as the last deploy wrote it.

`fleetcast config diff --deployed NEW` compares NEW with it, region by region, to say
before a deploy which pools would roll there.
"""

from __future__ import annotations

from typing import Any

from fleetcast.config import ConfigError, FleetConfig, config_from_json
from fleetcast.contract.errors import UserError


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
