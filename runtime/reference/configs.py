"""Model shapes the reference backend can build and serve (no torch needed to read them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """A GPT-2 family shape. `vocab_size` is the model's (embedding rows); the tokenizer may use fewer ids."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    vocab_size: int
    n_positions: int
    layer_norm_epsilon: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def param_count(self) -> int:
        d, v, p, n = self.n_embd, self.vocab_size, self.n_positions, self.n_layer
        per_layer = (2 * d) + (d * 3 * d + 3 * d) + (d * d + d) + (2 * d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
        return v * d + p * d + n * per_layer + 2 * d  # lm_head is tied to wte

    def kv_slot_bytes(self, max_seq: int, element_size: int) -> int:
        """Bytes one KV cache slot (one sequence of `max_seq` positions) takes in every layer's K and V."""
        return self.n_layer * 2 * self.n_head * max_seq * self.head_dim * element_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# `tiny` runs on a laptop CPU in tests; `wide` too, where a test times prefill work against a loaded machine's
# noise (four times tiny's width: a 192-token prefill costs about 16 times the prefill of a few tokens); the
# others are the public GPT-2 shapes (random weights).
SIZES: dict[str, ModelShape] = {
    "tiny": ModelShape("tiny", n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=256),
    "wide": ModelShape("wide", n_layer=4, n_embd=128, n_head=4, vocab_size=512, n_positions=256),
    "gpt2": ModelShape("gpt2", n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024),
    "gpt2-medium": ModelShape("gpt2-medium", n_layer=24, n_embd=1024, n_head=16, vocab_size=50257, n_positions=1024),
    "gpt2-large": ModelShape("gpt2-large", n_layer=36, n_embd=1280, n_head=20, vocab_size=50257, n_positions=1024),
    "gpt2-xl": ModelShape("gpt2-xl", n_layer=48, n_embd=1600, n_head=25, vocab_size=50257, n_positions=1024),
}


TOKENS_PER_BLOCK = 64  # KV accounting granularity reported in kvCacheStats (trtllm-serve's default block)


def kv_blocks_per_slot(max_seq: int) -> int:
    """The blocks of kvCacheStats one cache slot counts as (the engine's /metrics, runtime/reference/engine.py)."""
    return max_seq // TOKENS_PER_BLOCK or 1


def kv_tokens(budget_bytes: int, shape: ModelShape, max_seq: int, element_size: int) -> int:
    """The KV tokens a budget comes out as, as /metrics reports them (maxNumBlocks x tokensPerBlock): whole
    sequences of `max_seq`, each counted in whole blocks."""
    return budget_bytes // shape.kv_slot_bytes(max_seq, element_size) * kv_blocks_per_slot(max_seq) * TOKENS_PER_BLOCK


def shape_for(size: str) -> ModelShape:
    """The shape named `size`, or ValueError naming the allowed sizes."""
    try:
        return SIZES[size]
    except KeyError:
        raise ValueError(f"size: unknown model size {size!r}; allowed: {', '.join(SIZES)}") from None
