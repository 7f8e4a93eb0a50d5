"""`fleetcast deploy` / `fleetcast teardown`: the deployment guide's order, one command (single account)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from fleetcast.deploy import STEPS

    deploy = sub.add_parser("deploy", help="bootstrap, deploy providers, stage, publish, deploy consumers, approve, smoke")
    deploy.add_argument("--config", default="config/fleet.yaml")
    deploy.add_argument("--step", action="append", choices=STEPS,
                        help="run only this step (repeatable; default: all, in order)")
    deploy.add_argument("--trust", metavar="ACCOUNT", help="bootstrap: account trusted to deploy (cdk bootstrap --trust)")
    deploy.add_argument("--smoke-endpoint", metavar="URL", help="smoke: endpoint reachable from here")
    deploy.add_argument("--require-approval", choices=("never", "any-change", "broadening"), default="broadening",
                        help="passed to cdk deploy (default: %(default)s: IAM/security-group widening asks first)")
    deploy.add_argument("--profile", help="AWS profile")
    deploy.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    deploy.set_defaults(handler=_deploy)

    teardown = sub.add_parser("teardown", help="delete consumer stacks, then provider stacks (data retained)")
    teardown.add_argument("--config", default="config/fleet.yaml")
    teardown.add_argument("--dry-run", action="store_true")
    teardown.set_defaults(handler=_teardown)


def _clients(profile):
    import boto3

    session = boto3.Session(profile_name=profile) if profile else boto3.Session()
    return lambda service, region: session.client(service, region_name=region)


def _deploy(args: argparse.Namespace) -> int:
    from fleetcast.config import load_config
    from fleetcast.deploy import STEPS, execute, plan

    cfg = load_config(args.config)
    steps = [s for s in STEPS if s in (args.step or STEPS)]
    execute(plan(cfg, args.config, _clients(args.profile), steps=steps, trust_account=args.trust,
                 smoke_endpoint=args.smoke_endpoint, approval=args.require_approval), dry_run=args.dry_run)
    return 0


def _teardown(args: argparse.Namespace) -> int:
    from fleetcast.config import load_config
    from fleetcast.deploy import execute, teardown_plan

    cfg = load_config(args.config)
    execute(teardown_plan(cfg, args.config), dry_run=args.dry_run)
    return 0
