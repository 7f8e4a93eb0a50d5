"""`fleetcast traffic export`: a traffic profile (fleetcast.traffic/v1) from what the gateways metered."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from fleetcast.aws_session import add_aws_arguments

    parser = sub.add_parser("traffic", help="traffic profiles from production (CloudWatch)",
                            description="Build fleetcast.traffic/v1 profiles from the gateways' per-request metrics.")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    p = verbs.add_parser(
        "export", help="write a traffic profile from the gateways' CloudWatch metrics over a window",
        description="Arrivals per hour, burstiness within the hour (per-minute counts), input/output length and "
                    "in-flight histograms and per-consumer counts (a fleet of several models: one entry per consumer region "
                    "and model, from the per-model metering), summed from CloudWatch (GetMetricData; the caller "
                    "needs cloudwatch:GetMetricData in each provider region). Exact at hourly granularity for "
                    "windows inside the last 15 days (CloudWatch keeps 1-minute data 15 days).")
    p.add_argument("--config", default="config/fleet.yaml", help="fleet config (default: config/fleet.yaml)")
    p.add_argument("--since", required=True, help="start: ISO 8601 or an age such as 24h, 7d (floored to the hour)")
    p.add_argument("--until", default="now", help="end: ISO 8601, an age, or now (default; floored to the hour)")
    p.add_argument("--consumer", help="only this consumer (config name)")
    add_aws_arguments(p, region_help="only this provider region (default: every region in the config)")
    p.add_argument("--name", help="profile name shown in plan reports (default: <fleet>-production)")
    p.add_argument("--hour-stat", choices=("max", "mean"), default="max",
                   help="rate_rps per UTC hour of the day: the busiest day's (default) or the mean over days")
    p.add_argument("--out", required=True, metavar="FILE", help="write the profile here (YAML)")
    p.set_defaults(handler=_export)


def cloudwatch_caller(profile: str | None) -> Callable[..., dict[str, Any]]:
    """GetMetricData through the shared AWS access (retries, one-line errors, exit 4 without credentials)."""
    from fleetcast.aws_session import AwsSession

    access = AwsSession(profile)

    def call(region: str, **params: Any) -> dict[str, Any]:
        return access.call("cloudwatch", region, "GetMetricData", **params)
    return call


def _export(args: argparse.Namespace) -> int:
    from datetime import datetime

    from fleetcast.config import load_config
    from fleetcast.contract.errors import EXIT_USAGE, UserError
    from fleetcast.traffic import export
    from fleetcast.usage import parse_time

    cfg = load_config(args.config)
    now = datetime.now(UTC)
    since = parse_time(args.since, now, "--since")
    until = parse_time(args.until, now, "--until")
    out_dir = Path(args.out).parent
    if not out_dir.is_dir():  # said before the CloudWatch queries, not after them
        raise UserError(f"--out {args.out}: directory {out_dir} does not exist", EXIT_USAGE)
    profile, doc = export(cfg, since, until, cloudwatch_caller(args.profile), region=args.region,
                          consumer=args.consumer, name=args.name, hour_stat=args.hour_stat, now=now)
    write_profile(doc, Path(args.out))
    for c in profile.consumers:
        o = c.observed
        assert o is not None, "an exported profile records what each entry observed"
        print(f"{c.region}{f' {c.model}' if c.model else ''}: {sum(o.arrivals):,} requests over {len(o.arrivals)} h "
              f"({', '.join(f'{k} {v:,}' for k, v in o.consumers.items())}); "
              f"mean {c.input_mean:.0f} in / {c.output_mean:.0f} out tokens")
    print(f"wrote {args.out}")
    return 0


def write_profile(doc: dict[str, Any], path: Path) -> None:
    """YAML with the long hourly series on one line each."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedSeq

    def flow(value: object) -> object:
        if isinstance(value, list):
            seq = CommentedSeq(value)
            seq.fa.set_flow_style()
            return seq
        if isinstance(value, dict):
            return {k: flow(v) for k, v in value.items()}
        return value

    import io

    from fleetcast.config.edit import replace_files

    yaml = YAML()
    yaml.width = 1 << 16
    text = io.StringIO()
    yaml.dump({**doc, "consumers": [flow(c) for c in doc["consumers"]]}, text)
    replace_files([(path, text.getvalue())])  # whole or not at all: a profile cut short would still parse
