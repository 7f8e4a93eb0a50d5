"""Fault containment under MPS, on loopback: one client faults, the GPU's processes restart together, in order.

The MPS documentation (docs.nvidia.com/deploy/mps, "Memory Protection and Error Containment") says a fatal GPU
exception in one client is reported to every client of that GPU, and the server refuses new clients until all of
them have exited; on the H200 one co-located server died and the other stayed alive and never answered again
(issue 33). Restarting only the one that died would crash-loop it (cudaErrorMpsServerNotReady), so the supervisor
restarts the whole group: the wedged neighbour is killed, the daemon is started again if it died, and every
process starts again in its order. Real reference-backend servers (tiny, cpu) imitate the clients
(runtime/reference/mps_sim.py) under the stand-in control daemon (tests/runtime/fake_mps_control.py).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from runtime.serve import ServerProcess, ServeSettings, Serving, server_name
from runtime.supervisor import RestartPolicy
from tests.optional import needs_torch

from .test_multi_model import complete, processes

pytestmark = [needs_torch, pytest.mark.xdist_group("multi-model"), pytest.mark.usefixtures("forked_engines")]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    from runtime.reference.build import build_artifact

    out = tmp_path_factory.mktemp("tiny") / "artifact"
    build_artifact(out, size="tiny", seed=0)
    return out


def mps_serving(artifact, tmp_path, limits=None, max_restarts: int = 3, stop_timeout_s: float = 5.0):
    from runtime.devtools.harness import free_port

    ports = {"alpha": free_port(), "beta": free_port()}
    servers = [ServerProcess(**{**p.__dict__, "argv": [*p.argv, "--fault-on-signal"],
                                "mps_mem_limit_bytes": (limits or {}).get(p.model_id)})
               for p in processes(artifact, ["alpha", "beta"], ports)]
    settings = ServeSettings(port=free_port(), model_name="alpha", region="r", pool="p", gateway=False,
                             ready_timeout_s=120, restart=RestartPolicy(max_restarts=max_restarts, backoff_base_s=0.1),
                             liveness_interval_s=0.5, liveness_timeout_s=10, liveness_failures=3,
                             models_state_file=tmp_path / "models-ready.json",
                             # A wedged client ignores SIGTERM: the drain kills it after these, not 6 minutes.
                             drain_timeout_s=stop_timeout_s, server_stop_timeout_s=stop_timeout_s)
    s = Serving(settings, servers=servers, mps_root=tmp_path / "mps")
    s.supervisor.poll_s = 0.05
    return s, ports


def environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as handle:
        raw = handle.read().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def serves(port: int, model: str) -> bool:
    try:
        return complete(port, model)[0] == 200
    except OSError:
        return False


def test_engine_processes_are_clients_of_their_gpus_daemon_started_first_and_stopped_last(artifact, tmp_path,
                                                                                          fake_mps, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # the instance's: a client must not carry it
    s, ports = mps_serving(artifact, tmp_path, limits={"alpha": 3 << 30})
    daemon = s.mps_daemons[0]
    s.start()
    try:
        s.wait_ready()
        calls = [json.loads(line) for line in fake_mps.read_text().splitlines()]
        assert [c["argv"] for c in calls] == [["-d"]]  # one daemon, before any engine process
        for server in s.servers:
            env = environ(s.supervisor.children[server.name].pid)
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(daemon.pipe_dir)
            assert env["CUDA_MPS_LOG_DIRECTORY"] == str(daemon.log_dir)
            assert "CUDA_VISIBLE_DEVICES" not in env
            assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env  # never a default
        alpha = environ(s.supervisor.children[server_name("alpha", 0, single=False)].pid)
        assert alpha["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=3072M"
        assert daemon.alive()
    finally:
        s.drain()
    assert not daemon.alive()
    calls = [json.loads(line) for line in fake_mps.read_text().splitlines()]
    assert [c["argv"] for c in calls] == [["-d"], []]  # quit after the last engine process


@pytest.mark.parametrize("daemon_dies", [False, True], ids=["daemon-survives", "daemon-dies-too"])
def test_one_client_faults_and_every_process_of_the_gpu_restarts_together(artifact, tmp_path, fake_mps, daemon_dies):
    s, ports = mps_serving(artifact, tmp_path)
    daemon = s.mps_daemons[0]
    s.start()
    try:
        s.wait_ready()
        children = {m: s.supervisor.children[server_name(m, 0, single=False)] for m in ports}
        before = {m: c.pid for m, c in children.items()}
        first_daemon = daemon.pid()
        if daemon_dies:
            os.kill(first_daemon, signal.SIGKILL)
        faulted = time.monotonic()
        os.kill(before["alpha"], signal.SIGUSR2)  # alpha faults; beta is told and stops answering
        group = s.supervisor.groups["gpu0"]
        deadline = time.monotonic() + 120  # a bound on the wait; the verdicts are below
        downtime = None
        while time.monotonic() < deadline:
            if downtime is None and all(children[m].pid != before[m] and serves(ports[m], m) for m in ports):
                downtime = time.monotonic() - faulted
            if downtime is not None and group.restarts:  # the restart's own record comes after its ready checks
                break
            time.sleep(0.05)
        assert downtime is not None
        assert all(children[m].pid != before[m] for m in ports)  # both restarted, beta without dying on its own
        assert all(serves(ports[m], m) for m in ports)
        assert group.restarts == 1 and group.last_restart_s is not None
        assert children["alpha"].exit_codes == [1] and not s.supervisor.gave_up.is_set()
        assert daemon.alive() and (daemon.pid() != first_daemon) == daemon_dies
        # In order: alpha (first in serves) answered before beta started again.
        starts = {m: children[m].spawned_at for m in ports}
        assert starts["alpha"] < starts["beta"]
        state = json.loads((tmp_path / "models-ready.json").read_text())["models"]
        deadline = time.monotonic() + 30
        while not all(v["ready"] for v in state.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
            state = json.loads((tmp_path / "models-ready.json").read_text())["models"]
        assert all(v["ready"] for v in state.values())
        print(f"\nMPS fault on loopback ({'daemon killed too' if daemon_dies else 'daemon alive'}): every model "
              f"served again {downtime:.2f} s after the fault (group restart {group.last_restart_s:.2f} s)")
        (tmp_path.parent / f"mps-downtime-{int(daemon_dies)}.json").write_text(json.dumps(
            {"downtime_s": downtime, "group_restart_s": group.last_restart_s}))
    finally:
        s.drain()


def test_a_group_that_keeps_faulting_is_given_up_on(artifact, tmp_path, fake_mps):
    # One restart allowed: each restart starts both engine processes again (PyTorch imported twice), and a second
    # and third restart, as the shared policy's limit of 3 gave, repeated the first. The wedged neighbour left
    # behind ignores the drain's SIGTERM and is killed once the stop bound (both timeouts, no gateway) is out:
    # 10 s at the module's 5 s, for a process that is known not to answer.
    s, ports = mps_serving(artifact, tmp_path, max_restarts=1, stop_timeout_s=0.5)
    s.start()
    try:
        s.wait_ready()
        child = s.supervisor.children[server_name("alpha", 0, single=False)]
        group = s.supervisor.groups[child.group]
        faults = 0
        deadline = time.monotonic() + 300
        while not s.supervisor.gave_up.is_set() and time.monotonic() < deadline:
            pid = child.pid
            # Once the last restart is done (every process answered): a fault while the neighbour still loads
            # wedges it, and the restart waits its whole ready timeout for it.
            if child.running() and group.restarts >= faults and serves(ports["alpha"], "alpha"):
                os.kill(pid, signal.SIGUSR2)
                faults += 1
                while child.pid == pid and time.monotonic() < deadline and not s.supervisor.gave_up.is_set():
                    time.sleep(0.05)
            time.sleep(0.05)
        assert s.supervisor.gave_up.is_set() and s.supervisor.failed_child is child
        assert len(child.exit_codes) == 2  # max_restarts (1) restart, then the second exit gives up
    finally:
        s.drain()
    assert not s.mps_daemons[0].alive()
