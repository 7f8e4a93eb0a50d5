"""GPT-2 forward passes in plain PyTorch: a naive full recompute and a static-KV-cache path.

`naive_logits` works on the artifact's tensors as stored (Hugging Face GPT-2 names, Conv1D
[in, out] layout) and recomputes everything for every position: it is the correctness
reference. `GPT2` converts the same tensors once into [out, in] (nn.Linear) layout and runs
prefill (one sequence, causal attention, writes its KV into a cache slot) and decode (one new
token for each of B sequences in cache slots 0..B-1, attention over the first L cached
positions). Decode uses only fixed-shape ops with no host synchronisation, so it can be
captured in a CUDA graph per (B, L) bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .configs import ModelShape

# Prefill shapes vary per request: cuDNN attention builds a plan per new shape (seen on the H200:
# ~60 ms on the first prompt of each length), so prefill uses the flash/efficient kernels.
# Decode shapes are fixed per captured graph, so decode keeps PyTorch's default choice.
_PREFILL_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def weight_names(shape: ModelShape) -> list[tuple[str, tuple[int, ...]]]:
    """Every stored tensor's name and shape, in a fixed order (Hugging Face GPT-2 naming)."""
    d, v, p = shape.n_embd, shape.vocab_size, shape.n_positions
    names: list[tuple[str, tuple[int, ...]]] = [("transformer.wte.weight", (v, d)), ("transformer.wpe.weight", (p, d))]
    for i in range(shape.n_layer):
        pre = f"transformer.h.{i}."
        names += [
            (pre + "ln_1.weight", (d,)), (pre + "ln_1.bias", (d,)),
            (pre + "attn.c_attn.weight", (d, 3 * d)), (pre + "attn.c_attn.bias", (3 * d,)),
            (pre + "attn.c_proj.weight", (d, d)), (pre + "attn.c_proj.bias", (d,)),
            (pre + "ln_2.weight", (d,)), (pre + "ln_2.bias", (d,)),
            (pre + "mlp.c_fc.weight", (d, 4 * d)), (pre + "mlp.c_fc.bias", (4 * d,)),
            (pre + "mlp.c_proj.weight", (4 * d, d)), (pre + "mlp.c_proj.bias", (d,)),
        ]
    names += [("transformer.ln_f.weight", (d,)), ("transformer.ln_f.bias", (d,))]
    return names


