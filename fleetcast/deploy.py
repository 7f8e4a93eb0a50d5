"""The deploy path in the order AWS requires, for a single-account setup; every step also runs alone.

    bootstrap -> providers -> stage -> capacity -> publish -> consumers -> approve -> smoke
    teardown: consumers -> providers (buckets and image repositories retained unless asked)

First deploy order (fleetcast/first_deploy.py): `providers` deploys a region whose stack is new (or
still held) and whose model and image are not staged yet with its fleets held at zero instances;
`capacity`, after `stage`, deploys each held region again without the hold once `fleetcast stage
status` finds it staged, and refuses (naming what is missing) while it is not. A running fleet is
never held: a region already serving deploys as configured, with a warning if it is not staged.

Each step is either commands (the pinned CDK CLI through npx, or `fleetcast`
itself) or a small Python action against AWS. `--dry-run` prints the plan and
touches nothing. Multi-account setups run the same steps with each account's
credentials (the README's deployment guide says which account runs which).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from fleetcast.config import FleetConfig
from fleetcast.errors import UserError

STEPS = ("bootstrap", "providers", "stage", "capacity", "publish", "consumers", "approve", "smoke")
TEARDOWN = ("consumers", "providers")


def provider_stack(cfg: FleetConfig, region: str) -> str:
    return f"{cfg.name}-provider-{region}"


def consumer_stack(cfg: FleetConfig, name: str) -> str:
    return f"{cfg.name}-consumer-{name}"


@dataclass
class Step:
    name: str
    summary: str
    commands: list[list[str]] = field(default_factory=list)
    # Decides at run time (it reads AWS) which of `commands` run and how.
    resolve: Callable[[list[list[str]]], "Resolution"] | None = None
    action: Callable[[], list[str]] | None = None  # returns lines to print
    # Run first, for the operator to read; a failure is reported and does not stop the step.
    preview: list[list[str]] = field(default_factory=list)

    def describe(self) -> list[str]:
        lines = [f"== {self.name}: {self.summary}"]
        lines += ["   $ " + " ".join(c) + "   (preview)" for c in self.preview]
        lines += ["   $ " + " ".join(c) for c in self.commands]
        if self.action is not None:
            lines.append("   (reads stack outputs and edits the config)")
        return lines


@dataclass
class Resolution:
    """What a step runs, decided at run time: its commands, lines to print, and a refusal raised after the
    commands ran (what could proceed did)."""

    commands: list[list[str]]
    notes: list[str] = field(default_factory=list)
    refusal: str | None = None


def _fleetcast(*args: str) -> list[str]:
    return [sys.executable, "-m", "scripts.cli", *args]


def _cdk(*args: str) -> list[str]:
    return ["npx", "cdk", *args]


def publish_service_names(cfg: FleetConfig, config_path: str, clients: Callable[[str, str], Any]) -> list[str]:
    """Copy each provider region's endpoint service name into its consumers' entries in the config."""
    from fleetcast.config.edit import apply_edits
    from fleetcast.staging.aws import pick_output, stack_outputs

    names: dict[str, str] = {}
    for region in {c.service_region for c in cfg.consumers}:
        stack = provider_stack(cfg, region)
        names[region] = pick_output(stack_outputs(clients("cloudformation", region), stack), "servicename", stack=stack)
    edits = [(("consumers", i, "endpoint_service_name"), names[c.service_region])
             for i, c in enumerate(cfg.consumers) if c.endpoint_service_name != names[c.service_region]]
    if edits:
        apply_edits(config_path, edits)
    return [f"{c.name}: {names[c.service_region]}" + ("" if c.endpoint_service_name != names[c.service_region] else " (unchanged)")
            for c in cfg.consumers]


def plan(cfg: FleetConfig, config_path: str, clients: Callable[[str, str], Any], *, steps: Sequence[str],
         trust_account: str | None = None, smoke_endpoint: str | None = None, approval: str = "broadening") -> list[Step]:
    ctx = ["-c", f"config={config_path}"]
    providers = [provider_stack(cfg, r.region) for r in cfg.regions]
    consumers = [consumer_stack(cfg, c.name) for c in cfg.consumers]
    out: list[Step] = []
    for name in steps:
        if name == "bootstrap":
            envs = sorted({f"aws://{cfg.provider.account}/{r.region}" for r in cfg.regions}
                          | {f"aws://{c.account}/{c.region}" for c in cfg.consumers})
            trust = ["--trust", trust_account, "--trust-for-lookup", trust_account] if trust_account else []
            out.append(Step(name, "CDK bootstrap of every account/region the stacks deploy to",
                            [_cdk("bootstrap", *ctx, *trust, env) for env in envs]))
        elif name == "providers":
            out.append(Step(name, "VPC, fleet, NLB and endpoint service per region",
                            [_cdk("deploy", *ctx, "--require-approval", approval, *providers)],
                            # Which pools this deploy rolls, against what each region runs now.
                            preview=[_fleetcast("config", "diff", "--deployed", config_path)]))
        elif name == "stage":
            commands = [_fleetcast("stage", "model", "--config", config_path),
                        _fleetcast("stage", "image", "--config", config_path)]
            out.append(Step(name, "model weights into every region bucket; serving image into every region's ECR",
                            commands))
        elif name == "capacity":
            from fleetcast.first_deploy import release_resolver

            out.append(Step(name, "give regions held at zero instances their configured capacity once "
                            "`fleetcast stage status` finds their model and image staged (only those are deployed)",
                            [_cdk("deploy", *ctx, "--require-approval", approval, *providers)],
                            resolve=release_resolver(cfg, clients)))
        elif name == "publish":
            out.append(Step(name, "endpoint service names from the provider stacks into the consumer entries",
                            action=lambda: publish_service_names(cfg, config_path, clients)))
        elif name == "consumers":
            out.append(Step(name, "interface endpoint per consumer (each consumer account can run this itself)",
                            [_cdk("deploy", *ctx, "--require-approval", approval, *consumers)] if consumers else []))
        elif name == "approve":
            out.append(Step(name, "accept pending connections from allowed accounts",
                            [_fleetcast("connections", "sync", "--config", config_path, "--yes")]))
        elif name == "smoke":
            if smoke_endpoint:
                out.append(Step(name, "one streamed completion through the endpoint",
                                [_fleetcast("smoke", "--endpoint", smoke_endpoint)]))
            else:
                out.append(Step(name, "one streamed completion: run from inside a consumer VPC (or through an "
                                "SSM port-forwarding session) with --smoke-endpoint http://<endpoint DNS>:"
                                f"{cfg.engine.port}"))
        else:
            raise UserError(f"unknown step {name!r}; steps: {', '.join(STEPS)}", 2)
    from fleetcast.first_deploy import hold_resolver

    for step in out:
        if step.name == "providers" and clients is not None:  # without clients (a plan only) there is no AWS to ask
            step.summary += "; a new region not staged yet is deployed held at zero instances"
            step.resolve = hold_resolver(cfg, clients)
    return out


def teardown_plan(cfg: FleetConfig, config_path: str) -> list[Step]:
    """Consumers first: an endpoint service cannot be deleted while endpoints are connected to it."""
    ctx = ["-c", f"config={config_path}"]
    consumers = [consumer_stack(cfg, c.name) for c in cfg.consumers]
    providers = [provider_stack(cfg, r.region) for r in cfg.regions]
    return [
        Step("consumers", "delete consumer interface endpoints", [_cdk("destroy", *ctx, "--force", *consumers)] if consumers else []),
        Step("providers", "delete fleets, NLBs and endpoint services (buckets, logs and image repositories are "
             "retained: delete them by hand when the data may go)", [_cdk("destroy", *ctx, "--force", *providers)]),
    ]


def execute(steps: Sequence[Step], *, dry_run: bool, run: Callable[..., Any] = subprocess.run,
            log: Callable[[str], None] = print) -> None:
    for step in steps:
        for line in step.describe():
            log(line)
        if dry_run:
            continue
        for command in step.preview:
            if run(command).returncode != 0:
                log(f"   (preview `{' '.join(command[3:])}` failed; continuing with the step)")
        resolution = step.resolve(step.commands) if step.resolve is not None else Resolution(step.commands)
        for line in resolution.notes:
            log(f"   {line}")
        for command in resolution.commands:
            if run(command).returncode != 0:
                raise UserError(f"step {step.name} failed: `{' '.join(command)}`; fix it and rerun "
                                f"`fleetcast deploy --step {step.name}` (later steps did not run)")
        if step.action is not None:
            for line in step.action():
                log(f"   {line}")
        if resolution.refusal:
            raise UserError(f"step {step.name}: {resolution.refusal}")
