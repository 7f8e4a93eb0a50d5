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
touches nothing.

Accounts (fleetcast.accounts.AccountAccess): every command acting in an account
gets that account's profile (`--profile-for ACCOUNT=PROFILE`, else `--profile`),
so the provider steps run with the provider's credentials and each consumer
account's bootstrap and endpoint stack with its own; `--account` narrows the run
to some accounts. `--region R` narrows it to provider region R and the consumers
it serves.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from fleetcast.accounts import AccountAccess
from fleetcast.config import FleetConfig
from fleetcast.contract.context import Context, arg as context_arg
from fleetcast.contract.errors import UserError
from fleetcast.contract.names import consumer_stack_name, provider_stack_name, skip_reason
from fleetcast.contract.packaging import cli_module
from fleetcast.first_deploy import Resolution, hold_resolver, release_resolver

STEPS = ("bootstrap", "providers", "stage", "capacity", "publish", "consumers", "approve", "smoke")
TEARDOWN = ("consumers", "providers")


@dataclass
class Step:
    name: str
    summary: str
    commands: list[list[str]] = field(default_factory=list)
    # Decides at run time (it reads AWS) which of `commands` run and how.
    resolve: Callable[[list[list[str]]], Resolution] | None = None
    action: Callable[[], list[str]] | None = None  # returns lines to print
    # Run first, for the operator to read; a failure is reported and does not stop the step.
    preview: list[list[str]] = field(default_factory=list)
    # Teardown: the stacks this step deletes, one line each (name, account, region).
    deletes: list[str] = field(default_factory=list)

    def describe(self) -> list[str]:
        lines = [f"== {self.name}: {self.summary}"]
        lines += [f"   - delete {d}" for d in self.deletes]
        lines += ["   $ " + shown(c) + "   (preview)" for c in self.preview]
        lines += ["   $ " + shown(c) for c in self.commands]
        if self.action is not None:
            lines.append("   (reads stack outputs and edits the config)")
        return lines


# How the plan runs the CLIs (this interpreter, the venv's pinned CDK CLI) and how it prints them: the forms the
# README and runbook give, which an operator can copy and which read the same on every machine.
_CLI_RUN = [sys.executable, "-m", cli_module()]
CLI_SHOWN = ["fleetcast"]
CDK_SHOWN = ["npx", "cdk"]


def _fleetcast(*args: str) -> list[str]:
    return [*_CLI_RUN, *args]


def shown(command: Sequence[str]) -> str:
    """`command` as printed: `fleetcast ...` and `npx cdk ...` rather than this machine's interpreter and node."""
    from fleetcast.node import cdk_command

    for run, show in ((_CLI_RUN, CLI_SHOWN), (cdk_command(), CDK_SHOWN)):
        if list(command[:len(run)]) == run:
            return shlex.join([*show, *command[len(run):]])
    return shlex.join(command)


def _cdk(*args: str, profile: Sequence[str] = ()) -> list[str]:
    """The pinned CDK CLI on the venv's Node LTS (fleetcast.node), with the acting account's `--profile`."""
    from fleetcast.node import cdk_command

    return [*cdk_command(), *args, *profile]


