"""Which model family x backend x precision x KV-cache dtype x GPU architecture runs (TensorRT-LLM 1.2.x).

One function, `check`, decides. The config validator (fleetcast/config/rules.py), the
instance runtime (runtime/trtllm.py) and the planner (fleetcast/plan/solver.py) call it
and quote its reason, so a config that validates is one the instance accepts.

Values are the config's strings (`Precision.value` etc.): this module is stdlib-only
and imports nothing of the project. tests/contract/test_support.py checks every fact
below against the TensorRT-LLM 1.2.x source it comes from:

- precision per architecture: docs/source/features/quantization.md ("Hardware Support
  Matrix": FP8 from Ada sm89 on, NVFP4 on Blackwell only) and
  docs/source/reference/support-matrix.md (Ampere: FP16/BF16/INT8/INT4, no FP8).
  INT8/INT4 modes on sm120 are absent from that table, so they stay refused.
- KV cache on the TensorRT (engine) backend: convert_checkpoint.py of GPT offers only
  `--int8_kv_cache`; an FP8 KV cache comes from quantize.py `--qformat fp8
  --kv_cache_dtype fp8`, the path the runtime takes for precision fp8 only
  (examples/models/core/gpt/convert_checkpoint.py, examples/quantization/quantize.py).
  `TrtLlmArgs.validate_kv_cache_dtype` asserts `kv_cache_config.dtype == "auto"`: the
  engine carries its KV dtype (tensorrt_llm/llmapi/llm_args.py).
- KV cache on the PyTorch backend: `TorchLlmArgs.sync_quant_config_with_kv_cache_config_dtype`
  maps `kv_cache_config.dtype == "fp8"` to `QuantAlgo.FP8` and only warns on anything
  else, so int8 would be ignored (tensorrt_llm/llmapi/llm_args.py).
- refused for want of a source (issue 25 §5; lift each only with a measured run and its source):
  the engine flow on sm120 (g7e) - support-matrix.md and quantization.md list sm120 only for the
  quantization formats of the PyTorch path (NVFP4, MXFP4, FP8), and no 1.2.x document, example
  or test builds an engine there; fp8 weights with an INT8 KV cache on the engine flow -
  quantize.py accepts `--qformat fp8 --kv_cache_dtype int8`, but no 1.2.x document or test
  pairs them (the GPT example and the quantization docs pair fp8 with an fp8 KV cache).
- backends per family: GPT-2 is an engine-flow model (examples/models/core/gpt); the
  PyTorch backend serves Llama/Phi-3/Qwen2 from Hugging Face checkpoints and has no
  INT8 SmoothQuant/weight-only path; FP8/NVFP4 there come pre-quantized (ModelOpt).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

TENSORRT_LLM_LINE = "1.2"

FAMILIES = ("gpt2", "llama", "phi3", "qwen2")
BACKENDS = ("tensorrt", "pytorch")
PRECISIONS = ("fp16", "bf16", "int8_wo", "int8_sq", "fp8", "int4_wo", "nvfp4")
KV_CACHE_DTYPES = ("auto", "int8", "fp8")

BACKENDS_BY_FAMILY: dict[str, frozenset[str]] = {
    "gpt2": frozenset({"tensorrt"}),
    "llama": frozenset({"pytorch"}),
    "phi3": frozenset({"pytorch"}),
    "qwen2": frozenset({"pytorch"}),
}
PRECISIONS_BY_BACKEND: dict[str, frozenset[str]] = {
    "tensorrt": frozenset({"fp16", "bf16", "int8_wo", "int8_sq", "int4_wo", "fp8"}),
    "pytorch": frozenset({"fp16", "bf16", "fp8", "nvfp4"}),
}
PRECISIONS_BY_ARCH: dict[str, frozenset[str]] = {
    "sm86": frozenset({"fp16", "bf16", "int8_wo", "int8_sq", "int4_wo"}),
    "sm89": frozenset({"fp16", "bf16", "int8_wo", "int8_sq", "int4_wo", "fp8"}),
    "sm90": frozenset({"fp16", "bf16", "int8_wo", "int8_sq", "int4_wo", "fp8"}),
    "sm120": frozenset({"fp16", "bf16", "fp8", "nvfp4"}),
}
KV_CACHE_BY_ARCH: dict[str, frozenset[str]] = {
    "sm86": frozenset({"auto", "int8"}),
    "sm89": frozenset({"auto", "int8", "fp8"}),
    "sm90": frozenset({"auto", "int8", "fp8"}),
    "sm120": frozenset({"auto", "fp8"}),
}
KV_CACHE_BY_BACKEND: dict[str, frozenset[str]] = {
    "tensorrt": frozenset({"auto", "int8", "fp8"}),
    "pytorch": frozenset({"auto", "fp8"}),
}
# Engine flow: which KV cache each precision's build path can produce. convert_checkpoint.py
# (every precision but fp8) has --int8_kv_cache only; quantize.py (fp8) takes int8 or fp8, but
# fp8 weights with an INT8 KV cache have no source (above). INT8 KV with INT4 weight-only is not
# offered: unverified on this flow. Both are refused at validation rather than at boot.
TENSORRT_KV_BY_PRECISION: dict[str, frozenset[str]] = {
    "fp16": frozenset({"auto", "int8"}),
    "bf16": frozenset({"auto", "int8"}),
    "int8_wo": frozenset({"auto", "int8"}),
    "int8_sq": frozenset({"auto", "int8"}),
    "int4_wo": frozenset({"auto"}),
    "fp8": frozenset({"auto", "fp8"}),
}
# Why a pairing the build scripts would accept is still refused: no source says 1.2.x runs it.
TENSORRT_KV_UNSOURCED: dict[tuple[str, str], str] = {
    ("fp8", "int8"): "quantize.py accepts --qformat fp8 --kv_cache_dtype int8, but no TensorRT-LLM 1.2.x document or "
                     "test pairs fp8 weights with an INT8 KV cache; refused until measured",
}
# GPU architectures the TensorRT engine flow (trtllm-build) is known to build for in 1.2.x.
TENSORRT_ARCHS = frozenset({"sm86", "sm89", "sm90"})
TENSORRT_ARCH_REASON = "no TensorRT-LLM 1.2.x source says the engine flow builds for this architecture; refused until measured"


@dataclass(frozen=True)
class Refusal:
    """Why a combination does not run: the engine field to change, and the reason."""

    field: str  # "backend" | "precision" | "kv_cache_dtype" | "gpu"
    reason: str

    def __str__(self) -> str:
        return f"{'GPU' if self.field == 'gpu' else 'engine.' + self.field}: {self.reason}"


def arch_for_compute_capability(cc: str) -> str:
    """'8.9' -> 'sm89' (nvidia-smi's compute_cap)."""
    major, minor = cc.split(".")
    return f"sm{major}{minor}"


def instance_where(instance_type: str, gpu_name: str, arch: str) -> str:
    """How validator and planner name a pool's GPU in a reason (the same words in both)."""
    return f"{instance_type} ({gpu_name}, {arch})"


def _listed(values: Iterable[str]) -> str:
    return ", ".join(sorted(values)) or "none"


def check(family: str | None, backend: str | None, precision: str, kv_cache_dtype: str, arch: str,
          where: str = "") -> Refusal | None:
    """The first rule the combination breaks, or None when TensorRT-LLM 1.2.x runs it.

    `family`/`backend` may be None where the caller does not know them (a planner curve
    measured on an unknown backend): rules that need them are skipped. `where` names the
    GPU in the caller's words (see instance_where).
    """
    where = where or arch
    if family is not None:
        backends = BACKENDS_BY_FAMILY.get(family, frozenset())
        if backend is None and len(backends) == 1:
            backend = next(iter(backends))
        elif backend is not None and backend not in backends:
            return Refusal("backend", f"{family} models run on the {_listed(backends)} backend only, "
                                      f"not {backend} (TensorRT-LLM {TENSORRT_LLM_LINE}.x)")
    if arch not in PRECISIONS_BY_ARCH:
        return Refusal("gpu", f"{where} is not a supported architecture; supported: {_listed(PRECISIONS_BY_ARCH)}")
    if precision not in PRECISIONS_BY_ARCH[arch]:
        return Refusal("precision", f"{precision} is not supported on {where}; "
                                    f"allowed there: {_listed(PRECISIONS_BY_ARCH[arch])}")
    if backend is not None and precision not in PRECISIONS_BY_BACKEND[backend]:
        return Refusal("precision", f"{precision} is not available on the {backend} backend; "
                                    f"allowed: {_listed(PRECISIONS_BY_BACKEND[backend])}")
    if kv_cache_dtype not in KV_CACHE_BY_ARCH[arch]:
        return Refusal("kv_cache_dtype", f"{kv_cache_dtype} KV cache is not supported on {where}; "
                                         f"allowed there: {_listed(KV_CACHE_BY_ARCH[arch])}")
    if backend is not None and kv_cache_dtype not in KV_CACHE_BY_BACKEND[backend]:
        return Refusal("kv_cache_dtype", f"{kv_cache_dtype} KV cache is not available on the {backend} backend; "
                                         f"allowed: {_listed(KV_CACHE_BY_BACKEND[backend])}")
    if backend == "tensorrt" and kv_cache_dtype not in TENSORRT_KV_BY_PRECISION[precision]:
        why = TENSORRT_KV_UNSOURCED.get((precision, kv_cache_dtype))
        return Refusal("kv_cache_dtype", f"{kv_cache_dtype} KV cache is not built with precision {precision} on the "
                                         f"tensorrt backend{f' ({why})' if why else ''}; with {precision} use "
                                         f"{_listed(TENSORRT_KV_BY_PRECISION[precision])}")
    if backend == "tensorrt" and arch not in TENSORRT_ARCHS:
        return Refusal("gpu", f"the tensorrt backend is not supported on {where}: {TENSORRT_ARCH_REASON} "
                              f"(engine-flow architectures: {_listed(TENSORRT_ARCHS)})")
    return None


def needs_calibration(backend: str, precision: str, kv_cache_dtype: str) -> bool:
    """Engine-flow builds that read a calibration set: SmoothQuant, FP8, and any quantized KV cache.

    The PyTorch backend never calibrates: FP8/NVFP4 arrive pre-quantized and an FP8 KV
    cache is set by kv_cache_config.dtype.
    """
    return backend == "tensorrt" and (precision in ("int8_sq", "fp8") or kv_cache_dtype != "auto")
