"""Two reference-backend models on one GPU: KV budgets by start order, per-process overhead, latency.

One device call (nvidia-h200), from the repo root, wheels for pydantic/ruamel carried in .whl/:

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:$PWD python3 bench/h200_colocate.py --out $OUT

What it does, in order (every server is `python -m runtime.reference.server`, the runtime's own):
 1. builds a GPT-2 medium and a GPT-2 XL shaped artifact (random fp16 weights) on the GPU;
 2. measures the per-process overhead: a bare process that creates a CUDA context and initialises
    torch's allocator and cuBLAS (the GPU memory it holds, from the device's used memory), and for each
    served model the process's memory beyond its weights and KV cache (graphs, activations, workspaces);
 3. starts the two servers one after the other, in both orders, twice: with explicit KV budgets
    (--kv-cache-bytes, what the runtime passes) and with --kv-cache-free-gpu-memory-fraction (what
    free_gpu_memory_fraction does), and records each process's KV allocation against its plan;
 4. with explicit budgets, runs `fleetcast bench run` at concurrency 1, 16 and 64 against each model
    alone, then against both at once (same level, same duration, started together).
Writes colocate.json (the dataset: packing, memory, latency summaries) and bench runs under --out.
Time slicing against MPS, with repeats and both start orders, is bench/h200_sharing.py (bench/H200_RUNS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

GIB = 1 << 30
MODELS = {  # model id -> (reference size, planned KV budget in bytes)
    "gpt2-medium": ("gpt2-medium", 6 * GIB),
    "gpt2-xl": ("gpt2-xl", 20 * GIB),
}
BASE_PORT = 8101
LEVELS = (1, 16, 64)


def sh(cmd: list[str], **kw) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def gpu_used_mib() -> int:
    out = sh(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"])
    return int(out.strip().splitlines()[0])


def settle_used_mib(samples: int = 3) -> int:
    """Device memory in use once it stops moving (a process's exit frees asynchronously)."""
    last = None
    for _ in range(20):
        values = []
        for _ in range(samples):
            values.append(gpu_used_mib())
            time.sleep(0.2)
        if max(values) == min(values) and values[0] == last:
            return values[0]
        last = values[-1]
    return last


def get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


class Server:
    def __init__(self, model: str, artifact: Path, port: int, budget_args: list[str], log_dir: Path):
        self.model, self.port = model, port
        self.log = (log_dir / f"server-{model}-{port}.log").open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runtime.reference.server", "--artifact", str(artifact), "--device", "cuda",
             "--host", "127.0.0.1", "--port", str(port), "--served-model-name", model, "--max-seq-len", "1024",
             "--max-batch-size", "64", *budget_args],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout_s: float = 300.0) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.model} exited {self.proc.returncode} (see its log)")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - started
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.model} not ready within {timeout_s} s")

    def memory(self) -> dict:
        return get_json(f"http://127.0.0.1:{self.port}/memory")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()


