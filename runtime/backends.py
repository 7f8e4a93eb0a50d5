"""Which program builds and serves the engine: TensorRT-LLM on a fleet, the reference backend in dev/CI.

Both present the same face to the bootstrap:
    name, version            -> part of the engine cache key
    needs_model/calibration  -> what to download before a build
    check(cc, gpu_name)      -> refuse unsupported combinations before any download
    build(model, calib, workdir) -> artifact directory (uploaded to the cache as is)
    server_command(artifact, host, port, kv_cache_bytes, lora, kv_fraction, block_reuse) -> argv of the
                             OpenAI-compatible server (`lora`: the engine's LoRA options where the model serves
                             adapters; `kv_fraction`: the KV fraction next to a budget, runtime/kv_budget.py;
                             `block_reuse`: False where KV blocks must not be reused across requests)
    planned_kv_tokens(artifact, kv_cache_bytes) -> the KV tokens a budget must come out as (checked after start)
    server_env()             -> its environment (None: the runtime's)

The reference backend (runtime.reference, PyTorch) exists because TensorRT-LLM
cannot be installed on development and CI machines; it is picked only when
FLEETCAST_SERVING_BACKEND=reference, never by default.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from fleetcast.config import FleetConfig
from fleetcast.config.model import EngineSpec, ModelSpec
from fleetcast.contract.errors import UserError
from fleetcast.contract.instance_env import Var, default, setting

from .trtllm import TrtllmBackend


class ServingBackend(Protocol):
    name: str
    version: str

    @property
    def needs_model(self) -> bool: ...

    @property
    def needs_calibration(self) -> bool: ...

    def check(self, compute_capability: str, gpu_name: str = "") -> None: ...

    def build(self, model_dir: Path | None, calib_dir: Path | None, workdir: Path) -> Path: ...

    def server_command(self, artifact: Path, host: str, port: int, kv_cache_bytes: int | None = None,
                       lora: Mapping[str, Any] | None = None, kv_fraction: float | None = None,
                       block_reuse: bool = True) -> list[str]: ...

    def planned_kv_tokens(self, artifact: Path, kv_cache_bytes: int | None) -> int | None: ...

    def server_env(self) -> dict[str, str] | None: ...


def reference_seed(cfg: FleetConfig, model: ModelSpec, seed: int) -> int:
    """The seed of `model`'s reference weights: FLEETCAST_REFERENCE_SEED in a one-model fleet, and in a fleet of
    several, drawn from it and the model's id, so each model's process holds weights (and writes text) of its
    own; the same seed and id give the same weights on every instance."""
    if len(cfg.models) == 1:
        return seed
    return (seed + zlib.crc32(model.id.encode())) % (1 << 31)


class ReferenceBackend:
    """runtime.reference: random-weight GPT-2 shapes built by runtime.reference.build, served by its server."""

    name = "reference"

    def __init__(self, cfg: FleetConfig, engine: EngineSpec, size: str = default(Var.REFERENCE_SIZE),
                 seed: int = default(Var.REFERENCE_SEED), device: str = default(Var.REFERENCE_DEVICE),
                 drain_timeout_s: float | None = None, model: ModelSpec | None = None,
                 sim_gpu: tuple[int, Path] | None = None):
        """`sim_gpu` (cpu): the memory of the GPU the processes stand in for and the ledger directory they share,
        so the reference's KV rule counts one another (runtime/reference/server.py)."""
        from .reference.build import FORMAT
        from .reference.configs import SIZES

        if size not in SIZES:
            raise UserError(f"{Var.REFERENCE_SIZE.value}: {size!r} is not a reference model size; "
                            f"allowed: {', '.join(SIZES)}")
        self.cfg, self.engine = cfg, engine
        self.model = model if model is not None else cfg.model
        self.size, self.seed, self.device = size, reference_seed(cfg, self.model, seed), device
        # The generated weights depend on all of these, so they belong in the cache key.
        self.version = f"{FORMAT}:{size}:seed{self.seed}:{device}"
        self.drain_timeout_s = drain_timeout_s if drain_timeout_s is not None else cfg.operations.drain_timeout_s
        self.sim_gpu = sim_gpu if device == "cpu" else None

    @property
    def needs_model(self) -> bool:
        return False  # the artifact is generated (deterministic random weights), not converted

    @property
    def needs_calibration(self) -> bool:
        return False

    def check(self, compute_capability: str, gpu_name: str = "") -> None:
        from .reference.configs import shape_for

        shape = shape_for(self.size)
        m = self.model
        if m.max_input_len + m.max_output_len > shape.n_positions:
            raise UserError(
                f"{m.id}: max_input_len + max_output_len = {m.max_input_len + m.max_output_len} exceeds the "
                f"reference {self.size} model's {shape.n_positions} positions"
            )

    def build(self, model_dir: Path | None, calib_dir: Path | None, workdir: Path) -> Path:
        artifact = workdir / "artifact"
        dtype = "float16" if self.device == "cuda" else "float32"
        # A subprocess, like trtllm-build: the runtime process never loads torch.
        cmd = [sys.executable, "-m", "runtime.reference.build", "--out", str(artifact), "--size", self.size,
               "--seed", str(self.seed), "--dtype", dtype, "--device", self.device]
        from .trtllm import build_step_timeout_s

        timeout_s = build_step_timeout_s()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"reference build did not finish within {timeout_s:.0f} s") from None
        if proc.returncode != 0:
            raise RuntimeError(f"reference build exited {proc.returncode}: {proc.stderr.strip()[-1500:]}")
        return artifact

    def server_env(self) -> dict[str, str] | None:
        return None  # the runtime's own environment: the reference server is this project's code

    def planned_kv_tokens(self, artifact: Path, kv_cache_bytes: int | None) -> int | None:
        """Whole sequences of max_input_len + max_output_len, as the reference server's /metrics counts them."""
        if kv_cache_bytes is None:
            return None
        from .reference.configs import kv_tokens, shape_for

        m = self.model
        return kv_tokens(kv_cache_bytes, shape_for(self.size), m.max_input_len + m.max_output_len,
                         2 if self.device == "cuda" else 4)  # float16 on cuda, float32 on cpu: its build dtype

    def server_command(self, artifact: Path, host: str, port: int, kv_cache_bytes: int | None = None,
                       lora: Mapping[str, Any] | None = None, kv_fraction: float | None = None,
                       block_reuse: bool = True) -> list[str]:
        m = self.model
        cmd = [sys.executable, "-m", "runtime.reference.server", "--artifact", str(artifact), "--host", host,
               "--port", str(port), "--device", self.device, "--served-model-name", m.id,
               "--max-batch-size", str(self.engine.max_batch_size),
               "--max-seq-len", str(m.max_input_len + m.max_output_len),
               "--drain-timeout", str(self.drain_timeout_s)]
        if kv_cache_bytes is not None:
            cmd += ["--kv-cache-bytes", str(kv_cache_bytes)]  # the same budget TensorRT-LLM gets as max_tokens
        if kv_fraction is not None:
            cmd += ["--kv-cache-free-gpu-memory-fraction", f"{kv_fraction:g}"]  # and the same fraction beside it
        if self.sim_gpu is not None:
            cmd += ["--sim-gpu-memory-bytes", str(self.sim_gpu[0]), "--sim-gpu-ledger", str(self.sim_gpu[1])]
        if lora is not None:
            # The same options TensorRT-LLM gets as lora_config, so the reference checks requests against them.
            cmd += ["--lora-config", json.dumps(dict(lora), sort_keys=True)]
        if not block_reuse:
            cmd += ["--no-block-reuse"]
        return cmd


