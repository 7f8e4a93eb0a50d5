"""Where a LoRA adapter lives on an instance and the integer id its engine process knows it by.

One home for the runtime that stages adapters and the gateway that names them in each request's
`lora_request` (TensorRT-LLM's OpenAI server: `CompletionRequest.lora_request` /
`ChatCompletionRequest.lora_request`, a `tensorrt_llm.executor.request.LoRARequest` with
`lora_name`, `lora_int_id`, `lora_path`; tensorrt_llm/serve/openai_protocol.py). The local root is
mounted at the same path inside the serving container (runtime/host/run-container.sh), so one path
serves both sides (the local root: the instance setting `Var.LOCAL_ROOT`, fleetcast/contract/instance_env.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol


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
    """The staged adapter's directory (the `lora_path` its base model's processes load)."""
    return f"{local_root.rstrip('/')}/adapters/{model_id}/{adapter_id}"


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
