"""Write the seed scenario's benchmark results: SYNTHETIC scenario data, not measurements.

The seed article (a voice-AI team choosing g6e + INT8 for GPT-2 XL on AWS)
published conclusions, not raw numbers. These files are authored to be
plausible for GPT-2 XL (1.5B) with TensorRT-LLM at input 256 / output 128
tokens, and simple enough that the planner's answer can be checked by hand:

* mean ITL and mean TTFT are linear in concurrency c, so the mean E2E
  W(c) = TTFT(c) + 127 * ITL(c) is linear too (W0 + k*c, listed below);
* P99 TTFT per level is written out explicitly (the SLO checks read it);
* g6e int8_wo is fastest at batch 1-16 (weight-only GEMV kernels), fp8 wins at
  batch 32-64 (FP8 tensor cores), g5 (A10G) misses a 300 ms P99 TTFT from
  concurrency 8, g7e (RTX PRO 6000) is fastest but offered only in US regions.

Every file says so in `provenance: synthetic` (which the planner carries into
every output) and in labels.notes. Regenerate with:
    .venv/bin/python examples/plan/seed/make_results.py
"""

from __future__ import annotations

import json
from pathlib import Path

# The results-file revision these files follow (fleetcast/bench/schema.py).
SCHEMA_REVISION = 2
LEVELS = (1, 4, 8, 16, 32, 48, 64)
INPUT, OUTPUT = 256, 128

# instance, gpu, precision, region measured, (itl a, b), (ttft a, b), P99 TTFT per level, samples per run
CANDIDATES = [
    ("g5.xlarge", "A10G", "fp16", "ap-northeast-2", (6.8, 0.16), (34.0, 11.0), (82, 170, 318, 480, 790, 1080, 1400), 2000),
    ("g5.xlarge", "A10G", "int8_wo", "ap-northeast-2", (5.2, 0.12), (28.0, 9.0), (70, 140, 312, 470, 760, 990, 1290), 2000),
    ("g6e.xlarge", "L40S", "fp16", "ap-northeast-2", (5.0, 0.09), (16.0, 5.0), (38, 66, 98, 170, 292, 410, 530), 2000),
    ("g6e.xlarge", "L40S", "int8_wo", "ap-northeast-2", (3.4, 0.06), (12.0, 4.0), (30, 52, 80, 140, 232, 296, 380), 2000),
    ("g6e.xlarge", "L40S", "fp8", "ap-northeast-2", (3.8, 0.03), (10.0, 2.2), (34, 66, 104, 160, 210, 255, 290), 2000),
    ("g7e.2xlarge", "RTXPRO6000", "fp16", "us-east-1", (2.6, 0.03), (7.0, 1.8), (20, 36, 55, 90, 150, 205, 260), 400),
    ("g7e.2xlarge", "RTXPRO6000", "fp8", "us-east-1", (1.7, 0.015), (5.0, 1.2), (16, 28, 42, 66, 110, 150, 190), 400),
]


def stat(mean: float, p99: float, count: int) -> dict:
    wide = 0.06 if count >= 1000 else 0.15
    return {
        "count": count, "mean": round(mean, 3), "p50": round(mean * 0.92, 3), "p90": round(mean + (p99 - mean) * 0.55, 3),
        "p95": round(mean + (p99 - mean) * 0.75, 3), "p99": round(p99, 3), "min": round(mean * 0.5, 3),
        "max": round(p99 * 1.3, 3), "p99_ci": [round(p99 * (1 - wide * 0.8), 3), round(p99 * (1 + wide), 3)],
        "tail_note": None if count >= 100 else f"P99 rests on {count} samples",
    }


def run(c: int, itl: tuple, ttft: tuple, ttft_p99: float, n: int, gpu: str) -> dict:
    itl_mean = itl[0] + itl[1] * c
    ttft_mean = ttft[0] + ttft[1] * c
    e2e = ttft_mean + (OUTPUT - 1) * itl_mean
    rps = c / (e2e / 1000.0)
    errors = 8 if (gpu == "A10G" and c == 64) else 0
    return {
        "load": {"mode": "concurrency", "concurrency": c, "rate_rps": None, "arrival": None},
        "lengths": {"input_mean": INPUT, "output_mean": OUTPUT, "spec": f"input={INPUT} output={OUTPUT}"},
        "summary": {
            "requests": n, "completed": n - errors, "errors": errors,
            "errors_by_type": {"http_503": errors} if errors else {}, "duration_s": round(n / rps, 2),
            "ttft_ms": stat(ttft_mean, ttft_p99, n - errors),
            "itl_ms": stat(itl_mean, itl_mean * 1.3, n - errors),
            "e2e_ms": stat(e2e, e2e * 1.25, n - errors),
            "chunk_gap_ms": stat(itl_mean, itl_mean * 2.0, (n - errors) * (OUTPUT - 1)),
            "output_throughput_tps": round(rps * OUTPUT, 2), "total_throughput_tps": round(rps * (INPUT + OUTPUT), 2),
            "request_throughput_rps": round(rps, 4), "goodput_rps": None, "error_rate": errors / n,
            "mean_concurrency": c, "saturated": False, "saturation_reason": None,
            "schedule_lag_ms": stat(0.2, 1.1, n), "event_loop_lag_ms": stat(0.1, 0.6, n), "network_rtt_ms": 1.0,
        },
        "records": [],
    }


def main() -> None:
    out = Path(__file__).with_name("results")
    out.mkdir(exist_ok=True)
    for instance, gpu, precision, region, itl, ttft, p99s, n in CANDIDATES:
        doc = {
            "schema": "fleetcast.bench/v1", "revision": SCHEMA_REVISION, "provenance": "synthetic",
            "labels": {"instance_type": instance, "gpu": gpu, "precision": precision, "region": region,
                       "backend": "tensorrt", "model": "gpt2-xl",
                       "notes": "SYNTHETIC scenario data for the seed scenario (examples/plan/seed/make_results.py); "
                                "not a measurement"},
            "endpoint": f"http://scenario.invalid/{instance}/{precision}", "api": "completions", "config_hash": None,
            "client": {"host": "scenario", "cpus": 8, "python": "3.11", "fleetcast_version": "0.1.0"},
            "started_at": "2026-01-20T00:00:00Z", "finished_at": "2026-01-20T01:00:00Z", "seed": 7,
            "runs": [run(c, itl, ttft, p99, n, gpu) for c, p99 in zip(LEVELS, p99s)],
            "slo": {"ttft_ms": None, "itl_ms": None, "e2e_ms": None},
            "request": {"input_tokens": str(INPUT), "output_tokens": str(OUTPUT), "input_mean": INPUT,
                        "output_mean": OUTPUT, "prompts": "none (authored figures)", "force_output": True},
        }
        (out / f"{instance}-{precision}.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
