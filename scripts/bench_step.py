"""The reference engine's decode step against its batch: a fixed cost plus a cost per sequence.

Why: a quiet account's TTFT beside a neighbour is the step at the neighbour's batch (docs/gateway.md, "What
bounds the quiet account's P99"), so a step that grows with the batch is what fair admission cannot remove.
TensorRT-LLM's step is nearly flat in the batch for a small model; the reference engine's was not, through
its Python per sequence and step. This prints both parts, for two paths:

- engine: the Engine in process, tokens delivered to a no-op; the step is each decode-only iteration's
  `iterLatencyMS` (the engine's own stats).
- server: `python -m runtime.reference.server` as the fairness bench runs it, `--max-batch-size` the largest
  batch, B streaming clients on another core (raw sockets); the step is the period between one stream's
  tokens at the client (each stream's mean, median over the streams), and the server's CPU per iteration (both
  its processes), then split: the engine process's (runtime/reference/worker.py: the model, the engine's step
  loop, one message per delivery point) and the HTTP process's (every stream's task wake-up, SSE chunk and
  write), from the engine's pid in GET /memory.

- admit: the Engine in process with its prefix cache; the iteration that admits N prefix-cache hits at once and
  decodes nothing (each request wants one token), for each N of --hits: the step a quiet request admitted beside
  a neighbour's burst of hits waits for (docs/gateway.md). The prompt is the fairness bench's, so every request
  after the first reuses its two cached blocks and computes the last 32 tokens.

Each batch size runs --repeats times, interleaved, and each figure is the median of its runs. Each path fits
step(B) = fixed + per_seq x B by least squares over --batches and prints µs per sequence and step. The figures
depend on the machine and its load: they are printed, never asserted.

  taskset -c 1 python -m scripts.bench_step --client-cpu 0       # make bench-step: all on core 1, clients on 0
  python -m scripts.bench_step --server-cpu 1 --client-cpu 0     # the engine path unpinned
  taskset -c 1 python -m scripts.bench_step --paths server --server-cpu 0 --client-cpu 0 --engine-cpu 1
                                                                 # the engine process alone on core 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.devtools.harness import free_port  # noqa: E402
from scripts.bench_gateway import process_stats  # noqa: E402

# The server path's figures per batch size (ms): the engine's decode-only iteration; the period of a stream's
# tokens at its client; the server's CPU per iteration (both processes, every thread), from proc(5), which waits for
# a core on a loaded machine do not inflate and a client that falls behind cannot stretch; of it, the engine
# process's and the HTTP process's.
SERVER_FIGURES = ("engine_ms", "period_ms", "cpu_ms", "engine_cpu_ms", "http_cpu_ms")


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed, per_seq) of the least-squares line step = fixed + per_seq x batch."""
    n = len(points)
    mx = sum(b for b, _ in points) / n
    my = sum(s for _, s in points) / n
    sxx = sum((b - mx) ** 2 for b, _ in points)
    per_seq = sum((b - mx) * (s - my) for b, s in points) / sxx if sxx else 0.0
    return my - per_seq * mx, per_seq


