"""Turn a validated FleetConfig into the CDK app: one provider stack per region, one consumer stack per consumer."""

from __future__ import annotations

from collections.abc import Callable

from aws_cdk import App, Environment, Stack, Tags

from fleetcast.capacity_hold import HOLD_CONTEXT, check_held_regions
from fleetcast.config import FleetConfig
from fleetcast.contract.names import consumer_stack_name, provider_stack_name

from . import nag
from .bench_fleet import BenchFleets, bench_enabled
from .consumer import ConsumerStack
from .naming import skip_reason
from .provider import ProviderStack


def build_app(cfg: FleetConfig, app: App, *, report: Callable[[str], None] = print) -> dict[str, Stack]:
    """Add every stack of the fleet to `app` (with cdk-nag registered); returns stacks by name."""
    stacks: dict[str, Stack] = {}
    check_held_regions(app.node.try_get_context(HOLD_CONTEXT), [r.region for r in cfg.regions])
    for region in cfg.regions:
        name = provider_stack_name(cfg.name, region.region)
        stacks[name] = ProviderStack(
            app,
            name,
            cfg=cfg,
            region=region,
            env=Environment(account=cfg.provider.account, region=region.region),
            description=f"Fleetcast {cfg.name}: GPU fleet and PrivateLink service in {region.region}",
        )
        if bench_enabled(app):
            # `-c bench=true`: one self-benchmarking instance per pool, scaling itself to zero (issue 6).
            BenchFleets(stacks[name], "Bench", cfg=cfg, region=region, provider=stacks[name])
    for consumer in cfg.consumers:
        reason = skip_reason(consumer)
        if reason:
            report(f"fleetcast: skipping consumer {consumer.name}: {reason}")
            continue
        name = consumer_stack_name(cfg.name, consumer.name)
        stacks[name] = ConsumerStack(
            app,
            name,
            cfg=cfg,
            consumer=consumer,
            env=Environment(account=consumer.account, region=consumer.region),
            description=f"Fleetcast {cfg.name}: {consumer.name}'s endpoint to the {consumer.service_region} service",
        )
    for key, value in cfg.tags.items():
        Tags.of(app).add(key, value)
    nag.enable(app)
    return stacks


def cdk_json_context() -> dict:
    """The feature flags and defaults from cdk.json, for apps built in-process (tests) to match `cdk synth`."""
    import json
    from pathlib import Path

    return json.loads((Path(__file__).resolve().parent.parent / "cdk.json").read_text())["context"]
