"""Where a LoRA adapter lives on an instance and the integer id its engine process knows it by.

One home for the runtime that stages adapters and the gateway that names them in each request's
`lora_request` (TensorRT-LLM's OpenAI server: `CompletionRequest.lora_request` /
`ChatCompletionRequest.lora_request`, a `tensorrt_llm.executor.request.LoRARequest` with
`lora_name`, `lora_int_id`, `lora_path`; tensorrt_llm/serve/openai_protocol.py). The local root is
mounted at the same path inside the serving container (runtime/host/run-container.sh), so one path
serves both sides (the local root: the instance setting `Var.LOCAL_ROOT`, fleetcast/contract/instance_env.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .model_ids import model_slug
from .serving import GIB


# Read-only members, so the config's frozen models (fleetcast/config/model.py) satisfy them.
class _Adapter(Protocol):
    @property
    def id(self) -> str: ...


class _Model(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def adapters(self) -> Sequence[_Adapter]: ...


def adapter_dir(local_root: str, model_id: str, adapter_id: str) -> str:
    """The staged adapter's directory (the `lora_path` its base model's processes load): one segment per id, each
    its slug (fleetcast/contract/model_ids.py)."""
    return f"{local_root.rstrip('/')}/adapters/{model_slug(model_id)}/{model_slug(adapter_id)}"


def lora_int_ids(models: Iterable[_Model]) -> dict[str, int]:
    """adapter id -> its `lora_int_id`: 1, 2, ... in config order over every model's adapters.

    Deterministic from the validated config, so every instance and every process agrees; 0 is left
    unused (the engine's LoRA cache keys adapters by this id, and 0 reads as "no adapter" elsewhere).
    """
    ids: dict[str, int] = {}
    for model in models:
        for adapter in model.adapters:
            ids[adapter.id] = len(ids) + 1
    return ids


# ---------------------------------------------------------------- staged adapters and the engine's LoRA options

# A PEFT adapter directory (what `fleetcast stage adapter` takes and instances load): its config, and its
# weights in one of the two names TensorRT-LLM's HF LoRA loader looks for (tensorrt_llm/lora_manager.py,
# HfLoraLoader: adapter_config.json, get_model_path(lora_dir, "adapter_model") -> .safetensors or .bin).
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")

# TensorRT-LLM module name -> Hugging Face module name, as
# tensorrt_llm/lora_helper.py get_default_trtllm_modules_to_hf_modules() (1.2.x) has it. The PyTorch
# backend uses this mapping when LoraConfig.trtllm_modules_to_hf_modules is empty
# (tensorrt_llm/_torch/pyexecutor/_util.py), so an adapter's PEFT target_modules are these HF names.
TRTLLM_TO_HF_MODULES = {
    "attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_dense": "o_proj",
    "mlp_h_to_4h": "gate_proj", "mlp_4h_to_h": "down_proj", "mlp_gate": "up_proj", "mlp_gate_up": "gate_up_proj",
    "moe_h_to_4h": "w1", "moe_4h_to_h": "w2", "moe_gate": "w3", "moe_router": "gate",
}
HF_TO_TRTLLM_MODULES = {hf: trtllm for trtllm, hf in TRTLLM_TO_HF_MODULES.items()}

# The staged manifest's `extra` keys: what stage time read from adapter_config.json, so instances need no guess.
RANK_KEY = "lora_rank"
MODULES_KEY = "lora_target_modules"


class AdapterConfigError(ValueError):
    """adapter_config.json is not a LoRA adapter TensorRT-LLM's PyTorch backend can load per request."""


def adapter_shape(config_text: str | bytes, where: str) -> tuple[int, tuple[str, ...]]:
    """(rank, TensorRT-LLM target modules) of a PEFT LoRA adapter, from its adapter_config.json.

    PEFT writes `r` (the rank) and `target_modules` (the HF module names it adapts); TensorRT-LLM sizes its
    LoRA cache from LoraConfig.max_lora_rank and lora_target_modules (tensorrt_llm/lora_helper.py), so both
    are read here once, at stage time, and refused with the reason where the engine could not load them.
    """
    import json

    try:
        config = json.loads(config_text)
    except ValueError as exc:
        raise AdapterConfigError(f"{where}: {ADAPTER_CONFIG} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterConfigError(f"{where}: {ADAPTER_CONFIG} is not a JSON object")
    peft_type = config.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise AdapterConfigError(f"{where}: peft_type {peft_type!r}; allowed: LORA (TensorRT-LLM serves LoRA "
                                 "adapters per request, not other PEFT methods)")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise AdapterConfigError(f"{where}: r (the LoRA rank) is {rank!r}; allowed: a positive integer")
    modules = config.get("target_modules")
    if isinstance(modules, str):
        raise AdapterConfigError(
            f"{where}: target_modules is the pattern {modules!r}; allowed: a list of module names "
            f"({', '.join(sorted(HF_TO_TRTLLM_MODULES))}), which TensorRT-LLM maps to its own")
    if not isinstance(modules, list) or not modules or not all(isinstance(m, str) for m in modules):
        raise AdapterConfigError(f"{where}: target_modules is {modules!r}; allowed: a non-empty list of module names")
    unknown = sorted(set(modules) - set(HF_TO_TRTLLM_MODULES))
    if unknown:
        raise AdapterConfigError(
            f"{where}: target_modules {', '.join(unknown)} have no TensorRT-LLM LoRA module (the PyTorch backend maps "
            f"only {', '.join(sorted(HF_TO_TRTLLM_MODULES))}; tensorrt_llm/lora_helper.py)")
    return rank, tuple(sorted({HF_TO_TRTLLM_MODULES[m] for m in modules}))


def lora_config(shapes: Sequence[tuple[int, Sequence[str]]]) -> dict[str, object]:
    """The `lora_config` of a base model's engine process serving adapters of these (rank, modules) shapes.

    TensorRT-LLM 1.2.x, PyTorch backend (tensorrt_llm/llmapi/llm_args.py BaseLlmArgs.lora_config, a
    tensorrt_llm/lora_helper.py LoraConfig): with lora_dir not exactly one directory, lora_target_modules
    must name at least one module (tensorrt_llm/_torch/pyexecutor/_util.py asserts it), and adapters then
    load per request from each request's lora_request.lora_path. max_lora_rank (default 64) sizes the LoRA
    cache, so it is the largest rank staged; max_loras / max_cpu_loras (GPU and host LoRA cache slots) hold
    every adapter of the model, so none is evicted and reloaded between requests.
    """
    if not shapes:
        raise ValueError("no adapters")
    return {
        "lora_dir": [],
        "max_lora_rank": max(rank for rank, _ in shapes),
        "lora_target_modules": sorted({m for _, modules in shapes for m in modules}),
        "max_loras": len(shapes),
        "max_cpu_loras": len(shapes),
    }


# ---------------------------------------------------------------- the LoRA device cache, sized as TensorRT-LLM sizes it

# GPU memory each engine process of a model with adapters sets aside for its LoRA device cache: the one figure
# `config validate` counts (it cannot know the adapters' ranks and modules, which only staging reads, nor the base
# model's dimensions) and the bound the instance sizes the cache within (lora_cache_plan): max_loras is as many
# max-sized adapters as fit in it, at most every adapter of the model. A design figure, not a measured one: it
# holds 3 rank-64 adapters over all 7 modules of a 1.5B Qwen2 model and one of an 8B Llama.
LORA_DEVICE_RESERVE_BYTES = 1 * GIB

# PeftCacheConfig defaults (tensorrt_llm/llmapi/llm_args.py, 1.2.x); the runtime leaves them as they are.
PEFT_OPTIMAL_ADAPTER_SIZE = 8
PEFT_MAX_ADAPTER_SIZE = 64

_ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "half": 2, "float": 4}


class ModelDimsError(ValueError):
    """The base model's config.json does not say what sizing its LoRA cache needs."""


@dataclass(frozen=True)
class ModelDims:
    """What TensorRT-LLM's PyTorch backend sizes LoRA modules from: its model's binding config
    (hidden_size, mlp_hidden_size, num_heads, num_kv_heads, head_size, data type) and layer count."""

    layers: int
    hidden: int
    mlp_hidden: int
    heads: int
    kv_heads: int
    head_size: int
    element_bytes: int


def _positive(config: Mapping[str, object], *names: str) -> int | None:
    for name in names:
        value = config.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def model_dims(config: Mapping[str, object], where: str) -> ModelDims:
    """The dimensions of a Hugging Face checkpoint's config.json (Llama/Qwen2/Phi-3 names, or GPT-2's, which the
    reference backend's artifacts use), read as the PyTorch backend's ModelConfig.get_bindings_model_config reads
    them (tensorrt_llm/_torch/model_config.py): intermediate_size, num_key_value_heads (default the attention
    heads), head_size or head_dim (default hidden / heads), the data type from torch_dtype."""
    layers = _positive(config, "num_hidden_layers", "n_layer")
    hidden = _positive(config, "hidden_size", "n_embd")
    heads = _positive(config, "num_attention_heads", "n_head")
    if not (layers and hidden and heads):
        raise ModelDimsError(f"{where}: names no layer count, hidden size and attention heads "
                             "(num_hidden_layers, hidden_size, num_attention_heads), which size the LoRA cache")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float16").lower().removeprefix("torch.")
    if dtype not in _ELEMENT_BYTES:
        raise ModelDimsError(f"{where}: torch_dtype {dtype!r}; the LoRA cache is sized for "
                             f"{', '.join(sorted(_ELEMENT_BYTES))}")
    return ModelDims(
        layers=layers, hidden=hidden, heads=heads,
        mlp_hidden=_positive(config, "intermediate_size", "n_inner") or 4 * hidden,  # GPT-2: n_inner null = 4 x hidden
        kv_heads=_positive(config, "num_key_value_heads") or heads,
        head_size=_positive(config, "head_size", "head_dim") or hidden // heads,
        element_bytes=_ELEMENT_BYTES[dtype])


def module_dims(module: str, dims: ModelDims) -> tuple[int, int]:
    """(in, out) of a TensorRT-LLM LoRA module at tensor parallelism 1: LoraModule::createLoraModules
    (cpp/tensorrt_llm/runtime/loraModule.cpp)."""
    q_out, kv_out = dims.heads * dims.head_size, dims.kv_heads * dims.head_size
    table = {
        "attn_q": (dims.hidden, q_out), "attn_k": (dims.hidden, kv_out), "attn_v": (dims.hidden, kv_out),
        "attn_dense": (dims.hidden, dims.hidden),
        "mlp_h_to_4h": (dims.hidden, dims.mlp_hidden), "mlp_gate": (dims.hidden, dims.mlp_hidden),
        "mlp_4h_to_h": (dims.mlp_hidden, dims.hidden), "mlp_gate_up": (dims.hidden, 2 * dims.mlp_hidden),
    }
    if module not in table:
        raise ModelDimsError(f"LoRA module {module}: no dense-model size; allowed: {', '.join(table)}")
    return table[module]


def missing_qkv_modules(modules: Sequence[str]) -> list[str]:
    """tensorrt_llm/lora_helper.py get_missing_qkv_modules_from_lora_modules: q, k and v go together, the engine
    fills the ones an adapter lacks with zeros, so they are counted in the cache."""
    qkv = ("attn_q", "attn_k", "attn_v")
    return [m for m in qkv if m not in modules] if any(m in modules for m in qkv) else []


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def lora_device_cache_bytes(dims: ModelDims, modules: Sequence[str], max_lora_rank: int, max_loras: int) -> int:
    """GPU bytes of the LoRA device cache TensorRT-LLM 1.2.x allocates for `max_loras` adapters, PyTorch backend.

    tensorrt_llm/_torch/pyexecutor/_util.py create_py_executor_instance: with lora_config.max_loras set,
    peft_cache_config.num_device_module_layer = max_lora_rank x num_hidden_layers x (target + missing q/k/v
    modules) x max_loras, which overrides device_cache_percent (a share of the GPU memory free when the process
    starts, the start-order dependence this avoids). cpp/tensorrt_llm/batch_manager/peftCacheManager.cpp then
    gives the cache ceil(slots / slots per page) pages of slots-per-page x page-width elements of the model's data
    type (getMaxNumSlots, getPageManagerConfig), with page width the smallest module's in + out.
    """
    if max_loras < 1 or max_lora_rank < 1 or not modules:
        raise ValueError("a LoRA cache needs at least one adapter, a positive rank and one module")
    one_d = [sum(module_dims(m, dims)) for m in modules]
    page_width, widest = min(one_d), max(one_d)
    optimal = min(PEFT_OPTIMAL_ADAPTER_SIZE, max_lora_rank)  # PeftCacheManager's constructor caps both at the rank
    largest = min(PEFT_MAX_ADAPTER_SIZE, max_lora_rank)
    slots_per_page = max(dims.layers * sum(optimal * _ceil_div(d, page_width) for d in one_d),
                         _ceil_div(largest * widest, page_width))
    module_layers = max_lora_rank * dims.layers * (len(modules) + len(missing_qkv_modules(modules))) * max_loras
    pages = _ceil_div(device_slots(module_layers, widest, page_width), slots_per_page)
    return pages * slots_per_page * page_width * dims.element_bytes


def device_slots(num_device_module_layer: int, widest: int, page_width: int) -> int:
    """PeftCacheManager::getMaxNumSlots with num_device_module_layer > 0: that many max-sized module layers, each
    ceil(widest module's in + out / page width) slots (the free-memory share is read only when it is 0)."""
    return num_device_module_layer * _ceil_div(widest, page_width)


def lora_cache_plan(dims: ModelDims, shapes: Sequence[tuple[int, Sequence[str]]],
                    reserve_bytes: int = LORA_DEVICE_RESERVE_BYTES) -> tuple[dict[str, object], int]:
    """The `lora_config` of a model's processes and the bytes of its LoRA device cache, within `reserve_bytes`.

    Every adapter stays in the host cache (max_cpu_loras); the device cache holds as many max-sized adapters as
    the reserve does, at most all of them (a request for one not on the device waits for a slot). Raises
    ModelDimsError, naming the figures, when not even one fits.
    """
    options = lora_config(shapes)
    rank, modules = int(options["max_lora_rank"]), list(options["lora_target_modules"])  # type: ignore[call-overload]
    for count in range(len(shapes), 0, -1):
        size = lora_device_cache_bytes(dims, modules, rank, count)
        if size <= reserve_bytes:
            return {**options, "max_loras": count}, size
    one = lora_device_cache_bytes(dims, modules, rank, 1)
    raise ModelDimsError(
        f"one LoRA adapter at max_lora_rank {rank} over {', '.join(modules)} takes {one / GIB:.2f} GiB of LoRA device "
        f"cache on this model ({dims.layers} layers, hidden {dims.hidden}), above the {reserve_bytes / GIB:.2f} GiB "
        "each process sets aside (LORA_DEVICE_RESERVE_BYTES); allowed: adapters of a lower rank or fewer modules")
