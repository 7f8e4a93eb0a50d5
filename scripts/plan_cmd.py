"""`fleetcast plan`: pick instance type, precision and region by cost per token
under the SLO for the real traffic mix, report why, and optionally write it
into the fleet config. The method lives in fleetcast/plan/ (docs/plan.md).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from datetime import UTC
from pathlib import Path


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

    match = re.fullmatch(r"([a-z][a-z0-9]*\.[0-9a-z]+)@([a-z]{2}(?:-gov)?-[a-z]+-[0-9])=([0-9]+)", text, re.ASCII)
    if not match:
        raise argparse.ArgumentTypeError(f"--reserved must be TYPE@REGION=N (e.g. g6e.xlarge@ap-northeast-2=4), got {text!r}")
    return match.group(1), match.group(2), int(match.group(3))


def _lab(text: str) -> tuple[str, str]:
    gpu, sep, name = text.partition("=")
    if not sep or not gpu or not re.fullmatch(r"[a-z][a-z0-9]*\.[0-9a-z]+", name):
        raise argparse.ArgumentTypeError(f"--lab {text!r}: give GPU=TYPE, e.g. H200=lab.h200 (TYPE shaped like an "
                                         "instance type: family.size)")
    return gpu, name


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan", help="choose instance, precision and region by cost per token under the SLO for the traffic mix",
        description="Size each candidate for the production traffic (from arrivals: per-instance load derived from "
        "its curve, every hour at its busiest minute; or weighed by a concurrency histogram), add network latency "
        "and regional availability to the SLO check, rank candidates by total cost, explain every rejection. "
        "`fleetcast plan simulate` checks the sizing against a discrete-event simulation of each pool. Every fleet "
        "is planned as a packing search, one model a packing of one: which models share an instance, at which "
        "precision, with how many copies (docs/plan.md, \"Several models: the packing search\").",
    )
    p.add_argument("action", nargs="?", choices=["simulate"],
                   help="simulate: check the plan's sizing against a discrete-event simulation of each pool "
                        "(requests arriving per the profile, continuous batching per the measured curve); exit 3 "
                        "when the planner and the simulation disagree by more than 10%%")
    p.add_argument("--results", nargs="+", required=True, metavar="FILE",
                   help="fleetcast bench results files (or directories of them), one or more per instance x precision")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--traffic", metavar="FILE", help="traffic profile YAML (fleetcast.traffic/v1)")
    source.add_argument("--traffic-from", choices=("cloudwatch",), metavar="cloudwatch",
                        help="read the traffic from the gateways' CloudWatch metrics (as `fleetcast traffic export`); "
                             "with --since [--until] [--profile]")
    p.add_argument("--config", default="config/fleet.yaml", metavar="FILE",
                   help="fleet config: default SLOs, pool minimums, model(s) (default: config/fleet.yaml); with "
                        "several models the traffic profile gives one entry per region and model")
    p.add_argument("--ttft-p99-ms", type=_positive("--ttft-p99-ms"), metavar="MS", help="override the config's slo.ttft_p99_ms")
    p.add_argument("--itl-p99-ms", type=_positive("--itl-p99-ms"), metavar="MS", help="override the config's slo.itl_p99_ms")
    p.add_argument("--error-rate", type=_fraction, metavar="FRACTION", help="override the config's slo.error_rate")
    p.add_argument("--prices", metavar="FILE", help="on-demand prices overriding the shipped table")
    p.add_argument("--refresh-prices", action="store_true", help="fetch on-demand prices from the AWS Pricing API")
    p.add_argument("--profile", metavar="NAME",
                   help="AWS named profile for --refresh-prices / --live-availability / --traffic-from (default: the "
                        "standard credential chain; the Pricing API is asked in us-east-1, offerings in each candidate "
                        "region)")
    p.add_argument("--fixed-costs", metavar="FILE", help="per-region fixed costs overriding the shipped table")
    p.add_argument("--latency", metavar="FILE", help="inter-region RTT matrix overriding the shipped table")
    p.add_argument("--live-availability", action="store_true",
                   help="check instance offerings with ec2 describe-instance-type-offerings")
    p.add_argument("--quality", metavar="FILE", help="quality results per precision (fleetcast.quality/v1)")
    p.add_argument("--quality-threshold", type=float, metavar="X", help="override the quality file's threshold")
    p.add_argument("--estimate", nargs="+", default=[], metavar="SPEC",
                   help="add roofline-estimated candidates: INSTANCE[:PRECISION] or 'all' (always labelled estimated)")
    p.add_argument("--min-instances", type=_count, metavar="N", help="floor per hour (default: the config pool's capacity.min)")
    p.add_argument("--spot-prices", metavar="FILE",
                   help="Spot prices overriding the shipped dated table (prices: {type: {region: usd_per_hour}}, as_of)")
    p.add_argument("--spot-interruptions", metavar="FILE",
                   help="interruption-rate assumptions overriding the shipped ones "
                        "(monthly_interruption_rate: {type: share}, relaunch_s, as_of)")
    p.add_argument("--spot-relaunch-s", type=_positive("--spot-relaunch-s"), metavar="S",
                   help="assumed seconds from an interruption until the replacement serves (default: the table's)")
    p.add_argument("--reserved", type=_reserved, action="append", default=[], metavar="TYPE@REGION=N",
                   help="N instances of TYPE in REGION already paid for (capacity reservations): the plan pays only "
                        "for instances above them and says when they decided the pick; repeatable")
    packing = p.add_argument_group("packings (docs/plan.md, \"Several models: the packing search\")")
    packing.add_argument("--max-copies", type=_whole("--max-copies"), metavar="N",
                         help="most copies of one model per instance the packing search tries (default 2)")
    packing.add_argument("--lab", type=_lab, action="append", default=[], metavar="GPU=TYPE",
                         help="read reference-backend results measured on GPU without an "
                              "instance type (e.g. bench/data/h200-colocate-*.json) as the lab machine TYPE, one GPU, "
                              "priced by --prices; every output says it is not an AWS candidate; repeatable")
    packing.add_argument("--gpu-sharing", choices=("time_slicing", "mps"),
                         help="plan every pool as if its processes shared the GPU this way "
                              "(a what-if; default: each pool's gpu_sharing); under MPS the report also prices the "
                              "same traffic time-sliced")
    p.add_argument("--shared-reserve", action="store_true",
                   help="also size one shared reserve for regions whose peaks do not coincide (each region keeps a "
                        "base, one host region holds the others' overflow where their consumers' spill_regions allow "
                        "it) and say what it saves against every region held at its own peak; needs --config")
    p.add_argument("--report", metavar="DIR", help="write plan.md, plan.html, plan.json and plots into DIR; with "
                   "simulate: each simulated pool's 24-hour picture (simulate-POOL.png: instances, P99s, SLO misses)")
    p.add_argument("--json", action="store_true", help="print plan.json instead of the table")
    p.add_argument("--write-config", metavar="FILE",
                   help="update pools and regions of this fleet config with the planned fleet (consumer regions pooled "
                        "where cheaper; the spot: block with --write-spot), and write the drift baseline next to it "
                        "(<config>.plan-baseline.json): both computed and validated first, then written together, "
                        "or neither (a calibrated pick needs a staged set: `fleetcast stage calibration`)")
    p.add_argument("--write-schedule", action="store_true",
                   help="with --write-config: also write the pool's daily capacity schedule (UTC) from the hourly plan")
    p.add_argument("--write-spot", action="store_true",
                   help="with --write-config: add the spot: block where Spot pays (a pool that has one already is "
                        "kept up to date without it)")
    p.add_argument("--allow-estimated", action="store_true", help="let --write-config write an estimated choice")
    drift = p.add_argument_group("drift check (docs/plan.md, Drift)")
    drift.add_argument("--check", action="store_true",
                       help="re-plan and compare with --config and its baseline (written by --write-config): exit 3 "
                            "when the pick, capacity bounds or scaling target would change beyond --threshold, or the "
                            "traffic outgrew the plan; 0 otherwise")
    drift.add_argument("--baseline", metavar="FILE",
                       help="plan baseline (default: <config>.plan-baseline.json next to --config)")
    drift.add_argument("--threshold", type=_positive("--threshold"), metavar="FRACTION",
                       help="relative change that counts as drift (default: operations.plan_drift_check.threshold, "
                            "else 0.2)")
    drift.add_argument("--cost-threshold", type=_positive("--cost-threshold"), metavar="FRACTION",
                       help="cost per token change that counts as drift (default: the --threshold)")
    drift.add_argument("--since", help="with --traffic-from: start (ISO 8601 or an age such as 7d)")
    drift.add_argument("--until", default="now", help="with --traffic-from: end (default now)")
    drift.add_argument("--region", help="with --traffic-from: only this provider region")
    sim = p.add_argument_group("simulate")
    sim.add_argument("--seed", type=int, default=7, help="simulate: random seed (default 7; same seed, same figures)")
    sim.add_argument("--candidate", action="append", metavar="LABEL",
                     help="simulate: check this candidate ('g5.xlarge fp16') in every consumer region instead of the "
                          "plan's pools; repeatable")
    sim.add_argument("--max-hours", type=_whole("--max-hours"), metavar="N",
                     help="simulate: check only the N busiest distinct hours (default: every distinct hour)")
    p.set_defaults(handler=_plan)


def _traffic_from_cloudwatch(args: argparse.Namespace):
    from datetime import datetime

    from fleetcast.config import load_config
    from fleetcast.contract.errors import EXIT_USAGE, UserError
    from fleetcast.traffic import export
    from fleetcast.usage import parse_time

    from . import traffic_cmd

    if not args.since:
        raise UserError("--traffic-from cloudwatch needs --since (e.g. --since 7d)", exit_code=EXIT_USAGE)
    cfg = load_config(args.config)
    now = datetime.now(UTC)
    profile, _ = export(cfg, parse_time(args.since, now, "--since"), parse_time(args.until, now, "--until"),
                        traffic_cmd.cloudwatch_caller(args.profile), region=args.region, now=now)
    return profile


def _plan(args: argparse.Namespace) -> int:
    """One path for every fleet: one model or several, a packing search (fleetcast.plan.run.plan_fleet)."""
    from fleetcast.contract.errors import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, UserError
    from fleetcast.plan.run import PlanOptions, plan_fleet

    if args.traffic_from and args.write_config:
        raise UserError("--write-config takes a traffic file: export one with `fleetcast traffic export` and plan "
                        "from it, so the baseline records what was planned", exit_code=EXIT_USAGE)
    if (args.since or args.region) and not args.traffic_from:
        raise UserError("--since/--region go with --traffic-from cloudwatch", exit_code=EXIT_USAGE)
    if args.shared_reserve and (args.check or args.action == "simulate"):
        raise UserError("--shared-reserve goes with a plan, not with --check or simulate", exit_code=EXIT_USAGE)
    if args.gpu_sharing and args.write_config:
        raise UserError("--gpu-sharing plans a what-if; to write a plan under a mode, set regions[].pools[].gpu_sharing "
                        "in the config and plan without the flag", exit_code=EXIT_USAGE)
    if args.check and (args.write_config or args.report):
        raise UserError("--check only compares; run it without --write-config/--report", exit_code=EXIT_USAGE)
    profile = _traffic_from_cloudwatch(args) if args.traffic_from else None
    opts = PlanOptions(
        traffic_profile=profile,
        results=args.results, traffic=args.traffic, config=args.config, ttft_p99_ms=args.ttft_p99_ms,
        itl_p99_ms=args.itl_p99_ms, error_rate=args.error_rate, prices=args.prices, refresh_prices=args.refresh_prices,
        fixed_costs=args.fixed_costs, latency=args.latency, live_availability=args.live_availability,
        quality=args.quality, quality_threshold=args.quality_threshold, estimate=args.estimate,
        min_instances=args.min_instances, profile=args.profile, spot_prices=args.spot_prices,
        spot_interruptions=args.spot_interruptions, spot_relaunch_s=args.spot_relaunch_s,
        reserved={(t, r): n for t, r, n in args.reserved}, lab=dict(args.lab), gpu_sharing=args.gpu_sharing,
    )
    planned = plan_fleet(opts, max_copies=args.max_copies)
    if args.check:
        return _check(args, planned)
    if args.action == "simulate":
        lines, agree = planned.simulate(args.seed, args.candidate, args.max_hours or None,
                                        Path(args.report) if args.report else None)
        print("\n".join(lines))
        return EXIT_OK if agree else EXIT_REFUSED
    planned.promise_writes(_config_or_none(args.write_config or args.config), args.allow_estimated)
    print(planned.render(args.json))
    # With --json, stdout stays pure JSON; the rest goes to stderr.
    say = (lambda text: print(text, file=sys.stderr)) if args.json else print
    if args.shared_reserve:
        _shared_reserve(planned, args, say)
    # Everything written is computed and validated first; a refusal or failure leaves every file as it was.
    edit = baseline = None
    if args.write_config:
        from datetime import datetime

        edit = planned.edit(args.write_config, args.allow_estimated, args.write_schedule, args.write_spot)
        baseline = planned.baseline(args.write_config, edit.cfg, datetime.now(UTC).isoformat(timespec="seconds"))
    if args.report:
        _write_report(planned, args, edit is not None, say)
    if edit is not None:
        _write_edit(edit, baseline, args.write_config, say)
        for note in planned.write_notes(edit.cfg):
            say(f"  note: {note}")
        say(f"  baseline for `fleetcast plan --check`: {baseline[0]}")
    return EXIT_OK if planned.served else EXIT_REFUSED


def _shared_reserve(planned, args: argparse.Namespace, say) -> None:
    """--shared-reserve: fleetcast/plan/reserve.py over the planned pools (docs/plan.md, "A shared reserve")."""
    import json

    from fleetcast.config import load_config
    from fleetcast.contract.errors import EXIT_USAGE, UserError
    from fleetcast.plan.reserve import demands_of, size_shared_reserve

    if not args.config:
        raise UserError("--shared-reserve reads each consumer's spill_regions: give --config", exit_code=EXIT_USAGE)
    reserve = size_shared_reserve(demands_of(planned, load_config(args.config)), planned.ctx.latency.between)
    say("Shared reserve across regions (docs/plan.md, \"A shared reserve across regions\"):")
    for line in reserve.lines():
        say(f"  {line}")
    if args.report:
        path = Path(args.report) / "reserve.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(reserve.to_json(), indent=1) + "\n")
        say(f"  wrote {path}")


def _check(args: argparse.Namespace, planned) -> int:
    """plan --check: the re-plan against the config, and the traffic against the baseline --write-config wrote."""
    from fleetcast.config import load_config
    from fleetcast.contract.errors import EXIT_REFUSED
    from fleetcast.plan.check import config_path_required, drift_settings, render, replan_findings
    from fleetcast.plan.drift import Finding

    cfg = load_config(config_path_required(args.config))
    threshold = drift_settings(cfg, args.threshold)
    findings = [Finding("pick", region, "nothing the plan weighed serves it within every model's SLO")
                for region in planned.unserved()]
    findings += replan_findings(cfg, planned.pools(), threshold)
    findings += _baseline_findings(args, planned.consumers(), threshold,
                                   "the throughput per model, mix, latency and cost checks")
    print(render(findings, planned.result.traffic_name))
    return EXIT_REFUSED if findings else 0


def _write_report(planned, args: argparse.Namespace, config_pending: bool, say) -> None:
    """The report's pages and plots."""
    from fleetcast.contract.errors import UserError

    try:
        paths = planned.write_report(args.report)
    except OSError as exc:
        raise UserError(f"--report: cannot write {exc.filename or args.report}: {exc.strerror}; its pages were left "
                        "as they were" + (f", and {args.write_config} was not written" if config_pending else "")) from None
    say(f"\nreport: {', '.join(str(p) for p in paths[:3])} (+{len(paths) - 3} plots)")


