"""`fleetcast deploy` / `fleetcast teardown`: the deployment guide's order, one command, each account acted in
with its own profile (`--profile-for ACCOUNT=PROFILE`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetcast.accounts import AccountAccess
    from fleetcast.aws_session import AwsSession
    from fleetcast.config import FleetConfig


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from fleetcast.aws_session import add_aws_arguments
    from fleetcast.deploy import STEPS, TEARDOWN

    regions_help = ("only this provider region and the consumers it serves (repeatable; default: every region in "
                    "the config)")
    deploy = sub.add_parser("deploy", help="bootstrap, deploy providers (new regions held at zero), stage, release "
                                           "capacity, publish, deploy consumers, approve, smoke",
                            description="Run the deployment guide's steps in order. A provider region deployed for the "
                                        "first time is held at zero instances until `fleetcast stage status` says its "
                                        "model and image are staged; the capacity step then releases it. --profile "
                                        "reaches every step: each cdk command and each fleetcast sub-command.")
    deploy.add_argument("--config", default="config/fleet.yaml")
    deploy.add_argument("--step", action="append", choices=STEPS,
                        help="run only this step (repeatable; default: all, in order)")
    deploy.add_argument("--trust", metavar="ACCOUNT",
                        help="bootstrap: let this account (a CDK Pipelines account) deploy into every account of the "
                             "fleet (cdk bootstrap --trust/--trust-for-lookup); needs --execution-policy")
    deploy.add_argument("--execution-policy", action="append", metavar="ARN", default=[],
                        help="with --trust: managed policy the trusted deployments run under (repeatable; cdk "
                             "bootstrap --cloudformation-execution-policies)")
    deploy.add_argument("--smoke-endpoint", metavar="URL", help="smoke: endpoint reachable from here")
    deploy.add_argument("--require-approval", choices=("never", "any-change", "broadening"), default="broadening",
                        help="passed to cdk deploy (default: %(default)s: IAM/security-group widening asks first)")
    add_aws_arguments(deploy, region="many", region_help=regions_help)
    _add_account_arguments(deploy)
    deploy.add_argument("--yes", action="store_true",
                        help="do not ask before creating this fleet in a region where another fleet runs (as a "
                             "renamed config would: a second fleet, the old one kept)")
    deploy.add_argument("--dry-run", action="store_true",
                        help="print the plan and which profile acts in which account, run nothing (needs no AWS "
                             "credentials; with them, checks each profile's account and names other fleets)")
    deploy.set_defaults(handler=_deploy)

    teardown = sub.add_parser(
        "teardown", help="delete consumer stacks, then provider stacks (data retained); asks first",
        description="Delete the fleet's stacks: consumer stacks first (an endpoint service cannot be deleted while "
                    "endpoints are connected), then provider stacks. Lists the stacks per account and region, in "
                    "order, and asks for the fleet's name unless --yes; without a terminal and without --yes it "
                    "refuses (exit 2). Buckets, access logs and image repositories are retained.")
    teardown.add_argument("--config", default="config/fleet.yaml")
    teardown.add_argument("--step", action="append", choices=TEARDOWN,
                          help="run only this step (repeatable; default: both, consumers first)")
    add_aws_arguments(teardown, region="many", region_help=regions_help)
    _add_account_arguments(teardown)
    teardown.add_argument("--yes", action="store_true", help="do not ask; delete the listed stacks")
    teardown.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    teardown.set_defaults(handler=_teardown)


def _add_account_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile-for", action="append", metavar="ACCOUNT=PROFILE", default=[],
                        help="the profile acting in ACCOUNT (repeatable); accounts without one use --profile")
    parser.add_argument("--account", action="append", metavar="ACCOUNT",
                        help="act only in this account (repeatable; default: every account of the fleet)")


def _access(cfg: FleetConfig, args: argparse.Namespace) -> AccountAccess:
    from fleetcast.accounts import AccountAccess

    return AccountAccess.from_args(cfg, profile=args.profile, profile_for=args.profile_for, accounts=args.account)


def _resume(command: str, args: argparse.Namespace, *extra: str) -> str:
    """The command line that reruns a step of this run (same config, profiles, accounts and regions)."""
    parts = [*command.split(), "--config", args.config]
    if args.profile:
        parts += ["--profile", args.profile]
    for value in args.profile_for:
        parts += ["--profile-for", value]
    for account in args.account or []:
        parts += ["--account", account]
    for region in args.region or []:
        parts += ["--region", region]
    return shlex.join([*parts, *extra])


def _not_checked(aws: AwsSession) -> None:
    problem = aws.credentials_problem()
    if problem:
        print(f"dry run: AWS access not checked: {problem}")


def _check_identities(cfg: FleetConfig, access: AccountAccess, steps: Sequence[str]) -> None:
    """Before any step: each acting profile's account by sts:GetCallerIdentity; bootstrapping an account with
    another account's credentials is refused (CDK bootstraps with the target account's own)."""
    from fleetcast.accounts import caller_account_via_sts
    from fleetcast.contract.errors import UserError

    problems = access.check_identities(cfg, caller_account_via_sts(cfg.regions[0].region),
                                       bootstrapping="bootstrap" in steps)
    for problem in problems:
        print(f"refused: {problem}")
    if problems:
        raise UserError(f"not deploying: {len(problems)} account(s) would be bootstrapped with another account's "
                        "credentials (listed above)", 2)


def _deploy(args: argparse.Namespace) -> int:
    from fleetcast.aws_session import AwsSession
    from fleetcast.config import load_config
    from fleetcast.deploy import STEPS, execute, plan

    cfg = load_config(args.config)
    access = _access(cfg, args)
    # The provider account's session reads stacks and stages (publish, the first-deploy hold, capacity).
    aws = AwsSession(access.profile_of(cfg.provider.account))
    ready = _refuse_unready(cfg, args, access.profile_of(cfg.provider.account))
    steps = [s for s in STEPS if s in (args.step or STEPS)]
    planned = plan(cfg, args.config, aws.client, steps=steps, trust_account=args.trust,
                   execution_policies=args.execution_policy, smoke_endpoint=args.smoke_endpoint,
                   approval=args.require_approval, access=access, regions=args.region)
    if args.dry_run:
        for line in access.describe(cfg, trust=args.trust, policies=args.execution_policy,
                                    bootstrapping="bootstrap" in steps):
            print(line)
        print("(a dry run does not check which account each profile acts in; a deploy does, with "
              "sts:GetCallerIdentity, before any step)")
    elif set(steps) - {"smoke"}:  # smoke talks to the endpoint, not to AWS
        aws.require_credentials()
        _check_identities(cfg, access, steps)
    _check_parallel_fleet(cfg, args, access, aws, steps)
    execute(planned, dry_run=args.dry_run, resume=_resume("fleetcast deploy", args))
    if args.dry_run:
        _not_checked(aws)
        if not ready:
            # The plan is shown, but a pipeline gating on the dry run must not pass what the deploy refuses.
            print(f"dry run: {args.config} is not ready to deploy (problems listed above): a deploy would stop "
                  "before its first step", file=sys.stderr)
            return 1
    return 0


def _check_parallel_fleet(cfg: FleetConfig, args: argparse.Namespace, access: AccountAccess, aws: AwsSession,
                          steps: Sequence[str]) -> None:
    """Before the providers step: where this fleet has no stack but another fleet does, deploying may be a
    renamed config creating a second fleet; ask (a dry run only says so, when it has credentials)."""
    from fleetcast.deploy import confirm_parallel_fleet, select_regions
    from fleetcast.deployed import other_fleets

    if "providers" not in steps or not access.acts_in(cfg.provider.account):
        return
    if args.dry_run and aws.credentials_problem():
        return
    from fleetcast.aws_session import AwsCallError

    try:
        others = {region: other_fleets(aws, cfg, region) for region in select_regions(cfg, args.region)}
    except AwsCallError as exc:
        if not args.dry_run:
            raise
        print(f"dry run: other fleets in the provider regions not checked: {exc}")
        return
    if args.dry_run:
        for region, stacks in others.items():
            if stacks:
                print(f"dry run: {region} runs {', '.join(stacks)} but no stack of fleet {cfg.name}: a deploy would "
                      "create a second fleet beside it, and asks first (--yes does not)")
        return
    confirm_parallel_fleet(cfg, others, yes=args.yes)


def _refuse_unready(cfg: FleetConfig, args: argparse.Namespace, profile: str | None) -> bool:
    """Before any step: what `fleetcast config validate --deploy` refuses stops the deploy. A dry run shows it,
    goes on to print the plan, and exits 1 after it. Returns whether the config is ready."""
    from fleetcast.config.readiness import access_with_credentials, check_readiness, line_index
    from fleetcast.contract.errors import UserError

    readiness = check_readiness(cfg, access_with_credentials(profile, strict=not args.dry_run))
    if readiness.refusals or readiness.warnings:
        print(readiness.render(args.config, line_index(args.config)))
    if not readiness.ready and not args.dry_run:
        raise UserError(f"not deploying: {args.config} has {len(readiness.refusals)} value(s) that cannot work in a "
                        "real account (listed above); fix them, then rerun", 1)
    return readiness.ready


def _teardown(args: argparse.Namespace) -> int:
    from fleetcast.aws_session import AwsSession
    from fleetcast.config import load_config
    from fleetcast.deploy import TEARDOWN, confirm_teardown, execute, teardown_plan

    cfg = load_config(args.config)
    access = _access(cfg, args)
    aws = AwsSession(access.profile_of(cfg.provider.account))
    steps = teardown_plan(cfg, args.config, access=access, regions=args.region,
                          steps=[s for s in TEARDOWN if s in (args.step or TEARDOWN)])
    if args.dry_run:
        for line in access.describe(cfg):
            print(line)
        execute(steps, dry_run=True)
        _not_checked(aws)
        return 0
    confirm_teardown(cfg, steps, yes=args.yes)
    aws.require_credentials()
    execute(steps, dry_run=False, resume=_resume("fleetcast teardown", args, "--yes"))
    return 0