def select_backend(cfg: FleetConfig, engine: EngineSpec, env: dict[str, Any] | None = None,
                   model: ModelSpec | None = None) -> ServingBackend:
    """The backend that builds and serves `model` (default: the config's first) with `engine`."""
    env = dict(os.environ if env is None else env)
    choice = setting(env, Var.SERVING_BACKEND)
    if choice in ("tensorrt-llm", "trtllm"):
        return TrtllmBackend(cfg, engine, model=model)
    if choice == "reference":
        fake = env.get(Var.FAKE_GPU.value)
        sim_gpu = None
        if fake:  # the development GPU's memory, for the reference's KV rule on cpu
            from .gpu import parse_nvidia_smi

            sim_gpu = (parse_nvidia_smi(fake).memory_mib * (1 << 20), Path(setting(env, Var.LOCAL_ROOT)) / "sim-gpu")
        return ReferenceBackend(cfg, engine, size=setting(env, Var.REFERENCE_SIZE),
                                seed=setting(env, Var.REFERENCE_SEED), device=setting(env, Var.REFERENCE_DEVICE),
                                model=model, sim_gpu=sim_gpu)
    raise UserError(f"{Var.SERVING_BACKEND.value}: {choice!r} is not a backend; allowed: tensorrt-llm, reference")