def bare_context_mib() -> dict:
    """GPU memory of a process that only initialises CUDA, torch's allocator and cuBLAS."""
    before = settle_used_mib()
    code = ("import torch,time,sys; a=torch.ones(256,256,device='cuda',dtype=torch.float16); b=a@a; "
            "torch.cuda.synchronize(); print(torch.cuda.memory_reserved(), flush=True); sys.stdin.readline()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    reserved = int(proc.stdout.readline())
    held = settle_used_mib()
    proc.stdin.write("\n")
    proc.stdin.flush()
    proc.wait(30)
    return {"device_used_delta_mib": held - before, "torch_reserved_bytes": reserved}


def start_pair(order: list[str], artifacts: dict, mode: str, fraction: float, log_dir: Path) -> tuple[list, dict]:
    """Start the two servers one after another (each ready before the next starts)."""
    servers, record = [], {"order": order, "mode": mode, "processes": []}
    for index, model in enumerate(order):
        before = settle_used_mib()
        budget = (["--kv-cache-bytes", str(MODELS[model][1])] if mode == "budget"
                  else ["--kv-cache-free-gpu-memory-fraction", str(fraction)])
        server = Server(model, artifacts[model], BASE_PORT + list(MODELS).index(model), budget, log_dir)
        servers.append(server)
        ready_s = server.wait_ready()
        after = settle_used_mib()
        mem = server.memory()
        kv, weights = mem["kv_cache_bytes"], mem["weights_bytes"]
        process_bytes = (after - before) * (1 << 20)
        record["processes"].append({
            "model": model, "position": index, "ready_s": round(ready_s, 2),
            "planned_kv_bytes": MODELS[model][1] if mode == "budget" else None,
            "kv_budget_bytes": mem.get("kv_budget_bytes"), "kv_cache_bytes": kv,
            "kv_slots": mem["kv_cache_slots"], "kv_slot_bytes": mem["kv_slot_bytes"],
            "kv_vs_plan": round(kv / MODELS[model][1], 4) if mode == "budget" else None,
            "weights_bytes": weights, "free_before_kv_bytes": mem.get("free_before_kv_bytes"),
            "torch_reserved_bytes": mem.get("torch_reserved_bytes"),
            "device_used_delta_bytes": process_bytes,
            "overhead_bytes": process_bytes - weights - kv,
        })
    return servers, record


def bench(model: str, level: int, duration: float, out: Path, quiet: bool = True) -> subprocess.Popen:
    port = BASE_PORT + list(MODELS).index(model)
    cmd = [sys.executable, "-m", "scripts.cli", "bench", "run", "--endpoint", f"http://127.0.0.1:{port}",
           "--model", model, "--concurrency", str(level), "--duration", str(duration),
           "--warmup", "4", "--input-tokens", "128", "--output-tokens", "128", "--tokenizer", str(ARTIFACTS[model]),
           "--label", "backend=reference", "--label", "gpu=H200", "--label", f"model={model}-shape",
           "--label", "precision=fp16", "--out", str(out), "--quiet"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def summary_of(path: Path) -> dict:
    data = json.loads(path.read_text())
    s = data["runs"][0]["summary"]
    pick = lambda st: {k: st.get(k) for k in ("count", "p50", "p99", "tail_note")}  # noqa: E731
    return {"requests": s["requests"], "errors": s["errors"], "ttft_ms": pick(s["ttft_ms"]),
            "itl_ms": pick(s["itl_ms"]), "output_tps": round(s["output_throughput_tps"], 1),
            "saturated": s["saturated"], "duration_s": round(s["duration_s"], 2)}


ARTIFACTS: dict[str, Path] = {}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--duration", type=float, default=15.0, help="seconds per bench run")
    ap.add_argument("--fraction", type=float, default=0.5)
    ap.add_argument("--skip-latency", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_dir = Path("/tmp/colocate-runs")
    runs_dir.mkdir(exist_ok=True)
    result: dict = {"what": "two reference-backend models co-located on one GPU (bench/h200_colocate.py)",
                    "gpu": sh(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                               "--format=csv,noheader"]).strip(),
                    "models": {m: {"size": s, "planned_kv_bytes": b} for m, (s, b) in MODELS.items()}}
    for model, (size, _) in MODELS.items():
        ARTIFACTS[model] = Path(f"/tmp/artifact-{size}")
        if not (ARTIFACTS[model] / "config.json").exists():
            sh([sys.executable, "-m", "runtime.reference.build", "--out", str(ARTIFACTS[model]), "--size", size,
                "--device", "cuda"])
    result["idle_used_mib"] = settle_used_mib()
    result["bare_process"] = [bare_context_mib() for _ in range(2)]
    print("bare process:", result["bare_process"], flush=True)

    result["starts"] = []
    orders = [list(MODELS), list(reversed(MODELS))]
    for mode in ("budget", "fraction"):
        for order in orders:
            servers, record = start_pair(order, ARTIFACTS, mode, args.fraction, out)
            for s in servers:
                s.stop()
            result["starts"].append(record)
            print(json.dumps({k: record[k] for k in ("order", "mode")}),
                  [(p["model"], p["kv_cache_bytes"] / GIB, p["overhead_bytes"] / GIB) for p in record["processes"]],
                  flush=True)

    if not args.skip_latency:
        servers, record = start_pair(orders[0], ARTIFACTS, "budget", args.fraction, out)
        result["latency_packing"] = record
        latency = []
        try:
            for level in LEVELS:
                for model in MODELS:
                    path = runs_dir / f"alone-{model}-c{level}.json"
                    proc = bench(model, level, args.duration, path)
                    proc.communicate()
                    latency.append({"model": model, "level": level, "with": None, **summary_of(path)})
                procs = {}
                for model in MODELS:
                    procs[model] = bench(model, level, args.duration, runs_dir / f"together-{model}-c{level}.json")
                for proc in procs.values():
                    proc.communicate()
                others = list(MODELS)
                for model in MODELS:
                    other = [m for m in others if m != model][0]
                    latency.append({"model": model, "level": level, "with": f"{other}@c{level}",
                                    **summary_of(runs_dir / f"together-{model}-c{level}.json")})
                for row in latency[-4:]:
                    print(row["model"], row["level"], row["with"], row["ttft_ms"]["p99"], row["itl_ms"]["p99"],
                          flush=True)
        finally:
            for s in servers:
                s.stop()
        result["latency"] = latency
        with tarfile.open(out / "colocate-runs.tar.gz", "w:gz") as tar:
            tar.add(runs_dir, arcname="colocate-runs")
    (out / "colocate.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
