"""Published architecture figures of the models Fleetcast knows, from each checkpoint's config.json: the one home
of them for the planner's roofline estimate (fleetcast/plan/estimate.py) and validate's KV-room warning
(fleetcast/config/kv_room.py).

kv_width is what one layer stores per token for keys (values the same): num_key_value_heads x head_dim
(GPT-2: n_embd, one KV head per attention head).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import ModelSpec


@dataclass(frozen=True)
class ModelShape:
    params: float
    layers: int
    kv_width: int  # per layer, keys (values the same): n_kv_heads * head_dim


# Public architecture figures (config.json of each checkpoint).
MODEL_SHAPES = {
    "gpt2": ModelShape(124e6, 12, 768),
    "gpt2-medium": ModelShape(355e6, 24, 1024),
    "gpt2-large": ModelShape(774e6, 36, 1280),
    "gpt2-xl": ModelShape(1.558e9, 48, 1600),
    "llama-3.2-1b": ModelShape(1.236e9, 16, 512),
    "llama-3.2-3b": ModelShape(3.213e9, 28, 1024),
    "phi-3-mini": ModelShape(3.821e9, 32, 3072),
    # Qwen/Qwen2.5-0.5B: num_hidden_layers 24, num_key_value_heads 2, hidden_size 896 / 14 heads = head_dim 64.
    "qwen2.5-0.5b": ModelShape(0.494e9, 24, 128),
    "qwen2.5-1.5b": ModelShape(1.544e9, 28, 256),
    # Qwen/Qwen2.5-3B: num_hidden_layers 36, num_key_value_heads 2, hidden_size 2048 / 16 heads = head_dim 128.
    "qwen2.5-3b": ModelShape(3.086e9, 36, 256),
}

# Hub repository names carry variants of one architecture (Qwen2.5-0.5B-Instruct is Qwen2.5-0.5B's shape).
_VARIANT_SUFFIXES = ("-instruct", "-chat", "-it", "-base")


def shape_of(model: ModelSpec) -> ModelShape | None:
    """The figures of a config's model: by its hub source's repository name (openai-community/gpt2-xl ->
    gpt2-xl, Qwen/Qwen2.5-0.5B-Instruct -> qwen2.5-0.5b), else by its id; None when neither is known."""
    names = [] if model.staged else [model.source.rsplit("/", 1)[-1].lower()]
    names.append(model.id.rsplit("/", 1)[-1].lower())
    for name in names:
        for suffix in ("", *_VARIANT_SUFFIXES):
            if suffix and not name.endswith(suffix):
                continue
            shape = MODEL_SHAPES.get(name.removesuffix(suffix) if suffix else name)
            if shape is not None:
                return shape
    return None