def naive_logits(shape: ModelShape, w: dict[str, torch.Tensor], ids: list[int]) -> torch.Tensor:
    """Logits [T, vocab] for every position of `ids`, recomputed from scratch (float32)."""
    w = {k: t.float() for k, t in w.items()}
    T, d, H = len(ids), shape.n_embd, shape.n_head
    D = d // H
    idx = torch.tensor(ids, dtype=torch.long, device=w["transformer.wte.weight"].device)
    h = w["transformer.wte.weight"][idx] + w["transformer.wpe.weight"][:T]
    causal = torch.ones(T, T, dtype=torch.bool, device=h.device).tril()
    eps = shape.layer_norm_epsilon
    for i in range(shape.n_layer):
        p = f"transformer.h.{i}."
        x = F.layer_norm(h, (d,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = x @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (t.reshape(T, H, D).transpose(0, 1) for t in qkv.split(d, dim=1))
        att = (q @ k.transpose(1, 2)) / math.sqrt(D)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(0, 1).reshape(T, d)
        h = h + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        x = F.layer_norm(h, (d,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        m = F.gelu(x @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        h = h + m @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    h = F.layer_norm(h, (d,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    return h @ w["transformer.wte.weight"].t()


@dataclass
class _Layer:
    ln1_w: torch.Tensor
    ln1_b: torch.Tensor
    qkv_w: torch.Tensor  # [3d, d]
    qkv_b: torch.Tensor
    proj_w: torch.Tensor  # [d, d]
    proj_b: torch.Tensor
    ln2_w: torch.Tensor
    ln2_b: torch.Tensor
    fc_w: torch.Tensor  # [4d, d]
    fc_b: torch.Tensor
    out_w: torch.Tensor  # [d, 4d]
    out_b: torch.Tensor


class KVCache:
    """Static KV cache: one tensor [n_layer, 2, max_batch, n_head, max_seq, head_dim], slots by row."""

    def __init__(self, shape: ModelShape, max_batch: int, max_seq: int, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        self.max_batch, self.max_seq = max_batch, max_seq  # max_batch: slots, which a KV budget may set
        self.kv = torch.zeros(
            shape.n_layer, 2, max_batch, shape.n_head, max_seq, shape.head_dim, device=device, dtype=dtype
        )
        self.rows = torch.arange(max_batch, device=device)

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    @staticmethod
    def slot_bytes(shape: ModelShape, max_seq: int, element_size: int) -> int:
        """Bytes one slot (one sequence of `max_seq` positions) takes in every layer's K and V."""
        return shape.kv_slot_bytes(max_seq, element_size)

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy slot `src`'s first `length` positions into slot `dst` (compaction after a finish)."""
        self.kv[:, :, dst, :, :length] = self.kv[:, :, src, :, :length]


class GPT2:
    """GPT-2 weights in inference layout plus prefill/decode over a KVCache."""

    def __init__(self, shape: ModelShape, weights: dict[str, torch.Tensor], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        self.shape, self.device, self.dtype = shape, torch.device(device), dtype
        missing = [n for n, _ in weight_names(shape) if n not in weights]
        if missing:
            raise ValueError(f"artifact: weights are missing {len(missing)} tensors, first {missing[0]!r}")
        for name, expected in weight_names(shape):
            if tuple(weights[name].shape) != expected:
                raise ValueError(f"artifact: tensor {name!r} has shape {tuple(weights[name].shape)}, expected {expected}")

        def dev(name: str, transpose: bool = False) -> torch.Tensor:
            t = weights[name].to(device=self.device, dtype=dtype)
            return t.t().contiguous() if transpose else t.contiguous()

        self.wte = dev("transformer.wte.weight")
        self.wpe = dev("transformer.wpe.weight")
        self.layers = []
        for i in range(shape.n_layer):
            p = f"transformer.h.{i}."
            self.layers.append(_Layer(
                dev(p + "ln_1.weight"), dev(p + "ln_1.bias"),
                dev(p + "attn.c_attn.weight", True), dev(p + "attn.c_attn.bias"),
                dev(p + "attn.c_proj.weight", True), dev(p + "attn.c_proj.bias"),
                dev(p + "ln_2.weight"), dev(p + "ln_2.bias"),
                dev(p + "mlp.c_fc.weight", True), dev(p + "mlp.c_fc.bias"),
                dev(p + "mlp.c_proj.weight", True), dev(p + "mlp.c_proj.bias"),
            ))
        self.lnf_w = dev("transformer.ln_f.weight")
        self.lnf_b = dev("transformer.ln_f.bias")
        self.scale = 1.0 / math.sqrt(shape.head_dim)
        self._positions = torch.arange(shape.n_positions, device=self.device)
        # "sdpa": one fused attention call per layer (measured faster on the H200: 2.99 vs 3.20 ms
        # per batch-1 gpt2-xl step, bench/data/h200-reference-decode.json); "bmm": baddbmm +
        # softmax + bmm, kept as the bench's comparison point.
        self.decode_attention = "sdpa"
        self._decode_fn = self._decode_impl

    def new_cache(self, max_batch: int, max_seq: int) -> KVCache:
        return KVCache(self.shape, max_batch, max_seq, self.device, self.dtype)

    def _ln(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.shape.n_embd,), w, b, self.shape.layer_norm_epsilon)

    @torch.inference_mode()
    def prefill(self, cache: KVCache, slot: int, ids: torch.Tensor) -> torch.Tensor:
        """Run the prompt `ids` [T] (on device) into cache slot `slot`; return the last position's logits [V]."""
        return self.prefill_batch(cache, slot, ids.unsqueeze(0), ids.new_tensor([ids.shape[0]]))[0]

    @torch.inference_mode()
    def prefill_batch(self, cache: KVCache, first_slot: int, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Run N right-padded prompts `ids` [N, T] into slots first_slot..first_slot+N-1.

        Returns each prompt's last-position logits [N, V]. Padding positions (>= a prompt's
        length) write KV that is never attended: decode overwrites position `length` first and
        attends only to positions <= its own.
        """
        N, T = ids.shape
        d, H, D = self.shape.n_embd, self.shape.n_head, self.shape.head_dim
        h = F.embedding(ids, self.wte) + self.wpe[:T]  # [N, T, d]
        for i, lw in enumerate(self.layers):
            x = self._ln(h, lw.ln1_w, lw.ln1_b)
            qkv = F.linear(x, lw.qkv_w, lw.qkv_b).view(N, T, 3, H, D).permute(2, 0, 3, 1, 4)  # [3, N, H, T, D]
            cache.kv[i, :, first_slot:first_slot + N, :, :T] = qkv[1:]
            with sdpa_kernel(_PREFILL_BACKENDS):
                y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)  # [N, H, T, D]
            y = y.transpose(1, 2).reshape(N, T, d)
            h = h + F.linear(y, lw.proj_w, lw.proj_b)
            x = self._ln(h, lw.ln2_w, lw.ln2_b)
            h = h + F.linear(F.gelu(F.linear(x, lw.fc_w, lw.fc_b), approximate="tanh"), lw.out_w, lw.out_b)
        last = h[torch.arange(N, device=h.device), lengths - 1]  # [N, d]
        return F.linear(self._ln(last, self.lnf_w, self.lnf_b), self.wte)

    @torch.inference_mode()
    def prefill_batch_from(self, cache: KVCache, first_slot: int, ids: torch.Tensor, starts: list[int],
                           lengths: list[int], context: int) -> torch.Tensor:
        """Run N prompts' tokens from their own offsets on into slots first_slot..first_slot+N-1; return each
        one's last-position logits [N, V].

        Row i of `ids` [N, T] (right-padded, on device) holds lengths[i] new tokens for positions starts[i].. of
        its slot, whose positions < starts[i] already hold that prompt's KV (a reused prefix; none where
        starts[i] is 0). Every row attends to its slot's first `context` positions (>= every row's end), masked to
        its own prefix and causal part, so prompts of different cached lengths share one forward. Only the new
        tokens' KV is written, padding's never."""
        N, T = ids.shape
        d, H, D = self.shape.n_embd, self.shape.n_head, self.shape.head_dim
        # Rows of one offset and length in a row (a burst of one prompt's hits) write their KV in one copy per layer.
        runs: list[tuple[int, int, int, int]] = []  # first row, end row, start, length
        for row, (start, n) in enumerate(zip(starts, lengths, strict=True)):
            if runs and runs[-1][1] == row and runs[-1][2:] == (start, n):
                runs[-1] = (runs[-1][0], row + 1, start, n)
            else:
                runs.append((row, row + 1, start, n))
        head = torch.tensor([starts, [n - 1 for n in lengths]], dtype=torch.long).to(ids.device)
        pos = head[0].unsqueeze(1) + self._positions[:T]  # [N, T]; padding positions may pass the table's end
        h = F.embedding(ids, self.wte) + F.embedding(pos.clamp(max=self.shape.n_positions - 1), self.wpe)
        visible = (self._positions[:context] <= pos.unsqueeze(2)).unsqueeze(1)  # [N, 1, T, context]
        for i, lw in enumerate(self.layers):
            x = self._ln(h, lw.ln1_w, lw.ln1_b)
            qkv = F.linear(x, lw.qkv_w, lw.qkv_b).view(N, T, 3, H, D).permute(2, 0, 3, 1, 4)  # [3, N, H, T, D]
            for a, b, start, n in runs:
                cache.kv[i, :, first_slot + a:first_slot + b, :, start:start + n] = qkv[1:, a:b, :, :n]
            k = cache.kv[i, 0, first_slot:first_slot + N, :, :context]
            v = cache.kv[i, 1, first_slot:first_slot + N, :, :context]
            with sdpa_kernel(_PREFILL_BACKENDS):
                y = F.scaled_dot_product_attention(qkv[0], k, v, attn_mask=visible)  # [N, H, T, D]
            h = h + F.linear(y.transpose(1, 2).reshape(N, T, d), lw.proj_w, lw.proj_b)
            x = self._ln(h, lw.ln2_w, lw.ln2_b)
            h = h + F.linear(F.gelu(F.linear(x, lw.fc_w, lw.fc_b), approximate="tanh"), lw.out_w, lw.out_b)
        last = h[torch.arange(N, device=h.device), head[1]]  # [N, d]
        return F.linear(self._ln(last, self.lnf_w, self.lnf_b), self.wte)

    @torch.inference_mode()
    def decode(self, cache: KVCache, tokens: torch.Tensor, pos: torch.Tensor, L: int) -> torch.Tensor:
        """One decode step for slots 0..B-1: `tokens`/`pos` [B] on device, attention over positions < L.

        Each row's token is written into the cache at its `pos` and attends to positions <= pos.
        Returns logits [B, V]. Fixed shapes and no host sync: safe to capture in a CUDA graph.
        """
        logits: torch.Tensor = self._decode_fn(cache.kv, cache.rows[: tokens.shape[0]], tokens, pos, L)
        return logits

    def _decode_impl(self, kv_all: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor,
                     L: int) -> torch.Tensor:
        # Plain tensors in, so torch.compile can wrap this (scripts/bench_decode.py's "compile" variant).
        B = tokens.shape[0]
        d, H, D = self.shape.n_embd, self.shape.n_head, self.shape.head_dim
        h = F.embedding(tokens, self.wte) + F.embedding(pos, self.wpe)
        visible = self._positions[:L].unsqueeze(0) <= pos.unsqueeze(1)  # [B, L]
        bias = torch.zeros(B, L, device=h.device, dtype=h.dtype).masked_fill_(~visible, float("-inf"))
        bias4 = bias.view(B, 1, 1, L)
        bias = bias.unsqueeze(1).expand(B, H, L).reshape(B * H, 1, L)
        for i, lw in enumerate(self.layers):
            x = self._ln(h, lw.ln1_w, lw.ln1_b)
            qkv = F.linear(x, lw.qkv_w, lw.qkv_b).view(B, 3, H, D)
            kv = kv_all[i]
            kv[:, rows, :, pos] = qkv[:, 1:]  # advanced indices split by a slice: value is [B, 2, H, D]
            q = qkv[:, 0].reshape(B * H, 1, D)
            k = kv[0, :B, :, :L].reshape(B * H, L, D)  # a view: slots are contiguous rows
            v = kv[1, :B, :, :L].reshape(B * H, L, D)
            if self.decode_attention == "sdpa":
                y = F.scaled_dot_product_attention(
                    q.view(B, H, 1, D), k.view(B, H, L, D), v.view(B, H, L, D), attn_mask=bias4
                ).reshape(B, d)
            else:
                att = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=self.scale).softmax(dim=-1)
                y = torch.bmm(att, v).view(B, d)
            h.addmm_(y, lw.proj_w.t()).add_(lw.proj_b)
            x = self._ln(h, lw.ln2_w, lw.ln2_b)
            m = F.gelu(F.linear(x, lw.fc_w, lw.fc_b), approximate="tanh")
            h.addmm_(m, lw.out_w.t()).add_(lw.out_b)
        x = self._ln(h, self.lnf_w, self.lnf_b)
        return F.linear(x, self.wte)
