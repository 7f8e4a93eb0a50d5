"""The GPU fleets' machine image: the DLAMI's public SSM parameter, and pinning its current ids.

`ami: {id: latest}` makes each launch template read the parameter at deploy time
(CloudFormation resolves an `AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>`
parameter on every stack update), so a newer DLAMI rolls the fleet on the next
deploy. `fleetcast ami pin` reads the same parameter once per region with the
caller's credentials and writes the ids into the config, for teams that want
an AMI change to be a reviewed config change instead.

The DLAMI and its parameter: fleetcast/contract/ami.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fleetcast.contract.ami import DLAMI_SSM_PARAMETER
from fleetcast.contract.errors import EXIT_AWS_SERVICE, UserError


def latest_ami_id(access: Any, region: str) -> str:
    """The DLAMI id the public parameter names in `region` now (needs ssm:GetParameter)."""
    answer = access.call("ssm", region, "GetParameter", Name=DLAMI_SSM_PARAMETER)
    value: str = answer.get("Parameter", {}).get("Value", "")
    if not value.startswith("ami-"):
        raise UserError(f"{DLAMI_SSM_PARAMETER} in {region} holds {value!r}, not an AMI id", EXIT_AWS_SERVICE)
    return value


def pin(config_path: str | Path, access: Any, regions: Iterable[str] | None = None, *,
        dry_run: bool = False) -> list[tuple[str, str, str]]:
    """Write the current DLAMI id of each chosen provider region into `regions[i].ami.id`.

    Returns (region, old id, new id) per region. Every region is read before the file
    is touched, so a failure in one region leaves the config as it was; the edit keeps
    comments and layout and is validated before it replaces the file.
    """
    from fleetcast.config import load_config
    from fleetcast.config.edit import apply_edits

    cfg = load_config(config_path)
    names = [r.region for r in cfg.regions]
    chosen = list(regions) if regions else names
    for region in chosen:
        if region not in names:
            raise UserError(f"--region {region!r} is not a provider region of {config_path}; "
                            f"choose one of: {', '.join(names)}", 2)
    changes = []
    edits = []
    for index, region in enumerate(names):
        if region not in chosen:
            continue
        old = cfg.regions[index].ami.id
        new = latest_ami_id(access, region)
        changes.append((region, old, new))
        if new != old:
            edits.append((("regions", index, "ami", "id"), new))
    if edits and not dry_run:
        apply_edits(config_path, edits)
    return changes
