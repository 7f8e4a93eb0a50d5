"""KV-cache budgets that do not depend on the order processes start in.

TensorRT-LLM sizes a process's KV cache as `free_gpu_memory_fraction` times the GPU memory free
when that process's executor starts, so with several processes on one GPU the second gets a
fraction of what the first left (measured with the reference backend, which does the same with
--kv-cache-free-gpu-memory-fraction: 68.9 GiB then 31.1 GiB, or 66.5 then 33.7 in the other order;
bench/data/h200-colocate.json). Each process therefore gets an explicit budget in bytes, passed
as the knob TensorRT-LLM 1.2.x honours on both backends, `kv_cache_config.max_tokens`:

- engine flow (`--backend tensorrt`, the C++ executor): `BaseKVCacheManager::calculateMaxNumBlocks`
  (cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp) computes tokens = fraction x free memory /
  KV bytes per token and, when `maxTokens` is set, takes the smaller of the two;
- PyTorch backend: `KvCacheCreator.configure_kv_cache_capacity`
  (tensorrt_llm/_torch/pyexecutor/_util.py) takes the smaller of its fraction-based estimate and
  `max_tokens` x KV size per token.

Both take the smaller of `max_tokens` and `free_gpu_memory_fraction` x the memory free when the process sizes
its cache, and that free memory counts every other process on the GPU: a fraction that is the smaller one
leaves the process short of its plan (the processes started last, on a shared GPU). So a process with a
budget is given the highest fraction the config allows (fleetcast.config.memory.binding_fraction, which the
validator checks budgets against too), and `check_budgets_bind` refuses
a plan where even that could be the smaller in some start order, with the arithmetic; after start,
runtime/serve.py compares each process's KV cache with its plan and names a short one.

`kv_cache_config.max_gpu_total_bytes` exists too, but only the PyTorch backend reads it: the C++
executor's `KvCacheConfig` carries `maxGpuTotalBytes` and `calculateMaxNumBlocks` never reads it.
The fraction stays in the options as a cap, so a budget larger than what is free degrades to
today's behaviour instead of failing an allocation. tests/runtime/test_kv_budget.py records the
sources.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fleetcast.contract.errors import UserError
from fleetcast.contract.serving import (
    GIB,
    PROCESS_OVERHEAD_BYTES,
    kv_bytes_per_token as kv_bytes_per_token_of,
    mps_client_limit,
)

if TYPE_CHECKING:  # annotations only
    from fleetcast.contract.serving import ProcessSlot

_KV_ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "int8": 1}


def _first(config: Mapping[str, object], *names: str) -> int | None:
    for name in names:
        value = config.get(name)
        if isinstance(value, int) and value > 0:
            return value
    return None


def kv_bytes_per_token(artifact: Path, backend: str, kv_cache_dtype: str) -> int:
    """KV-cache bytes one token takes in every layer: 2 (K and V) x layers x KV heads x head size x
    element size, read from the artifact's config (the engine's for the engine flow, the Hugging
    Face checkpoint's for the PyTorch backend)."""
    path = artifact / "engine" / "config.json" if backend == "tensorrt" else artifact / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"kv_cache_gb: cannot size the KV cache, {path} is unreadable ({exc})") from None
    config = raw.get("pretrained_config", raw) if isinstance(raw, dict) else {}
    layers = _first(config, "num_hidden_layers", "n_layer")
    heads = _first(config, "num_attention_heads", "n_head")
    hidden = _first(config, "hidden_size", "n_embd")
    kv_heads = _first(config, "num_key_value_heads") or heads
    head_size = _first(config, "head_size", "head_dim") or (hidden // heads if hidden and heads else None)
    if not (layers and kv_heads and head_size):
        raise UserError(f"kv_cache_gb: cannot size the KV cache, {path} names no layer count, heads and head size")
    quant = config.get("quantization") or {}
    kv_quant = str(quant.get("kv_cache_quant_algo") or "").lower()
    if kv_cache_dtype in ("int8", "fp8") or kv_quant in ("int8", "fp8"):
        element = 1
    else:
        dtype = str(config.get("dtype") or config.get("torch_dtype") or "float16").lower()
        element = _KV_ELEMENT_BYTES.get(dtype, 2)
    return kv_bytes_per_token_of(layers, kv_heads * head_size, element)


def max_tokens_for(budget_bytes: int, per_token: int) -> int:
    """`kv_cache_config.max_tokens` for a budget: whole tokens, at least one."""
    tokens = budget_bytes // per_token
    if tokens < 1:
        raise UserError(f"kv_cache_gb: {budget_bytes} bytes hold no token of this model ({per_token} bytes each)")
    return tokens


def process_bytes(weights: int, kv: int, lora: int = 0, overhead: int = PROCESS_OVERHEAD_BYTES) -> int:
    """GPU memory one engine process holds: its weights, the per-process overhead, its LoRA device cache and
    its KV budget (the sum plan_budgets counts)."""
    return weights + overhead + lora + kv


def overhead_of(overhead_bytes: int | Mapping[str, int], model_id: str) -> int:
    """A model's per-process overhead: one figure for every model, or each model's own (the validator's
    fleetcast.config.memory.process_overhead, which counts a backend's activations and CUDA graphs)."""
    if isinstance(overhead_bytes, int):
        return overhead_bytes
    return overhead_bytes.get(model_id, PROCESS_OVERHEAD_BYTES)


def check_budgets_bind(slots: Sequence[ProcessSlot], budgets: Mapping[tuple[str, int], int | None],
                       weights_bytes: Mapping[str, int], free_bytes: int, fraction: float,
                       overhead_bytes: int | Mapping[str, int] = PROCESS_OVERHEAD_BYTES,
                       lora_bytes: Mapping[str, int] | None = None) -> None:
    """Refuse, with the arithmetic, a plan where a process's budget could exceed `fraction` x the memory free
    when it sizes its KV cache, in the worst start order: every other process already holding its whole share
    (weights, overhead, LoRA cache, KV) and this one its weights, overhead and LoRA cache. Then no start order
    makes the fraction the smaller one, and every process gets its max_tokens."""
    lora = lora_bytes or {}
    held = {(s.model_id, s.copy_index): process_bytes(weights_bytes.get(s.model_id, 0), budgets.get(
        (s.model_id, s.copy_index)) or 0, lora.get(s.model_id, 0), overhead_of(overhead_bytes, s.model_id))
        for s in slots}
    for s in slots:
        key = (s.model_id, s.copy_index)
        budget = budgets.get(key)
        if budget is None:
            continue
        own = weights_bytes.get(s.model_id, 0) + overhead_of(overhead_bytes, s.model_id) + lora.get(s.model_id, 0)
        others = sum(v for k, v in held.items() if k != key)
        worst_free = free_bytes - others - own
        if fraction * worst_free < budget:
            raise UserError(
                f"kv_cache_gb: {s.model_id}#{s.copy_index}'s KV budget of {budget / GIB:.2f} GiB cannot bind: started last, it would "
                f"find {free_bytes / GIB:.2f} GiB free - {others / GIB:.2f} GiB held by the other processes - "
                f"{own / GIB:.2f} GiB of its own weights and overhead = {worst_free / GIB:.2f} GiB, and TensorRT-LLM "
                f"takes min(max_tokens, {fraction:g} x that = {fraction * max(worst_free, 0) / GIB:.2f} GiB); "
                "give the processes smaller kv_cache_gb budgets or serve fewer copies")


def mps_memory_limit(weights: int, kv: int, fraction: float, lora: int = 0,
                     overhead: int = PROCESS_OVERHEAD_BYTES) -> int:
    """CUDA_MPS_PINNED_DEVICE_MEM_LIMIT of a process under MPS: its planned share (weights + overhead + LoRA + KV)
    with its part of the validator's headroom, and at least room for the fraction it is given
    (fleetcast.contract.serving.mps_client_limit, the rule the validator checks the packing with)."""
    return mps_client_limit(process_bytes(weights, kv, lora, overhead), kv, fraction)


def plan_budgets(slots: Sequence[ProcessSlot], explicit: Mapping[str, int | None], weights_bytes: Mapping[str, int],
                 free_bytes: int, fraction: float, overhead_bytes: int | Mapping[str, int] = PROCESS_OVERHEAD_BYTES,
                 lora_bytes: Mapping[str, int] | None = None) -> dict[tuple[str, int], int | None]:
    """Budget in bytes per (model id, copy index); None leaves the engine's fraction in charge.

    A slot whose model has an explicit budget (`kv_cache_gb`) gets it. With one process and no
    budget, the engine's own fraction decides, as before. Otherwise the processes without a budget
    share equally what `fraction` of the memory free before the first start leaves once every
    process's weights, overhead, LoRA device cache (`lora_bytes`, per process of a model with adapters:
    fleetcast.contract.adapters.lora_cache_plan) and explicit budget are counted, which no start order changes.
    """
    keys = [(s.model_id, s.copy_index) for s in slots]
    if len(slots) == 1 and explicit.get(slots[0].model_id) is None:
        return {keys[0]: None}
    missing = [s for s in slots if explicit.get(s.model_id) is None]
    fixed = sum(explicit.get(s.model_id) or 0 for s in slots)
    lora = lora_bytes or {}
    fixed += sum(process_bytes(weights_bytes.get(s.model_id, 0), 0, lora.get(s.model_id, 0),
                               overhead_of(overhead_bytes, s.model_id)) for s in slots)
    usable = int(fraction * free_bytes)
    share = (usable - fixed) // len(missing) if missing else 0
    if missing and share <= 0:
        names = ", ".join(sorted({s.model_id for s in missing}))
        raise UserError(
            f"kv_cache_gb: nothing is left for the KV cache of {names}: {fraction:g} x {free_bytes / GIB:.1f} GiB "
            f"free = {usable / GIB:.1f} GiB, and weights + the per-process overhead + LoRA caches "
            f"+ explicit budgets take {fixed / GIB:.1f} GiB; give every model a kv_cache_gb or serve fewer copies")
    return {(s.model_id, s.copy_index): explicit.get(s.model_id) or share for s in slots}


def artifact_bytes(artifact: Path) -> int:
    """Bytes of an artifact's files on disk: the weights a process loads, within a few KB of config."""
    return sum(p.stat().st_size for p in artifact.rglob("*") if p.is_file())
