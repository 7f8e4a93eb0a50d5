"""`fleetcast ami pin`: replace `latest` (or older pinned ids) with the DLAMI's current id per region."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("ami", help="pin the fleets' DLAMI ids in the config (read from its public SSM parameter)")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    from fleetcast.aws_session import add_aws_arguments
    from fleetcast.contract.ami import DLAMI_NAME, DLAMI_SSM_PARAMETER

    pin = actions.add_parser(
        "pin", help="write each provider region's current DLAMI id into regions[].ami.id",
        description=f"Read the public SSM parameter {DLAMI_SSM_PARAMETER} ({DLAMI_NAME}) in each provider "
                    "region with your AWS credentials (ssm:GetParameter) and write the ids into the config, "
                    "keeping its comments. With `ami: {id: latest}` every deploy resolves the parameter anew, "
                    "so a new DLAMI rolls the fleet; pinned ids change only when you run this again. "
                    "Exit 4 when credentials or the permission are missing.")
    pin.add_argument("--config", default="config/fleet.yaml", help="fleet config (default: %(default)s)")
    add_aws_arguments(pin, region="many")
    pin.add_argument("--dry-run", action="store_true", help="print the ids, leave the config unchanged")
    pin.set_defaults(handler=_pin)


def _pin(args: argparse.Namespace) -> int:
    from fleetcast.ami import pin
    from fleetcast.aws_session import AwsSession

    changes = pin(args.config, AwsSession.from_args(args), args.region, dry_run=args.dry_run)
    for region, old, new in changes:
        state = "unchanged" if old == new else f"{old} -> {new}"
        print(f"{region}: {new} ({state})")
    if args.dry_run:
        print(f"dry run: {args.config} not changed")
    elif any(old != new for _, old, new in changes):
        print(f"pinned regions[].ami.id in {args.config}")
    return 0
