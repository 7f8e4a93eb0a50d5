"""Which GPU this instance has: name and compute capability from nvidia-smi.

Engines are tied to the GPU architecture, so the compute capability goes into
the engine cache key and decides which precisions are allowed at all (checked
before anything is downloaded).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from fleetcast.config import catalog
from fleetcast.contract.instance_env import Var


class GpuError(RuntimeError):
    """No usable GPU, or nvidia-smi answered something unreadable."""


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: str  # "8.9"
    count: int
    memory_mib: int

    @property
    def arch(self) -> str:
        return catalog.arch_for_compute_capability(self.compute_capability)


def parse_nvidia_smi(text: str) -> GpuInfo:
    """Parse `nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader,nounits`."""
    rows = [[c.strip() for c in line.split(",")] for line in text.strip().splitlines() if line.strip()]
    if not rows:
        raise GpuError("nvidia-smi listed no GPU")
    for row in rows:
        if len(row) != 3 or not row[1].replace(".", "", 1).isdigit() or "." not in row[1]:
            raise GpuError(f"unexpected nvidia-smi line {','.join(row)!r} (expected name, compute_cap, memory.total)")
    names = {r[0] for r in rows}
    caps = {r[1] for r in rows}
    if len(names) > 1 or len(caps) > 1:
        raise GpuError(f"mixed GPUs on one instance ({', '.join(sorted(names))}); one engine cannot serve them all")
    return GpuInfo(name=rows[0][0], compute_capability=rows[0][1], count=len(rows), memory_mib=int(float(rows[0][2])))


def detect_gpu(timeout_s: float = 30.0) -> GpuInfo:
    """Ask nvidia-smi. FLEETCAST_FAKE_GPU="name,cc,mem" stands in on machines without a GPU (dev, CI)."""
    fake = os.environ.get(Var.FAKE_GPU)
    if fake:
        return parse_nvidia_smi(fake)
    exe = shutil.which("nvidia-smi")
    if not exe:
        raise GpuError("nvidia-smi is not on PATH: is the container started with --gpus all?")
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout_s, check=True,
        ).stdout
    except subprocess.CalledProcessError as exc:
        raise GpuError(f"nvidia-smi failed ({exc.returncode}): {exc.stderr.strip()[:300]}") from None
    except subprocess.TimeoutExpired:
        raise GpuError(f"nvidia-smi did not answer within {timeout_s:.0f} s") from None
    return parse_nvidia_smi(out)


def sample_utilization(timeout_s: float = 10.0) -> tuple[float, float] | None:
    """(GPU utilization %, memory used %) averaged over GPUs, or None when unavailable."""
    exe = shutil.which("nvidia-smi")
    if not exe or os.environ.get(Var.FAKE_GPU):
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=utilization.gpu,memory.used,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout_s, check=True,
        ).stdout
        rows = [[float(c) for c in line.split(",")] for line in out.strip().splitlines() if line.strip()]
    except (subprocess.SubprocessError, ValueError):
        return None
    if not rows:
        return None
    util = sum(r[0] for r in rows) / len(rows)
    mem = sum(100.0 * r[1] / r[2] for r in rows if r[2]) / len(rows)
    return util, mem


def free_memory_bytes(timeout_s: float = 10.0) -> int | None:
    """Free memory of the (first) GPU now, or None when unavailable. FLEETCAST_FAKE_GPU: all of its memory."""
    fake = os.environ.get(Var.FAKE_GPU)
    if fake:
        return parse_nvidia_smi(fake).memory_mib * (1 << 20)
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=timeout_s, check=True).stdout
        return int(float(out.strip().splitlines()[0])) * (1 << 20)
    except (subprocess.SubprocessError, ValueError, IndexError):
        return None
