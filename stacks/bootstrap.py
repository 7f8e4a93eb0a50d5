"""What every instance of the region reads at boot: the validated config and the runtime bundle.

The config travels as an SSM parameter (the JSON of the validated model, read
and validated again on the instance) rather than inside user data, which stays
small; the config digest in user data is what rolls the launch template.
"""

from __future__ import annotations

from aws_cdk import Stage, aws_s3_assets as s3_assets, aws_ssm as ssm
from constructs import Construct

from fleetcast.config import FleetConfig
from fleetcast.config.parameter import ADVANCED_TIER_LIMIT, config_parameter
from fleetcast.contract.errors import UserError
from fleetcast.contract.names import config_parameter_description

from .bench_fleet import bench_enabled
from .runtime_bundle import BENCH, SERVING, stage_bundle


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
        bundle = BENCH if bench_enabled(self) else SERVING
        self.runtime_bundle = s3_assets.Asset(self, "RuntimeBundle", path=str(stage_bundle(Stage.of(self).outdir, bundle)))