def low(values: list[float]) -> float:
    """The 20th percentile: the step's own cost on a shared machine, where the median adds waits for a core."""
    ordered = sorted(values)
    return ordered[len(ordered) // 5]


def decode_only(stats: list[dict[str, Any]], batch: int) -> list[float]:
    """iterLatencyMS of the iterations that decoded `batch` sequences and admitted none."""
    return [s["iterLatencyMS"] for s in stats
            if s["inflightBatchingStats"]["numGenRequests"] == batch and s["numNewActiveRequests"] == 0]


def engine_steps(batches: list[int], steps: int, temperature: float, threads: int,
                 repeats: int = 1) -> dict[int, dict[str, float]]:
    """Per batch size: the decode-only iteration (ms), the engine in process, tokens to a no-op; and the model's
    decode step alone (`Engine.decode_step`: inputs in, the step, its top-2 read back), timed the same way."""
    import torch

    from runtime.reference.build import random_weights
    from runtime.reference.configs import shape_for
    from runtime.reference.engine import Engine, SamplingParams, Sequence
    from runtime.reference.model import GPT2
    from runtime.reference.tokenizer import EOS_ID, VOCAB_SIZE

    torch.set_num_threads(threads)
    shape = shape_for("tiny")
    engine = Engine(GPT2(shape, random_weights(shape, seed=0)), max_batch_size=max(batches),
                    max_seq_len=shape.n_positions, vocab_size=VOCAB_SIZE, eos_id=EOS_ID, stats_keep=100_000)
    engine.start()
    runs: dict[int, list[float]] = {batch: [] for batch in batches}
    try:
        for batch in batches * repeats:
            done = threading.Semaphore(0)

            def emit(token: int | None, reason: str | None, done: threading.Semaphore = done) -> None:
                if reason is not None:
                    done.release()

            params = SamplingParams(max_tokens=steps, ignore_eos=True, temperature=temperature)
            engine.pop_stats()
            for i in range(batch):
                engine.submit(Sequence(prompt=[1 + i, 2, 3, 4], params=params, emit=emit))
            for _ in range(batch):
                done.acquire()
            runs[batch].append(low(decode_only(engine.pop_stats(), batch)))
    finally:
        engine.stop()
    out = {batch: {"step_ms": statistics.median(figures)} for batch, figures in runs.items()}
    with torch.inference_mode():
        for batch in batches:  # the model alone, at the context the runs above averaged (half their tokens)
            tokens, positions = [1] * batch, [4 + steps // 2] * batch
            samples = []
            for _ in range(steps):
                started = time.perf_counter()
                engine.decode_step(tokens, positions)
                samples.append((time.perf_counter() - started) * 1000)
            out[batch]["model_ms"] = low(samples)
    return out


ADMIT_PROMPT = "the quick brown fox " * 8  # scripts/bench_fairness.py's prompt: 160 byte tokens, 2 full KV blocks


def admission_steps(counts: list[int], temperature: float, threads: int, repeats: int = 1,
                    samples: int = 20) -> dict[int, dict[str, float]]:
    """Per N of `counts`: the iteration that admits N prefix-cache hits together and decodes nothing (ms; the 20th
    percentile of `samples` such iterations, median over `repeats` runs), the engine in process."""
    import torch

    from runtime.reference.build import random_weights
    from runtime.reference.configs import shape_for
    from runtime.reference.engine import Engine, SamplingParams, Sequence
    from runtime.reference.model import GPT2
    from runtime.reference.tokenizer import EOS_ID, VOCAB_SIZE, ByteTokenizer

    torch.set_num_threads(threads)
    shape = shape_for("tiny")
    engine = Engine(GPT2(shape, random_weights(shape, seed=0)), max_batch_size=max(counts),
                    max_seq_len=shape.n_positions, vocab_size=VOCAB_SIZE, eos_id=EOS_ID, stats_keep=100_000)
    engine.start()
    prompt = ByteTokenizer().encode(ADMIT_PROMPT)
    params = SamplingParams(max_tokens=1, temperature=temperature)
    runs: dict[int, list[float]] = {n: [] for n in counts}

    done = threading.Semaphore(0)

    def emit(token: int | None, reason: str | None) -> None:
        if reason is not None:
            done.release()

    def admit(n: int) -> None:
        engine.submit_all([Sequence(prompt=prompt, params=params, salt="neighbour", emit=emit) for _ in range(n)])
        for _ in range(n):
            done.acquire()

    try:
        admit(1)  # the miss that caches the prompt's blocks
        for n in counts * repeats:
            engine.pop_stats()
            for _ in range(samples):
                admit(n)
            steps = [s["iterLatencyMS"] for s in engine.pop_stats() if s["numNewActiveRequests"] == n]
            runs[n].append(low(steps))
    finally:
        engine.stop()
    return {n: {"step_ms": statistics.median(figures)} for n, figures in runs.items()}


async def _stream(port: int, body: bytes) -> list[float]:
    """Arrival times of one streamed completion's token chunks."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    times: list[float] = []
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%b" % (len(body), body))
        await reader.readuntil(b"\r\n\r\n")
        while True:
            line = await reader.readline()
            if not line:
                break
            if line.startswith(b"data: {") and b'"text"' in line:
                times.append(time.perf_counter())
    finally:
        writer.close()
    return times


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def server_steps(batches: list[int], steps: int, temperature: float, server_cpu: int | None,
                 client_cpu: int | None, repeats: int = 1, engine_cpu: int | None = None) -> dict[int, dict[str, float]]:
    """Per batch size: the engine's median decode-only iteration and the clients' median token period (ms)."""
    from runtime.reference.build import build_artifact

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        build_artifact(Path(tmp) / "artifact", size="tiny")
        cmd = [sys.executable, "-m", "runtime.reference.server", "--artifact", str(Path(tmp) / "artifact"),
               "--port", str(port), "--threads", "1", "--max-batch-size", str(max(batches)), "--no-block-reuse"]
        cpus = {server_cpu} if server_cpu is not None else None
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        if client_cpu is not None:
            os.sched_setaffinity(0, {client_cpu})
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("the reference server did not start") from None
                    time.sleep(0.1)
            engine_pid = _get(f"http://127.0.0.1:{port}/memory")["engine_pid"]
            if engine_cpu is not None:  # the engine process alone on a core, as on the device host (FAIRNESS_DEVICE.md)
                os.sched_setaffinity(engine_pid, {engine_cpu})
            body = json.dumps({"prompt": "the quick brown fox " * 2, "max_tokens": steps, "ignore_eos": True,
                               "temperature": temperature, "stream": True}).encode()
            runs: dict[int, list[dict[str, float]]] = {batch: [] for batch in batches}
            for i, batch in enumerate([batches[0], *batches * repeats]):  # the first run warms the path up
                _get(f"http://127.0.0.1:{port}/metrics")

                async def run(batch: int = batch) -> list[list[float]]:
                    return await asyncio.gather(*(_stream(port, body) for _ in range(batch)))

                cpu_before, engine_before = process_stats(proc.pid).cpu_s, process_stats(engine_pid).cpu_s
                streams = asyncio.run(run())
                cpu_s = process_stats(proc.pid).cpu_s - cpu_before  # the server and its child, the engine process
                engine_s = process_stats(engine_pid).cpu_s - engine_before
                # Each stream's mean period from its 2nd token (the 1st decode step) on: a client that read several
                # chunks at once would make single gaps near zero, the mean is immune.
                periods = [(times[-1] - times[1]) / (len(times) - 2) for times in streams if len(times) > 2]
                stats = _get(f"http://127.0.0.1:{port}/metrics")
                iters = decode_only(stats, batch)
                if i:
                    per_iteration = 1000 / max(1, len(stats))
                    runs[batch].append({"engine_ms": low(iters) if iters else float("nan"),
                                        "period_ms": statistics.median(periods) * 1000,
                                        "cpu_ms": cpu_s * per_iteration,
                                        "engine_cpu_ms": engine_s * per_iteration,
                                        "http_cpu_ms": (cpu_s - engine_s) * per_iteration})
            return {batch: {key: statistics.median(r[key] for r in figures) for key in SERVER_FIGURES}
                    for batch, figures in runs.items()}
        finally:
            proc.terminate()
            proc.wait(10)


def report(engine: dict[int, dict[str, float]] | None, server: dict[int, dict[str, float]] | None,
           admit: dict[int, dict[str, float]] | None = None) -> list[str]:
    lines = []
    if engine:
        lines.append("engine in process (decode-only iteration, tokens to a no-op; the model's decode_step alone; "
                     "20th percentiles):")
        lines += [f"  batch {b:>3}: iteration {v['step_ms']:7.3f} ms, model {v['model_ms']:7.3f} ms, "
                  f"the rest {v['step_ms'] - v['model_ms']:7.3f} ms" for b, v in engine.items()]
        for key, name in (("step_ms", "iteration"), ("model_ms", "model")):
            fixed, per = fit([(b, v[key]) for b, v in engine.items()])
            lines.append(f"  fit ({name}): fixed {fixed * 1000:7.1f} µs + {per * 1000:6.1f} µs per sequence-step")
        fixed, per = fit([(b, v["step_ms"] - v["model_ms"]) for b, v in engine.items()])
        lines.append(f"  fit (iteration less model: the engine's Python): fixed {fixed * 1000:7.1f} µs + "
                     f"{per * 1000:6.1f} µs per sequence-step")
    if server:
        lines.append("server (B streams; the engine's decode-only iteration, 20th percentile; the period of each "
                     "stream's tokens at the client, median over the streams; the server's CPU per iteration, both "
                     "processes, then the engine process's and the HTTP process's):")
        lines += [f"  batch {b:>3}: engine {v['engine_ms']:7.3f} ms, token period {v['period_ms']:7.3f} ms, "
                  f"CPU {v['cpu_ms']:7.3f} ms (engine process {v['engine_cpu_ms']:7.3f} ms, HTTP process "
                  f"{v['http_cpu_ms']:7.3f} ms)" for b, v in server.items()]
        for key, name in (("engine_ms", "engine"), ("period_ms", "token period"), ("cpu_ms", "server CPU"),
                          ("engine_cpu_ms", "engine process CPU"), ("http_cpu_ms", "HTTP process CPU")):
            fixed, per = fit([(b, v[key]) for b, v in server.items()])
            lines.append(f"  fit ({name}): fixed {fixed * 1000:7.1f} µs + {per * 1000:6.1f} µs per sequence-step")
    if admit:
        lines.append("engine in process, the step admitting N prefix-cache hits at once (no decode; 20th percentile):")
        lines += [f"  {n:>3} hits: step {v['step_ms']:7.3f} ms" for n, v in admit.items()]
        fixed, per = fit([(n, v["step_ms"]) for n, v in admit.items()])
        lines.append(f"  fit (admission step): fixed {fixed * 1000:7.1f} µs + {per * 1000:6.1f} µs per admitted hit")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m scripts.bench_step", description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,4,8,16", help="batch sizes, comma-separated (default 1,4,8,16)")
    p.add_argument("--steps", type=int, default=200, help="tokens per request, so decode steps per batch (default 200)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="1.0 (default): sampled, as the fairness bench's requests; 0: greedy")
    p.add_argument("--paths", default="engine,server,admit",
                   help="any of engine, server, admit, comma-separated (default all three)")
    p.add_argument("--hits", default="1,4,8,13",
                   help="prefix-cache hits admitted at once, for the admit path (default 1,4,8,13)")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs of each batch size, interleaved; each figure is their median (default 3)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, as the benches serve)")
    p.add_argument("--server-cpu", type=int, default=None, help="pin the server to this core")
    p.add_argument("--client-cpu", type=int, default=None, help="pin this process (the clients) to this core")
    p.add_argument("--engine-cpu", type=int, default=None,
                   help="pin the server's engine process to this core once it serves (default: the server's cores)")
    p.add_argument("--json", default=None, help="write the figures here as JSON")
    args = p.parse_args(argv)
    args.batch_list = sorted({int(b) for b in args.batches.split(",")})
    if len(args.batch_list) < 2 or args.batch_list[0] < 1:
        p.error("--batches: at least two sizes, each >= 1")
    if args.steps < 4:
        p.error("--steps: at least 4")
    if args.repeats < 1:
        p.error("--repeats: at least 1")
    args.hit_list = sorted({int(n) for n in args.hits.split(",")})
    if len(args.hit_list) < 2 or args.hit_list[0] < 1:
        p.error("--hits: at least two counts, each >= 1")
    args.path_set = set(args.paths.split(","))
    if not args.path_set or args.path_set - {"engine", "server", "admit"}:
        p.error("--paths: any of engine, server, admit, comma-separated")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    engine = (engine_steps(args.batch_list, args.steps, args.temperature, args.threads, args.repeats)
              if "engine" in args.path_set else None)
    server = (server_steps(args.batch_list, args.steps, args.temperature, args.server_cpu, args.client_cpu,
                           args.repeats, args.engine_cpu) if "server" in args.path_set else None)
    admit = (admission_steps(args.hit_list, args.temperature, args.threads, args.repeats)
             if "admit" in args.path_set else None)
    print(f"reference engine, tiny model on cpu, temperature {args.temperature}, {args.steps} tokens per request, "
          f"median of {args.repeats} runs; "
          f"engine path on cores {args.cores}, server on {args.server_cpu if args.server_cpu is not None else args.cores}, "
          f"clients on {args.client_cpu if args.client_cpu is not None else args.cores}"
          + (f", the engine process on {args.engine_cpu}" if args.engine_cpu is not None else ""))
    for line in report(engine, server, admit):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps({"engine": engine, "server": server, "admit": admit}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    sys.exit(run_quietly(main))
