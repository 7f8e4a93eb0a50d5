"""What one instance serves: one engine process per (model, copy), each on its own loopback port.

The shape is the shared multi-model interface: `FleetConfig.served_by(pool)` gives one
`ServedModel(model, engine, copies, kv_cache_bytes)` per model the pool serves, in the pool's
`serves` order, and `fleetcast.contract.serving.process_slots(served)` the local process layout
(`ProcessSlot(model_id, copy_index, port)`), which the gateway routes to as well.

Until the list-form config is on main, `served_models` and `process_slots` fall back to the
single-model form: one copy of `cfg.model` with the pool's engine and no explicit KV budget, on
`engine.port + 1` (where the model server has always listened). This module is the one place that
changes when it lands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleetcast.config import FleetConfig, Pool


@dataclass(frozen=True)
class ServedModel:
    """One model a pool's instances serve (fleetcast.config's, when it has one)."""

    model: Any  # fleetcast.config.model.ModelSpec
    engine: Any  # fleetcast.config.model.EngineSpec: fleet <- model <- pool
    copies: int = 1
    kv_cache_bytes: int | None = None  # per copy; None: the engine's free-memory fraction decides


@dataclass(frozen=True)
class ProcessSlot:
    model_id: str
    copy_index: int
    port: int


def served_models(cfg: FleetConfig, pool: Pool) -> tuple:
    """What `pool`'s instances serve, in the pool's order."""
    served_by = getattr(cfg, "served_by", None)
    if served_by is not None:
        return tuple(served_by(pool))
    return (ServedModel(model=cfg.model, engine=cfg.engine_for(pool)),)


def process_slots(served: Sequence) -> tuple:
    """One loopback port per (model, copy), deterministic from the serve order."""
    try:
        from fleetcast.contract.serving import process_slots as contract_slots
    except ImportError:
        contract_slots = None  # type: ignore[assignment]  # a contract without serving.py
    if contract_slots is not None:
        return tuple(contract_slots(served))
    base = served[0].engine.port + 1
    slots, port = [], base
    for entry in served:
        for copy in range(entry.copies):
            slots.append(ProcessSlot(entry.model.id, copy, port))
            port += 1
    return tuple(slots)


def calibration_of(cfg: FleetConfig, model: Any):
    """A model's calibration set: its own where the config has per-model ones, else the fleet's."""
    own = getattr(model, "calibration", None)
    return own if own is not None else getattr(cfg, "calibration", None)
