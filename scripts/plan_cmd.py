"""`fleetcast plan`: pick instance type, precision and region by cost per token
under the SLO for the real traffic mix, report why, and optionally write it
into the fleet config. The method lives in fleetcast/plan/ (docs/plan.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys


def _positive(flag: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a number, got {text!r}") from None
        if not value > 0 or math.isinf(value):
            raise argparse.ArgumentTypeError(f"{flag} must be a positive number, got {text!r}")
        return value
    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--error-rate must be a number in [0, 1), got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"--error-rate must be in [0, 1), got {text!r}")
    return value


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"--min-instances must be a whole number >= 0, got {text!r}")
    return int(text)


def _whole(flag: str):
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be a whole number >= 1, got {text!r}")
        return int(text)
    return parse


def _reserved(text: str) -> tuple[str, str, int]:
    import re

    match = re.match(r"^([a-z][a-z0-9]*\.[0-9a-z]+)@([a-z]{2}(?:-gov)?-[a-z]+-\d)=(\d+)$", text)
    if not match:
        raise argparse.ArgumentTypeError(f"--reserved must be TYPE@REGION=N (e.g. g6e.xlarge@ap-northeast-2=4), got {text!r}")
    return match.group(1), match.group(2), int(match.group(3))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan", help="choose instance, precision and region by cost per token under the SLO for the traffic mix",
        description="Size each candidate for the production traffic (from arrivals: per-instance load derived from "
        "its curve, every hour at its busiest minute; or weighed by a concurrency histogram), add network latency "
        "and regional availability to the SLO check, rank candidates by total cost, explain every rejection. "
        "`fleetcast plan simulate` checks the sizing against a discrete-event simulation of each pool.",
    )
    p.add_argument("action", nargs="?", choices=["simulate"],
                   help="simulate: check the plan's sizing against a discrete-event simulation of each pool "
                        "(requests arriving per the profile, continuous batching per the measured curve); exit 3 "
                        "when the planner and the simulation disagree by more than 10%%")
    p.add_argument("--results", nargs="+", required=True, metavar="FILE",
                   help="fleetcast bench results files (or directories of them), one or more per instance x precision")
    p.add_argument("--traffic", required=True, metavar="FILE", help="traffic profile YAML (fleetcast.traffic/v1)")
    p.add_argument("--config", default="config/fleet.yaml", metavar="FILE",
                   help="fleet config: default SLOs, pool minimums, model (default: config/fleet.yaml)")
    p.add_argument("--ttft-p99-ms", type=_positive("--ttft-p99-ms"), metavar="MS", help="override the config's slo.ttft_p99_ms")
    p.add_argument("--itl-p99-ms", type=_positive("--itl-p99-ms"), metavar="MS", help="override the config's slo.itl_p99_ms")
    p.add_argument("--error-rate", type=_fraction, metavar="FRACTION", help="override the config's slo.error_rate")
    p.add_argument("--prices", metavar="FILE", help="on-demand prices overriding the shipped table")
    p.add_argument("--refresh-prices", action="store_true", help="fetch on-demand prices from the AWS Pricing API")
    p.add_argument("--fixed-costs", metavar="FILE", help="per-region fixed costs overriding the shipped table")
    p.add_argument("--latency", metavar="FILE", help="inter-region RTT matrix overriding the shipped table")
    p.add_argument("--live-availability", action="store_true",
                   help="check instance offerings with ec2 describe-instance-type-offerings")
    p.add_argument("--quality", metavar="FILE", help="quality results per precision (fleetcast.quality/v1)")
    p.add_argument("--quality-threshold", type=float, metavar="X", help="override the quality file's threshold")
    p.add_argument("--estimate", nargs="+", default=[], metavar="SPEC",
                   help="add roofline-estimated candidates: INSTANCE[:PRECISION] or 'all' (always labelled estimated)")
    p.add_argument("--min-instances", type=_count, metavar="N", help="floor per hour (default: the config pool's capacity.min)")
    p.add_argument("--reserved", type=_reserved, action="append", default=[], metavar="TYPE@REGION=N",
                   help="N instances of TYPE in REGION already paid for (capacity reservations): the plan pays only "
                        "for instances above them and says when they decided the pick; repeatable")
    p.add_argument("--report", metavar="DIR", help="write plan.md, plan.html, plan.json and plots into DIR")
    p.add_argument("--json", action="store_true", help="print plan.json instead of the table")
    p.add_argument("--write-config", metavar="FILE",
                   help="update pools and regions of this fleet config with the planned fleet (consumer regions pooled "
                        "where cheaper; re-validated; untouched if invalid)")
    p.add_argument("--write-schedule", action="store_true",
                   help="with --write-config: also write the pool's daily capacity schedule (UTC) from the hourly plan")
    p.add_argument("--allow-estimated", action="store_true", help="let --write-config write an estimated choice")
    sim = p.add_argument_group("simulate")
    sim.add_argument("--seed", type=int, default=7, help="simulate: random seed (default 7; same seed, same figures)")
    sim.add_argument("--candidate", action="append", metavar="LABEL",
                     help="simulate: check this candidate ('g5.xlarge fp16') in every consumer region instead of the "
                          "plan's pools; repeatable")
    sim.add_argument("--max-hours", type=_whole("--max-hours"), metavar="N",
                     help="simulate: check only the N busiest distinct hours (default: every distinct hour)")
    p.set_defaults(handler=_plan)


def _plan(args: argparse.Namespace) -> int:
    from fleetcast.plan.report import render_terminal, to_json, write_report
    from fleetcast.plan.run import PlanOptions, build_plan
    from fleetcast.plan.writeback import apply_plan, throttling_notes

    opts = PlanOptions(
        results=args.results, traffic=args.traffic, config=args.config, ttft_p99_ms=args.ttft_p99_ms,
        itl_p99_ms=args.itl_p99_ms, error_rate=args.error_rate, prices=args.prices, refresh_prices=args.refresh_prices,
        fixed_costs=args.fixed_costs, latency=args.latency, live_availability=args.live_availability,
        quality=args.quality, quality_threshold=args.quality_threshold, estimate=args.estimate,
        min_instances=args.min_instances, reserved={(t, r): n for t, r, n in args.reserved},
    )
    result, plans, ctx = build_plan(opts)
    if args.action == "simulate":
        from fleetcast.plan.simulate import simulate_plan

        lines, agree = simulate_plan(plans, result.pools, ctx, seed=args.seed, candidates=args.candidate,
                                     max_groups=args.max_hours or None)
        print("\n".join(lines))
        return 0 if agree else 3
    print(json.dumps(to_json(result), indent=1) if args.json else render_terminal(result))
    # With --json, stdout stays pure JSON; the rest goes to stderr.
    say = (lambda text: print(text, file=sys.stderr)) if args.json else print
    if args.report:
        paths = write_report(result, args.report)
        say(f"\nreport: {', '.join(str(p) for p in paths[:3])} (+{len(paths) - 3} plots)")
    if args.write_config:
        changes = apply_plan(args.write_config, plans, result.pools, allow_estimated=args.allow_estimated,
                             write_schedule=args.write_schedule)
        if changes:
            say(f"\n{args.write_config}: updated and re-validated")
            for change in changes:
                say(f"  {change}")
        else:
            say(f"\n{args.write_config}: already matches the plan; unchanged")
        from fleetcast.config import load_config

        for note in throttling_notes(load_config(args.write_config), result.pools):
            say(f"  note: {note}")
    return 0 if all(p.winner for p in plans) else 3
