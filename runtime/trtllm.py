"""TensorRT-LLM command lines: checkpoint conversion, quantization, engine build, serving.

Nothing here imports tensorrt_llm: the runtime runs the release's own scripts and
CLIs inside the pinned serving image (nvcr.io/nvidia/tensorrt-llm/release:1.2.1),
so this module only decides the exact argv. tests/runtime/trtllm_1_2_1_cli.py
holds the option names and choices of those scripts as read from the release
source, and the tests parse every command built here against them.

Flows (TensorRT-LLM 1.2.x):
- GPT-2 (engine flow, `--backend tensorrt`):
    fp16/bf16, int8_wo, int4_wo, int8_sq (+ INT8 KV cache):
        python3 examples/models/core/gpt/convert_checkpoint.py ... -> TRT-LLM checkpoint
    fp8 (+ FP8 KV cache): python3 examples/quantization/quantize.py --qformat fp8 ...
    then: trtllm-build --checkpoint_dir ... --output_dir ENGINE (config.json + rank0.engine)
- Llama/Phi-3/Qwen2 (PyTorch backend): no engine. The staged checkpoint (pre-quantized
  for fp8/nvfp4) is the artifact; trtllm-serve loads it directly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetcast.config import Backend, FleetConfig, KvCacheDtype, ModelFamily, Precision
from fleetcast.config.model import EngineSpec, ModelSpec
from fleetcast.contract import support
from fleetcast.contract.calibration import loader_dir as calibration_loader_dir
from fleetcast.contract.errors import UserError
from fleetcast.contract.instance_env import Var, setting
from fleetcast.contract.selection import tokenizer_file

from . import vendor


def examples_dir() -> str:
    """Where the release image keeps its examples (the image ships the repo's examples/ at /app/tensorrt_llm). Read
    from the environment when asked, as every setting: a process forked from one that imported this module (the
    tests' fork server) has an environment of its own."""
    return str(setting(os.environ, Var.TRTLLM_EXAMPLES))


CONVERT_GPT = "models/core/gpt/convert_checkpoint.py"
QUANTIZE = "quantization/quantize.py"
SMOOTHQUANT_ALPHA = 0.5  # the release README's recommended first try



class UnsupportedCombination(UserError):
    """The config asks for a model/precision/GPU combination this release cannot build or serve."""


_DTYPE = {Precision.FP16: "float16", Precision.BF16: "bfloat16"}


def check_supported(model_family: ModelFamily, engine: EngineSpec, compute_capability: str, gpu_name: str = "") -> None:
    """Refuse, before anything is downloaded, what cannot run on this GPU with this release.

    The decision is fleetcast/contract/support.py's, the same one `fleetcast config validate`
    made for this pool's instance type.
    """
    arch = support.arch_for_compute_capability(compute_capability)
    where = f"{gpu_name or 'this GPU'} (compute capability {compute_capability}, {arch})"
    refusal = support.check(model_family.value, engine.backend.value, engine.precision.value,
                            engine.kv_cache_dtype.value, arch, where)
    if refusal is not None:
        raise UnsupportedCombination(str(refusal))


def needs_calibration(engine: EngineSpec) -> bool:
    """Calibrated builds read the staged calibration set (instances cannot reach the hub)."""
    return support.needs_calibration(engine.backend.value, engine.precision.value, engine.kv_cache_dtype.value)


@dataclass(frozen=True)
class BuildPaths:
    work_dir: Path  # the build's writable directory: every step runs in it (cwd)
    model_dir: Path  # staged Hugging Face checkpoint
    checkpoint_dir: Path  # TRT-LLM checkpoint (intermediate)
    engine_dir: Path  # trtllm-build output
    calib_dir: Path | None = None  # staged calibration dataset

    @property
    def timing_cache(self) -> Path:
        # trtllm-build saves a timing cache to BuildConfig.output_timing_cache, default the
        # relative "model.cache", and asserts the save (tensorrt_llm/builder.py): in the
        # container's read-only working directory that fails the build before the engine is
        # written. It stays out of the artifact (not uploaded).
        return self.work_dir / "model.cache"


def convert_command(engine: EngineSpec, paths: BuildPaths, calib_samples: int = 512, python: str = "python3") -> list[str]:
    """Hugging Face GPT-2 -> TensorRT-LLM checkpoint, with the quantization the config asks for."""
    p = engine.precision
    if p is Precision.FP8:
        cmd = [python, f"{examples_dir()}/{QUANTIZE}", "--model_dir", str(paths.model_dir), "--dtype", "float16",
               "--qformat", "fp8", "--output_dir", str(paths.checkpoint_dir)]
        if engine.kv_cache_dtype is not KvCacheDtype.AUTO:
            cmd += ["--kv_cache_dtype", engine.kv_cache_dtype.value]
        cmd += _calibration_args(paths, "--calib_dataset") + ["--calib_size", str(calib_samples)]
        return cmd
    dtype = _DTYPE.get(p, "float16")
    cmd = [python, f"{examples_dir()}/{CONVERT_GPT}", "--model_dir", str(paths.model_dir), "--dtype", dtype,
           "--output_dir", str(paths.checkpoint_dir)]
    if p is Precision.INT8_WEIGHT_ONLY:
        cmd += ["--use_weight_only", "--weight_only_precision", "int8"]
    elif p is Precision.INT4_WEIGHT_ONLY:
        cmd += ["--use_weight_only", "--weight_only_precision", "int4"]
    elif p is Precision.INT8_SMOOTHQUANT:
        cmd += ["--smoothquant", str(SMOOTHQUANT_ALPHA), "--per_token", "--per_channel"]
    if engine.kv_cache_dtype is KvCacheDtype.INT8:
        cmd += ["--int8_kv_cache"]
    if needs_calibration(engine):
        cmd += _calibration_args(paths, "--calib_dataset")
    return cmd


def _calibration_args(paths: BuildPaths, flag: str) -> list[str]:
    if paths.calib_dir is None:
        raise UserError("calibration: this precision is calibrated; stage a calibration set and set calibration.dataset")
    # The staged layout's loader directory: the only path both calibration loaders read (fleetcast.staging.calibration).
    return [flag, str(calibration_loader_dir(paths.calib_dir))]


def build_command(engine: EngineSpec, max_input_len: int, max_output_len: int, paths: BuildPaths) -> list[str]:
    """trtllm-build of the converted checkpoint, sized by the config's limits."""
    return [
        "trtllm-build",
        "--checkpoint_dir", str(paths.checkpoint_dir),
        "--output_dir", str(paths.engine_dir),
        "--gemm_plugin", "auto",
        "--max_batch_size", str(engine.max_batch_size),
        "--max_input_len", str(max_input_len),
        "--max_seq_len", str(max_input_len + max_output_len),
        "--max_num_tokens", str(engine.max_num_tokens),
        "--output_timing_cache", str(paths.timing_cache),
    ]


def extra_llm_api_options(engine: EngineSpec, kv_max_tokens: int | None = None,
                          lora: Mapping[str, Any] | None = None, kv_fraction: float | None = None,
                          block_reuse: bool = True) -> dict[str, Any]:
    """LLM API options trtllm-serve has no flag for, only those the backend's args class accepts.

    TrtLlmArgs and TorchLlmArgs forbid unknown keys (tensorrt_llm/llmapi/llm_args.py), so a
    key of the other backend makes trtllm-serve exit at startup:
    - kv_cache_config: BaseLlmArgs, both backends;
    - never return_perf_metrics: nothing here reads per-request perf metrics, and in 1.1/1.2
      trtllm-serve then reads `args.perf_metrics_max_requests` (tensorrt_llm/serve/openai_server.py),
      a TorchLlmArgs field, so the TensorRT backend crashes at startup (NVIDIA/TensorRT-LLM issue
      #9678 on release 1.2.0rc2; the fix, PR #10662, is not known to be in 1.2.1);
    - enable_iter_perf_stats (iteration stats behind /metrics): TorchLlmArgs only; the TensorRT
      backend's C++ executor keeps them by default (kDefaultIterStatsMaxIterations = 1000);
    - kv_cache_config.dtype: the PyTorch backend's KV cache dtype ("fp8" sets the FP8 KV
      cache); TrtLlmArgs asserts it stays "auto", the engine carries its KV dtype;
    - kv_cache_config.max_tokens: a process's explicit KV budget on a GPU it shares, which
      both backends honour as a cap next to the fraction (runtime/kv_budget.py); `kv_fraction`, the
      fraction such a process gets instead of the engine's, so that max_tokens is the smaller one
      (fleetcast.config.memory.binding_fraction);
    - lora_config (BaseLlmArgs, a tensorrt_llm/lora_helper.py LoraConfig): where the model serves LoRA
      adapters per request (PyTorch backend only; config validation refuses them elsewhere), built from
      the staged adapters' manifests and the artifact's config.json by fleetcast.contract.adapters.lora_cache_plan
      (max_loras pins the LoRA device cache's size; without it the engine takes a share of free GPU memory).
    - kv_cache_config.enable_block_reuse (KvCacheConfig, default True): false where the process may serve
      more than one KV-cache salt group on a path that cannot carry the salt (fleetcast.contract.isolation).
    """
    fraction = engine.kv_cache_free_gpu_memory_fraction if kv_fraction is None else kv_fraction
    kv_cache: dict[str, Any] = {"free_gpu_memory_fraction": fraction}
    if kv_max_tokens is not None:
        kv_cache["max_tokens"] = kv_max_tokens
    if not block_reuse:
        kv_cache["enable_block_reuse"] = False
    options: dict[str, Any] = {"kv_cache_config": kv_cache}
    if lora is not None:
        if engine.backend is not Backend.PYTORCH:
            raise UserError(f"LoRA adapters need the pytorch backend; this engine is {engine.backend.value}")
        options["lora_config"] = dict(lora)
    if engine.backend is Backend.PYTORCH:
        options["enable_iter_perf_stats"] = True
        kv = engine.kv_cache_dtype.value
        if kv != "auto" and kv in support.KV_CACHE_BY_BACKEND["pytorch"]:  # others: refused by check_supported
            kv_cache["dtype"] = kv
    return options


def serve_command(engine: EngineSpec, model_dir: Path, tokenizer_dir: Path | None, host: str, port: int,
                  max_seq_len: int, options_file: Path, kv_fraction: float | None = None) -> list[str]:
    """trtllm-serve on loopback behind the gateway (`model_dir`: engine dir or HF checkpoint)."""
    cmd = ["trtllm-serve", str(model_dir), "--backend", engine.backend.value, "--host", host, "--port", str(port)]
    if tokenizer_dir is not None:
        cmd += ["--tokenizer", str(tokenizer_dir)]
    cmd += [
        "--max_batch_size", str(engine.max_batch_size),
        "--max_num_tokens", str(engine.max_num_tokens),
        "--max_seq_len", str(max_seq_len),
        "--kv_cache_free_gpu_memory_fraction",
        str(engine.kv_cache_free_gpu_memory_fraction if kv_fraction is None else kv_fraction),
        "--extra_llm_api_options", str(options_file),
        "--log_level", "info",
    ]
    return cmd


# ---------------------------------------------------------------- running a build


Runner = Callable[[list[str], Path, Path], None]  # (argv, build log, working directory)

# What TensorRT-LLM's own processes (convert scripts, trtllm-build, trtllm-serve) must not see
# or must see: instances have no route to the Hugging Face hub, so a stray hub call fails at
# once instead of hanging until a timeout.
HUB_OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def tool_env(environ: Mapping[str, str] | None = None, *, script: str | None = None) -> dict[str, str]:
    """The environment of a TensorRT-LLM process: the runtime's, minus the vendored packages.

    The vendored directory (runtime/vendor.py) holds boto3 & co. for the runtime itself, on the
    container's PYTHONPATH; TensorRT-LLM must import the versions it was released with.

    A `script` from the release's examples gets the directory that holds examples/ first on its
    path: run by absolute path, Python puts only the script's own directory on sys.path, and newer
    example scripts import their siblings as a package (convert_checkpoint.py: `examples._deprecation`),
    which resolves from there whether examples/ is a regular or a namespace package. First, so that
    no other `examples` on the path (the runtime bundle's) is found instead.
    """
    env = dict(os.environ if environ is None else environ)
    vendored = {os.path.normpath(p) for p in (vendor.VENDOR_DIR, env.get(vendor.VENDOR_DIR_ENV, "")) if p}
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.normpath(p) not in vendored]
    examples = os.path.normpath(examples_dir())
    if script is not None and os.path.normpath(script).startswith(examples + os.sep):
        kept.insert(0, os.path.dirname(examples))
    env["PYTHONPATH"] = os.pathsep.join(kept)  # set even when empty: it overrides an inherited value
    env.update(HUB_OFFLINE)
    return env


def build_step_timeout_s() -> float:
    return float(setting(os.environ, Var.BUILD_STEP_TIMEOUT_S))


def run_logged(cmd: list[str], log_file: Path, cwd: Path | None = None, timeout_s: float | None = None) -> None:
    """Run one build step in `cwd` with tool_env(); its output goes to the build log and to stderr
    (CloudWatch Logs via awslogs).

    A step that hangs is killed after `timeout_s`: otherwise its lock refreshes and the
    launch-hook heartbeats would keep a stuck instance (and every waiter) alive forever.
    """
    timeout_s = build_step_timeout_s() if timeout_s is None else timeout_s
    with log_file.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        started = time.monotonic()
        # Stopped from outside (a Spot notice raises in the main thread from its signal handler; SIGTERM), the step
        # must not outlive its caller, which releases the cache lock so another instance can build. The exception
        # can arrive at any point once the child is forked, also inside Popen or before the Timer thread runs, so the
        # process is registered before the fork and the whole span from there on is guarded.
        spawned: list[_StepProcess] = []
        killer: threading.Timer | None = None
        try:
            proc = _StepProcess(spawned, cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=True, cwd=cwd,
                                env=tool_env(script=cmd[1] if len(cmd) > 1 and cmd[1].endswith(".py") else None))
            killer = threading.Timer(timeout_s, lambda: _kill_group(proc))
            killer.start()
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                sys.stderr.write(f"[build] {line}")
            code = proc.wait()
        except BaseException:
            for forked in spawned:
                if getattr(forked, "pid", None) is not None:
                    _kill_group(forked)
                    forked.wait()
            raise
        finally:
            if killer is not None:
                killer.cancel()
        elapsed = time.monotonic() - started
        out.write(f"# exit {code} after {elapsed:.1f} s\n")
    name = os.path.basename(cmd[0]) if cmd[0] != "python3" else cmd[1]
    if code != 0 and elapsed >= timeout_s:
        raise RuntimeError(f"{name} did not finish within {timeout_s:.0f} s ({Var.BUILD_STEP_TIMEOUT_S.value}); killed")
    if code != 0:
        tail = log_file.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{name} exited {code}: {tail}")


class _StepProcess(subprocess.Popen):  # type: ignore[type-arg]
    """A build step's process, put in `spawned` before it is forked: an exception raised while Popen is still
    running (after the fork) leaves the object behind, with its pid, for run_logged to kill."""

    def __init__(self, spawned: list[_StepProcess], *args: Any, **kwargs: Any) -> None:
        spawned.append(self)
        super().__init__(*args, **kwargs)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        # No such group yet: stopped between the fork and the child's setsid, so nothing else was started.
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def copy_tokenizer(model_dir: Path, dest: Path, extra: tuple[str, ...] = ()) -> None:
    """Tokenizer, config and generation config of the HF directory (never a weight format) next to the engine."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in model_dir.iterdir():
        if path.is_file() and tokenizer_file(path.name, extra):
            shutil.copy2(path, dest / path.name)


class TrtllmBackend:
    """Builds and serves with TensorRT-LLM (inside the release image)."""

    name = "tensorrt-llm"

    def __init__(self, cfg: FleetConfig, engine: EngineSpec, runner: Runner = run_logged,
                 model: ModelSpec | None = None):
        self.cfg, self.engine, self.runner = cfg, engine, runner
        self.model = model if model is not None else cfg.model  # the one this backend builds and serves
        self.version = engine.tensorrt_llm_version

    @property
    def needs_model(self) -> bool:
        return True

    @property
    def needs_calibration(self) -> bool:
        return needs_calibration(self.engine)

    def check(self, compute_capability: str, gpu_name: str = "") -> None:
        check_supported(self.model.family, self.engine, compute_capability, gpu_name)

    def build(self, model_dir: Path | None, calib_dir: Path | None, workdir: Path) -> Path:
        assert model_dir is not None
        artifact = workdir / "artifact"
        if self.engine.backend is Backend.PYTORCH:
            # No engine: the verified staged checkpoint is the artifact. FP8/NVFP4 must arrive
            # pre-quantized (ModelOpt writes hf_quant_config.json); nothing here quantizes.
            if self.engine.precision in (Precision.FP8, Precision.NVFP4) and not (model_dir / "hf_quant_config.json").is_file():
                raise UserError(
                    f"engine.precision: {self.engine.precision.value} on the pytorch backend needs a pre-quantized "
                    f"checkpoint (hf_quant_config.json); stage one as model.source, e.g. an FP8 ModelOpt export"
                )
            shutil.copytree(model_dir, artifact, ignore=shutil.ignore_patterns("manifest.json"))
            return artifact
        paths = BuildPaths(work_dir=workdir, model_dir=model_dir, checkpoint_dir=workdir / "checkpoint",
                           engine_dir=artifact / "engine", calib_dir=calib_dir)
        calibration = self.model.calibration
        samples = calibration.samples if calibration else 512
        workdir.mkdir(parents=True, exist_ok=True)
        log_file = workdir / "build.log"
        m = self.model
        # Each step runs in the build's own directory: the container's working directory
        # (/opt/fleetcast, the runtime bundle) is mounted read-only.
        self.runner(convert_command(self.engine, paths, samples), log_file, workdir)
        self.runner(build_command(self.engine, m.max_input_len, m.max_output_len, paths), log_file, workdir)
        if not (paths.engine_dir / "config.json").is_file() or not list(paths.engine_dir.glob("rank*.engine")):
            raise RuntimeError(f"trtllm-build finished but {paths.engine_dir} has no config.json/rank*.engine")
        copy_tokenizer(model_dir, artifact / "tokenizer", self.model.stage_patterns)
        shutil.rmtree(paths.checkpoint_dir, ignore_errors=True)
        return artifact

    def server_env(self) -> dict[str, str]:
        return tool_env()

    def planned_kv_tokens(self, artifact: Path, kv_cache_bytes: int | None) -> int | None:
        """The KV tokens a budget must come out as: kv_cache_config.max_tokens."""
        if kv_cache_bytes is None:
            return None
        from .kv_budget import kv_bytes_per_token, max_tokens_for

        per_token = kv_bytes_per_token(artifact, self.engine.backend.value, self.engine.kv_cache_dtype.value)
        return max_tokens_for(kv_cache_bytes, per_token)

    def server_command(self, artifact: Path, host: str, port: int, kv_cache_bytes: int | None = None,
                       lora: Mapping[str, Any] | None = None, kv_fraction: float | None = None,
                       block_reuse: bool = True) -> list[str]:
        max_tokens = self.planned_kv_tokens(artifact, kv_cache_bytes)
        # One file per budget: copies of a model share the artifact (and so its directory).
        suffix = ("" if max_tokens is None else f".kv{max_tokens}") + ("" if block_reuse else ".noreuse")
        options = artifact.parent / f"{artifact.name}{suffix}.llm_api_options.yaml"
        # JSON is YAML: no yaml dependency needed to write it.
        options.write_text(json.dumps(extra_llm_api_options(self.engine, max_tokens, lora, kv_fraction, block_reuse),
                                      indent=1))
        m = self.model
        if self.engine.backend is Backend.PYTORCH:
            return serve_command(self.engine, artifact, None, host, port, m.max_input_len + m.max_output_len, options,
                                 kv_fraction)
        return serve_command(self.engine, artifact / "engine", artifact / "tokenizer", host, port,
                             m.max_input_len + m.max_output_len, options, kv_fraction)
