"""Two reference-backend models on one GPU, time-sliced or under MPS: the co-located dataset of issue 33.

Run (on the device machine, from the repo root; bench/H200_RUNS.md gives the exact device calls):

    python3 bench/h200_sharing.py --gpu-sharing mps --order xl-first --solo xl --out /tmp/h200/mps-xl-first
    python3 bench/h200_sharing.py --gpu-sharing mps --order medium-first --solo medium --out /tmp/h200/mps-medium-first
    python3 bench/h200_sharing.py --summarize /tmp/h200/ts-* /tmp/h200/mps-* --out /tmp/h200   # goals, pass/fail

What one run does, in order:
 1. builds the GPT-2 XL- and medium-shaped artifacts (random fp16 weights; cached under --artifacts);
 2. serves both with runtime.serve.Serving, the runtime's own supervisor, in the --order given: each engine
    process ready before the next starts, each with its explicit KV budget (--kv-cache-bytes) and the binding
    fraction beside it (fleetcast.config.memory.binding_fraction), as runtime/bootstrap.py passes them. Under
    --gpu-sharing mps the GPU's MPS control daemon is started through runtime/mps.py as the runtime starts it
    (its own pipe and log directories, here under a temp dir), each process is its client with its device-memory
    limit set to its planned share with its part of the headroom (runtime.kv_budget.mps_memory_limit), and
    the daemon is stopped after the last process; time_slicing starts no daemon;
 3. records each process's KV cache against its plan (GET /memory) and, under MPS, that it ran as a client;
 4. for each repeat and each concurrency level (per model): each model alone (the other loaded, idle; not with
    --solo none), then both at once (two `fleetcast bench run` clients started together, same level, same
    duration);
 5. writes per model and kind (alone/together) one bench results file (revision 7: packing.gpu_sharing, every
    repeat as runs[].repeat, a together run's peers the other model's mean concurrency in the same repeat):
    h200-sharing-<mode>-<order>-<model>-<alone|together>.json, and sharing.json (the points, their spread over
    repeats, combined throughput, KV against plan, the mode and order). Both are rewritten after every point, so
    a run stopped at --deadline-s (or killed) still leaves whole repeats behind.

--summarize reads several runs' sharing.json and checks issue 33's goals for MPS at 16 and 64 streams: each
model's ITL P99 within 1.3x its solo figure, combined throughput at least 1.8x the time-sliced figure; it prints
one PASS/FAIL line per goal and writes goals.json. With --calibration FILE it also writes the planner's MPS
estimator calibration (fleetcast/config/data/gpu_sharing.yaml): per goal level, model and way, each metric's median
over every repeat of every run given, the repeats counted and the lowest and highest repeat. The time-slicing dataset of docs/runtime.md
(bench/data/h200-colocate*.json) is bench/h200_colocate.py's, unchanged.

--device cpu is the dry run (tests/bench/test_h200_sharing_script.py): two tiny shapes on CPU, bf16, short
runs; under mps it needs an nvidia-cuda-mps-control on PATH (the tests' stand-in, tests/runtime/fake_mps_control.py)
and the reference backend imitates the MPS server (runtime/reference/mps_sim.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: the runtime and fleetcast packages are the repo's
    sys.path.insert(0, str(ROOT))

GIB = 1 << 30
MPS_BIN = Path("/usr/local/nvidia/bin")  # where the device machine has nvidia-cuda-mps-control (not on PATH there)
ORDERS = {"xl-first": ("gpt2-xl-shape", "gpt2-medium-shape"), "medium-first": ("gpt2-medium-shape", "gpt2-xl-shape")}
MODES = ("time_slicing", "mps")
GOAL_LEVELS = (16, 64)
ITL_GOAL = 1.3  # each model's ITL P99 under MPS within this times its solo figure (issue 33)
THROUGHPUT_GOAL = 1.8  # combined throughput under MPS at least this times the time-sliced figure (issue 33)


@dataclass(frozen=True)
class Shape:
    """One served model: the reference size, its KV budget, the request shape and precision it runs at."""

    size: str
    kv_bytes: int


def shapes(device: str) -> dict[str, Shape]:
    """The pair: on cuda the GPT-2 XL and medium shapes at bench/h200_colocate.py's budgets (20 and 6 GiB); on cpu
    two tiny shapes, each budgeted for a full batch of the dry run's sequences."""
    if device == "cuda":
        return {"gpt2-xl-shape": Shape("gpt2-xl", 20 * GIB), "gpt2-medium-shape": Shape("gpt2-medium", 6 * GIB)}
    from runtime.reference.configs import shape_for

    return {"gpt2-xl-shape": Shape("wide", CPU_BATCH * shape_for("wide").kv_slot_bytes(CPU_SEQ, 2)),
            "gpt2-medium-shape": Shape("tiny", CPU_BATCH * shape_for("tiny").kv_slot_bytes(CPU_SEQ, 2))}


