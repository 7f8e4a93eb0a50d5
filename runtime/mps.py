"""CUDA MPS (Multi-Process Service) under the engine processes of a pool with `gpu_sharing: mps`.

One control daemon per GPU, started before the first engine process on that GPU and stopped after the
last (runtime/serve.py runs it as the start and end of that GPU's process group, runtime/supervisor.py).
Sources: NVIDIA's MPS documentation (docs.nvidia.com/deploy/mps), cited by section here and in
tests/runtime/test_mps.py:

- "Appendix: Tools and Interface Reference", nvidia-cuda-mps-control: `nvidia-cuda-mps-control -d` starts
  the daemon in the background, `echo quit | nvidia-cuda-mps-control` shuts it down, and the daemon writes
  `nvidia-cuda-mps-control.pid` (its PID) into CUDA_MPS_PIPE_DIRECTORY.
- "Quick Start", "Starting multiple control/server pairs": each daemon gets its own pipe and log directories;
  "Appendix: Environment Variables", CUDA_MPS_PIPE_DIRECTORY: the daemon, its server and its clients must
  see the same pipe directory. The directories live under the runtime's local root (<root>/mps/gpu<N>/),
  which the serving container mounts from the host (runtime/host/run-container.sh), so a client in another
  container with that mount and the host's IPC namespace (`--ipc host`, also in run-container.sh) reaches
  the same daemon.
- "Appendix: Environment Variables", CUDA_VISIBLE_DEVICES: set before the daemon starts, it remaps the
  devices its clients see, so each daemon is started with its one GPU and a client always addresses it as
  device 0; "Appendix: Common Tasks", "Starting MPS client application": CUDA_VISIBLE_DEVICES is not set in
  the client's environment.
- "Appendix: Environment Variables", CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (a client's device-memory limit,
  "<device>=<limit>", e.g. "0=1024M") and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (a client's share of SMs).

The nvidia-container-toolkit mounts nvidia-cuda-mps-control and nvidia-cuda-mps-server into a container
started with GPUs (pkg/nvcdi/driver-nvml.go, newDriverBinariesDiscoverer), so the runtime starts the daemon
inside the serving container, next to its clients.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fleetcast.contract.errors import UserError

log = logging.getLogger("fleetcast.mps")

CONTROL = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"  # written into the pipe directory by the daemon
PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
LOG_DIRECTORY = "CUDA_MPS_LOG_DIRECTORY"
PINNED_DEVICE_MEM_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ACTIVE_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
MIB = 1 << 20


class MpsError(RuntimeError):
    """The MPS control daemon could not be started (or would not stop)."""


def pinned_mem_limit(limit_bytes: int, device: int = 0) -> str:
    """CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for one device, in whole MiB rounded up: "0=1536M"."""
    if limit_bytes < 1:
        raise ValueError(f"a device-memory limit must be positive, got {limit_bytes}")
    return f"{device}={-(-limit_bytes // MIB)}M"


def mps_root(local_root: Path) -> Path:
    return local_root / "mps"


@dataclass
class MpsDaemon:
    """The control daemon of one GPU, with its own pipe and log directories under `root`."""

    gpu: int
    root: Path
    control: str = CONTROL
    start_timeout_s: float = 30.0
    stop_timeout_s: float = 30.0

    @property
    def pipe_dir(self) -> Path:
        return self.root / f"gpu{self.gpu}" / "pipe"

    @property
    def log_dir(self) -> Path:
        return self.root / f"gpu{self.gpu}" / "log"

    def daemon_env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if environ is None else environ)
        env.update({VISIBLE_DEVICES: str(self.gpu), PIPE_DIRECTORY: str(self.pipe_dir), LOG_DIRECTORY: str(self.log_dir)})
        return env

    def client_env(self, limit_bytes: int | None, active_thread_percentage: int | None) -> dict[str, str]:
        """What an engine process needs to run as this daemon's client (merged over its own environment;
        Child.env_unset drops CUDA_VISIBLE_DEVICES)."""
        env = {PIPE_DIRECTORY: str(self.pipe_dir), LOG_DIRECTORY: str(self.log_dir)}
        if limit_bytes is not None:
            env[PINNED_DEVICE_MEM_LIMIT] = pinned_mem_limit(limit_bytes)  # device 0: the daemon's one GPU
        if active_thread_percentage is not None:
            env[ACTIVE_THREAD_PERCENTAGE] = str(active_thread_percentage)
        return env

    def pid(self) -> int | None:
        try:
            return int((self.pipe_dir / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None

    def alive(self) -> bool:
        pid = self.pid()
        return pid is not None and process_alive(pid)

    def _executable(self) -> str:
        exe = shutil.which(self.control)
        if exe is None:
            raise UserError(f"gpu_sharing: mps needs {self.control} on PATH (the NVIDIA container toolkit mounts it "
                            "into a container started with --gpus); it is not there")
        return exe

    def start(self) -> None:
        """`nvidia-cuda-mps-control -d` with this GPU's directories; returns once the daemon wrote its PID."""
        if self.alive():
            return
        exe = self._executable()
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.pipe_dir / PID_FILE).unlink(missing_ok=True)  # a dead daemon's: not this one's
        try:
            proc = subprocess.run([exe, "-d"], env=self.daemon_env(), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=self.start_timeout_s,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise MpsError(f"{self.control} -d (GPU {self.gpu}) did not return within {self.start_timeout_s:.0f} s") from None
        if proc.returncode != 0:
            raise MpsError(f"{self.control} -d (GPU {self.gpu}) exited {proc.returncode}: "
                           f"{proc.stderr.decode(errors='replace').strip()[-500:]}")
        deadline = time.monotonic() + self.start_timeout_s
        while not self.alive():
            if time.monotonic() > deadline:
                raise MpsError(f"{self.control} (GPU {self.gpu}) wrote no live PID to {self.pipe_dir / PID_FILE} "
                               f"within {self.start_timeout_s:.0f} s")
            time.sleep(0.05)
        log.info("MPS control daemon of GPU %d started (pid %s, pipe directory %s)", self.gpu, self.pid(), self.pipe_dir)

    def stop(self) -> None:
        """`echo quit | nvidia-cuda-mps-control`, then SIGKILL if the daemon outlives stop_timeout_s."""
        pid = self.pid()
        if pid is None or not self.alive():
            return
        try:
            subprocess.run([self._executable()], input=b"quit\n", env=self.daemon_env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=self.stop_timeout_s, check=False)
        except (subprocess.TimeoutExpired, UserError) as exc:
            log.warning("quit to the MPS control daemon of GPU %d failed: %s", self.gpu, exc)
        deadline = time.monotonic() + self.stop_timeout_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.alive():
            log.error("MPS control daemon of GPU %d (pid %d) did not quit within %.0f s; killing it", self.gpu, pid,
                      self.stop_timeout_s)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 5.0
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
        log.info("MPS control daemon of GPU %d stopped", self.gpu)


def process_alive(pid: int) -> bool:
    """`pid` runs (a zombie, dead but not yet reaped, does not); another user's process counts as running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode(errors="replace")
    except OSError:
        return True  # no /proc: the signal check is all there is
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"
