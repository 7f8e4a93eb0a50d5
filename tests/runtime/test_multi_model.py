"""Several models on one instance: one engine process per (model, copy), each supervised on its own.

Real reference-backend servers (tiny shape, CPU) on loopback, under runtime.serve.Serving as the
bootstrap runs them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import pytest

from runtime.devtools.harness import free_port
from runtime.serve import ServeError, ServerProcess, ServeSettings, Serving, http_json, server_name
from runtime.supervisor import RestartPolicy
from tests.optional import needs_torch

pytestmark = [needs_torch, pytest.mark.xdist_group("multi-model"), pytest.mark.usefixtures("forked_engines")]

MAX_SEQ = 128
SLOT = 2 * 2 * 4 * MAX_SEQ * 16 * 4  # tiny: 2 layers, K and V, 4 heads x 16, float32 on CPU: bytes per sequence
BUDGETS = {"alpha": 5 * SLOT, "beta": 3 * SLOT + SLOT // 2}  # beta's half slot cannot hold a sequence


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    from runtime.reference.build import build_artifact

    out = tmp_path_factory.mktemp("tiny") / "artifact"
    build_artifact(out, size="tiny", seed=0)
    return out


def processes(artifact, order, ports, budgets=BUDGETS):
    return [ServerProcess(
        name=server_name(model, 0, single=False), model_id=model, copy_index=0, port=ports[model],
        argv=[sys.executable, "-m", "runtime.reference.server", "--artifact", str(artifact), "--host", "127.0.0.1",
              "--port", str(ports[model]), "--served-model-name", model, "--max-seq-len", str(MAX_SEQ),
              "--max-batch-size", "8", "--kv-cache-bytes", str(budgets[model]), "--threads", "1"],
        kv_cache_bytes=budgets[model]) for model in order]


def serving(tmp_path, servers, **kw):
    settings = ServeSettings(port=free_port(), model_name=servers[0].model_id, region="r", pool="p", gateway=False,
                             ready_timeout_s=120, restart=RestartPolicy(max_restarts=kw.pop("max_restarts", 3),
                                                                        backoff_base_s=0.1),
                             # Liveness is not under test here (test_supervisor_liveness.py): probes that give a
                             # server 10 s to answer, so a loaded machine never has a slow one killed as frozen.
                             liveness_interval_s=0.2, liveness_timeout_s=10, liveness_failures=3,
                             models_state_file=tmp_path / "models-ready.json", **kw)
    s = Serving(settings, servers=servers)
    s.supervisor.poll_s = 0.05
    return s


def complete(port, model):
    status, reply = http_json("POST", f"http://127.0.0.1:{port}/v1/completions",
                              {"model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0}, timeout_s=30)
    return status, reply


def test_kv_budgets_are_the_plan_whatever_the_start_order(artifact, tmp_path):
    ports = {"alpha": free_port(), "beta": free_port()}
    seen = {}
    for order in (["alpha", "beta"], ["beta", "alpha"]):
        s = serving(tmp_path, processes(artifact, order, ports))
        s.start()
        try:
            s.wait_ready()
            seen[tuple(order)] = {m: http_json("GET", f"http://127.0.0.1:{ports[m]}/memory")[1] for m in order}
        finally:
            s.drain()
    first, second = seen.values()
    for model in BUDGETS:
        assert first[model]["kv_cache_bytes"] == second[model]["kv_cache_bytes"]
        assert first[model]["kv_budget_bytes"] == BUDGETS[model]
    # Whole sequences of the budget are allocated, and no more sequences run at once than it holds.
    assert first["alpha"]["kv_cache_bytes"] == 5 * SLOT and first["alpha"]["kv_cache_slots"] == 5
    assert first["beta"]["kv_cache_bytes"] == 3 * SLOT and first["beta"]["kv_cache_slots"] == 3


def test_a_crashed_model_process_restarts_while_the_other_keeps_serving(artifact, tmp_path):
    ports = {"alpha": free_port(), "beta": free_port()}
    s = serving(tmp_path, processes(artifact, ["alpha", "beta"], ports))
    s.start()
    try:
        s.wait_ready()
        state = json.loads((tmp_path / "models-ready.json").read_text())["models"]
        assert {m: v["ready"] for m, v in state.items()} == {"alpha": True, "beta": True}

        results, stop = [], threading.Event()

        def beta_traffic():
            while not stop.is_set():
                results.append(complete(ports["beta"], "beta")[0])

        worker = threading.Thread(target=beta_traffic)
        worker.start()
        alpha = s.supervisor.children["server:alpha#0"]
        first_pid = alpha.pid
        os.killpg(first_pid, signal.SIGKILL)
        # alpha is reported down in the readiness file the gateway's /health reads, then comes back on its own.
        down_seen = back = False
        for _ in range(600):  # bounded: 60 s
            state = json.loads((tmp_path / "models-ready.json").read_text())["models"]
            assert state["beta"]["ready"]
            down_seen = down_seen or not state["alpha"]["ready"]
            if down_seen and alpha.pid != first_pid and state["alpha"]["ready"]:
                back = True
                break
            time.sleep(0.1)
        stop.set()
        worker.join(60)
        assert down_seen and back
        assert alpha.starts == 2 and alpha.exit_codes == [-signal.SIGKILL]
        assert s.supervisor.children["server:beta#0"].starts == 1
        assert results and set(results) == {200}, results  # beta answered every request meanwhile
        assert complete(ports["alpha"], "alpha")[0] == 200
        assert json.loads((tmp_path / "models-ready.json").read_text())["models"]["alpha"]["ready"]
    finally:
        report = s.drain()
    # Drain covers every process: each exits on its own SIGTERM.
    assert report["server_exits"] == {"server:alpha#0": 0, "server:beta#0": 0}


def test_a_model_that_keeps_crashing_at_start_is_named(artifact, tmp_path):
    ports = {"alpha": free_port(), "beta": free_port()}
    servers = processes(artifact, ["alpha", "beta"], ports)
    broken = ServerProcess(servers[1].name, "beta", 0, ports["beta"], [sys.executable, "-c", "import sys; sys.exit(3)"])
    s = serving(tmp_path, [servers[0], broken], max_restarts=2)
    s.start()
    try:
        with pytest.raises(ServeError, match=rf"model beta \(copy 0, port {ports['beta']}\) kept crashing "
                                             r"\(exit codes \[3, 3, 3\]\)"):
            s.wait_ready()
        assert complete(ports["alpha"], "alpha")[0] == 200  # started first, and still serving
    finally:
        s.drain()


def test_a_budget_that_holds_no_sequence_is_refused_naming_the_flag(artifact):
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "runtime.reference.server", "--artifact", str(artifact),
                           "--port", str(free_port()), "--max-seq-len", str(MAX_SEQ), "--kv-cache-bytes", "1000"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f"--kv-cache-bytes: a budget of 1000 bytes holds no sequence of {MAX_SEQ} tokens ({SLOT} bytes" in proc.stderr
