"""`fleetcast usage`: tokens, requests, errors and cost share per consumer from CloudWatch."""

from __future__ import annotations

import argparse
from datetime import UTC


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from fleetcast.aws_session import add_aws_arguments

    parser = sub.add_parser(
        "usage", help="per-consumer tokens, requests, errors and cost share over a time window",
        description="Sum the gateway's per-consumer metrics (CloudWatch GetMetricData) over a window and split "
                    "each region's estimated fleet cost by token share.")
    parser.add_argument("--config", default="config/fleet.yaml", help="fleet config (default: config/fleet.yaml)")
    parser.add_argument("--since", required=True, help="start: ISO 8601 (2026-11-01, 2026-11-01T09:00Z) or an age "
                                                       "such as 24h, 7d")
    parser.add_argument("--until", default="now", help="end: ISO 8601, an age, or now (default)")
    add_aws_arguments(parser, region_help="one provider region (default: all in the config)")
    parser.add_argument("--by-model", action="store_true",
                        help="one row per consumer and model (or adapter) it may call, from the gateway's "
                             "[Fleet, Pool, Consumer, Model] metrics")
    parser.add_argument("--cost", action="store_true",
                        help="attribute every instance-hour of each pool and each region's fixed costs (NLB, LCUs, "
                             "endpoints) to consumers and models by the GPU time their tokens took; prints the sum "
                             "check against the fleet's cost (implies --by-model)")
    parser.add_argument("--png", metavar="FILE", help="with --cost: also draw what each account cost as a PNG")
    parser.add_argument("--format", choices=("table", "csv", "json"), default="table")
    parser.add_argument("--json", action="store_const", const="json", dest="format", help="same as --format json")
    parser.set_defaults(handler=_usage)


def _usage(args: argparse.Namespace) -> int:
    from datetime import datetime

    from fleetcast.aws_session import AwsSession
    from fleetcast.config import load_config
    from fleetcast.contract.errors import EXIT_USAGE, UserError
    from fleetcast.usage import attribute, collect, parse_time, render, render_cost, write_png
    from fleetcast.usage.cost import check_png_path

    if args.png and not args.cost:
        raise UserError("--png draws the cost attribution: give --cost with it", exit_code=EXIT_USAGE)
    if args.png:
        check_png_path(args.png)  # before any AWS call: a bad path costs nothing
    cfg = load_config(args.config)
    now = datetime.now(UTC)
    since = parse_time(args.since, now, "--since")
    until = parse_time(args.until, now, "--until")
    aws = AwsSession(args.profile)  # --region picks a config region; each region's client is its own
    report = collect(cfg, since, until, args.region, client=lambda region: aws.client("cloudwatch", region),
                     now=now, by_model=args.by_model or args.cost)
    if not args.cost:
        print(render(report, args.format))
        return 0
    costs = attribute(cfg, report)
    text = render_cost(costs, args.format)
    if args.png:
        write_png(costs, args.png)
    print(text)
    return 0
