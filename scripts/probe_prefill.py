"""What a prefill of a shape the engine never ran costs against one it ran before, and what the iteration stats'
allocations cost the collector: the reference engine with its warm-up and stats before and after fair35l.

    python -m scripts.probe_prefill --device cuda            # one GPU, about a minute
    python -m scripts.probe_prefill --device cpu --max-batch 4 --rows 1,3 --lengths 70 --decode-tokens 8

Each variant runs in processes of its own (lazy kernel loading, the allocator's pool and library heuristics are a
process's: a second variant in the same process would find them warm), `--repeats` times, alternating:
  before  one row per padded length warmed (the warm-up before fair35l), the stats read torch.cuda.memory_allocated
  after   every batch bucket of rows at every padded length that fits a prefill (Engine.warmup_shapes), the stats
          read the allocator's nested stats (no closure cycle)
In each, the engine serves, with nothing else running, batches of `--rows` x `--lengths`, each twice: prompts that
are all new (whole prefills, "fresh") and, once a prompt's blocks are cached, prefix-cache hits of it ("hit": the
rest of the prompt against its cached context, the fairness bench's case). The engine's own record says whether
each batch's shape ran before (Engine.prefill_shapes); the probe prints each prefill group's time (its forward and
first-token readback) by new or seen, P50 / P90 / max, and the engine thread's split of the long iterations (on a
CPU, waiting for one, blocked). Then `--decode-tokens` steps of a full batch: the collections per 1000 iterations
and the objects they freed.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from runtime.ttft_trace import iteration_split, thread_clock

VARIANTS = ("before", "after")
LONG_MS = 5.0


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of whole numbers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least one number, each 1 or more")
    return values


# The prompt of each sequence of the decode batch: short, so that the steps are decode steps.
DECODE_PROMPT = 20


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m scripts.probe_prefill", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--size", default="tiny", help="the model's shape (runtime/reference/configs.py; default tiny, the "
                                                  "fairness bench's)")
    p.add_argument("--max-batch", type=int, default=16, help="the engine's max batch size (default 16)")
    p.add_argument("--rows", type=_ints, default=[1, 2, 3, 4, 5, 6, 8, 9, 12, 16],
                   help="rows of the batches served (default 1,2,3,4,5,6,8,9,12,16)")
    p.add_argument("--lengths", type=_ints, default=[70, 100, 160, 250],
                   help="prompt lengths in tokens (default 70,100,160,250; within the model's positions)")
    p.add_argument("--decode-tokens", type=int, default=200,
                   help=f"decode steps of a full batch of {DECODE_PROMPT}-token prompts (default 200; the prompt and "
                        "its steps within the model's positions)")
    p.add_argument("--repeats", type=int, default=2, help="processes per variant (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the bench's server)")
    p.add_argument("--out", type=Path, help="write every figure here as JSON")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from runtime.reference.configs import shape_for

    try:
        shape = shape_for(args.size)
    except ValueError as exc:
        p.error(f"--size: {exc}")
    if max(args.lengths) >= shape.n_positions:
        p.error(f"--lengths: each must be below the model's {shape.n_positions} positions")
    if not 1 <= args.decode_tokens < shape.n_positions - DECODE_PROMPT:
        p.error(f"--decode-tokens: 1 to {shape.n_positions - DECODE_PROMPT - 1}, so that a {DECODE_PROMPT}-token "
                f"prompt and its steps fit the model's {shape.n_positions} positions")
    if max(args.rows) > args.max_batch:
        p.error(f"--rows: each must be at most --max-batch ({args.max_batch})")
    return args


class Watch:
    """The probe's IterationObserver: every iteration's record, with the engine thread's CPU split."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def begin(self) -> tuple[float, float]:
        return thread_clock()

    def end(self, token: tuple[float, float], record: dict[str, Any]) -> None:
        wall = (record["end"] - record["start"]) * 1000
        cpu, runq, blocked = iteration_split(token, thread_clock(), wall)
        self.records.append({**record, "ms": wall, "cpu_ms": cpu, "runq_ms": runq, "blocked_ms": blocked})


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One variant in this process: serve the batches, then the decode steps; the figures."""
    import torch

    from runtime.reference.build import random_weights
    from runtime.reference.configs import shape_for
    from runtime.reference.engine import Engine, SamplingParams, Sequence
    from runtime.reference.model import GPT2
    from runtime.reference.tokenizer import EOS_ID, VOCAB_SIZE

    torch.set_num_threads(args.threads)
    shape = shape_for(args.size)
    dtype = torch.float16 if args.device == "cuda" else torch.float32
    model = GPT2(shape, random_weights(shape, seed=3), device=args.device, dtype=dtype)
    engine = Engine(model, max_batch_size=args.max_batch, max_seq_len=shape.n_positions, vocab_size=VOCAB_SIZE,
                    eos_id=EOS_ID)
    before = args.child == "before"
    if before:  # the stats as they were: torch.cuda.memory_allocated, a closure cycle per call
        device = engine.device
        engine._gpu_memory = lambda: torch.cuda.memory_allocated(device) if device.type == "cuda" else 0  # type: ignore[method-assign]
    watch = Watch()
    engine.observer = watch
    started = time.monotonic()
    engine.start(grid=not before)  # warm-up, decode graphs (on a GPU), the scheduler thread
    warm_s = time.monotonic() - started
    warmed = len(engine.prefill_shapes)

    def serve(prompts: list[list[int]], salt: str, max_tokens: int = 2) -> None:
        left = [len(prompts)]
        done = threading.Event()

        def emit(token: int | None, reason: str | None) -> None:
            if reason is not None:
                left[0] -= 1
                if not left[0]:
                    done.set()

        engine.submit_all([Sequence(prompt=p, params=SamplingParams(max_tokens=max_tokens, ignore_eos=True), emit=emit,
                                    salt=salt) for p in prompts])
        if not done.wait(120):
            raise RuntimeError("the engine did not finish a batch in 120 s")

    serial = itertools.count(1)
    for length in args.lengths:
        for rows in args.rows:
            for _ in range(2):  # the second time, the same shape is seen
                serve([[(next(serial) * 7 + i) % 250 for i in range(length)] for _ in range(rows)], "fresh")
            salt = f"hit-{length}-{rows}"
            prompt = [(next(serial) * 11 + i) % 250 for i in range(length)]
            serve([prompt], salt)  # its blocks are cached from the next iteration on
            for _ in range(2):
                serve([prompt] * rows, salt)
    # The decode steps of a full batch: the collections they make.
    collections = [0, 0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop":
            collections[0] += 1
            collections[1] += info.get("collected", 0)

    gc.collect()
    gc.callbacks.append(on_gc)
    try:
        serve([[5 + i] * DECODE_PROMPT for i in range(args.max_batch)], "decode", max_tokens=args.decode_tokens)
    finally:
        gc.callbacks.remove(on_gc)
    engine.stop()  # every iteration's record is in once its thread ended (a batch's last tokens go out before it)
    prefills = [{"shape": g["shape"], "new": g["new"], "ms": g["ms"], "iteration_ms": round(r["ms"], 3)}
                for r in watch.records for g in r["groups"] or []]
    prefills.pop()  # the decode batch's own prefill, the run's last
    last_admitting = max(i for i, r in enumerate(watch.records) if r["admitted"])
    steps = len(watch.records) - last_admitting
    long = [r for r in watch.records if r["ms"] >= LONG_MS]
    return {"variant": args.child, "device": args.device, "warm_up_s": round(warm_s, 3), "warmed_shapes": warmed,
            "prefills": prefills, "decode_iterations": steps, "collections": collections[0],
            "collected": collections[1],
            "long": [{k: round(r[k], 3) for k in ("ms", "cpu_ms", "runq_ms", "blocked_ms")} | {"admitted": r["admitted"]}
                     for r in long]}


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    v = sorted(values)
    return f"{v[len(v) // 2]:.2f} / {v[int(len(v) * 0.9)]:.2f} / {v[-1]:.2f} ms (n={len(v)})"


def summary(runs: list[dict[str, Any]]) -> list[str]:
    lines = []
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant]
        if not mine:
            continue
        warm = ", ".join(f"{r['warm_up_s']:.2f}" for r in mine)
        lines.append(f"{variant}: {len(mine)} process(es); warm-up and graphs {warm} s, {mine[0]['warmed_shapes']} "
                     "shapes warmed")
        for kind in ("fresh", "hit"):
            for new in (True, False):
                ms = [g["ms"] for r in mine for g in r["prefills"] if g["shape"][0] == kind and g["new"] is new]
                lines.append(f"  {kind:<5} {'new ' if new else 'seen'} shapes, prefill group P50 / P90 / max: {spread(ms)}")
        for kind in ("fresh", "hit"):
            paid: dict[bool, list[float]] = {True: [], False: []}  # first use less the second use of one shape, by whether the first was new
            for r in mine:
                uses: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
                for g in r["prefills"]:
                    if g["shape"][0] == kind:
                        uses.setdefault(tuple(g["shape"]), []).append(g)
                for first, second, *_ in (u for u in uses.values() if len(u) >= 2):
                    paid[first["new"]].append(first["ms"] - second["ms"])
            lines.append(f"  {kind:<5} first use less second use of the same shape, P50 / P90 / max: new "
                         f"{spread(paid[True])}; warmed {spread(paid[False])}")
        per_run = [f"{1000 * r['collections'] / max(1, r['decode_iterations']):.1f} ({r['collected']} freed)" for r in mine]
        lines.append(f"  collections per 1000 decode iterations: {', '.join(per_run)}")
        long = [x for r in mine for x in r["long"]]
        if long:
            tot = {k: sum(x[k] for x in long) for k in ("ms", "cpu_ms", "runq_ms", "blocked_ms")}
            lines.append(f"  iterations of {LONG_MS:g} ms or more: {len(long)}, {tot['ms']:.1f} ms: on a CPU "
                         f"{tot['cpu_ms']:.1f}, waiting for one {tot['runq_ms']:.1f}, blocked {tot['blocked_ms']:.1f}")
        else:
            lines.append(f"  iterations of {LONG_MS:g} ms or more: none")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("probe_prefill: --device cuda, but torch sees no CUDA device", file=sys.stderr)
            return 2
    passthrough = ["--device", args.device, "--size", args.size, "--max-batch", str(args.max_batch),
                   "--rows", ",".join(map(str, args.rows)), "--lengths", ",".join(map(str, args.lengths)),
                   "--decode-tokens", str(args.decode_tokens), "--threads", str(args.threads)]
    runs = []
    for i in range(args.repeats):
        for variant in (VARIANTS if i % 2 == 0 else VARIANTS[::-1]):
            done = subprocess.run([sys.executable, "-m", "scripts.probe_prefill", *passthrough, "--child", variant],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(f"probe_prefill: the {variant} process failed:\n{done.stderr[-3000:]}", file=sys.stderr)
                return 1
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"ran {variant} ({i + 1} of {args.repeats})", flush=True)
    lines = summary(runs)
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k not in ("out", "child")},
                                        "runs": runs, "summary": lines}, indent=1))
    return 0


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    sys.exit(run_quietly(main))
