"""Stack names and consumer skip rules: pure Python (no CDK import), shared by the app and the CLIs."""

from __future__ import annotations

from fleetcast.config import Consumer, FleetConfig
from fleetcast.contract.names import consumer_stack_name, provider_stack_name


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
