"""The construct API: Fleetcast's stacks inside a platform team's own CDK app or CDK Pipelines stages.

    from fleetcast.config import load_config
    from fleetcast_cdk.fleet import FleetcastStage, add_fleet   # `stacks.fleet` inside the repository

    cfg = load_config("fleet.yaml")              # or parse_config(dict) for a config built in code
    add_fleet(app, cfg)                           # every stack of the fleet, next to the app's own stacks
    FleetcastStage(pipeline_scope, "Consumers", cfg=cfg, account="444455556666")   # one account's stacks

Every stack keeps the name the `fleetcast` CLI looks it up by (`provider_stack_name`,
`consumer_stack_name`), wherever it sits in the tree, and pins the CDK feature flags it is
tested against (stacks/feature_flags.py), so its template is the same in any app. cdk-nag is the
caller's to register on its App or Stage (`nag.enable`); `FleetcastStage` registers it on itself.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from aws_cdk import Environment, Stack, Stage, Tags
from constructs import Construct

from fleetcast.config import FleetConfig
from fleetcast.contract.names import consumer_stack_name, provider_stack_name, skip_reason
from fleetcast.contract.spill import pending_spill_reason, service_name_of, spill_targets

from . import nag
from .bench_fleet import BenchFleets, bench_enabled
from .consumer import ConsumerStack
from .consumer_failover import dns_failover_skip_reason
from .provider import ProviderStack

# Resources the config's `tags` stay off (see add_fleet).
UNTAGGED_RESOURCE_TYPES = ["AWS::EC2::LaunchTemplate"]


def add_fleet(scope: Construct, cfg: FleetConfig, *, accounts: Collection[str] | None = None,
              report: Callable[[str], None] = print) -> dict[str, Stack]:
    """Add the fleet's stacks under `scope` (an App or a Stage): one provider stack per region and one
    consumer stack per consumer whose endpoint service name is known (`report` says why one is skipped).
    `accounts`: only the stacks that deploy into these accounts. Returns the stacks by name."""
    stacks: dict[str, Stack] = {}
    if accounts is None or cfg.provider.account in accounts:
        for region in cfg.regions:
            name = provider_stack_name(cfg.name, region.region)
            stacks[name] = provider = ProviderStack(
                scope, name, stack_name=name, cfg=cfg, region=region,
                env=Environment(account=cfg.provider.account, region=region.region),
                description=f"Fleetcast {cfg.name}: GPU fleet and PrivateLink service in {region.region}",
            )
            for remote in spill_targets(cfg, region.region):
                reason = pending_spill_reason(cfg, region.region, remote)
                if reason:
                    report(f"fleetcast: {reason}")
            if bench_enabled(scope):
                # `-c bench=true`: one self-benchmarking instance per pool, scaling itself to zero (issue 6).
                BenchFleets(provider, "Bench", cfg=cfg, region=region, provider=provider)
    for consumer in cfg.consumers:
        if accounts is not None and consumer.account not in accounts:
            continue
        reason = skip_reason(consumer)
        if reason:
            report(f"fleetcast: skipping consumer {consumer.name}: {reason}")
            continue
        if consumer.failover_region is not None and service_name_of(cfg, consumer.failover_region) is None:
            report(f"fleetcast: consumer {consumer.name} gets no failover endpoint yet: copy the "
                   f"{consumer.failover_region} provider stack's EndpointServiceName output into "
                   f"regions[{consumer.failover_region}].endpoint_service_name, synth again")
        elif consumer.failover_region is not None and (reason := dns_failover_skip_reason(cfg, consumer)):
            report(f"fleetcast: {reason}")
        name = consumer_stack_name(cfg.name, consumer.name)
        stacks[name] = ConsumerStack(
            scope, name, stack_name=name, cfg=cfg, consumer=consumer,
            env=Environment(account=consumer.account, region=consumer.region),
            description=f"Fleetcast {cfg.name}: {consumer.name}'s endpoint to the {consumer.service_region} service",
        )
    for stack in stacks.values():
        for key, value in cfg.tags.items():
            # Not into launch templates: a tag there is launch template data, so changing it would make a new
            # version and replace every instance. The groups propagate the tags to the instances they launch.
            Tags.of(stack).add(key, value, exclude_resource_types=UNTAGGED_RESOURCE_TYPES)
    return stacks


class FleetcastStage(Stage):
    """One account's share of the fleet as a CDK Pipelines stage: the provider stacks when `account` is the
    provider account, and the consumer stacks of the consumers in `account`; cdk-nag registered on it.

    `stacks` maps stack name -> Stack. A stage with no stack for `account` is refused: a pipeline
    wave that deploys nothing is a misspelt account, not an intent."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, account: str,
                 report: Callable[[str], None] = print, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.stacks = add_fleet(self, cfg, accounts={account}, report=report)
        if not self.stacks:
            from fleetcast.contract.errors import UserError

            known = sorted({cfg.provider.account} | {c.account for c in cfg.consumers})
            raise UserError(f"FleetcastStage {construct_id}: fleet {cfg.name} deploys no stack into account "
                            f"{account}; its accounts: {', '.join(known)}")
        nag.enable(self)
