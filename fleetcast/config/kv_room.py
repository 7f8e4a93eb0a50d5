"""KV space against batch: how many full-length sequences each process's KV share holds, against the batch its
engine is built for. A warning, not a refusal: a batch of short requests still fills the engine, but a pool whose
KV cache holds fewer full sequences than max_batch_size queues requests at long lengths while its batch has room,
and TTFT climbs long before the engine is busy.

The share is the memory plan's (fleetcast/config/memory.py plan_pool: kv_cache_gb, else the even share of what
the GPU leaves); bytes per token are the one formula (fleetcast/contract/serving.py kv_bytes_per_token) over the
published figures of the model (fleetcast/config/architectures.py); a full sequence is max_input_len +
max_output_len tokens. Models without published figures, and pools of one process on the KV fraction (whose
share only the instance knows), are not checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetcast.contract.serving import GIB, kv_bytes_per_token

from .architectures import shape_of

if TYPE_CHECKING:
    from .model import EngineSpec, FleetConfig, ModelSpec
    from .rules import ConfigIssue

# A KV entry's element size: 1 byte for an int8/fp8 KV cache, else the activations' 16 bits (as runtime/kv_budget.py
# reads it from the built artifact).
KV_ELEMENT_BYTES = {"int8": 1, "fp8": 1}
ACTIVATION_BYTES = 2


def model_kv_bytes_per_token(model: ModelSpec, engine: EngineSpec) -> int | None:
    shape = shape_of(model)
    if shape is None:
        return None
    return kv_bytes_per_token(shape.layers, shape.kv_width, _element(engine))


def _element(engine: EngineSpec) -> int:
    return KV_ELEMENT_BYTES.get(engine.kv_cache_dtype.value, ACTIVATION_BYTES)


def kv_room_warnings(cfg: FleetConfig) -> list[ConfigIssue]:
    """Each served model whose KV share holds fewer full sequences than its engine's max_batch_size, with the
    arithmetic, blamed on the serve entry (or the pool where it serves every model)."""
    from .memory import plan_pool
    from .rules import ConfigIssue

    out: list[ConfigIssue] = []
    for i, region in enumerate(cfg.regions):
        for j, pool in enumerate(region.pools):
            plan = plan_pool(cfg, pool)
            if plan is None:
                continue
            shares = {p.model_id: p.kv_bytes for p in plan.processes}
            for k, served in enumerate(cfg.served_by(pool)):
                share = shares.get(served.model.id)
                per_token = model_kv_bytes_per_token(served.model, served.engine)
                if not share or per_token is None:
                    continue
                tokens = served.model.max_input_len + served.model.max_output_len
                sequences = share / (per_token * tokens)
                batch = served.engine.max_batch_size
                if sequences >= batch:
                    continue
                where = ("regions", i, "pools", j) + (("serves", k) if pool.serves else ())
                out.append(ConfigIssue(where,
                    f"{served.model.id}'s KV share of {share / GIB:.2f} GiB holds {sequences:.1f} full sequences, "
                    f"against max_batch_size {batch}: {per_token:,} bytes per token "
                    f"({shape_text(served.model, served.engine)}) x {tokens} tokens (max_input_len + max_output_len) = "
                    f"{per_token * tokens / 2**20:.1f} MiB each; at full length the batch waits for KV space. "
                    f"Allowed as is; to match, kv_cache_gb >= {per_token * tokens * batch / GIB:.2f} per copy, "
                    f"max_batch_size <= {max(1, int(sequences))}, or an int8/fp8 KV cache"))
    return out


def shape_text(model: ModelSpec, engine: EngineSpec) -> str:
    shape = shape_of(model)
    return "unknown" if shape is None else \
        f"K and V x {shape.layers} layers x {shape.kv_width} KV heads x head size x {_element(engine)} bytes"
