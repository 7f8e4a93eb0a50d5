"""Decode-step benchmark for the reference backend: step time against the memory-bandwidth floor.

Builds random weights for --size directly on --device (no artifact on disk), captures the
engine's decode CUDA graphs, checks greedy decoding against a naive full-recompute reference
on the same weights, measures device-to-device copy bandwidth in the same run, and times one
decode step (graph replay, CUDA events, median) for each batch size. The floor for a step is
reading every parameter once: params * bytes_per_param / copy bandwidth.

  python scripts/bench_decode.py --device cuda --size gpt2-xl --out result.json
  python scripts/bench_decode.py --device cpu --size tiny        # plumbing check, no GPU
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from fleetcast.contract.serving import GIB
from runtime.reference.build import random_weights
from runtime.reference.configs import SIZES, shape_for
from runtime.reference.engine import Engine
from runtime.reference.model import GPT2, naive_logits
from runtime.reference.tokenizer import EOS_ID, VOCAB_SIZE


class Timer:
    """Median time of a callable: CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def median_ms(self, fn, reps: int, inner: int, warmup: int = 5) -> float:
        for _ in range(warmup):
            fn()
        self.sync()
        samples = []
        for _ in range(reps):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(inner):
                    fn()
                b.record()
                b.synchronize()
                samples.append(a.elapsed_time(b) / inner)
            else:
                t = time.perf_counter()
                for _ in range(inner):
                    fn()
                samples.append((time.perf_counter() - t) * 1000 / inner)
        return statistics.median(samples)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def copy_bandwidth(device: torch.device, timer: Timer, nbytes: int) -> float:
    """Device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device).uniform_(-1, 1)
    dst = torch.empty_like(src)
    ms = timer.median_ms(lambda: dst.copy_(src), reps=20, inner=5)
    return 2 * nbytes / (ms / 1000)


def check_greedy(engine: Engine, weights: dict, steps: int) -> dict:
    """Greedy tokens from prefill + decode steps vs the naive recompute over float32 weights."""
    shape = engine.model.shape
    prompt = [int(t) for t in torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(1))]
    logits = engine.model.prefill(engine.cache, 0, torch.tensor(prompt, device=engine.device))
    got = [int(logits[:VOCAB_SIZE].argmax())]
    first_step_logits = None
    pos = len(prompt)
    for _ in range(steps - 1):
        lg, tops = engine.decode_step([got[-1]], [pos])
        if first_step_logits is None:
            first_step_logits = lg[0].float().clone()
        got.append(tops[0][0])
        pos += 1
    ids, want = list(prompt), []
    ref_logits = None
    for i in range(steps):
        row = naive_logits(shape, weights, ids)[-1]
        if i == 1:
            ref_logits = row
        want.append(int(row[:VOCAB_SIZE].argmax()))
        ids.append(got[i])  # teacher-force on the engine's tokens so one near-tie does not cascade
    rel = float((first_step_logits - ref_logits).norm() / ref_logits.norm())
    matched = sum(a == b for a, b in zip(got, want))
    engine.cache.kv.zero_()
    return {"steps": steps, "tokens_matched": matched, "first_decode_logits_rel_err": rel, "engine": got, "naive": want}


def kernel_profile(engine: Engine, B: int, L: int) -> dict:
    """Kernel count and summed kernel time of one eager decode step (launch gaps excluded)."""
    try:
        from torch.profiler import ProfilerActivity, profile

        engine._decode_eager(B, L)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine._decode_eager(B, L)
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if getattr(e, "device_type", None) is not None
                   and str(e.device_type).endswith("CUDA")]
        total_us = sum(getattr(e, "device_time", 0.0) or getattr(e, "cuda_time", 0.0) for e in kernels)
        top: dict[str, float] = {}
        for e in kernels:
            top[e.name] = top.get(e.name, 0.0) + (getattr(e, "device_time", 0.0) or getattr(e, "cuda_time", 0.0))
        heaviest = sorted(top.items(), key=lambda kv: -kv[1])[:8]
        return {"kernels": len(kernels), "kernel_time_ms": total_us / 1000,
                "heaviest": [{"name": n[:80], "ms": t / 1000} for n, t in heaviest]}
    except Exception as exc:  # noqa: BLE001 - profiling is a diagnostic; the timing figures do not depend on it
        return {"error": repr(exc)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="gpt2-xl", choices=list(SIZES))
    ap.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default=None, choices=("float16", "bfloat16", "float32"),
                    help="default float16 on cuda, float32 on cpu")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--context", type=int, default=128, help="positions attended per step (sets the L bucket)")
    ap.add_argument("--long-context", type=int, default=1000, help="extra batch-1 point at this context")
    ap.add_argument("--attention", default="bmm,sdpa", help="decode attention variants to time")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--inner", type=int, default=10)
    ap.add_argument("--check-steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--copy-mib", type=int, default=None,
                    help="buffer the copy bandwidth is measured on (default 4096 on cuda, 256 on cpu)")
    ap.add_argument("--out", default=None, help="write the full result as JSON here")
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    dtype_name = args.dtype or ("float16" if device.type == "cuda" else "float32")
    dtype = getattr(torch, dtype_name)
    batches = [int(b) for b in args.batches.split(",")]
    shape = shape_for(args.size)
    timer = Timer(device)
    result: dict = {
        "size": args.size, "device": args.device, "dtype": dtype_name,
        "params": shape.param_count(), "torch": torch.__version__, "python": platform.python_version(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        result["gpu"] = {"name": props.name, "sms": props.multi_processor_count,
                         "memory_gib": round(props.total_memory / GIB, 1), "cuda": torch.version.cuda}

    copy_mib = args.copy_mib or (4096 if device.type == "cuda" else 256)
    bw = copy_bandwidth(device, timer, nbytes=copy_mib << 20)
    bytes_per_param = torch.finfo(dtype).bits // 8
    floor_ms = shape.param_count() * bytes_per_param / bw * 1000
    result["copy_bandwidth_TBps"] = bw / 1e12
    result["floor_ms"] = floor_ms

    t = time.monotonic()
    weights = random_weights(shape, args.seed, dtype_name, args.device)
    model = GPT2(shape, weights, device=device, dtype=dtype)
    result["weights_seconds"] = round(time.monotonic() - t, 2)
    max_pos = max(args.context, args.long_context if args.long_context else 0)
    engine = Engine(model, max_batch_size=max(batches), max_seq_len=min(shape.n_positions, max(max_pos + 1, 2)),
                    vocab_size=VOCAB_SIZE, eos_id=EOS_ID)
    result["kv_cache_gib"] = round(engine.cache.nbytes / GIB, 2)

    variants = {}
    all_batch_buckets, all_seq_buckets = engine.batch_buckets, engine.seq_buckets
    for attention in args.attention.split(","):
        engine._graphs.clear()
        if attention == "compile":
            # torch.compile (Inductor fuses LayerNorm/bias/GELU/residual kernels) inside our own
            # CUDA graph; batch 1 only, since each (B, L) shape is a fresh compilation.
            model.decode_attention = "bmm"
            model._decode_fn = torch.compile(model._decode_impl, dynamic=False)
            engine.batch_buckets, engine.seq_buckets = [1], [engine.bucket(1, args.context - 1)[1]]
            point_batches, long_ctx = [1], 0
        else:
            model.decode_attention = attention
            model._decode_fn = model._decode_impl
            engine.batch_buckets, engine.seq_buckets = all_batch_buckets, all_seq_buckets
            point_batches, long_ctx = batches, args.long_context
        t = time.monotonic()
        if engine.cuda_graphs:
            engine.capture_graphs()
        v: dict = {"capture_seconds": round(time.monotonic() - t, 2), "graphs": len(engine._graphs)}
        v["greedy_check"] = check_greedy(engine, weights, args.check_steps)
        steps = {}
        ctx_points = [(B, args.context) for B in point_batches]
        if long_ctx:
            ctx_points.append((1, long_ctx))
        for B, ctx in ctx_points:
            engine._tokens[:B] = torch.randint(0, VOCAB_SIZE, (B,), device=device)
            engine._pos[:B] = ctx - 1
            if engine.cuda_graphs:
                Bb, L = engine.bucket(B, ctx - 1)
                graph = engine._graphs[(Bb, L)][0]
                fn = graph.replay
            else:
                Bb, L = B, ctx
                fn = lambda B=B, L=L: engine._decode_eager(B, L)  # noqa: E731
            ms = timer.median_ms(fn, reps=args.reps, inner=args.inner)
            steps[f"B{B}_ctx{ctx}"] = {"batch": B, "context": ctx, "L_bucket": L, "step_ms": ms,
                                       "tokens_per_s": B * 1000 / ms, "vs_floor": ms / floor_ms}
        v["steps"] = steps
        # The server's view: host inputs in, graph replay, top-2 back to the host.
        for B in sorted({1, max(point_batches)}):
            toks, pos = [1] * B, [args.context - 1] * B
            v[f"host_step_ms_B{B}"] = timer.median_ms(lambda: engine.decode_step(toks, pos), reps=args.reps, inner=1)  # noqa: B023 - called only within this iteration
        if device.type == "cuda":
            v["profile_B1"] = kernel_profile(engine, 1, engine.bucket(1, args.context - 1)[1])
        variants[attention] = v
        result["variants"] = variants
        if args.out:  # after every variant, so a later failure or timeout keeps what was measured
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    best = min(variants, key=lambda a: variants[a]["steps"][f"B1_ctx{args.context}"]["step_ms"])
    b1 = variants[best]["steps"][f"B1_ctx{args.context}"]["step_ms"]
    result["best_attention"] = best
    result["batch1_step_ms"] = b1
    result["batch1_vs_floor"] = b1 / floor_ms

    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{args.size} {dtype_name} on {result.get('gpu', {}).get('name', args.device)}: "
          f"params {shape.param_count()/1e9:.3f}e9, copy bandwidth {bw/1e12:.2f} TB/s, floor {floor_ms:.3f} ms")
    for attention, v in variants.items():
        chk = v["greedy_check"]
        print(f"[{attention}] graphs {v['graphs']} captured in {v['capture_seconds']}s; greedy check "
              f"{chk['tokens_matched']}/{chk['steps']} tokens match naive, logits rel err {chk['first_decode_logits_rel_err']:.2e}; "
              f"host step B1 {v['host_step_ms_B1']:.3f} ms")
        if "profile_B1" in v:
            print(f"[{attention}] profile B1: {v['profile_B1']}")
        print(f"{'batch':>6} {'ctx':>5} {'L':>5} {'step ms':>9} {'tok/s':>10} {'x floor':>8}")
        for s in v["steps"].values():
            print(f"{s['batch']:>6} {s['context']:>5} {s['L_bucket']:>5} {s['step_ms']:>9.3f} "
                  f"{s['tokens_per_s']:>10.0f} {s['vs_floor']:>8.2f}")
    print(f"BATCH-1 STEP {b1:.3f} ms = {b1/floor_ms:.2f}x the {floor_ms:.3f} ms floor ({best} attention)")
    return 0


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    sys.exit(run_quietly(main))
