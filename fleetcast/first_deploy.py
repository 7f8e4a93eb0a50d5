"""`fleetcast deploy`'s first-deploy order: which provider regions are held at zero instances, and when
they get their capacity (fleetcast/contract/capacity_hold.py has the mechanism, stacks/ apply it).

- providers: a region whose stack is new, or still held, and not staged yet is deployed with
  `-c hold_capacity`; a staged region deploys as configured; a region already serving is never
  held (it deploys as configured, with a warning when it is not staged).
- capacity: each held region that `fleetcast stage status`'s check (fleetcast/staging/readiness.py)
  now finds staged is deployed again without the hold; the others are refused, naming what is
  missing, after the ready ones were deployed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetcast.config import FleetConfig
from fleetcast.contract.capacity_hold import hold_context_args
from fleetcast.contract.errors import UserError
from fleetcast.contract.names import provider_stack_name
from fleetcast.staging.readiness import region_readiness


@dataclass
class Resolution:
    """What a step runs, decided at run time: its commands, lines to print, and a refusal raised after the
    commands ran (what could proceed did)."""

    commands: list[list[str]]
    notes: list[str] = field(default_factory=list)
    refusal: str | None = None


def provider_regions(cfg: FleetConfig, command: list[str]) -> list[str]:
    """The provider regions whose stacks a cdk command names."""
    return [r.region for r in cfg.regions if provider_stack_name(cfg.name, r.region) in command]


def hold_resolver(cfg: FleetConfig, clients: Callable[[str, str], Any]) -> Callable[[list[list[str]]], Resolution]:
    """providers: add `-c hold_capacity=...` for the regions that must not launch instances yet."""

    def resolve(commands: list[list[str]]) -> Resolution:
        out, lines = [], []
        for command in commands:
            held = []
            for region in provider_regions(cfg, command):
                ready = region_readiness(cfg, region, clients, provider_stack_name(cfg.name, region))
                if ready.staged:
                    lines.append(f"{region}: model and image staged: deployed with its configured capacity")
                elif not ready.deployed or ready.held:
                    held.append(region)
                    lines.append(f"{region}: {'new stack' if not ready.deployed else 'still held'}, not staged yet "
                                 f"({ready.problems[0]}): fleets held at zero instances until the capacity step")
                else:
                    lines.append(f"{region}: WARNING: serving, but {'; '.join(ready.problems)}; deployed as "
                                 "configured (a running fleet is never held at zero): stage it before its "
                                 "instances are replaced")
            out.append([*command, *hold_context_args(held)])
        return Resolution(out, lines)

    return resolve


def release_resolver(cfg: FleetConfig,
                     clients: Callable[[str, str], Any] | None) -> Callable[[list[list[str]]], Resolution]:
    """capacity: deploy held regions that are staged now; refuse, naming what is missing, for the rest."""

    def resolve(commands: list[list[str]]) -> Resolution:
        if clients is None:
            raise UserError("the capacity step reads the provider stacks and staging state: it needs AWS access")
        out, lines, waiting = [], [], []
        stacks = {provider_stack_name(cfg.name, r.region) for r in cfg.regions}
        for command in commands:
            release = []
            for region in provider_regions(cfg, command):
                ready = region_readiness(cfg, region, clients, provider_stack_name(cfg.name, region))
                if not ready.held:
                    lines.append(f"{region}: not held" + ("" if ready.deployed else " (stack not deployed)"))
                elif ready.staged:
                    release.append(provider_stack_name(cfg.name, region))
                    lines.append(f"{region}: model and image staged: deploying its configured capacity")
                else:
                    waiting.append(f"{region}: {'; '.join(ready.problems)}")
            if release:
                out.append([a for a in command if a not in stacks or a in release])
        refusal = None
        if waiting:
            refusal = ("held at zero instances until staged: " + " | ".join(waiting) + "; run `fleetcast deploy "
                       "--step stage` (`fleetcast stage status` shows what is missing), then `fleetcast deploy "
                       "--step capacity`")
        return Resolution(out, lines, refusal)

    return resolve
