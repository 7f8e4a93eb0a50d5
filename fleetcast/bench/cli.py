"""`fleetcast bench run|report|collect|network-share|probe-wheels`: measure an
OpenAI-compatible endpoint, render results, download results written by
benchmark instances, split out the network share, stage the probe's wheels.

Lives in the library (not scripts/) because bench instances run it from the
runtime bundle, which carries fleetcast/ and runtime/ only; scripts/bench_cmd.py
registers it with the `fleetcast` CLI."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from fleetcast.contract import bench as bench_defaults
from fleetcast.contract.bucket import BENCH as BENCH_PREFIX
from fleetcast.contract.errors import EXIT_INTERRUPTED, FleetcastError, UserError
from fleetcast.contract.instance_env import Var

if TYPE_CHECKING:
    from pathlib import Path

    from fleetcast.bench.runner import BenchOptions, Level
    from fleetcast.bench.schema import Labels
    from fleetcast.config import FleetConfig

DEFAULT_REQUESTS_PER_LEVEL = 100
_LABEL_KEYS = ("instance_type", "gpu", "precision", "region", "backend", "model", "notes", "path", "consumer")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from fleetcast.aws_session import add_aws_arguments

    parser = sub.add_parser("bench", help="benchmark an endpoint: TTFT, ITL, tails, throughput, goodput")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    run = actions.add_parser("run", help="run a benchmark and write the results file (JSON + CSV)",
                             formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    run.add_argument("--endpoint", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    run.add_argument("--api", choices=("completions", "chat"), default="completions")
    run.add_argument("--model", help="model id to send (default: first id from GET /v1/models)")
    mix = run.add_argument_group(
        "several models at once (--model-mix; docs/bench.md, 'Several models through one endpoint')")
    mix.add_argument("--model-mix", metavar="MODEL:SHARE,...",
                     help="drive these models at once, each level split by the shares (summing to 1), e.g. "
                          "gpt2-xl:0.7,qwen2.5-1.5b:0.3; writes one results file per model (OUT-MODEL.json)")
    mix.add_argument("--model-input-tokens", action="append", default=[], metavar="MODEL=SPEC",
                     help="a mix model's own --input-tokens (repeatable)")
    mix.add_argument("--model-output-tokens", action="append", default=[], metavar="MODEL=SPEC",
                     help="a mix model's own --output-tokens (repeatable)")
    mix.add_argument("--model-tokenizer", action="append", default=[], metavar="MODEL=DIR",
                     help="a mix model's own --tokenizer (repeatable)")
    mix.add_argument("--model-endpoint", action="append", default=[], metavar="MODEL=URL",
                     help="a mix model's own server (e.g. its engine process on an instance), instead of --endpoint "
                          "(repeatable)")
    mix.add_argument("--model-precision", action="append", default=[], metavar="MODEL=PREC",
                     help="the precision a mix model's engine runs at (repeatable; recorded in its file's "
                          "labels.precision and in every file's packing); default: with --pool the pool's engine "
                          "precision, else --label precision")
    mix.add_argument("--pool", help="with --config: the pool whose instance served the run (a mix, or --model alone "
                                    "with its peers idle); its serves (models, copies, KV budgets) and instance type "
                                    "are recorded as the packing")
    mix.add_argument("--packing", metavar="MODEL:COPIES[:KV_GIB],...",
                     help="what shared the instance (a mix, or --model alone with its peers idle), when no "
                          "--config/--pool says it, e.g. gpt2-xl:1:20,qwen2.5-1.5b:1 (instance type and GPU from --label)")
    mix.add_argument("--gpu-sharing", choices=("time_slicing", "mps"),
                     help="how the packing's processes shared the GPU, recorded in every file's packing (the "
                          "planner uses a co-located curve only for pools that share the same way); default: with "
                          "--pool the pool's gpu_sharing, else time_slicing")
    load = run.add_argument_group("load (give exactly one)")
    load.add_argument("--concurrency", help="closed-loop sweep, e.g. 1,2,4,8,16,32,64")
    load.add_argument("--rate", help="open-loop request rates in req/s, e.g. 2,5,10")
    load.add_argument("--arrival", choices=("poisson", "constant"), default="poisson", help="arrivals for --rate")
    load.add_argument("--trace", help="replay a JSONL/CSV trace: timestamp (ms), input_length, output_length")
    load.add_argument("--trace-speed", type=float, default=1.0, help="replay speed factor for --trace")
    load.add_argument("--mix", help="traffic mix over concurrency levels, e.g. '1-16:0.8,32:0.15,64:0.05'")
    stop = run.add_argument_group("stop")
    stop.add_argument("--requests-per-level", type=int, default=None,
                      help="requests per run (default 100 when --duration is not given); "
                           "at least the highest --concurrency level")
    stop.add_argument("--duration", type=float, default=None, help="seconds per run (stop issuing after)")
    stop.add_argument("--warmup", type=int, default=2, help="warm-up requests before the first run, not recorded")
    stop.add_argument("--repeats", type=int, default=1,
                      help="run each level this many times in a row; the file keeps every repeat (runs[].repeat) "
                           "and the planner sizes from the worst and reports the spread")
    shape = run.add_argument_group("request shape")
    shape.add_argument("--input-tokens", default=bench_defaults.INPUT_TOKENS, help="N, normal:MEAN,STD or buckets like 64:0.5,512:0.5")
    shape.add_argument("--output-tokens", default=bench_defaults.OUTPUT_TOKENS, help="same syntax as --input-tokens")
    shape.add_argument("--tokenizer", help="local Hugging Face tokenizer dir for exact prompt lengths")
    shape.add_argument("--no-force-output", action="store_true",
                       help="do not send ignore_eos/min_tokens (for servers that reject them)")
    shape.add_argument("--seed", type=int, default=0)
    slo = run.add_argument_group("SLOs for goodput")
    slo.add_argument("--slo-ttft-ms", type=float)
    slo.add_argument("--slo-itl-ms", type=float)
    slo.add_argument("--slo-e2e-ms", type=float)
    out = run.add_argument_group("output")
    out.add_argument("--out", required=True, help="results JSON path (CSV written next to it)")
    out.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                     help=f"result labels, keys: {', '.join(_LABEL_KEYS)}")
    out.add_argument("--config", help="fleet config file; its digest is stored as config_hash")
    out.add_argument("--no-records", action="store_true", help="omit per-request records from the JSON")
    out.add_argument("--report", metavar="DIR", help="also write plots and an HTML report to DIR")
    out.add_argument("--progress", action="store_true", help="live progress on stderr even when not a tty")
    misc = run.add_argument_group("client")
    misc.add_argument("--header", action="append", default=[], metavar="NAME:VALUE", help="extra HTTP header")
    misc.add_argument("--ca-bundle", help="PEM file of CAs to trust for an https endpoint (e.g. a private CA)")
    misc.add_argument("--rtt-probe", action="store_true", help="measure TCP connect time to split network time")
    misc.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    misc.add_argument("--max-inflight", type=int, default=4096, help="cap on open-loop requests in flight")
    misc.add_argument("--cpu", type=int, help="pin the client to this CPU core")
    misc.add_argument("--quiet", action="store_true")
    run.set_defaults(handler=_run)

    report = actions.add_parser("report", help="plots (PNG), CSV and a self-contained HTML report from results")
    report.add_argument("results", nargs="+", help="results JSON files (several are compared)")
    report.add_argument("--out", required=True, help="output directory")
    report.add_argument("--allow-mixed", action="store_true",
                        help="render series of different request shapes (lengths, tokenizer, forced output) together; "
                             "refused otherwise, since their latencies are not comparable")
    report.set_defaults(handler=_report)

    collect = actions.add_parser("collect", help="download results uploaded by benchmark instances from S3")
    collect.add_argument("--bucket", required=True)
    collect.add_argument("--prefix", default=BENCH_PREFIX, help="key prefix")
    collect.add_argument("--out", required=True, help="local directory")
    add_aws_arguments(collect, region_help="bucket region (default: AWS_REGION / AWS_DEFAULT_REGION / the profile's)")
    collect.add_argument("--endpoint-url", help="S3 endpoint override (tests, S3-compatible stores)")
    collect.set_defaults(handler=_collect)

    share = actions.add_parser(
        "network-share", help="per load level, latency on the instance vs through PrivateLink, and the difference")
    share.add_argument("instance", metavar="INSTANCE.json", help="results measured on the serving instance")
    share.add_argument("privatelink", metavar="PRIVATELINK.json", help="results measured through PrivateLink")
    share.add_argument("--json", metavar="PATH", help="also write the comparison as JSON")
    share.add_argument("--allow-mixed", action="store_true",
                       help="compare files of different request shapes anyway (the deltas then mix path and shape)")
    share.set_defaults(handler=_network_share)

    wheels = actions.add_parser(
        "probe-wheels", help="download the wheels the consumer-side bench probe carries (Linux x86_64, CPython 3.11)")
    wheels.add_argument("--out", default=bench_defaults.PROBE_WHEELS_DIR,
                        help="wheelhouse directory (synth context bench_probe_wheels)")
    wheels.set_defaults(handler=_probe_wheels)


def _labels(pairs: list[str]) -> Labels:
    from pydantic import ValidationError

    from fleetcast.bench.schema import Labels

    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in _LABEL_KEYS:
            raise UserError(f"--label {pair!r}: use KEY=VALUE with KEY one of {', '.join(_LABEL_KEYS)}")
        values[key] = value
    try:
        return Labels.model_validate(values)
    except ValidationError:
        raise UserError(f"--label backend={values.get('backend')!r}: use tensorrt, pytorch, reference or unknown") from None


def _levels(args: argparse.Namespace) -> list[Level]:
    from fleetcast.bench.distributions import parse_distribution, parse_int_list
    from fleetcast.bench.runner import Level, load_trace

    given = [n for n in ("concurrency", "rate", "trace", "mix") if getattr(args, n)]
    if len(given) != 1:
        raise UserError("give exactly one of --concurrency, --rate, --trace, --mix"
                        + (f" (got {', '.join('--' + g for g in given)})" if given else ""))
    if args.concurrency:
        levels = parse_int_list(args.concurrency, "--concurrency")
        per_level = args.requests_per_level
        if per_level is None and args.duration is None:
            per_level = DEFAULT_REQUESTS_PER_LEVEL
        if per_level is not None and args.duration is None and per_level < max(levels):
            # N requests can never have more than N in flight: the run would carry a label it did not measure.
            short = [c for c in levels if c > per_level]
            raise UserError(
                f"--requests-per-level {per_level} is below --concurrency level(s) {', '.join(map(str, short))}: "
                f"a run of {per_level} requests never has more than {per_level} in flight; give "
                f"--requests-per-level >= {max(levels)} (several times the level for a steady state) or drop those levels")
        return [Level("concurrency", concurrency=c) for c in levels for _ in range(args.repeats)]
    if args.rate:
        rates: list[Level] = []
        for part in args.rate.split(","):
            try:
                rate = float(part)
            except ValueError:
                raise UserError(f"--rate: {part!r} is not a number (req/s)") from None
            if rate <= 0:
                raise UserError(f"--rate: {rate} must be > 0")
            rates += [Level("rate", rate_rps=rate, arrival=args.arrival)] * args.repeats
        return rates
    if args.trace:
        if args.trace_speed <= 0:
            raise UserError("--trace-speed must be > 0")
        return [Level("trace", trace=load_trace(args.trace, args.trace_speed))] * args.repeats
    return [Level("mix", mix=parse_distribution(args.mix, "--mix"))] * args.repeats


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fleetcast.bench.distributions import parse_distribution
    from fleetcast.bench.metrics import Slo
    from fleetcast.bench.report import write_csv, write_report
    from fleetcast.bench.runner import Bench, BenchOptions
    from fleetcast.bench.schema import dump_results, number_repeats

    if args.cpu is not None:
        try:
            os.sched_setaffinity(0, {args.cpu})
        except (OSError, ValueError) as exc:
            raise UserError(f"--cpu {args.cpu}: cannot pin ({exc})") from None
    if args.repeats < 1:
        raise UserError(f"--repeats: {args.repeats} is out of range (at least 1)")
    if args.gpu_sharing and not (args.pool or args.packing):
        raise UserError("--gpu-sharing describes a packing: give it with --pool or --packing")
    for name in ("requests_per_level", "warmup"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "warmup" else 1):
            raise UserError(f"--{name.replace('_', '-')}: {value} is out of range")
    if args.ca_bundle and not Path(args.ca_bundle).is_file():
        raise UserError(f"--ca-bundle: {args.ca_bundle} does not exist")
    if args.duration is not None and args.duration <= 0:
        raise UserError("--duration must be > 0 seconds")
    per_level = args.requests_per_level
    if per_level is None and args.duration is None and not args.trace:
        per_level = DEFAULT_REQUESTS_PER_LEVEL
    headers = {}
    for h in args.header:
        name, sep, value = h.partition(":")
        if not sep or not name.strip():
            raise UserError(f"--header {h!r}: use NAME:VALUE")
        headers[name.strip()] = value.strip()
    if os.environ.get(Var.BENCH_API_KEY) and "Authorization" not in headers:
        headers["Authorization"] = f"Bearer {os.environ[Var.BENCH_API_KEY]}"
    config_hash, cfg = None, None
    if args.config:
        from fleetcast.config import load_config

        cfg = load_config(args.config)
        config_hash = cfg.digest()
    out = Path(args.out)
    if not out.parent.is_dir():
        raise UserError(f"--out: directory {out.parent} does not exist")
    packing, precision = None, None
    if not args.model_mix:
        given = [f for f, v in (("--model-input-tokens", args.model_input_tokens),
                                ("--model-output-tokens", args.model_output_tokens),
                                ("--model-tokenizer", args.model_tokenizer),
                                ("--model-endpoint", args.model_endpoint),
                                ("--model-precision", args.model_precision)) if v]
        if given:
            raise UserError(f"{', '.join(given)} only go with --model-mix")
        if args.pool or args.packing:
            from fleetcast.bench.mix import check_mix_against, model_precisions, packing_from_args, with_precisions

            if not args.model:
                raise UserError(f"{'--pool' if args.pool else '--packing'} with one model needs --model (which of "
                                "the packing's models this run measures)")
            labels = _labels(args.label)
            packing, where = packing_from_args(args, cfg, labels)
            assert packing is not None, "--pool or --packing given"
            check_mix_against(packing, {args.model: 1.0}, where, flag="--model")
            # The measured model's precision: the pool's engine's (a contradicting --label is refused), else the label.
            precision = model_precisions([], {args.model: 1.0}, packing, labels.precision)[args.model]
            packing = with_precisions(packing, {args.model: precision})
    opts = BenchOptions(
        endpoint=args.endpoint, api=args.api, model=args.model,
        input_tokens=parse_distribution(args.input_tokens, "--input-tokens"),
        output_tokens=parse_distribution(args.output_tokens, "--output-tokens"),
        levels=_levels(args), requests_per_level=per_level, duration_s=args.duration, warmup=args.warmup,
        seed=args.seed, timeout_s=args.timeout,
        slo=Slo(args.slo_ttft_ms, args.slo_itl_ms, args.slo_e2e_ms), headers=headers,
        tokenizer_dir=args.tokenizer, force_output=not args.no_force_output, rtt_probe=args.rtt_probe,
        keep_records=not args.no_records, labels=_labels(args.label).model_copy(
            update={"precision": precision} if packing is not None and precision else {}), config_hash=config_hash,
        max_inflight=args.max_inflight, ca_bundle=args.ca_bundle,
        progress=args.progress or (sys.stderr.isatty() and not args.quiet),
    )
    log: Callable[[str], None] = (
        (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True)))
    if args.model_mix:
        return _run_mix(args, opts, cfg, out, log)
    results = Bench(opts, log=log).run()
    results = results.model_copy(update={"runs": number_repeats(results.runs)})
    if packing is not None:
        # One model measured on a packed instance: the others loaded and idle (docs/bench.md).
        results = results.model_copy(update={
            "packing": packing, "labels": results.labels.model_copy(update={"model": args.model}),
            "runs": [r.model_copy(update={"peers": {p: 0.0 for p in packing.peers_of(args.model)}})
                     for r in results.runs]})
    dump_results(results, out)
    csv_path = out.with_suffix(".csv")
    write_csv([results], csv_path)
    log(f"wrote {out} and {csv_path}")
    if args.report:
        index = write_report([results], Path(args.report))
        log(f"wrote {index}")
    saturated = [r for r in results.runs if r.summary.saturated]
    if saturated:
        log(f"warning: {len(saturated)} run(s) marked saturated: the client, not the server, may have set those figures")
    if results.interrupted:
        print(f"interrupted: {results.interrupted}; the finished level(s) are in {out}, marked interrupted",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def mix_out_path(out: Path, model: str) -> Path:
    """Where a --model-mix run writes `model`'s results: --out's name with the model's slug appended (r.json ->
    r-gpt2-xl.json; Qwen/Qwen2.5 -> r-Qwen!2fQwen2.5.json, one file, not a directory)."""
    from fleetcast.contract.model_ids import model_slug

    return out.with_name(f"{out.stem}-{model_slug(model)}{out.suffix or '.json'}")


def _run_mix(args: argparse.Namespace, opts: BenchOptions, cfg: FleetConfig | None, out: Path,
             log: Callable[[str], None]) -> int:
    """--model-mix: every model at once, one results file per model, one CSV and report for all (and the total)."""
    from dataclasses import replace
    from pathlib import Path

    from fleetcast.bench.mix import (
        FLAG,
        MixBench,
        check_mix_against,
        mix_models,
        model_precisions,
        packing_from_args,
        parse_model_mix,
        per_model_option,
        split_warnings,
        with_precisions,
    )
    from fleetcast.bench.report import write_csv, write_report
    from fleetcast.bench.schema import dump_results, number_repeats

    if args.model:
        raise UserError(f"--model and {FLAG} exclude each other (the mix names every model it sends)")
    if args.trace or args.mix:
        raise UserError(f"{FLAG} takes --concurrency or --rate levels (a --trace or --mix has no per-model split)")
    shares = parse_model_mix(args.model_mix)
    mix = mix_models(shares, args.input_tokens, args.output_tokens,
                     per_model_option(args.model_input_tokens, "--model-input-tokens", shares),
                     per_model_option(args.model_output_tokens, "--model-output-tokens", shares),
                     per_model_option(args.model_tokenizer, "--model-tokenizer", shares), args.tokenizer, cfg,
                     per_model_option(args.model_endpoint, "--model-endpoint", shares))
    packing, where = packing_from_args(args, cfg, opts.labels)
    if packing is None:
        raise UserError(f"{FLAG} records what shared the instance: give --pool NAME (with --config) or --packing "
                        "MODEL:COPIES[:KV_GIB],...")
    check_mix_against(packing, shares, where)
    precisions = model_precisions(args.model_precision, shares, packing, opts.labels.precision)
    packing = with_precisions(packing, precisions)
    mix = [replace(m, precision=precisions[m.model]) for m in mix]
    if args.pool:
        opts.labels = opts.labels.model_copy(update={k: v for k, v in (("instance_type", packing.instance_type),
                                                                        ("gpu", packing.gpu))
                                                     if v and getattr(opts.labels, k) is None})
    paths = {m.model: mix_out_path(out, m.model) for m in mix}
    results = [res.model_copy(update={"runs": number_repeats(res.runs)})
               for res in MixBench(opts, mix, packing, args.model_mix, log=log).run()]
    for line in split_warnings(results):  # --quiet too: the files' split is not the mix the flag named
        print(f"warning: {line}", file=sys.stderr)
    for m, res in zip(mix, results, strict=True):  # MixBench's results are in the mix's order
        dump_results(res, paths[m.model])
    csv_path = out.with_suffix(".csv")
    write_csv(results, csv_path)
    log(f"wrote {', '.join(str(p) for p in paths.values())} and {csv_path}")
    if args.report:
        log(f"wrote {write_report(results, Path(args.report))}")
    if any(r.summary.saturated for res in results for r in res.runs):
        log("warning: run(s) marked saturated: the client, not the server, may have set those figures")
    if results[0].interrupted:
        print(f"interrupted: {results[0].interrupted}; the finished level(s) are in {', '.join(map(str, paths.values()))}",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def _report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fleetcast.bench.report import write_report
    from fleetcast.bench.schema import load_results

    results = [load_results(p) for p in args.results]
    index = write_report(results, Path(args.out), allow_mixed=args.allow_mixed, names=list(args.results))
    print(index)
    return 0


def _collect(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fleetcast.bench.collect import collect

    files = collect(args.bucket, args.prefix, Path(args.out), region=args.region, endpoint_url=args.endpoint_url,
                    profile=args.profile)
    for f in files:
        print(f)
    print(f"{len(files)} results file(s) in {args.out}", file=sys.stderr)
    return 0


def _network_share(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from fleetcast.bench.network_share import check_paths, network_share, render_table, to_json
    from fleetcast.bench.schema import load_results, mixed_shapes

    instance, privatelink = load_results(args.instance), load_results(args.privatelink)
    mixed = mixed_shapes([(args.instance, instance), (args.privatelink, privatelink)])
    if mixed and not args.allow_mixed:
        raise UserError(f"the two files have different request shapes ({mixed}): a delta would mix the network's share "
                        "with the shape's; run the same sweep on both paths, or pass --allow-mixed")
    if mixed:
        print(f"warning: different request shapes (--allow-mixed): {mixed}", file=sys.stderr)
    for warning in check_paths(instance, privatelink):
        print(f"warning: {warning}", file=sys.stderr)
    shares, only_one = network_share(instance, privatelink)
    print("latency in ms: instance / privatelink / delta (privatelink - instance); "
          "ttft_p50-rtt: TTFT P50 delta minus the round trip PrivateLink adds")
    print(render_table(shares), end="")
    if only_one:
        print(f"levels in one file only (skipped): {', '.join(only_one)}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(shares, only_one), indent=2) + "\n")
    return 0


def _probe_wheels(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fleetcast.bench.probe_wheels import download

    wheels = download(Path(args.out))
    print(f"{len(wheels)} wheels in {args.out}", file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    """`fleetcast bench ...` without the rest of the CLI (used on bench instances).
    User mistakes print one line and return their exit code, as in the full CLI."""
    parser = argparse.ArgumentParser(prog="fleetcast")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except FleetcastError as exc:
        print(f"fleetcast bench: {exc}", file=sys.stderr)
        return exc.exit_code