def _by_account(items: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    """(account, stack) pairs -> stacks per account, in first-seen order: one cdk command per account."""
    out: dict[str, list[str]] = {}
    for account, stack in items:
        out.setdefault(account, []).append(stack)
    return out


def select_regions(cfg: FleetConfig, regions: Sequence[str] | None) -> list[str]:
    """Provider regions to act on: all, or those `--region` names (each must be one of the config's)."""
    known = [r.region for r in cfg.regions]
    for region in regions or []:
        if region not in known:
            raise UserError(f"--region {region} is not a provider region of fleet {cfg.name} ({', '.join(known)})", 2)
    return [r for r in known if not regions or r in regions]


def _region_args(cfg: FleetConfig, chosen: Sequence[str]) -> list[str]:
    """`--region` for each chosen region, or nothing when all are chosen (the sub-command's default)."""
    if len(chosen) == len(cfg.regions):
        return []
    return [arg for region in chosen for arg in ("--region", region)]


def publish_service_names(cfg: FleetConfig, config_path: str, clients: Callable[[str, str], Any],
                          regions: Sequence[str] | None = None) -> list[str]:
    """Copy each provider region's endpoint service name into its consumers' entries in the config, and into
    the region's own entry where another region spills to it or a consumer fails over to it."""
    from fleetcast.config.edit import apply_edits
    from fleetcast.contract.outputs import ProviderOutput, require_output
    from fleetcast.contract.spill import reached_regions
    from fleetcast.staging.aws import stack_outputs

    chosen = select_regions(cfg, regions)
    consumers = [(i, c) for i, c in enumerate(cfg.consumers) if c.service_region in chosen]
    # Regions another region spills to or a consumer fails over to: their spill and failover endpoints
    # connect by regions[].endpoint_service_name (fleetcast/contract/spill.py).
    targets = [(j, r) for j, r in enumerate(cfg.regions) if r.region in chosen and r.region in reached_regions(cfg)]
    names: dict[str, str] = {}
    for region in {c.service_region for _, c in consumers} | {r.region for _, r in targets}:
        stack = provider_stack_name(cfg.name, region)
        names[region] = require_output(stack_outputs(clients("cloudformation", region), stack),
                                       ProviderOutput.ENDPOINT_SERVICE_NAME, stack)
    edits = [(("consumers", i, "endpoint_service_name"), names[c.service_region])
             for i, c in consumers if c.endpoint_service_name != names[c.service_region]]
    edits += [(("regions", j, "endpoint_service_name"), names[r.region])
              for j, r in targets if r.endpoint_service_name != names[r.region]]
    if edits:
        apply_edits(config_path, edits)
    return [f"{c.name}: {names[c.service_region]}" + ("" if c.endpoint_service_name != names[c.service_region] else " (unchanged)")
            for _, c in consumers] + [
        f"regions[{r.region}]: {names[r.region]}" + ("" if r.endpoint_service_name != names[r.region] else " (unchanged)")
        for _, r in targets]


def _aws(clients: Callable[[str, str], Any] | None, step: str) -> Callable[[str, str], Any]:
    # A plan built without AWS access (a dry run, a test) can be printed; running one of its AWS-reading steps
    # must refuse as a usage error rather than fail calling None.
    if clients is None:
        raise UserError(f"the {step} step reads the provider stacks: it needs AWS access")
    return clients


def plan(cfg: FleetConfig, config_path: str, clients: Callable[[str, str], Any] | None, *, steps: Sequence[str],
         trust_account: str | None = None, execution_policies: Sequence[str] = (), smoke_endpoint: str | None = None,
         approval: str = "broadening", aws: Any = None, access: AccountAccess | None = None,
         regions: Sequence[str] | None = None) -> list[Step]:
    """`access`: the profile acting in each account and the accounts acted in (default: `aws`'s profile
    everywhere); `clients` act in the provider account; `regions`: only these provider regions and the
    consumers they serve (default: all). `trust_account` needs `execution_policies`, as the CDK CLI does."""
    if trust_account and not execution_policies:
        # The pinned CDK CLI refuses `--trust` without them (MissingExecutionPoliciesForTrust); say so before
        # any step, with the least-privilege choice left to the operator rather than AdministratorAccess.
        raise UserError("--trust needs --execution-policy ARN (the policy the trusted account's deployments run "
                        "under; cdk bootstrap refuses --trust without --cloudformation-execution-policies)", 2)
    access = access or AccountAccess(default=getattr(aws, "profile", None))
    ctx = context_arg(Context.CONFIG, config_path)
    chosen = select_regions(cfg, regions)
    provider = cfg.provider.account
    in_provider = access.acts_in(provider)
    providers = [provider_stack_name(cfg.name, r) for r in chosen] if in_provider else []
    served = [c for c in cfg.consumers if c.service_region in chosen]
    # The app builds a consumer stack only once its endpoint service name is in the config: the publish
    # step of this run writes it, otherwise cdk would be asked for a stack that does not exist.
    deployable = served if "publish" in steps else [c for c in served if skip_reason(c) is None]
    consumers = _by_account([(c.account, consumer_stack_name(cfg.name, c.name)) for c in deployable
                             if access.acts_in(c.account)])
    profile = access.cli_args(provider)
    as_provider = access.cdk_args(provider)
    where = _region_args(cfg, chosen)
    out: list[Step] = []
    for name in steps:
        if name in ("providers", "stage", "capacity", "publish", "approve") and not in_provider:
            continue  # provider-account steps, and --account leaves the provider account out
        if name == "bootstrap":
            envs = sorted({(provider, r) for r in chosen if in_provider}
                          | {(c.account, c.region) for c in served if access.acts_in(c.account)})
            trust = ([arg for a in ("--trust", "--trust-for-lookup") for arg in (a, trust_account)]
                     + ["--cloudformation-execution-policies", ",".join(execution_policies)] if trust_account else [])
            out.append(Step(name, "CDK bootstrap of every account/region the stacks deploy to, each with that "
                            "account's own credentials",
                            [_cdk("bootstrap", *ctx, *trust, f"aws://{a}/{r}", profile=access.cdk_args(a))
                             for a, r in envs]))
        elif name == "providers":
            # Which pools this deploy rolls, against what each region runs now (diff --deployed takes one region).
            diffs = ([_fleetcast("config", "diff", "--deployed", config_path, *profile)] if not where else
                     [_fleetcast("config", "diff", "--deployed", config_path, *profile, "--region", r) for r in chosen])
            out.append(Step(name, "VPC, fleet, NLB and endpoint service per region",
                            [_cdk("deploy", *ctx, "--require-approval", approval, *providers, profile=as_provider)],
                            preview=diffs))
        elif name == "stage":
            commands = [_fleetcast("stage", "model", "--config", config_path, *profile, *where),
                        _fleetcast("stage", "image", "--config", config_path, *profile, *where)]
            out.append(Step(name, "model weights into every region bucket; serving image into every region's ECR",
                            commands))
        elif name == "capacity":
            out.append(Step(name, "give regions held at zero instances their configured capacity once "
                            "`fleetcast stage status` finds their model and image staged (only those are deployed)",
                            [_cdk("deploy", *ctx, "--require-approval", approval, *providers, profile=as_provider)],
                            resolve=release_resolver(cfg, clients)))
        elif name == "publish":
            out.append(Step(name, "endpoint service names from the provider stacks into the consumer entries",
                            action=lambda: publish_service_names(cfg, config_path, _aws(clients, "publish"), chosen)))
        elif name == "consumers":
            out.append(Step(name, "interface endpoint per consumer, one deploy per consumer account with its "
                            "profile (each consumer account can run this itself: --account)",
                            [_cdk("deploy", *ctx, "--require-approval", approval, *stacks,
                                  profile=access.cdk_args(account)) for account, stacks in consumers.items()]))
        elif name == "approve":
            out.append(Step(name, "accept pending connections from allowed accounts",
                            [_fleetcast("connections", "sync", "--config", config_path, *profile, *where, "--yes")]))
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
    for step in out:
        if step.name == "providers" and clients is not None and providers:  # without clients (a plan only) there is no AWS to ask
            step.summary += "; a new region not staged yet is deployed held at zero instances"
            step.resolve = hold_resolver(cfg, clients)
    return out


def teardown_plan(cfg: FleetConfig, config_path: str, *, aws: Any = None, access: AccountAccess | None = None,
                  regions: Sequence[str] | None = None, steps: Sequence[str] = TEARDOWN) -> list[Step]:
    """Consumers first: an endpoint service cannot be deleted while endpoints are connected to it.

    `--force` only skips the CDK CLI's own prompt: `fleetcast teardown` has shown the stacks and asked
    (`confirm_teardown`) before any of these commands runs.
    """
    access = access or AccountAccess(default=getattr(aws, "profile", None))
    ctx = context_arg(Context.CONFIG, config_path)
    chosen = select_regions(cfg, regions)
    # A consumer the app builds no stack for (no endpoint_service_name yet) has nothing cdk can destroy.
    served = [c for c in cfg.consumers
              if c.service_region in chosen and skip_reason(c) is None and access.acts_in(c.account)]
    consumers = _by_account([(c.account, consumer_stack_name(cfg.name, c.name)) for c in served])
    providers = [provider_stack_name(cfg.name, r) for r in chosen] if access.acts_in(cfg.provider.account) else []
    out = []
    if "consumers" in steps:
        out.append(Step("consumers", "delete consumer interface endpoints, each account with its profile",
                        [_cdk("destroy", *ctx, "--force", *stacks, profile=access.cdk_args(account))
                         for account, stacks in consumers.items()],
                        deletes=[f"{consumer_stack_name(cfg.name, c.name)}  (account {c.account}, {c.region})" for c in served]))
    if "providers" in steps and providers:
        out.append(Step("providers", "delete fleets, NLBs and endpoint services (buckets, logs and image repositories "
                        "are retained: delete them by hand when the data may go)",
                        [_cdk("destroy", *ctx, "--force", *providers, profile=access.cdk_args(cfg.provider.account))],
                        deletes=[f"{provider_stack_name(cfg.name, r)}  (account {cfg.provider.account}, {r})" for r in chosen]))
    return out


def confirm_teardown(cfg: FleetConfig, steps: Sequence[Step], *, yes: bool, stdin: TextIO | None = None,
                     err: TextIO | None = None) -> None:
    """Show what will be deleted, in order, and ask for the fleet's name; refuse when no one can answer.

    Raises UserError (exit 2) without a terminal and without --yes, (exit 3) when not confirmed.
    """
    err = sys.stderr if err is None else err
    stacks = [d for s in steps for d in s.deletes]
    if not stacks:
        return
    err.write(f"fleetcast teardown deletes these {len(stacks)} stack(s) of fleet {cfg.name}, in this order:\n")
    err.write("".join(f"  {i}. {d}\n" for i, d in enumerate(stacks, 1)))
    err.write("Buckets, access logs and image repositories are retained.\n")
    _confirm_by_name(cfg.name, "delete them", yes=yes, stdin=stdin, err=err,
                     refusal="refusing to delete stacks without confirmation: stdin is not a terminal; check the "
                             "list with --dry-run, then rerun with --yes",
                     declined="not confirmed; nothing deleted")


def confirm_parallel_fleet(cfg: FleetConfig, others: Mapping[str, Sequence[str]], *, yes: bool,
                           stdin: TextIO | None = None, err: TextIO | None = None) -> None:
    """Before deploying a fleet whose provider stacks do not exist where other fleets' do (`others`: region ->
    their stacks, fleetcast.deployed.other_fleets): a renamed config makes a second fleet, not an update.

    Raises UserError (exit 2) without a terminal and without --yes, (exit 3) when not confirmed.
    """
    err = sys.stderr if err is None else err
    found = {region: stacks for region, stacks in others.items() if stacks}
    if not found:
        return
    err.write(f"Fleet {cfg.name} has no provider stack yet where other fleets run:\n")
    err.write("".join(f"  {region}: {', '.join(stacks)} (this deploy creates "
                      f"{provider_stack_name(cfg.name, region)} beside it)\n" for region, stacks in found.items()))
    err.write("If this config renames one of them (its `name` changed), deploying it does not update that fleet: "
              "it creates a second, parallel fleet with its own instances, NLB and endpoint service names, and the "
              "old fleet keeps running and billing until `fleetcast teardown` with the old config deletes it.\n")
    _confirm_by_name(cfg.name, "create it", yes=yes, stdin=stdin, err=err,
                     refusal=f"refusing to create fleet {cfg.name} beside another fleet without confirmation: stdin "
                             "is not a terminal; check `fleetcast config diff OLD NEW`, then rerun with --yes",
                     declined="not confirmed; nothing deployed")


def _confirm_by_name(name: str, what: str, *, yes: bool, stdin: TextIO | None, err: TextIO, refusal: str,
                     declined: str) -> None:
    """Ask for the fleet's name unless --yes; no terminal to ask: exit 2, a wrong answer: exit 3."""
    stdin = sys.stdin if stdin is None else stdin
    if yes:
        return
    if stdin is None or not stdin.isatty():
        raise UserError(refusal, 2)
    err.write(f"Type the fleet name ({name}) to {what}: ")
    err.flush()
    if stdin.readline().strip() != name:
        raise UserError(declined, 3)


def execute(steps: Sequence[Step], *, dry_run: bool, run: Callable[..., Any] | None = None,
            log: Callable[[str], None] = print, resume: str = "fleetcast deploy") -> None:
    """Run the steps in order; `resume` is the command that reruns a failed step (`--step NAME` appended)."""
    if run is None:
        import os

        from fleetcast.node import path_with_node

        # The CDK app's jsii runtime starts the first `node` on PATH: the venv's LTS one.
        os.environ["PATH"] = path_with_node()
        run = subprocess.run  # looked up per call, so tests can replace the runner
    for step in steps:
        for line in step.describe():
            log(line)
        if dry_run:
            continue
        for command in step.preview:
            if run(command).returncode != 0:
                log(f"   (preview `{shown(command)}` failed; continuing with the step)")
        resolution = step.resolve(step.commands) if step.resolve is not None else Resolution(step.commands)
        for line in resolution.notes:
            log(f"   {line}")
        for command in resolution.commands:
            if run(command).returncode != 0:
                raise UserError(f"step {step.name} failed: `{shown(command)}`; fix it and rerun "
                                f"`{resume} --step {step.name}` (later steps did not run)")
        if step.action is not None:
            for line in step.action():
                log(f"   {line}")
        if resolution.refusal:
            raise UserError(f"step {step.name}: {resolution.refusal}")
