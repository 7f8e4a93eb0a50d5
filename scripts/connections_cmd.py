"""`fleetcast connections list|approve|reject|sync`: review PrivateLink endpoint connections.

Thin: argument parsing here, everything else in fleetcast.connections.
Exit codes: 0 ok, 1 bad input, 2 usage, 3 refused (nothing changed),
4 missing credentials or IAM permission, 5 other AWS failure.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetcast.connections import Access, Reviewer

# Tests replace this to hand the command a stubbed Access.
ACCESS_FACTORY: Callable[[argparse.Namespace], Access] | None = None


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from fleetcast.aws_session import add_aws_arguments

    parser = sub.add_parser(
        "connections", help="review, approve and reject PrivateLink endpoint connections",
        description="Review the endpoint connection requests to the fleet's endpoint services. Exit codes: 0 ok, "
                    "1 bad input, 2 usage, 3 refused (nothing changed), 4 missing credentials or IAM permission, "
                    "5 other AWS failure.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default="config/fleet.yaml", help="fleet config (default: config/fleet.yaml)")
    add_aws_arguments(common, region="many")
    common.add_argument("--service-id", help="endpoint service id, overriding discovery (needs one --region)")

    changing = argparse.ArgumentParser(add_help=False)
    changing.add_argument("--dry-run", action="store_true",
                          help="show and audit the plan, check the IAM permission with EC2's DryRun; change nothing")
    changing.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    changing.add_argument("--audit-log", metavar="FILE", help="append the audit JSON lines here (default: stdout)")

    targets = argparse.ArgumentParser(add_help=False)
    targets.add_argument("endpoint_ids", nargs="*", metavar="ENDPOINT_ID", help="vpce-... ids")
    targets.add_argument("--account", action="append", default=[], metavar="ACCOUNT_ID",
                         help="every relevant connection from this account (repeatable)")

    lst = actions.add_parser("list", parents=[common], help="every connection, pending first")
    lst.add_argument("--json", action="store_true", help="machine-readable output")
    lst.set_defaults(handler=_list)

    approve = actions.add_parser("approve", parents=[common, targets, changing],
                                 help="accept pending connections (only from accounts the config allows)")
    approve.add_argument("--force", action="store_true",
                         help="also accept accounts the config does not allow (needs --reason)")
    approve.add_argument("--reason", help="why; recorded in the audit log (required with --force)")
    approve.set_defaults(handler=_approve)

    reject = actions.add_parser("reject", parents=[common, targets, changing],
                                help="reject pending connections or cut off available ones")
    reject.add_argument("--reason", help="why; recorded in the audit log")
    reject.set_defaults(handler=_reject)

    sync = actions.add_parser("sync", parents=[common, changing],
                              help="accept pending requests from allowed accounts, list the rest")
    sync.add_argument("--reject-unknown", action="store_true",
                      help="reject pending requests from accounts the config does not allow")
    sync.add_argument("--reason", help="recorded with each decision")
    sync.set_defaults(handler=_sync)


def _reviewer(args: argparse.Namespace) -> tuple[Reviewer, list[str]]:
    from fleetcast.aws_session import AwsSession
    from fleetcast.config import load_config
    from fleetcast.connections import AuditLog, Reviewer

    cfg = load_config(args.config)
    access = ACCESS_FACTORY(args) if ACCESS_FACTORY else AwsSession.from_args(args)
    audit = AuditLog(path=getattr(args, "audit_log", None))
    reviewer = Reviewer(cfg, access, audit)
    return reviewer, reviewer.regions(args.region)


def _list(args: argparse.Namespace) -> int:
    reviewer, regions = _reviewer(args)
    return reviewer.list(regions, args.service_id, as_json=args.json)


def _approve(args: argparse.Namespace) -> int:
    reviewer, regions = _reviewer(args)
    return reviewer.approve(regions, args.endpoint_ids, args.account, service_id=args.service_id, force=args.force,
                            reason=args.reason, dry_run=args.dry_run, yes=args.yes)


def _reject(args: argparse.Namespace) -> int:
    reviewer, regions = _reviewer(args)
    return reviewer.reject(regions, args.endpoint_ids, args.account, service_id=args.service_id, reason=args.reason,
                           dry_run=args.dry_run, yes=args.yes)


def _sync(args: argparse.Namespace) -> int:
    reviewer, regions = _reviewer(args)
    return reviewer.sync(regions, service_id=args.service_id, reject_unknown=args.reject_unknown, reason=args.reason,
                         dry_run=args.dry_run, yes=args.yes)
