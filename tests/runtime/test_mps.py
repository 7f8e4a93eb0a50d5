"""The MPS control daemon under a pool with gpu_sharing: mps, against a stand-in that behaves like the real one.

Sources, NVIDIA's MPS documentation (docs.nvidia.com/deploy/mps):
- "Appendix: Tools and Interface Reference", nvidia-cuda-mps-control: `-d` starts the daemon in the background,
  `echo quit | nvidia-cuda-mps-control` shuts it down, and the daemon writes nvidia-cuda-mps-control.pid into
  CUDA_MPS_PIPE_DIRECTORY.
- "Quick Start", "Starting multiple control/server pairs": separate CUDA_MPS_PIPE_DIRECTORY and
  CUDA_MPS_LOG_DIRECTORY per daemon.
- "Appendix: Environment Variables": CUDA_MPS_PIPE_DIRECTORY must be the same for the daemon and its clients;
  CUDA_VISIBLE_DEVICES set before the daemon starts remaps the devices its clients see (a client then addresses
  the daemon's one GPU as device 0); CUDA_MPS_PINNED_DEVICE_MEM_LIMIT is "<device>=<limit>" (e.g. "0=1G",
  "0=512M"); CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is a percentage.
- "Appendix: Common Tasks", "Starting MPS client application": CUDA_VISIBLE_DEVICES is not set in the client's
  environment.
The stand-in is tests/runtime/fake_mps_control.py (the fake_mps fixture puts it on PATH); the product runs the real
binary, which the NVIDIA container toolkit mounts into a GPU container (NVIDIA/nvidia-container-toolkit
pkg/nvcdi/driver-nvml.go, newDriverBinariesDiscoverer: nvidia-cuda-mps-control, nvidia-cuda-mps-server).
"""

import json
import re
from pathlib import Path

import pytest

from fleetcast.contract.errors import UserError
from runtime import mps

REPO = Path(__file__).resolve().parents[2]


def calls(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_pinned_memory_limit_is_device_equals_mebibytes_rounded_up():
    assert mps.pinned_mem_limit(1 << 30) == "0=1024M"
    assert mps.pinned_mem_limit((1 << 30) + 1) == "0=1025M"  # never below the planned share
    assert mps.pinned_mem_limit(512 << 20, device=1) == "1=512M"
    assert re.fullmatch(r"\d+=\d+M", mps.pinned_mem_limit(123456789))
    with pytest.raises(ValueError):
        mps.pinned_mem_limit(0)


def test_a_daemon_per_gpu_with_its_own_pipe_and_log_directories(tmp_path, fake_mps):
    daemons = [mps.MpsDaemon(gpu, tmp_path / "mps") for gpu in (0, 1)]
    try:
        for daemon in daemons:
            daemon.start()
        assert all(d.alive() for d in daemons)
        assert len({d.pid() for d in daemons}) == 2
        assert len({d.pipe_dir for d in daemons}) == 2 and len({d.log_dir for d in daemons}) == 2
        started = [c for c in calls(fake_mps) if c["argv"] == ["-d"]]
        assert [c["env"]["CUDA_VISIBLE_DEVICES"] for c in started] == ["0", "1"]
        assert [c["env"]["CUDA_MPS_PIPE_DIRECTORY"] for c in started] == [str(d.pipe_dir) for d in daemons]
        assert [c["env"]["CUDA_MPS_LOG_DIRECTORY"] for c in started] == [str(d.log_dir) for d in daemons]
        assert (daemons[0].log_dir / "control.log").read_text().startswith("[")
        daemons[0].start()  # already running: nothing started twice
        assert len([c for c in calls(fake_mps) if c["argv"] == ["-d"]]) == 2
    finally:
        for daemon in daemons:
            daemon.stop()
    assert not any(d.alive() for d in daemons)
    quits = [c for c in calls(fake_mps) if c["argv"] == []]
    assert [c["env"]["CUDA_MPS_PIPE_DIRECTORY"] for c in quits] == [str(d.pipe_dir) for d in daemons]


def test_a_client_reaches_its_daemon_and_carries_its_limits(tmp_path):
    daemon = mps.MpsDaemon(0, tmp_path / "mps")
    env = daemon.client_env(3 * (1 << 30), 40)
    assert env == {"CUDA_MPS_PIPE_DIRECTORY": str(daemon.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(daemon.log_dir),
                   "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3072M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40"}
    # No cap unless asked (a cap is measured per packing, never a default), no limit without a planned share.
    assert set(daemon.client_env(None, None)) == {"CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"}


def test_without_the_control_binary_the_error_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="nvidia-cuda-mps-control on PATH"):
        mps.MpsDaemon(0, tmp_path / "mps").start()


def test_a_daemon_that_ignores_quit_is_killed(tmp_path, fake_mps):
    daemon = mps.MpsDaemon(0, tmp_path / "mps", stop_timeout_s=0.5)
    daemon.start()
    pid = daemon.pid()
    (daemon.pipe_dir / "control").unlink()  # quit cannot reach it any more
    daemon.stop()
    assert not daemon.alive() and pid is not None


def test_the_serving_container_shares_the_hosts_ipc_and_mounts_the_pipe_directory():
    """MPS clients in a container reach the daemon through its pipe directory and need the IPC namespace it
    uses: the serving container runs with --ipc host, and the MPS directories are under the local root, which
    it mounts from the host."""
    script = (REPO / "runtime" / "host" / "run-container.sh").read_text()
    assert "--ipc host" in script
    from fleetcast.contract.instance_env import Var, default

    root = default(Var.LOCAL_ROOT)
    assert f"--volume {root}:{root}" in script
    assert str(mps.mps_root(Path(root))).startswith(root + "/")
