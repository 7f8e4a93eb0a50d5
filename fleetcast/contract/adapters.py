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
