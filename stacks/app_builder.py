"""Turn a validated FleetConfig into the CDK app: one provider stack per region, one consumer stack per consumer."""

from __future__ import annotations

from collections.abc import Callable

from aws_cdk import App, Stack

from fleetcast.config import FleetConfig
from fleetcast.contract.capacity_hold import HOLD_CONTEXT, check_held_regions

from . import nag
from .bench_fleet import bench_enabled, bench_knobs
from .feature_flags import FEATURE_FLAGS
from .fleet import add_fleet


def build_app(cfg: FleetConfig, app: App, *, report: Callable[[str], None] = print) -> dict[str, Stack]:
    """Add every stack of the fleet to `app` (with cdk-nag registered); returns stacks by name."""
    check_held_regions(app.node.try_get_context(HOLD_CONTEXT), [r.region for r in cfg.regions])
    if bench_enabled(app):
        bench_knobs(app)  # a bad -c knob is refused before any stack is built, not inside the first region's
    stacks = add_fleet(app, cfg, report=report)
    nag.enable(app)
    return stacks


def cdk_json_context() -> dict:
    """What `cdk synth` of app.py gives a Fleetcast stack: cdk.json's context and the feature flags the stacks
    pin on themselves; for apps built in-process (tests), also for constructs placed in a test's own stack."""
    import json
    from pathlib import Path

    return {**FEATURE_FLAGS, **json.loads((Path(__file__).resolve().parent.parent / "cdk.json").read_text())["context"]}
