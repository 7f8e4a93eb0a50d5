"""What every instance of the region reads at boot: the validated config and the runtime bundle.

The config travels as an SSM parameter (the JSON of the validated model, read
and validated again on the instance) rather than inside user data, which stays
small; the config digest in user data is what rolls the launch template.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from fleetcast.config import FleetConfig
from fleetcast.config.parameter import ADVANCED_TIER_LIMIT, config_parameter
from fleetcast.errors import UserError

from .naming import config_parameter_description

REPO_ROOT = Path(__file__).resolve().parent.parent
# Python packages the instance runs: the config model and the runtime.
BUNDLED_PACKAGES = ("fleetcast", "runtime")


def stage_runtime_bundle() -> Path:
    """Copy the bundled packages into one directory (a CDK asset takes one path); the hash follows content."""
    staging = Path(tempfile.mkdtemp(prefix="fleetcast-runtime-bundle-"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for package in BUNDLED_PACKAGES:
        shutil.copytree(REPO_ROOT / package, staging / package, ignore=ignore)
    return staging


class InstanceBootstrap(Construct):
    """The config parameter (`/<fleet>/config`) and the runtime bundle asset of one region."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig) -> None:
        super().__init__(scope, construct_id)
        # Plain JSON up to 8 KB, compressed beyond (fleetcast/config/parameter.py); validate refuses a
        # config that fits no tier, so this refusal is only a backstop.
        value, tier = config_parameter(cfg)
        if tier is None:
            raise UserError(
                f"the config parameter value is {len(value)} bytes even compressed; an SSM parameter holds at most "
                f"{ADVANCED_TIER_LIMIT}: trim consumers or pools, or split the fleet"
            )
        self.config_parameter = ssm.StringParameter(
            self,
            "Config",
            parameter_name=cfg.config_parameter_name,
            description=config_parameter_description(cfg),
            string_value=value,
            tier=ssm.ParameterTier.ADVANCED if tier == "Advanced" else ssm.ParameterTier.STANDARD,
        )
        self.runtime_bundle = s3_assets.Asset(self, "RuntimeBundle", path=str(stage_runtime_bundle()))
