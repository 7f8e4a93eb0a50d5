"""Prefix cache of the reference engine: KV blocks of prompts already prefilled, reused by later prompts.

As TensorRT-LLM's KV cache manager does, a prompt is cut into blocks of TOKENS_PER_BLOCK tokens and each full
block is keyed by a hash chain: a block's key covers its tokens and its parent's key, and the first block's
key also covers the request's `cache_salt` (cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp,
BlockKeyHasher::hash mixes cacheSaltID in only where parentHash == 0). Two prompts reuse each other's blocks
only as far as their tokens agree from the start and only when their salts are equal, so a caller whose
requests carry another salt never finds a block this one computed.

A request reuses the longest chain of cached blocks that leaves at least one prompt token to compute (the last
position's logits give the first output token), and its prefill then runs only over the rest: the time saved is
real prefill work skipped. The engine keeps its static per-slot cache, so reused blocks are copied from a pool of
their own into the slot; the pool evicts the least recently used blocks when full.
"""

from __future__ import annotations

import collections
import hashlib

import torch

from .model import KVCache

NO_SALT = b"\x00"  # a salted first block never shares a key with an unsalted one (salts are prefixed b"\x01")


def block_keys(prompt: list[int], salt: str | None, block_tokens: int) -> list[bytes]:
    """The key of each full block of `prompt`, in order: a chain whose first link carries the salt."""
    parent = NO_SALT if salt is None else b"\x01" + salt.encode()
    keys = []
    for start in range(0, len(prompt) - block_tokens + 1, block_tokens):
        tokens = b"".join(t.to_bytes(4, "little") for t in prompt[start:start + block_tokens])
        parent = hashlib.sha256(parent + tokens).digest()
        keys.append(parent)
    return keys


class PrefixCache:
    """`capacity` blocks of every layer's K and V for `block_tokens` positions, keyed by block_keys."""

    def __init__(self, cache: KVCache, capacity: int, block_tokens: int) -> None:
        if capacity < 1:
            raise ValueError(f"prefix cache capacity: must be >= 1 block, got {capacity}")
        n_layer, two, _, n_head, _, head_dim = cache.kv.shape
        self.block_tokens = block_tokens
        self.pool = torch.zeros(capacity, n_layer, two, n_head, block_tokens, head_dim,
                                device=cache.kv.device, dtype=cache.kv.dtype)
        self._rows: collections.OrderedDict[bytes, int] = collections.OrderedDict()  # key -> pool row, LRU first
        self._free = list(range(capacity - 1, -1, -1))
        # Cumulative, as TensorRT-LLM's kvCacheStats reports them: blocks found and blocks computed.
        self.reused_blocks = 0
        self.missed_blocks = 0

    @property
    def nbytes(self) -> int:
        return self.pool.numel() * self.pool.element_size()

    def match(self, keys: list[bytes], prompt_len: int) -> list[int]:
        """Pool rows of the longest cached chain of `keys` that leaves a prompt token to compute."""
        limit = (prompt_len - 1) // self.block_tokens
        rows = []
        for key in keys[:limit]:
            row = self._rows.get(key)
            if row is None:
                break
            rows.append(row)
        self._touch(keys[:len(rows)])
        return rows

    def _touch(self, chain: list[bytes]) -> None:
        """Mark a chain used, its first block last: the least recently used block is then always a chain's end,
        so eviction never cuts a chain in the middle (a child without its parent can never be found again)."""
        for key in reversed(chain):
            self._rows.move_to_end(key)

    def load(self, chains: list[tuple[int, list[int]]], cache: KVCache) -> None:
        """Copy each (slot, rows) chain's blocks into positions 0.. of that cache slot. Consecutive slots with the
        same chain (a burst of hits on one prefix) take each block in one copy for all of them: on a GPU each copy
        is a launch, which a batch of hits would otherwise pay per block and hit."""
        runs: list[tuple[int, int, list[int]]] = []  # first slot, slots, the chain
        for slot, rows in chains:
            if runs and runs[-1][0] + runs[-1][1] == slot and runs[-1][2] == rows:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1, rows)
            elif rows:
                runs.append((slot, 1, rows))
        B = self.block_tokens
        for first, n, rows in runs:
            for i, row in enumerate(rows):
                block = self.pool[row].unsqueeze(2)  # [L, 2, 1, H, B, D], the same for every slot of the run
                cache.kv[:, :, first:first + n, :, i * B:(i + 1) * B] = block.expand(-1, -1, n, -1, -1, -1)

    def store(self, keys: list[bytes], cache: KVCache, slot: int, reused: int) -> None:
        """Keep the prompt's full blocks from slot `slot` (the first `reused` came from the pool)."""
        self.reused_blocks += reused
        self.missed_blocks += len(keys) - reused
        self._touch([k for k in keys if k in self._rows])  # what is cached must not be evicted for the rest
        for i, key in enumerate(keys):
            if key in self._rows:
                continue
            if self._free:
                row = self._free.pop()
            else:
                _, row = self._rows.popitem(last=False)  # the least recently used chain end
            start = i * self.block_tokens
            self.pool[row] = cache.kv[:, :, slot, :, start:start + self.block_tokens]
            self._rows[key] = row
        self._touch(keys)

    def stats(self) -> dict[str, float]:
        total = self.reused_blocks + self.missed_blocks
        return {"reusedBlocks": self.reused_blocks, "missedBlocks": self.missed_blocks,
                "cacheHitRate": self.reused_blocks / total if total else 0.0}
