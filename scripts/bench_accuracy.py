"""Benchmark-accuracy check (a benchmark script, not a test): `fleetcast bench`
and, when available, NVIDIA AIPerf against the test server's ground truth.

The test server (fleetcast.bench.testserver) runs pinned to --server-cpu and
logs when it wrote each token; each tool runs pinned to --client-cpu, one at a
time, at each concurrency. For P50/P99 TTFT and ITL it prints the truth, each
tool's figure and error, and the highest concurrency at which each tool's four
figures are all within max(2%, 1 ms) of the truth.

    .venv/bin/python scripts/bench_accuracy.py --aiperf /path/to/venv/bin/aiperf

AIPerf 0.13 needs a Hugging Face tokenizer directory offline; the script builds
a tiny byte-level BPE one and passes --use-server-token-count.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetcast.bench.accuracy import (
    METRICS,
    TestServerProcess,
    ToolResult,
    build_tiny_tokenizer,
    run_aiperf,
    run_fleetcast,
    truth_stats,
    within,
)
from fleetcast.bench.testserver import MODEL_ID, Timings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", default="1,2,4,8,16,32,64")
    p.add_argument("--requests", type=int, default=150, help="requests per level (at least 3x the concurrency)")
    p.add_argument("--input-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--ttft-jitter-ms", type=float, default=20.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--itl-jitter-ms", type=float, default=3.0)
    p.add_argument("--spike-prob", type=float, default=0.01)
    p.add_argument("--spike-ms", type=float, default=30.0)
    p.add_argument("--server-cpu", type=int, default=0)
    p.add_argument("--client-cpu", type=int, default=1)
    p.add_argument("--port", type=int, default=18731)
    p.add_argument("--aiperf", default=os.environ.get("AIPERF") or shutil.which("aiperf"),
                   help="aiperf executable (default: $AIPERF or aiperf on PATH); 'none' to skip")
    p.add_argument("--json", help="also write all figures to this JSON file")
    a = p.parse_args(argv)
    levels = [int(x) for x in a.concurrency.split(",")]
    use_aiperf = a.aiperf and a.aiperf != "none"
    if not use_aiperf:
        print("AIPerf not found (--aiperf PATH or $AIPERF): measuring fleetcast only", file=sys.stderr)
    timings = Timings(a.ttft_ms, a.ttft_jitter_ms, a.itl_ms, a.itl_jitter_ms, a.spike_prob, a.spike_ms, 0)
    print(f"server truth: {timings}; pinned server cpu {a.server_cpu}, client cpu {a.client_cpu}; "
          f"{a.input_tokens} in / {a.output_tokens} out tokens")
    rows = []
    best = {"fleetcast": 0, "aiperf": 0}
    contiguous = {"fleetcast": True, "aiperf": True}
    with tempfile.TemporaryDirectory() as tmp, TestServerProcess(a.port, timings, a.server_cpu) as server:
        tok_dir = str(build_tiny_tokenizer(Path(tmp) / "tok")) if use_aiperf else ""
        header = f"{'conc':>4} {'metric':<9} | {'truth':>8} {'fleetcast':>9} {'err':>7} |"
        header += f" {'truth':>8} {'aiperf':>9} {'err':>7}" if use_aiperf else ""
        print(header)
        outside: dict[str, list[str]] = {"fleetcast": [], "aiperf": []}
        for c in levels:
            n = max(a.requests, 3 * c)
            tools: dict[str, ToolResult] = {}
            truths = {}
            server.reset()
            tools["fleetcast"] = run_fleetcast(server.url, c, n, a.input_tokens, a.output_tokens, a.client_cpu)
            truths["fleetcast"] = truth_stats(server.truth())
            if use_aiperf:
                server.reset()
                try:
                    tools["aiperf"] = run_aiperf(a.aiperf, server.url, MODEL_ID, c, n, a.input_tokens,
                                                 a.output_tokens, tok_dir, a.client_cpu)
                except RuntimeError as exc:
                    print(f"aiperf failed at concurrency {c}: {exc}", file=sys.stderr)
                truths["aiperf"] = truth_stats(server.truth())
            for name, res in tools.items():
                ok = all(within(res.figures[(m, q)], getattr(truths[name][m], q)) for m, q in METRICS)
                if ok:
                    best[name] = c
                else:
                    outside[name].append(f"{c}{' (flagged saturated)' if res.saturated else ''}")
                contiguous[name] = contiguous[name] and ok
            for m, q in METRICS:
                line = f"{c:>4} {m[:-3] + ' ' + q:<9} |"
                row = {"concurrency": c, "metric": f"{m}.{q}"}
                for name in tools:
                    truth = getattr(truths[name][m], q)
                    v = tools[name].figures[(m, q)]
                    err = None if v is None else (v - truth) / truth * 100.0
                    mark = "" if within(v, truth) else "*"
                    line += f" {truth:>8.2f}"
                    line += f" {v:>9.2f} {err:>+6.1f}%{mark:1}|" if v is not None else f" {'-':>9} {'-':>7} |"
                    row[name] = {"truth": truth, "measured": v, "error_pct": err, "within": within(v, truth)}
                print(line, flush=True)
                rows.append(row)
            fc = tools["fleetcast"]
            if fc.saturated:
                print(f"     fleetcast flagged this run saturated: {fc.note}")
    print("(* outside max(2%, 1 ms) of the truth; each tool run has its own truth log from the server)")
    for name in tools:
        print(f"{name}: highest concurrency with P50/P99 TTFT and ITL all within max(2%, 1 ms): "
              f"{best[name] or 'none'}; levels outside: {', '.join(outside[name]) or 'none'}")
    if a.json:
        Path(a.json).write_text(json.dumps({"timings": timings.__dict__, "rows": rows, "best": best,
                                            "outside": outside}, indent=2))
    return 0


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    sys.exit(run_quietly(main))