CPU_SEQ, CPU_BATCH, CPU_TOKENS = 64, 8, 16  # the dry run: max sequence, batch, input = output tokens


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spread(values: list[float]) -> dict[str, float | int | None]:
    """What the repeats measured: lowest, median, highest, and the width (highest over lowest - 1)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return {"n": 0, "min": None, "median": None, "max": None, "width": None}
    lo, hi = min(vals), max(vals)
    return {"n": len(vals), "min": round(lo, 3), "median": round(statistics.median(vals), 3), "max": round(hi, 3),
            "width": round(hi / lo - 1, 4) if lo > 0 else None}


def write_json(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def gpu_name(device: str) -> str:
    if device != "cuda":
        return "cpu-dry-run"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, check=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "H200"
    return "H200" if "H200" in out else out.replace(" ", "-")


def ensure_mps_on_path() -> str | None:
    """The device machine keeps nvidia-cuda-mps-control (and the server it spawns) off PATH: put its directory on."""
    from runtime.mps import CONTROL

    if shutil.which(CONTROL) is None and (MPS_BIN / CONTROL).exists():
        os.environ["PATH"] = f"{MPS_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    return shutil.which(CONTROL)


class Pair:
    """The two engine processes under the runtime's Serving (and, under MPS, the GPU's control daemon)."""

    def __init__(self, args: argparse.Namespace, artifacts: dict[str, Path], work: Path, slack_bytes: int = 0,
                 **settings: object):
        """`settings`: ServeSettings fields over the bench's (bench/h200_mps_fault.py: the runtime's restart policy
        and liveness, fault-on-signal servers)."""
        from fleetcast.config.memory import binding_fraction, process_overhead
        from runtime.kv_budget import artifact_bytes, mps_memory_limit
        from runtime.reference.configs import kv_tokens, shape_for
        from runtime.serve import ServerProcess, ServeSettings, Serving, server_name
        from runtime.supervisor import RestartPolicy

        self.args, self.shapes = args, shapes(args.device)
        self.fraction = binding_fraction()
        self.ports = {m: free_port() for m in self.shapes}
        self.limits: dict[str, int | None] = {}
        servers = []
        for model in ORDERS[args.order]:
            shape = self.shapes[model]
            weights = artifact_bytes(artifacts[model])
            # As the instance sets it (runtime/bootstrap.py): the validator's overhead of a process of this size
            # at the engine's default limits (fleetcast.config.memory.served_overhead), activations counted.
            overhead = process_overhead("tensorrt", shape_for(shape.size).param_count(), 64, 8192).total_bytes
            limit = (mps_memory_limit(weights, shape.kv_bytes, self.fraction, overhead=overhead) + slack_bytes
                     if args.gpu_sharing == "mps" else None)
            self.limits[model] = limit
            argv = [sys.executable, "-m", "runtime.reference.server", "--artifact", str(artifacts[model]),
                    "--device", args.device, "--host", "127.0.0.1", "--port", str(self.ports[model]),
                    "--served-model-name", model, "--max-seq-len", str(self.max_seq),
                    "--max-batch-size", str(64 if args.device == "cuda" else CPU_BATCH),
                    "--kv-cache-bytes", str(shape.kv_bytes),
                    "--kv-cache-free-gpu-memory-fraction", f"{self.fraction:g}"]
            if args.device == "cpu":
                argv += ["--dtype", "bfloat16", "--threads", "1"]
            planned = kv_tokens(shape.kv_bytes, shape_for(shape.size), self.max_seq, 2)  # fp16 and bf16: 2 bytes
            servers.append(ServerProcess(name=server_name(model, 0, single=False), model_id=model, copy_index=0,
                                         port=self.ports[model], argv=argv, kv_cache_bytes=shape.kv_bytes,
                                         mps_mem_limit_bytes=limit, kv_tokens_planned=planned))
        # A bench run is not a restart test: a process that dies fails the run (its figures would be a restart's),
        # and a liveness probe slow under 64 streams must not kill a server mid-point (bench/h200_mps_fault.py
        # keeps the runtime's own restart policy and liveness).
        fields: dict = {"ready_timeout_s": 600.0, "restart": RestartPolicy(max_restarts=0, backoff_base_s=0.1),
                        "liveness_interval_s": 30.0, "liveness_timeout_s": 30.0, "liveness_failures": 10,
                        "models_state_file": work / "models-ready.json", **settings}
        serve_settings = ServeSettings(port=free_port(), model_name=servers[0].model_id, region="lab", pool="h200",
                                       gateway=False, **fields)
        work.mkdir(parents=True, exist_ok=True)
        self.mps_root = work / "mps" if args.gpu_sharing == "mps" else None
        self.serving = Serving(serve_settings, servers=servers, mps_root=self.mps_root)

    @property
    def max_seq(self) -> int:
        return 1024 if self.args.device == "cuda" else CPU_SEQ

    def start(self) -> dict:
        from runtime.serve import http_json

        self.serving.start()
        timings = self.serving.wait_ready()
        processes = []
        for position, server in enumerate(self.serving.servers):
            _, mem = http_json("GET", f"{server.base}/memory", timeout_s=30)
            mem = mem if isinstance(mem, dict) else {}
            child = self.serving.supervisor.children[server.name]
            env = process_env(child.pid) if child.pid else {}
            kv = mem.get("kv_cache_bytes")
            processes.append({
                "model": server.model_id, "position": position, "pid": child.pid,
                "ready_s": timings["models"][server.name]["ready_s"],
                "planned_kv_bytes": server.kv_cache_bytes, "kv_cache_bytes": kv,
                "kv_vs_plan": round(kv / server.kv_cache_bytes, 4) if kv and server.kv_cache_bytes else None,
                "kv_budget_bytes": mem.get("kv_budget_bytes"), "kv_budget_source": mem.get("kv_budget_source"),
                "kv_slot_bytes": mem.get("kv_slot_bytes"), "weights_bytes": mem.get("weights_bytes"),
                "free_before_kv_bytes": mem.get("free_before_kv_bytes"),
                "torch_reserved_bytes": mem.get("torch_reserved_bytes"),
                "mps_mem_limit_bytes": server.mps_mem_limit_bytes,
                "mps_client": {k: env.get(k) for k in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
                                                       "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_VISIBLE_DEVICES")}
                if self.mps_root is not None else None,
            })
        daemon = next(iter(self.serving.mps_daemons.values()), None)
        return {"processes": processes, "kv_short": timings.get("kv_short"),
                "mps_daemon": None if daemon is None else {"pid": daemon.pid(), "pipe_dir": str(daemon.pipe_dir),
                                                           "log_dir": str(daemon.log_dir), "alive": daemon.alive()}}

    def stop(self) -> dict:
        from runtime.serve import http_json

        peaks = {}
        for server in self.serving.servers:  # what each process came to need, before the drain ends it
            try:
                _, mem = http_json("GET", f"{server.base}/memory", timeout_s=10)
                peaks[server.model_id] = mem
            except Exception as exc:  # noqa: BLE001 - a dead process has no peaks to report
                peaks[server.model_id] = {"error": str(exc)[-300:]}
        apps = gpu_apps()
        report = self.serving.drain()
        daemon = next(iter(self.serving.mps_daemons.values()), None)
        if daemon is not None:
            # A pair whose processes all died before the drain left no member to stop on purpose, so the group's
            # after_stop never ran: quit the daemon here (a no-op when it is gone), or a retry would start a second.
            daemon.stop()
        return {"drain_s": round(report.get("drain_s", 0.0), 2), "memory_at_stop": peaks, "gpu_apps_at_stop": apps,
                "mps_daemon_alive_after": None if daemon is None else daemon.alive()}


def wait_mps_servers_gone(timeout_s: float = 30.0) -> None:
    """A quit control daemon's MPS server can outlive it for a moment, holding the GPU: a retry waits it out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if subprocess.run(["pgrep", "-f", "nvidia-cuda-mps-server"], capture_output=True).returncode != 0:
            return
        time.sleep(0.2)


