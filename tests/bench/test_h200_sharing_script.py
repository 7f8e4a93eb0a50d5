"""bench/h200_sharing.py, bench/h200_mps_fault.py and plot_colocate.py --sharing in their CPU dry run: the whole
path of the H200 runs (issue 33), so the device calls of bench/H200_RUNS.md work the first time.

The MPS control daemon is the tests' stand-in (tests/runtime/fake_mps_control.py, on PATH as
nvidia-cuda-mps-control); the reference servers on cpu imitate an MPS server's clients (runtime/reference/mps_sim.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.optional import needs_torch

pytestmark = [needs_torch, pytest.mark.usefixtures("forked_engines")]


ROOT = Path(__file__).resolve().parents[2]
SHARING = ROOT / "bench" / "h200_sharing.py"
FAULT = ROOT / "bench" / "h200_mps_fault.py"
PAIR = ("gpt2-xl-shape", "gpt2-medium-shape")


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def mps_env(tmp: Path) -> dict[str, str]:
    """PATH with the stand-in control daemon first; its calls recorded in tmp/mps-calls.jsonl."""
    bin_dir = tmp / "mps-bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT / 'tests' / 'runtime' / 'fake_mps_control.py'} \"$@\"\n")
    exe.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "FAKE_MPS_CALLS": str(tmp / "mps-calls.jsonl"), "PYTHONUNBUFFERED": "1"}


def script(path: Path, *argv: str, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(path), *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    """The --artifacts cache every run here shares, as the runbook's runs share /tmp's: each model is built once
    (a build is a process that imports PyTorch), and the runs after the first find it there."""
    return tmp_path_factory.mktemp("artifacts")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, artifacts):
    """One short run per mode on cpu: time slicing with both solo points; MPS started in the other order, two repeats
    of the pair and one of medium alone (the runbook splits the solo points between a mode's two runs); then the
    goals over both."""
    tmp = tmp_path_factory.mktemp("sharing")
    env = mps_env(tmp)
    common = ("--device", "cpu", "--levels", "2", "--duration", "0.5", "--artifacts", str(artifacts))
    ts = script(SHARING, "--gpu-sharing", "time_slicing", "--order", "xl-first", "--repeats", "1",
                "--out", str(tmp / "ts"), *common, env=env)
    assert ts.returncode == 0, ts.stderr[-3000:]
    mps = script(SHARING, "--gpu-sharing", "mps", "--order", "medium-first", "--repeats", "2", "--solo", "medium",
                 "--solo-repeats", "1",
                 "--out", str(tmp / "mps"), *common, env=env)
    assert mps.returncode == 0, mps.stderr[-3000:]
    goals = script(SHARING, "--summarize", str(tmp / "ts"), str(tmp / "mps"), "--goal-levels", "2",
                   "--out", str(tmp), env=env)
    assert goals.returncode == 0, goals.stderr[-3000:]
    return tmp, goals.stdout


def test_each_mode_writes_results_the_planner_reads_with_the_mode_and_every_repeat(runs, tmp_path):
    from fleetcast.bench.schema import dump_results, load_results
    from fleetcast.plan.packing import load_model_curves

    tmp, _ = runs
    files = sorted(tmp.glob("*/h200-sharing-*.json"))
    names = {f.name for f in files}
    expected = {f"h200-sharing-{mode}-{order}-{m}-{kind}.json" for mode, order in
                (("time_slicing", "xl-first"), ("mps", "medium-first")) for m in PAIR for kind in ("alone", "together")}
    assert names == expected - {"h200-sharing-mps-medium-first-gpt2-xl-shape-alone.json"}  # --solo medium
    for f in files:
        res = load_results(f)
        mode = "mps" if "-mps-" in f.name else "time_slicing"
        assert res.packing.gpu_sharing == mode and res.revision == 7
        assert {s.model: s.kv_cache_gb for s in res.packing.serves}.keys() == set(PAIR)
        twice = mode == "mps" and f.name.endswith("together.json")
        assert [r.repeat for r in res.runs] == ([1, 2] if twice else [None])
        (peer,) = [m for m in PAIR if m != res.labels.model]
        for run in res.runs:
            assert run.load.concurrency == 2
            assert (run.peers[peer] > 0) == f.name.endswith("together.json")  # the busy peer's measured concurrency
    # On 2 shared CPUs the dry run's client is often marked saturated, and the planner skips such runs; whether it is
    # is this machine's load, not the files' format, so the planner reads copies that say it was not.
    copies = []
    for f in files:
        res = load_results(f)
        res = res.model_copy(update={"runs": [r.model_copy(update={"summary": r.summary.model_copy(
            update={"saturated": False})}) for r in res.runs]})
        dump_results(res, tmp_path / f.name)
        copies.append(str(tmp_path / f.name))
    curves = load_model_curves(copies, PAIR, lab={"cpu-dry-run": "lab.h200"})
    colocated = {(c.model, c.sharing) for c in curves if c.colocated}
    assert colocated == {(m, mode) for m in PAIR for mode in ("time_slicing", "mps")}


def test_under_mps_the_daemon_starts_first_stops_last_and_each_process_is_a_client_at_its_planned_share(runs, artifacts):
    from fleetcast.config.memory import binding_fraction, process_overhead
    from runtime.kv_budget import artifact_bytes, mps_memory_limit
    from runtime.mps import pinned_mem_limit
    from runtime.reference.configs import shape_for

    tmp, _ = runs
    calls = [json.loads(line)["argv"] for line in (tmp / "mps-calls.jsonl").read_text().splitlines()]
    assert calls == [["-d"], []]  # one daemon for the MPS run (none for time slicing), quit after the last process
    data = json.loads((tmp / "mps" / "sharing.json").read_text())
    assert data["gpu_sharing"] == "mps" and data["order"] == "medium-first" and data["stop"]["mps_daemon_alive_after"] is False
    assert [p["model"] for p in data["start"]["processes"]] == ["gpt2-medium-shape", "gpt2-xl-shape"]
    for proc in data["start"]["processes"]:
        size = data["models"][proc["model"]]["size"]
        weights = artifact_bytes(artifacts / f"artifact-{size}-bf16")
        # As the instance sets it: the validator's overhead of a process of that size (runtime/bootstrap.py).
        overhead = process_overhead("tensorrt", shape_for(size).param_count(), 64, 8192).total_bytes
        limit = mps_memory_limit(weights, proc["planned_kv_bytes"], binding_fraction(), overhead=overhead)
        assert proc["mps_mem_limit_bytes"] == limit
        assert proc["mps_client"] == {"CUDA_MPS_PIPE_DIRECTORY": data["start"]["mps_daemon"]["pipe_dir"],
                                      "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": pinned_mem_limit(limit),
                                      "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": None, "CUDA_VISIBLE_DEVICES": None}
        assert proc["kv_vs_plan"] == 1.0 and proc["kv_budget_source"] == "--kv-cache-bytes"
    ts = json.loads((tmp / "ts" / "sharing.json").read_text())
    assert ts["start"]["mps_daemon"] is None and all(p["mps_client"] is None for p in ts["start"]["processes"])


def test_the_table_keeps_each_repeat_its_spread_and_the_pairs_combined_throughput(runs):
    tmp, _ = runs
    table = json.loads((tmp / "mps" / "sharing.json").read_text())["table"]
    combined = next(r for r in table if r["kind"] == "together" and r["model"] == "combined")
    per_model = [r for r in table if r["kind"] == "together" and r["model"] != "combined"]
    for i, rep in enumerate(combined["repeats"]):
        assert rep["output_tps"] == pytest.approx(sum(r["repeats"][i]["output_tps"] for r in per_model), abs=0.1)
    for row in per_model:
        itl = [r["itl_p99_ms"] for r in row["repeats"]]
        assert len(itl) == 2 and row["itl_p99_ms"]["min"] == round(min(itl), 3)
        assert row["itl_p99_ms"]["max"] == round(max(itl), 3)


def test_the_summary_prints_one_verdict_per_goal(runs):
    tmp, stdout = runs
    result = json.loads((tmp / "goals.json").read_text())
    assert len(result["checks"]) == 3  # each model's ITL, and the combined throughput, at the one level
    # XL was not measured alone under MPS: its ITL is held against its time-sliced solo figure.
    solo = {c["model"]: c["solo_median_ms"] for c in result["checks"] if c["goal"] == "itl_p99_vs_solo"}
    ts = json.loads((tmp / "ts" / "sharing.json").read_text())["table"]
    assert solo["gpt2-xl-shape"] == next(r["itl_p99_ms"]["median"] for r in ts
                                         if r["kind"] == "alone" and r["model"] == "gpt2-xl-shape")
    lines = [line for line in stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert len(lines) == 3 and all(c["pass"] in (True, False) for c in result["checks"])


def test_goals_arithmetic_worst_mps_itl_against_median_solo_and_median_throughput_ratio():
    goals = load(SHARING).goals

    def run(mode, rows):
        return {"gpu_sharing": mode, "order": "xl-first", "points_done": 1, "table": rows}

    def row(kind, model, **reps):
        key, values = next(iter(reps.items()))
        return {"kind": kind, "level": 16, "model": model, "repeats": [{key: v} for v in values]}

    runs = [run("mps", [row("alone", "a", itl_p99_ms=[10.0, 20.0, 11.0]), row("together", "a", itl_p99_ms=[12.0, 14.3]),
                        row("together", "combined", output_tps=[180.0, 200.0, 190.0])]),
            run("time_slicing", [row("together", "combined", output_tps=[100.0, 110.0, 90.0])])]
    checks = goals(runs, (16,))["checks"]
    itl = next(c for c in checks if c["goal"] == "itl_p99_vs_solo")
    assert itl["ratio"] == 1.3 and itl["pass"]  # 14.3 (the worst) over 11.0 (the median solo): exactly the limit
    tps = next(c for c in checks if c["goal"] == "combined_tps_vs_time_slicing")
    assert tps["ratio"] == 1.9 and tps["pass"] and tps["ratio_range"] == [round(180 / 110, 3), round(200 / 90, 3)]
    runs[0]["table"][1]["repeats"][1]["itl_p99_ms"] = 14.4
    runs[1]["table"][0]["repeats"] = [{"output_tps": 106.0}]
    checks = goals(runs, (16,))["checks"]
    assert [c["pass"] for c in checks] == [False, False]  # 1.31x solo; 190 / 106 = 1.79x
    assert "over by" in load(SHARING).goal_line(checks[0]) and "short by" in load(SHARING).goal_line(checks[1])


def test_the_plot_shows_both_modes(runs, tmp_path):
    pytest.importorskip("matplotlib")
    tmp, _ = runs
    png = tmp_path / "sharing.png"
    load(ROOT / "bench" / "plot_colocate.py").main(["--sharing", str(tmp / "ts"), str(tmp / "mps"), "--png", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_client_faults_and_every_model_serves_again_under_the_supervisor(tmp_path, artifacts):
    env = mps_env(tmp_path)
    # The wedged servers are found by 2 liveness probes that wait out their timeout: with 2 s, not the runtime's 5,
    # about 5 s from the fault to the kill, not 11. A server that is not wedged answers /health in milliseconds
    # here; killing it takes 2 such probes in a row both past 2 s.
    done = script(FAULT, "--device", "cpu", "--repeats", "1", "--liveness-interval-s", "0.5", "--liveness-failures",
                  "2", "--liveness-timeout-s", "2", "--probe-timeout-s", "20", "--artifacts", str(artifacts), "--out", str(tmp_path / "fault"),
                  env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "fault" / "mps-fault.json").read_text())
    (fault,) = result["faults"]
    assert fault["fault_client"]["method"] == "mps_sim" and fault["fault_client_exit"] == 1
    assert fault["serving_before_fault"] == {m: True for m in PAIR}
    # Both clients of the daemon were reached (alive, not answering), and the supervisor replaced both together.
    assert fault["recovered"] and fault["replaced"] == {m: True for m in PAIR} and fault["group_restarts"] == 1
    for model in PAIR:
        seen = fault["models"][model]
        assert 0 <= seen["down_at_s"] < seen["serving_again_s"] <= fault["downtime_s"]
    assert result["summary"]["without_operator"] and result["summary"]["downtime_s"]["n"] == 1
    assert "PASS every model served again without an operator" in done.stdout
    calls = [json.loads(line)["argv"] for line in (tmp_path / "mps-calls.jsonl").read_text().splitlines()]
    assert calls[0] == ["-d"] and calls[-1] == []


def test_a_run_past_its_deadline_starts_no_point_and_still_writes_what_it_has(tmp_path, artifacts):
    """The device calls bound each run with --deadline-s, so a slow machine returns its finished points instead of
    being killed at the call's limit with nothing written."""
    done = script(SHARING, "--device", "cpu", "--gpu-sharing", "time_slicing", "--levels", "2", "--duration", "0.5",
                  "--deadline-s", "1", "--artifacts", str(artifacts), "--out", str(tmp_path / "ts"))
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((tmp_path / "ts" / "sharing.json").read_text())
    assert data["stopped_early"].startswith("--deadline-s 1: stopped before repeat 1, level 2")
    assert data["points_done"] == 0 and data["table"] == [] and data["stop"]["drain_s"] >= 0