def _write_edit(edit, baseline: tuple, config_path: str, say) -> None:
    """Replace the config (when it changes) and its drift baseline together, then say what changed."""
    from fleetcast.config.edit import replace_files
    from fleetcast.contract.errors import UserError

    try:
        replace_files(([(edit.path, edit.text)] if edit.text is not None else []) + [baseline])
    except OSError as exc:
        raise UserError(f"--write-config: cannot write {exc.filename or edit.path}: {exc.strerror}; "
                        f"{edit.path} and its baseline were left as they were") from None
    if edit.changes:
        say(f"\n{config_path}: updated and re-validated")
        for change in edit.changes:
            say(f"  {change}")
    else:
        say(f"\n{config_path}: already matches the plan; unchanged")
    for note in edit.notes:
        say(f"  {note}")


def _config_or_none(path: str | None):
    """The config the write would edit, for the report's promise; None when there is none (or it is invalid:
    the write itself then says why)."""
    from pathlib import Path

    from fleetcast.config import ConfigError, load_config

    if not path or not Path(path).is_file():
        return None
    try:
        return load_config(path)
    except ConfigError:
        return None


def _baseline_findings(args: argparse.Namespace, consumers: list, threshold: float, what: str) -> list:
    """The traffic against the baseline --write-config wrote next to the config (a note when there is none)."""
    from fleetcast.plan.check import baseline_findings
    from fleetcast.plan.drift import baseline_path, load_baseline

    cost_threshold = args.cost_threshold if args.cost_threshold is not None else threshold
    path = Path(args.baseline) if args.baseline else baseline_path(args.config)
    if path.exists() or args.baseline:
        return baseline_findings(load_baseline(path), consumers, threshold, cost_threshold)
    print(f"note: no plan baseline at {path}: checked the re-plan only ({what} need the baseline "
          "`fleetcast plan --write-config` writes)")
    return []