def keep_mps_logs(work: Path, dest: Path) -> None:
    """The MPS control daemon's and server's logs of every start attempt (what a refused or faulted client left)."""
    for log in sorted(work.glob("try*/mps/**/*.log")):
        target = dest / log.relative_to(work)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, target)


def gpu_apps() -> list[dict] | None:
    """nvidia-smi's compute processes and the device memory each holds (a process's whole footprint, CUDA context
    included); None without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    rows = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            rows.append({"pid": int(parts[0]), "name": parts[1], "used_mib": parts[2]})
    return rows


def process_env(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def packing_spec(shape_map: dict[str, Shape]) -> str:
    return ",".join(f"{m}:1:{s.kv_bytes / GIB:.6g}" for m, s in shape_map.items())


def bench_cmd(args: argparse.Namespace, pair: Pair, model: str, level: int, out: Path, artifacts: dict[str, Path],
              gpu: str) -> list[str]:
    tokens = "128" if args.device == "cuda" else str(CPU_TOKENS)
    with_peer = "the other model busy at the same level" if "together" in out.name else "the other loaded and idle"
    notes = (f"reference backend ({'PyTorch, random fp16 weights, one H200' if args.device == 'cuda' else 'CPU dry run, tiny shapes'}), "
             f"{args.gpu_sharing.replace('_', ' ')}, started {args.order}, {with_peer}; bench/h200_sharing.py; "
             "not an AWS candidate")
    return [sys.executable, "-m", "scripts.cli", "bench", "run", "--endpoint", f"http://127.0.0.1:{pair.ports[model]}",
            "--model", model, "--concurrency", str(level), "--duration", f"{args.duration:g}",
            "--warmup", str(args.warmup), "--input-tokens", tokens, "--output-tokens", tokens,
            "--tokenizer", str(artifacts[model]), "--timeout", "120",
            "--packing", packing_spec(pair.shapes), "--gpu-sharing", args.gpu_sharing,
            "--label", "backend=reference", "--label", f"gpu={gpu}",
            "--label", f"precision={'fp16' if args.device == 'cuda' else 'bf16'}",
            "--label", f"notes={notes}", "--out", str(out), "--quiet"]


def run_bench(cmds: list[list[str]], timeout_s: float) -> None:
    """Start every client at once (a together point's two), wait for all; a failed client fails the point."""
    procs = [subprocess.Popen(c, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for c in cmds]
    failures = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        if proc.returncode != 0:
            failures.append(f"exit {proc.returncode}: {out.strip()[-800:]}")
    if failures:
        raise RuntimeError("bench run failed: " + " | ".join(failures))


def summary_row(run) -> dict:
    s = run.summary
    return {"requests": s.requests, "errors": s.errors, "ttft_p99_ms": s.ttft_ms.p99, "itl_p99_ms": s.itl_ms.p99,
            "ttft_p50_ms": s.ttft_ms.p50, "itl_p50_ms": s.itl_ms.p50, "output_tps": s.output_throughput_tps,
            "mean_concurrency": s.mean_concurrency, "saturated": s.saturated, "ttft_tail_note": s.ttft_ms.tail_note}


class Dataset:
    """The run's points, assembled into bench results files and sharing.json after every point."""

    def __init__(self, args: argparse.Namespace, out: Path, raw: Path):
        self.args, self.out, self.raw = args, out, raw
        self.points: list[dict] = []  # {"kind", "level", "repeat", "files": {model: raw path}}
        self.meta: dict = {}

    def add(self, point: dict) -> None:
        self.points.append(point)
        self.write()

    def results_files(self) -> dict[str, Path]:
        """Per (model, kind) one results file of every run so far, repeats numbered, peers filled in."""
        from fleetcast.bench.schema import dump_results, load_results, number_repeats

        written = {}
        for kind in ("alone", "together"):
            for model in ORDERS[self.args.order]:
                points = [p for p in self.points if p["kind"] == kind and model in p["files"]]
                if not points:
                    continue
                runs = []
                for point in points:
                    (run,) = load_results(point["files"][model]).runs
                    if kind == "together":
                        (peer,) = [m for m in point["files"] if m != model]
                        peer_run = load_results(point["files"][peer]).runs[0]
                        run = run.model_copy(update={"peers": {peer: round(peer_run.summary.mean_concurrency, 3)}})
                    runs.append(run.model_copy(update={"repeat": None}))
                first, last = load_results(points[0]["files"][model]), load_results(points[-1]["files"][model])
                merged = first.model_copy(update={"runs": number_repeats(runs), "finished_at": last.finished_at})
                path = self.out / f"h200-sharing-{self.args.gpu_sharing}-{self.args.order}-{model}-{kind}.json"
                dump_results(merged, path)
                written[f"{model}/{kind}"] = path
        return written

    def table(self) -> list[dict]:
        """Per kind, level and model (and the pair's combined throughput): each repeat's figures and their spread."""
        from fleetcast.bench.schema import load_results

        rows = []
        keys = sorted({(p["kind"], p["level"]) for p in self.points}, key=lambda k: (k[0], k[1]))
        for kind, level in keys:
            pts = [p for p in self.points if p["kind"] == kind and p["level"] == level]
            for model in ORDERS[self.args.order]:
                reps = [summary_row(load_results(p["files"][model]).runs[0]) for p in pts if model in p["files"]]
                rows.append({"kind": kind, "level": level, "model": model, "repeats": reps,
                             "ttft_p99_ms": spread([r["ttft_p99_ms"] for r in reps]),
                             "itl_p99_ms": spread([r["itl_p99_ms"] for r in reps]),
                             "output_tps": spread([r["output_tps"] for r in reps])})
            if kind == "together":
                combined = [sum(load_results(f).runs[0].summary.output_throughput_tps for f in p["files"].values())
                            for p in pts]
                rows.append({"kind": kind, "level": level, "model": "combined", "output_tps": spread(combined),
                             "repeats": [{"output_tps": round(c, 1)} for c in combined]})
        return rows

    def write(self) -> None:
        files = self.results_files()
        write_json(self.out / "sharing.json", {
            **self.meta, "gpu_sharing": self.args.gpu_sharing, "order": self.args.order,
            "points_done": len(self.points), "files": {k: p.name for k, p in files.items()}, "table": self.table()})


def build_artifacts(args: argparse.Namespace) -> dict[str, Path]:
    out = {}
    for model, shape in shapes(args.device).items():
        path = Path(args.artifacts) / f"artifact-{shape.size}-{'fp16' if args.device == 'cuda' else 'bf16'}"
        if not (path / "config.json").exists():
            subprocess.run([sys.executable, "-m", "runtime.reference.build", "--out", str(path), "--size", shape.size,
                            "--device", args.device, "--dtype", "float16" if args.device == "cuda" else "bfloat16"],
                           cwd=ROOT, check=True, capture_output=True, text=True)
        out[model] = path
    return out


def solo_of(args: argparse.Namespace, model: str) -> bool:
    """--solo: is `model` measured alone in this run."""
    return args.solo == "both" or (args.solo != "none" and model == f"gpt2-{args.solo}-shape")


def run(args: argparse.Namespace) -> int:
    from fleetcast.bench.schema import load_results

    started = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "raw"
    raw.mkdir(exist_ok=True)
    control = ensure_mps_on_path() if args.gpu_sharing == "mps" else None
    if args.gpu_sharing == "mps" and control is None:
        print("error: --gpu-sharing mps needs nvidia-cuda-mps-control (on PATH or in /usr/local/nvidia/bin)",
              file=sys.stderr)
        return 2
    artifacts = build_artifacts(args)
    gpu = gpu_name(args.device)
    data = Dataset(args, out, raw)
    data.meta = {"what": "two reference-backend models on one GPU (bench/h200_sharing.py)", "device": args.device,
                 "gpu": gpu, "argv": sys.argv[1:], "mps_control": control, "levels": args.levels,
                 "repeats": args.repeats, "duration_s": args.duration, "warmup": args.warmup,
                 "models": {m: {"size": s.size, "planned_kv_bytes": s.kv_bytes} for m, s in shapes(args.device).items()}}
    work = Path(tempfile.mkdtemp(prefix="h200-sharing-"))
    pair, attempts = None, []
    for slack_mib in [0, *(args.mps_retry_slack_mib if args.gpu_sharing == "mps" else [])]:
        if attempts:
            wait_mps_servers_gone()
        pair = Pair(args, artifacts, work / f"try{len(attempts)}", slack_bytes=slack_mib << 20)
        try:
            data.meta["start"] = pair.start()
            data.meta["mps_limit_slack_mib"] = slack_mib
            attempts.append({"slack_mib": slack_mib, "ok": True})
            break
        except Exception as exc:  # noqa: BLE001 - recorded; under MPS retried once with a larger limit
            attempts.append({"slack_mib": slack_mib, "ok": False, "error": str(exc)[-1500:], "stop": pair.stop()})
            pair = None
    data.meta["start_attempts"] = attempts
    if pair is None:
        data.write()
        keep_mps_logs(work, out / "mps-logs")
        print(f"error: the pair did not start: {attempts[-1]['error']}", file=sys.stderr)
        return 1
    print(json.dumps({"mode": args.gpu_sharing, "order": args.order,
                      "kv_vs_plan": {p["model"]: p["kv_vs_plan"] for p in data.meta["start"]["processes"]},
                      "mps_limit_gib": {m: (v or 0) / GIB for m, v in pair.limits.items()}}), flush=True)
    point_s: list[float] = []
    stopped = None
    try:
        for repeat in range(1, args.repeats + 1):
            for level in args.levels:
                kinds = [("alone", [m]) for m in ORDERS[args.order] if solo_of(args, m) and repeat <= args.solo_repeats]
                kinds.append(("together", list(ORDERS[args.order])))
                for kind, models in kinds:
                    guess = statistics.median(point_s) if point_s else args.duration + 15
                    if args.deadline_s and time.monotonic() - started + guess + 45 > args.deadline_s:
                        stopped = f"--deadline-s {args.deadline_s:g}: stopped before repeat {repeat}, level {level}"
                        raise TimeoutError(stopped)
                    t0 = time.monotonic()
                    tag = f"{kind}-{'+'.join(m.split('-')[1] for m in models)}-c{level}-r{repeat}"
                    files = {m: raw / f"{tag}-{m}.json" for m in models}
                    run_bench([bench_cmd(args, pair, m, level, files[m], artifacts, gpu) for m in models],
                              timeout_s=args.duration * 4 + 300)
                    data.add({"kind": kind, "level": level, "repeat": repeat, "files": {m: str(p) for m, p in files.items()}})
                    point_s.append(time.monotonic() - t0)
                    row = {m: (round(r.summary.itl_ms.p99 or 0, 2), round(r.summary.output_throughput_tps))
                           for m, f in files.items() for r in load_results(f).runs}
                    print(f"{tag}: itl_p99_ms/tok_s {row} ({point_s[-1]:.1f} s)", flush=True)
    except TimeoutError:
        print(stopped, flush=True)
    finally:
        data.meta["stop"] = pair.stop()
        data.meta["stopped_early"] = stopped
        data.meta["elapsed_s"] = round(time.monotonic() - started, 1)
        data.write()
        keep_mps_logs(work, out / "mps-logs")
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {out / 'sharing.json'} ({len(data.points)} points, {data.meta['elapsed_s']} s)", flush=True)
    return 0


# ---------------------------------------------------------------- goals over several runs


def goals(runs: list[dict], levels: tuple[int, ...] = GOAL_LEVELS) -> dict:
    """Issue 33's goals, from the runs' sharing.json: per level in GOAL_LEVELS,
    - ITL: each model's worst ITL P99 under MPS together (over every repeat and start order) against the median of its
      solo ITL P99 under MPS (the other client loaded, idle; time-sliced solo where no MPS solo was measured);
    - throughput: the median combined throughput under MPS over the median time-sliced, with the range of that ratio
      (lowest MPS over highest time-sliced, highest over lowest) beside it."""
    def rows(mode: str, kind: str, level: int, model: str) -> list[dict]:
        return [r for run in runs if run["gpu_sharing"] == mode for r in run["table"]
                if r["kind"] == kind and r["level"] == level and r["model"] == model]

    def values(mode, kind, level, model, key):
        return [rep[key] for r in rows(mode, kind, level, model) for rep in r["repeats"] if rep.get(key) is not None]

    models = sorted({r["model"] for run in runs for r in run["table"] if r["model"] != "combined"})
    checks = []
    for level in levels:
        for model in models:
            together = values("mps", "together", level, model, "itl_p99_ms")
            solo = values("mps", "alone", level, model, "itl_p99_ms") or values("time_slicing", "alone", level, model,
                                                                                  "itl_p99_ms")
            if together and solo:
                ratio = max(together) / statistics.median(solo)
                checks.append({"goal": "itl_p99_vs_solo", "level": level, "model": model, "limit": ITL_GOAL,
                               "mps_together_worst_ms": round(max(together), 3),
                               "solo_median_ms": round(statistics.median(solo), 3), "ratio": round(ratio, 3),
                               "pass": ratio <= ITL_GOAL, "repeats": len(together)})
            else:
                checks.append({"goal": "itl_p99_vs_solo", "level": level, "model": model, "pass": None,
                               "missing": "no MPS together run" if not together else "no solo run"})
        mps = values("mps", "together", level, "combined", "output_tps")
        ts = values("time_slicing", "together", level, "combined", "output_tps")
        if mps and ts:
            ratio = statistics.median(mps) / statistics.median(ts)
            checks.append({"goal": "combined_tps_vs_time_slicing", "level": level, "limit": THROUGHPUT_GOAL,
                           "mps_median_tps": round(statistics.median(mps), 1),
                           "time_slicing_median_tps": round(statistics.median(ts), 1), "ratio": round(ratio, 3),
                           "ratio_range": [round(min(mps) / max(ts), 3), round(max(mps) / min(ts), 3)],
                           "pass": ratio >= THROUGHPUT_GOAL, "repeats": [len(mps), len(ts)]})
        else:
            checks.append({"goal": "combined_tps_vs_time_slicing", "level": level, "pass": None,
                           "missing": "no MPS together run" if not mps else "no time-sliced together run"})
    return {"checks": checks, "all_pass": all(c["pass"] for c in checks),
            "runs": [{"gpu_sharing": r["gpu_sharing"], "order": r["order"], "points": r["points_done"],
                      "stopped_early": r.get("stopped_early")} for r in runs]}


# What the planner's MPS estimator is calibrated on (fleetcast/config/data/gpu_sharing.yaml; docs/plan.md, "GPU
# sharing in the plan"): per level and model, the median of every repeat over both start orders of
# - alone: the model alone with no MPS daemon (the time-sliced runs' solo, the other loaded and idle): what an ordinary
#   solo curve measures, which the estimator stretches;
# - time_slicing / mps: both busy at that level, time-sliced / under MPS;
# - mps_alone: the model alone as an MPS client (the other client loaded and idle): recorded, not calibrated on.
CALIBRATION_WAYS = {"alone": ("time_slicing", "alone"), "time_slicing": ("time_slicing", "together"),
                    "mps": ("mps", "together"), "mps_alone": ("mps", "alone")}
CALIBRATION_METRICS = ("output_tps", "itl_p99_ms", "ttft_p99_ms")


def calibration(runs: list[dict], levels: tuple[int, ...] = GOAL_LEVELS) -> list[dict]:
    """The calibration pairs (CALIBRATION_WAYS): per level, per model, per way, each metric's median over the
    repeats, the repeats counted and each metric's lowest and highest repeat."""
    pairs = []
    models = sorted({r["model"] for run in runs for r in run["table"] if r["model"] != "combined"}, reverse=True)
    for level in levels:
        figures: dict[str, dict] = {}
        for model in models:
            for way, (mode, kind) in CALIBRATION_WAYS.items():
                reps = [rep for run in runs if run["gpu_sharing"] == mode for r in run["table"]
                        if r["kind"] == kind and r["level"] == level and r["model"] == model for rep in r["repeats"]]
                if not reps:
                    raise ValueError(f"--calibration: no {mode} {kind} run of {model} at {level} streams")
                vals = {m: [rep[m] for rep in reps] for m in CALIBRATION_METRICS}
                figures.setdefault(model, {})[way] = {
                    **{m: round(statistics.median(v), 1) for m, v in vals.items()}, "repeats": len(reps),
                    "spread": {m: [round(min(v), 1), round(max(v), 1)] for m, v in vals.items()}}
        pairs.append({"concurrency": level, "models": figures})
    return pairs


CALIBRATION_HEADER = """\
# Two processes sharing one GPU, alone and both busy, by time slicing and under MPS: what the planner's MPS
# estimator (fleetcast/plan/estimate.py, mps_calibration) is calibrated on and checked against, and the
# time-slicing rule is checked against too (docs/plan.md, "GPU sharing in the plan").
# Written by bench/h200_sharing.py --calibration (the command below) from the H200 sharing dataset,
# bench/data/h200-sharing/*/sharing.json (bench/H200_RUNS.md): the reference backend (PyTorch, random fp16
# weights) with the GPT-2 XL and GPT-2 medium shapes, 128 tokens in and out, 5 s per point, both start orders.
# Per model and way: each metric's median over every repeat of both start orders (repeats: how many), and
# spread: its lowest and highest repeat. alone: no MPS daemon (the time-sliced runs' solo, the other process
# loaded and idle), what the estimator stretches; time_slicing / mps: both busy at the same streams each;
# mps_alone: the model alone as an MPS client (recorded, not calibrated on: MPS's own cost to a lone client).
"""


def calibration_yaml(runs: list[dict], command: str, levels: tuple[int, ...] = GOAL_LEVELS) -> str:
    def flow(d: dict) -> str:
        return "{" + ", ".join(f"{k}: {flow(v) if isinstance(v, dict) else json.dumps(v)}" for k, v in d.items()) + "}"

    pairs = calibration(runs, levels)
    lines = [CALIBRATION_HEADER.rstrip("\n"),
             'provenance: "H200 sharing dataset (bench/data/h200-sharing), both start orders"',
             f"command: {json.dumps(command)}", "gpu: H200", "backend: reference", "input_tokens: 128",
             "output_tokens: 128", "pairs:"]
    for pair in pairs:
        lines += [f"  - concurrency: {pair['concurrency']}", "    models:"]
        for model, ways in pair["models"].items():
            lines.append(f"      {model}:")
            lines += [f"        {way}: {flow(fig)}" for way, fig in ways.items()]
    return "\n".join(lines) + "\n"


def goal_line(c: dict) -> str:
    verdict = {True: "PASS", False: "FAIL", None: "MISSING"}[c["pass"]]
    if c["pass"] is None:
        return f"{verdict} {c['goal']} at {c['level']} streams{' ' + c['model'] if 'model' in c else ''}: {c['missing']}"
    if c["goal"] == "itl_p99_vs_solo":
        miss = "" if c["pass"] else f", over by {c['ratio'] / c['limit'] - 1:.1%}"
        return (f"{verdict} ITL P99 {c['model']} at {c['level']} streams: MPS together {c['mps_together_worst_ms']:.1f} ms "
                f"(worst of {c['repeats']}) = {c['ratio']:.2f}x solo {c['solo_median_ms']:.1f} ms (goal <= {c['limit']}x{miss})")
    miss = "" if c["pass"] else f", short by {1 - c['ratio'] / c['limit']:.1%}"
    return (f"{verdict} combined throughput at {c['level']} streams: MPS {c['mps_median_tps']:.0f} tok/s = "
            f"{c['ratio']:.2f}x time-sliced {c['time_slicing_median_tps']:.0f} tok/s (range {c['ratio_range'][0]:.2f}-"
            f"{c['ratio_range'][1]:.2f}; goal >= {c['limit']}x{miss})")


def summarize(args: argparse.Namespace) -> int:
    runs = []
    for directory in args.summarize:
        path = Path(directory) / "sharing.json"
        if not path.is_file():
            print(f"error: {path} does not exist (a bench/h200_sharing.py run's --out)", file=sys.stderr)
            return 2
        runs.append(json.loads(path.read_text()))
    levels = tuple(int(x) for x in args.goal_levels.split(","))
    result = goals(runs, levels)
    table = None
    if args.calibration:
        command = ("python3 bench/h200_sharing.py --summarize " + " ".join(args.summarize) +
                   f" --out {args.out} --calibration {args.calibration}")
        try:
            table = calibration_yaml(runs, command, levels)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "goals.json", result)
    if table is not None:
        tmp = Path(args.calibration).with_name(f".{Path(args.calibration).name}.tmp")
        tmp.write_text(table)
        tmp.replace(args.calibration)
        print(f"wrote {args.calibration}")
    for check in result["checks"]:
        print(goal_line(check))
    print("ALL GOALS PASS" if result["all_pass"] else "GOALS NOT ALL MET (see above)")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for the results files and sharing.json (or goals.json)")
    ap.add_argument("--gpu-sharing", choices=MODES, help="how the two processes share the GPU")
    ap.add_argument("--order", choices=tuple(ORDERS), default="xl-first", help="which process starts first")
    ap.add_argument("--repeats", type=int, default=3, help="times each point is measured")
    ap.add_argument("--levels", default="1,16,64", help="closed-loop concurrency per model")
    ap.add_argument("--duration", type=float, default=None, help="seconds per bench run (default 8 cuda, 1 cpu)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up requests per bench run")
    ap.add_argument("--solo", choices=("both", "xl", "medium", "none"), default="both",
                    help="which models are also measured alone (the other loaded, idle); a start order does not change "
                         "a solo figure, so two runs of one mode can split them")
    ap.add_argument("--solo-repeats", type=int, default=None, help="times each solo point is measured (default --repeats)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the dry run (tiny shapes)")
    ap.add_argument("--artifacts", default=None, help="where the built artifacts are cached (default /tmp)")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="start no point that would end past this many seconds after the start (what finished is kept)")
    ap.add_argument("--mps-retry-slack-mib", type=lambda v: [int(x) for x in v.split(",") if x], default=[1024, 2048],
                    help="under MPS, when the pair fails to start at its planned limits, retry with this much more "
                         "per client, each in turn (comma-separated MiB; recorded in start_attempts)")
    ap.add_argument("--summarize", nargs="+", metavar="RUN_DIR", help="check the goals over these runs' sharing.json")
    ap.add_argument("--calibration", metavar="YAML",
                    help="with --summarize: also write the MPS estimator's calibration pairs (medians and spread at "
                         "the goal levels) to this file (fleetcast/config/data/gpu_sharing.yaml)")
    ap.add_argument("--goal-levels", default=",".join(map(str, GOAL_LEVELS)),
                    help="with --summarize: the levels the goals are checked at")
    args = ap.parse_args(argv)
    if args.summarize:
        return args
    if args.gpu_sharing is None:
        ap.error("--gpu-sharing is required (or --summarize)")
    try:
        args.levels = [int(x) for x in args.levels.split(",")]
    except ValueError:
        ap.error(f"--levels {args.levels!r}: comma-separated whole numbers")
    args.solo_repeats = args.repeats if args.solo_repeats is None else args.solo_repeats
    if args.repeats < 1 or not args.levels or min(args.levels) < 1:
        ap.error("--repeats and every --levels value must be at least 1")
    if args.duration is None:
        args.duration = 8.0 if args.device == "cuda" else 1.0
    args.artifacts = args.artifacts or tempfile.gettempdir()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return summarize(args) if args.summarize else run(args)


if __name__ == "__main__":
    sys.exit(main())
