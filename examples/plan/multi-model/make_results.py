"""Write the multi-model scenario's solo benchmark results: SYNTHETIC scenario data, not measurements.

Three models of different sizes (examples/plan/multi-model/fleet.yaml) on two instance types in
ap-northeast-2, each curve measured alone on its GPU (no `packing`), at input 256 / output 128 tokens:
plausible shapes (mean ITL and TTFT linear in concurrency, as the seed scenario's, whose helpers this
reuses) chosen so that the packing search has something to decide, not figures of a real GPU. Every
file says so in `provenance: synthetic` and labels.notes; the planner carries that into every output.
Regenerate with:
    .venv/bin/python examples/plan/multi-model/make_results.py
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("seed_results", HERE.parent / "seed" / "make_results.py")
seed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(seed)

LEVELS = (1, 4, 8, 16, 32, 64)
# instance, gpu, model, backend, precision, (itl a, b), (ttft a, b)
CURVES = [
    ("g6e.xlarge", "L40S", "gpt2-xl", "tensorrt", "int8_wo", (3.4, 0.06), (12.0, 4.0)),
    ("g6e.xlarge", "L40S", "gpt2-xl", "tensorrt", "fp16", (5.0, 0.09), (16.0, 5.0)),
    ("g6e.xlarge", "L40S", "qwen2.5-0.5b", "pytorch", "bf16", (2.2, 0.04), (8.0, 2.0)),
    ("g6e.xlarge", "L40S", "qwen2.5-3b", "pytorch", "bf16", (6.0, 0.12), (20.0, 6.0)),
    ("g6e.xlarge", "L40S", "qwen2.5-3b", "pytorch", "fp8", (4.2, 0.08), (15.0, 4.5)),
    ("g6.xlarge", "L4", "gpt2-xl", "tensorrt", "int8_wo", (6.5, 0.15), (24.0, 8.0)),
    ("g6.xlarge", "L4", "qwen2.5-0.5b", "pytorch", "bf16", (3.6, 0.07), (12.0, 3.5)),
    ("g6.xlarge", "L4", "qwen2.5-3b", "pytorch", "bf16", (11.0, 0.26), (40.0, 12.0)),
    ("g6.xlarge", "L4", "qwen2.5-3b", "pytorch", "fp8", (7.6, 0.18), (30.0, 9.0)),
]
SAMPLES = 2000


def main() -> None:
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    for instance, gpu, model, backend, precision, itl, ttft in CURVES:
        runs = [seed.run(c, itl, ttft, (ttft[0] + ttft[1] * c) * 2.4, SAMPLES, gpu) for c in LEVELS]
        doc = {
            "schema": "fleetcast.bench/v1", "revision": seed.SCHEMA_REVISION, "provenance": "synthetic",
            "labels": {"instance_type": instance, "gpu": gpu, "precision": precision, "region": "ap-northeast-2",
                       "backend": backend, "model": model,
                       "notes": "SYNTHETIC scenario data for the multi-model plan example "
                                "(examples/plan/multi-model/make_results.py); one process alone on its GPU; "
                                "not a measurement"},
            "endpoint": f"http://scenario.invalid/{instance}/{model}/{precision}", "api": "completions",
            "config_hash": None,
            "client": {"host": "scenario", "cpus": 8, "python": "3.11", "fleetcast_version": "0.1.0"},
            "started_at": "2026-01-20T00:00:00Z", "finished_at": "2026-01-20T01:00:00Z", "seed": 7,
            "runs": runs,
            "slo": {"ttft_ms": None, "itl_ms": None, "e2e_ms": None},
            "request": {"input_tokens": str(seed.INPUT), "output_tokens": str(seed.OUTPUT), "input_mean": seed.INPUT,
                        "output_mean": seed.OUTPUT, "prompts": "none (authored figures)", "force_output": True},
        }
        (out / f"{instance}-{model}-{precision}.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
