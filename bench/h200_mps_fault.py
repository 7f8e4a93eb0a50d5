"""How long every model is down after one MPS client faults, and that it comes back without an operator (issue 33).

Run (on the device machine, from the repo root; bench/H200_RUNS.md gives the exact device call):

    python3 bench/h200_mps_fault.py --repeats 3 --out $OUT/fault

What it does:
 1. serves the GPT-2 XL- and medium-shaped pair under MPS exactly as bench/h200_sharing.py does (runtime.serve.Serving:
    the GPU's control daemon through runtime/mps.py, each process a client at its planned memory limit), with the
    runtime's own restart policy and liveness probe (fleetcast.contract.instance_env defaults, or the flags below);
 2. keeps both busy (`fleetcast bench run` at --level streams each, for the whole repeat);
 3. starts a third MPS client of the same daemon that does nothing but fault on purpose: on cuda it writes to an
    illegal device address from a kernel (CuPy's NVRTC, else Triton; the error it got is recorded), on cpu it is
    the reference backend's imitation (runtime/reference/mps_sim.py: the fault reaches every client of the daemon,
    which stop answering while alive);
 4. from the moment it tells that client to fault, polls each model with a short completion until every model has
    been seen down and then serving again, and records per model how long that took, which processes the
    supervisor replaced, its group restarts and whether the daemon was replaced;
 5. repeats (--repeats), waiting for both models to serve in between, and writes mps-fault.json.
Nothing here restarts anything: recovery is the supervisor's (runtime/supervisor.py, group restarts).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/h200_sharing.py, run as a script or loaded by a test

import h200_sharing as sharing

ROOT = sharing.ROOT
READY = "FAULT-CLIENT-READY"
FAULT_CLIENT_LIMIT_BYTES = 2 * sharing.GIB  # the third client's own device-memory limit: a context and a few buffers
# Writes one int to the device address it is given: the pointer the fault uses is far outside any allocation.
CUDA_SOURCE = r'extern "C" __global__ void poke(unsigned long long address) { *((volatile int *)address) = 1; }'
ILLEGAL_ADDRESS = 0xDEAD00000000


def fault_client(device: str) -> int:
    """The third client: connect as an MPS client, say READY, wait for a line on stdin, fault, exit 1."""
    if device == "cpu":
        from runtime.reference.mps_sim import MpsClientSim

        sim = MpsClientSim.from_env(os.environ)
        if sim is None:
            print("error: no live MPS control daemon at CUDA_MPS_PIPE_DIRECTORY", flush=True)
            return 2
        sim.connect()
        print(READY, flush=True)
        sys.stdin.readline()
        sim.fault()
        print(json.dumps({"method": "mps_sim", "error": "fault imitated (runtime/reference/mps_sim.py)"}), flush=True)
        os._exit(1)
    launch = prepare_kernel()
    print(READY, flush=True)
    sys.stdin.readline()
    error = None
    try:
        launch(ILLEGAL_ADDRESS)
    except Exception as exc:  # noqa: BLE001 - the CUDA error is what is reported
        error = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"method": launch.__name__, "error": error}), flush=True)
    os._exit(1)


def prepare_kernel():
    """A launcher of the poke kernel, compiled and run once at a legal address first (so the fault itself is one
    launch); CuPy (NVRTC) where it imports, else Triton. Each synchronizes, so the error surfaces in the call."""
    import torch

    buffer = torch.zeros(1024, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    try:
        import cupy

        kernel = cupy.RawKernel(CUDA_SOURCE, "poke")

        def cupy_kernel(address: int) -> None:
            kernel((1,), (1,), (cupy.uint64(address),))
            cupy.cuda.runtime.deviceSynchronize()

        cupy_kernel(buffer.data_ptr())
        return cupy_kernel
    except Exception as exc:  # noqa: BLE001 - no CuPy, or its NVRTC cannot compile here: Triton instead
        print(f"CuPy kernel unavailable ({type(exc).__name__}: {exc}); using Triton", flush=True)
    import triton
    import triton.language as tl

    @triton.jit
    def poke(ptr, offset):
        tl.store(ptr + offset, 1)

    def triton_kernel(address: int) -> None:
        poke[(1,)](buffer, (address - buffer.data_ptr()) // 4)
        torch.cuda.synchronize()

    triton_kernel(buffer.data_ptr())
    return triton_kernel


def completes(port: int, model: str, timeout_s: float) -> bool:
    from runtime.serve import http_json

    body = {"model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0}
    try:
        status, _ = http_json("POST", f"http://127.0.0.1:{port}/v1/completions", body, timeout_s=timeout_s)
    except (OSError, ValueError):
        return False
    return status == 200


UNAFFECTED_S = 30.0  # a model that answers every probe this long after the fault was not reached by it


def watch(pair: sharing.Pair, model: str, fault_at: float, deadline: float, probe_timeout_s: float, out: dict) -> None:
    """One model after the fault: when it was first seen down, when it served again after that (0 when it answered
    every probe for UNAFFECTED_S: the fault never reached it)."""
    port = pair.ports[model]
    while time.monotonic() < deadline:
        sent = time.monotonic()  # a probe into a wedged server fails only at its timeout: down from when it was sent
        ok = completes(port, model, probe_timeout_s)
        now = time.monotonic()
        if ok and "down_at_s" not in out and now - fault_at > UNAFFECTED_S:
            out.update(unaffected=True, serving_again_s=0.0)
            return
        if not ok and "down_at_s" not in out:
            out["down_at_s"] = round(sent - fault_at, 3)
        if ok and "down_at_s" in out:
            out["serving_again_s"] = round(now - fault_at, 3)
            return
        time.sleep(0.1)


def start_load(args: argparse.Namespace, pair: sharing.Pair, artifacts: dict, gpu: str, raw: Path, tag: str) -> list:
    procs = []
    for model in sharing.ORDERS[args.order]:
        ns = argparse.Namespace(**{**vars(args), "duration": args.load_s, "warmup": 0})
        cmd = sharing.bench_cmd(ns, pair, model, args.level, raw / f"{tag}-{model}.json", artifacts, gpu)
        cmd[cmd.index("--timeout") + 1] = "10"  # a request into a wedged server gives up, the loop sends the next
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
    return procs


def stop_load(procs: list) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def one_fault(args, pair: sharing.Pair, artifacts: dict, gpu: str, raw: Path, repeat: int) -> dict:
    serving = pair.serving
    daemon = serving.mps_daemons[0]
    group = serving.supervisor.groups[serving.gpu_group(0)]
    children = {m: serving.supervisor.children[p.name] for m, p in zip(pair.ports, [
        next(s for s in serving.servers if s.model_id == m) for m in pair.ports], strict=True)}
    before = {m: c.pid for m, c in children.items()}
    restarts_before, daemon_before = group.restarts, daemon.pid()
    load = start_load(args, pair, artifacts, gpu, raw, f"load-r{repeat}")
    env = {**os.environ, **daemon.client_env(FAULT_CLIENT_LIMIT_BYTES, None)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    client = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--fault-client", "--device", args.device,
                               "--out", str(raw)], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    record: dict = {"repeat": repeat, "pids_before": before, "daemon_pid_before": daemon_before}
    try:
        assert client.stdout is not None and client.stdin is not None
        lines = []
        for line in client.stdout:
            lines.append(line.rstrip())
            if line.strip() == READY:
                break
        else:
            raise RuntimeError(f"the fault client exited before it was ready: {' | '.join(lines)[-1500:]}")
        time.sleep(args.busy_s)  # both models busy, the third client connected
        busy = {m: completes(pair.ports[m], m, args.probe_timeout_s) for m in pair.ports}
        fault_at = time.monotonic()
        client.stdin.write("go\n")
        client.stdin.flush()
        deadline = fault_at + args.recover_timeout_s
        seen: dict[str, dict] = {m: {} for m in pair.ports}
        threads = [threading.Thread(target=watch, args=(pair, m, fault_at, deadline, args.probe_timeout_s, seen[m]))
                   for m in pair.ports]
        for t in threads:
            t.start()
        rest, _ = client.communicate(timeout=120)
        for t in threads:
            t.join()
        report = next((json.loads(x) for x in rest.splitlines() if x.startswith("{")), None)
        # The supervisor counts a group restart once its members answer its own readiness check, which can come a
        # poll after the probes here saw them serve: wait (bounded) for that record before reading it.
        settle = time.monotonic() + 30.0
        while (any(c.pid != before[m] for m, c in children.items()) and group.restarts == restarts_before
               and time.monotonic() < settle):
            time.sleep(0.1)
        record.update({
            "serving_before_fault": busy, "fault_client": report, "fault_client_exit": client.returncode,
            "models": seen,
            "downtime_s": max((v.get("serving_again_s") for v in seen.values()), default=None)
            if all("serving_again_s" in v for v in seen.values()) else None,
            "recovered": all("serving_again_s" in v for v in seen.values()),
            "pids_after": {m: c.pid for m, c in children.items()},
            "replaced": {m: children[m].pid != before[m] for m in children},
            "exit_codes": {m: children[m].exit_codes[-3:] for m in children},
            "group_restarts": group.restarts - restarts_before,
            "group_restart_s": group.last_restart_s, "daemon_pid_after": daemon.pid(),
            "daemon_replaced": daemon.pid() != daemon_before, "gave_up": serving.supervisor.gave_up.is_set()})
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(10)
        stop_load(load)
    return record


def run(args: argparse.Namespace) -> int:
    from fleetcast.contract.instance_env import Var, default
    from runtime.supervisor import RestartPolicy

    started = time.monotonic()
    out = Path(args.out)
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    control = sharing.ensure_mps_on_path()
    if control is None:
        print("error: needs nvidia-cuda-mps-control (on PATH or in /usr/local/nvidia/bin)", file=sys.stderr)
        return 2
    args.gpu_sharing = "mps"
    artifacts = sharing.build_artifacts(args)
    gpu = sharing.gpu_name(args.device)
    liveness = {"liveness_interval_s": args.liveness_interval_s, "liveness_timeout_s": args.liveness_timeout_s,
                "liveness_failures": args.liveness_failures}
    policy = RestartPolicy(max_restarts=default(Var.MAX_RESTARTS), backoff_base_s=default(Var.RESTART_BACKOFF_S))
    result: dict = {"what": "one MPS client faults; every model's downtime under the supervisor (bench/h200_mps_fault.py)",
                    "device": args.device, "gpu": gpu, "argv": sys.argv[1:], "mps_control": control,
                    "level_per_model": args.level, "liveness": liveness,
                    "restart_policy": {"max_restarts": policy.max_restarts, "backoff_base_s": policy.backoff_base_s},
                    "faults": []}
    work = Path(tempfile.mkdtemp(prefix="h200-mps-fault-"))
    pair = sharing.Pair(args, artifacts, work, slack_bytes=args.mps_limit_slack_mib << 20, restart=policy, **liveness)
    result["mps_limit_slack_mib"] = args.mps_limit_slack_mib
    try:
        result["start"] = pair.start()
        for repeat in range(1, args.repeats + 1):
            if args.deadline_s and time.monotonic() - started + args.recover_timeout_s + 60 > args.deadline_s:
                result["stopped_early"] = f"--deadline-s {args.deadline_s:g}: stopped before repeat {repeat}"
                break
            record = one_fault(args, pair, artifacts, gpu, raw, repeat)
            result["faults"].append(record)
            sharing.write_json(out / "mps-fault.json", result)
            print(f"fault {repeat}: downtime {record['downtime_s']} s, replaced {record['replaced']}, "
                  f"group restarts {record['group_restarts']}, fault client {record['fault_client']}", flush=True)
            if not record["recovered"] or record["gave_up"]:
                break
            settle = time.monotonic() + args.recover_timeout_s
            while time.monotonic() < settle and not all(completes(p, m, args.probe_timeout_s)
                                                        for m, p in pair.ports.items()):
                time.sleep(0.5)
    finally:
        result["stop"] = pair.stop()
        downs = [f["downtime_s"] for f in result["faults"] if f.get("downtime_s") is not None]
        result["summary"] = {"faults": len(result["faults"]), "recovered": sum(f["recovered"] for f in result["faults"]),
                             "downtime_s": sharing.spread(downs),
                             "without_operator": bool(result["faults"]) and all(f["recovered"] for f in result["faults"])}
        result["elapsed_s"] = round(time.monotonic() - started, 1)
        sharing.write_json(out / "mps-fault.json", result)
    s = result["summary"]
    print(f"{'PASS' if s['without_operator'] else 'FAIL'} every model served again without an operator after "
          f"{s['recovered']}/{s['faults']} faults; downtime {s['downtime_s']}", flush=True)
    return 0 if s["without_operator"] else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from fleetcast.contract.instance_env import Var, default

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for mps-fault.json")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the dry run (mps_sim)")
    ap.add_argument("--order", choices=tuple(sharing.ORDERS), default="xl-first")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--level", type=int, default=None, help="streams per model while the fault hits (16 cuda, 2 cpu)")
    ap.add_argument("--busy-s", type=float, default=None, help="seconds both are busy before the fault (5 cuda, 1 cpu)")
    ap.add_argument("--recover-timeout-s", type=float, default=180.0, help="give up on a repeat after this long")
    ap.add_argument("--probe-timeout-s", type=float, default=5.0, help="one completion probe's bound")
    ap.add_argument("--liveness-interval-s", type=float, default=default(Var.LIVENESS_INTERVAL_S))
    ap.add_argument("--liveness-timeout-s", type=float, default=default(Var.LIVENESS_TIMEOUT_S))
    ap.add_argument("--liveness-failures", type=int, default=default(Var.LIVENESS_FAILURES))
    ap.add_argument("--artifacts", default=None, help="where the built artifacts are cached (default /tmp)")
    ap.add_argument("--deadline-s", type=float, default=None, help="start no repeat that could end past this")
    ap.add_argument("--mps-limit-slack-mib", type=int, default=0,
                    help="each client's memory limit this much over its planned share (what bench/h200_sharing.py's "
                         "start_attempts found the pair needs)")
    ap.add_argument("--fault-client", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cuda = args.device == "cuda"
    args.level = args.level or (16 if cuda else 2)
    args.busy_s = args.busy_s if args.busy_s is not None else (5.0 if cuda else 1.0)
    args.load_s = args.recover_timeout_s + 600.0  # the load outlives every repeat; it is killed after each
    args.artifacts = args.artifacts or tempfile.gettempdir()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return fault_client(args.device) if args.fault_client else run(args)


if __name__ == "__main__":
    sys.exit(main())
