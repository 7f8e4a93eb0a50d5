"""Names derived from the fleet's config: CloudFormation stacks (CLIs look them up by these), which
consumers get a stack, and the config parameter's description (synth checks it). Shared by the app and
the CLIs. The config is described by the few attributes read here (fleetcast.config's models have them),
so the contract imports nothing of the project.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .model_ids import model_slug


class Consumer(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def service_region(self) -> str: ...
    @property
    def endpoint_service_name(self) -> str | None: ...


class _Region(Protocol):
    @property
    def region(self) -> str: ...


class FleetConfig(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def regions(self) -> Sequence[_Region]: ...
    @property
    def consumers(self) -> Sequence[Consumer]: ...
    def digest(self) -> str: ...

# The tag through which the provider stack makes its endpoint service findable (`fleetcast connections`).
FLEET_TAG = "fleetcast:fleet"


def provider_stack_name(fleet: str, region: str) -> str:
    return f"{fleet}-provider-{region}"


def fleet_of_provider_stack(stack: str, region: str) -> str | None:
    """The fleet name in a `provider_stack_name(fleet, region)`, or None for a stack not named so."""
    suffix = provider_stack_name("", region)
    if not stack.endswith(suffix):
        return None
    return stack[:-len(suffix)] or None


def consumer_stack_name(fleet: str, consumer: str) -> str:
    return f"{fleet}-consumer-{consumer}"


# PutMetricAlarm AlarmName: "Length Constraints: Minimum length of 1. Maximum length of 255" (botocore's
# cloudwatch model); validate checks each model alarm's name fits (fleetcast/config/rules.py).
ALARM_NAME_MAX = 255


def pool_alarm_prefix(fleet: str, region: str, pool: str) -> str:
    """What every alarm of one pool is named with (stacks/fleet_alarms.py)."""
    return f"{fleet}-{region}-{pool}"


def model_alarm_name(fleet: str, region: str, pool: str, model_id: str, what: str) -> str:
    """A pool's alarm on one model's metric (`what`: ttft-p99, itl-p99): the model as its slug, the one name
    form of an id (fleetcast/contract/model_ids.py)."""
    return f"{pool_alarm_prefix(fleet, region, pool)}-{model_slug(model_id)}-{what}"


def plan_drift_description(fleet: str, region: str, schedule: str) -> str:
    """The drift-check Lambda's description (stacks/plan_drift.py); validate checks it fits Lambda's limit."""
    return f"{fleet}: plan drift check in {region} ({schedule})"


def skip_reason(consumer: Consumer) -> str | None:
    """Why a consumer gets no stack, or None when it gets one."""
    if consumer.endpoint_service_name is None:
        return (
            "no endpoint_service_name yet: deploy the provider stack for "
            f"{consumer.service_region}, copy its EndpointServiceName output into the config, synth again"
        )
    return None


def expected_stacks(cfg: FleetConfig) -> list[str]:
    """Every stack the app builds for `cfg`, providers first."""
    names = [provider_stack_name(cfg.name, r.region) for r in cfg.regions]
    names += [consumer_stack_name(cfg.name, c.name) for c in cfg.consumers if skip_reason(c) is None]
    return names


def config_parameter_description(cfg: FleetConfig) -> str:
    """The `/<fleet>/config` parameter's description: names the whole config's digest (synth checks it)."""
    return f"Validated Fleetcast config (digest {cfg.digest()[:12]}); instances validate it again"
