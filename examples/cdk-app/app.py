#!/usr/bin/env python3
"""A platform team's own CDK app that adds a Fleetcast fleet next to its own stacks.

    npx cdk synth -a ".venv/bin/python examples/cdk-app/app.py"   (from the repository root, offline)

The venv's Python (or `python` with the venv activated): it has aws_cdk and fleetcast, a bare one has not.

The team's stack (an SNS topic its on-call subscribes to) and Fleetcast's provider and consumer
stacks live in one app. Fleetcast's stacks keep their names (the `fleetcast` CLI finds them by
those) and their templates (the feature flags are pinned on each stack), whatever this app's
cdk.json says. cdk-nag runs on the whole app, the team's stack included.
"""

from __future__ import annotations

import sys
from pathlib import Path

from aws_cdk import App, Environment, Stack, aws_iam as iam, aws_kms as kms, aws_sns as sns
from constructs import Construct

from fleetcast.config import load_config
from fleetcast_cdk import nag
from fleetcast_cdk.fleet import add_fleet

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parents[1] / "config" / "fleet.yaml"


class PlatformAlertsStack(Stack):
    """The team's own stack: an encrypted topic that CloudWatch alarms of every platform service publish to."""

    def __init__(self, scope: Construct, construct_id: str, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        key = kms.Key(self, "TopicKey", enable_key_rotation=True, description="Platform alerts topic")
        key.grant_encrypt_decrypt(iam.ServicePrincipal("cloudwatch.amazonaws.com"))
        self.topic = sns.Topic(self, "Alerts", master_key=key, enforce_ssl=True)


def build(app: App, config_path: Path = CONFIG) -> dict[str, Stack]:
    """The whole app: the team's stack in the provider account, then the fleet's stacks."""
    cfg = load_config(str(config_path))
    home = Environment(account=cfg.provider.account, region=cfg.regions[0].region)
    stacks: dict[str, Stack] = {"platform-alerts": PlatformAlertsStack(app, "platform-alerts", env=home)}
    stacks |= add_fleet(app, cfg, report=lambda line: print(line, file=sys.stderr))
    nag.enable(app)
    return stacks


if __name__ == "__main__":
    app = App()
    build(app)
    app.synth()
