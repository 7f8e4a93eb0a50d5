"""Consumer changes without new instances: re-read the fleet config, apply its live fields.

Consumers (accounts, limits, API keys) and who may call which model (`models[].consumers`)
are not instance inputs: the launch template carries only
`FleetConfig.instance_digest(region, pool)`, which leaves them out (NOT_IN_INSTANCE_DIGEST),
so adding a consumer, changing its limits or entitling it to another model does not roll
the GPU fleet. Running gateways learn about it here instead, within one refresh period. A config that
fails validation, or a source that cannot be read, changes nothing: the gateway
keeps serving the consumers it has and says why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from fleetcast.config import ConfigError, Consumer, FleetConfig, config_from_json
from fleetcast.contract.instance_env import Var, default

from .identity import log

Apply = Callable[[FleetConfig, tuple[Consumer, ...]], Awaitable[None]]


def entitled_ids(cfg: FleetConfig, consumers: tuple[Consumer, ...]) -> dict[str, tuple[str, ...]]:
    """consumer -> the model and adapter ids the config lets it call (what a refresh compares)."""
    return {c.name: cfg.models_for(c.name) for c in consumers}


class ConfigRefresher:
    """Polls `read()` (the SSM parameter on an instance) and hands changed consumers to `apply`."""

    def __init__(self, read: Callable[[], str], source: str, boot: FleetConfig, region: str, pool: str, apply: Apply,
                 refresh_s: float = default(Var.GATEWAY_REFRESH_S)):
        self._read = read
        self.source = source
        self.region = region
        self.pool = pool
        self._apply = apply
        self.refresh_s = refresh_s
        self._boot_instance_digest = boot.instance_digest(region, pool)
        self._consumers = boot.consumers_of(region)
        self._entitled = entitled_ids(boot, self._consumers)
        # The text last looked at, good or bad: each version is logged once.
        self._seen: str | None = boot.model_dump_json()

    async def refresh(self) -> bool:
        """One poll; True when consumers or their entitlements changed and were applied."""
        try:
            text = await asyncio.get_running_loop().run_in_executor(None, self._read)
        except Exception as exc:  # noqa: BLE001 - a failed read must never stop the gateway
            log("config_refresh_failed", source=self.source, error=f"{type(exc).__name__}: {exc}")
            return False
        if text == self._seen:
            return False
        self._seen = text
        try:
            cfg = config_from_json(text)
        except ConfigError as exc:  # not the JSON the stacks write, or not the config's shape
            log("config_refresh_rejected", source=self.source, error=exc.render(),
                kept=[c.name for c in self._consumers])
            return False
        try:
            digest = cfg.instance_digest(self.region, self.pool)
        except KeyError:
            digest = "(this pool is gone)"
        if digest != self._boot_instance_digest:
            # Model, engine, pool...: those reach this pool only through new instances
            # (the rollout the same deploy started). Consumers still apply now.
            log("config_instance_fields_changed", source=self.source, instance_digest=digest[:12],
                running=self._boot_instance_digest[:12])
        consumers = cfg.consumers_of(self.region)
        entitled = entitled_ids(cfg, consumers)
        if consumers == self._consumers and entitled == self._entitled:
            return False
        before = {c.name: c for c in self._consumers}
        after = {c.name: c for c in consumers}
        was_entitled = self._entitled
        try:
            await self._apply(cfg, consumers)
        except Exception as exc:  # noqa: BLE001 - keep serving what we have; retry next period
            self._seen = None
            log("config_apply_failed", source=self.source, error=f"{type(exc).__name__}: {exc}",
                kept=[c.name for c in self._consumers])
            return False
        self._consumers, self._entitled = consumers, entitled
        log("consumers_reloaded", source=self.source,
            added=sorted(after.keys() - before.keys()), removed=sorted(before.keys() - after.keys()),
            changed=sorted(n for n in after.keys() & before.keys() if after[n] != before[n]),
            entitlements_changed=sorted(n for n in after.keys() & before.keys()
                                        if entitled[n] != was_entitled.get(n)))
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()
