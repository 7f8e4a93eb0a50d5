"""Where an instance's engine processes listen: one home for the runtime that starts them and the gateway
that routes to them.

One process per (model, copy) of the pool's `serves`, each on its own loopback port, numbered from the
port after the gateway's (`engine.port` + 1, where the single engine process has always listened) in
`serves` order, copies of a model together. The runtime and the gateway derive the same ports from the
same validated config without telling each other, and a one-model fleet keeps its layout.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

LOOPBACK_HOST = "127.0.0.1"

# kv_cache_gb's unit and the GPU memory table's: GiB, 2^30 bytes.
GIB = 2**30

# GPU memory one serving process holds beyond its weights and its KV cache (CUDA context, the framework's
# allocator and library workspaces, CUDA graphs, activations). Measured on an H200 with the reference backend,
# GPT-2 medium and XL shapes at max batch 64 and 1024 positions: 1.06-1.15 GiB per process, of which 719 MiB
# is a bare CUDA context with torch and cuBLAS initialised (bench/data/h200-colocate.json, docs/runtime.md).
# TensorRT-LLM's own overhead has not been measured. The instance's KV plan (runtime/kv_budget.py) and the
# validator's memory check (fleetcast/config/memory.py) both count it.
PROCESS_OVERHEAD_BYTES = 1_200 * (1 << 20)

# Share of a GPU's usable memory (nvidia-smi's total) a packing leaves unplanned: allocator fragmentation and what
# the overhead estimates miss. A design margin, not a measured figure. The validator plans every process within the
# rest (fleetcast/config/memory.py); under MPS each client's memory limit carries its own part of it
# (mps_client_limit), since a hard per-client limit leaves no shared headroom for any process to grow into.
HEADROOM_SHARE = 0.10


def mps_client_limit(planned_bytes: int, kv_bytes: int, fraction: float) -> int:
    """CUDA_MPS_PINNED_DEVICE_MEM_LIMIT of an engine process planned to hold `planned_bytes` (weights, overhead,
    LoRA cache and its KV budget `kv_bytes`), the one rule of the instance (runtime/kv_budget.mps_memory_limit) and
    the validator (fleetcast/config/memory.py):

    - its part of the headroom: planned / (1 - HEADROOM_SHARE), so that the limits of a packing that fits the
      usable memory less the headroom sum to at most the usable memory. On the H200 sharing run the planned share
      alone (the second term) left 36-105 MB of each client's limit free at the end, its peaks 0.08-0.33 GB over
      the validator's overhead (bench/data/h200-sharing/*/sharing.json, stop.memory_at_stop; docs/runtime.md);
    - and never less than room for the fraction: a client that sees its limit as the GPU must still find
      fraction x free >= its KV budget, so that max_tokens binds (planned - KV + KV / fraction)."""
    with_fraction = planned_bytes - kv_bytes + -(-kv_bytes * 1_000_000 // int(fraction * 1_000_000))
    # Rounded down, so that limits whose shares sum to the usable memory less the headroom never pass the usable.
    with_headroom = planned_bytes * 1_000 // int(round((1 - HEADROOM_SHARE) * 1_000))
    return max(with_fraction, with_headroom)


def kv_bytes_per_token(layers: int, kv_width: int, element_bytes: int) -> int:
    """KV-cache bytes one token takes in every layer: keys and values (2) x layers x KV heads x head size
    (kv_width) x element size. The one formula of the instance's KV plan (runtime/kv_budget.py, from the
    artifact's config.json) and validate's KV-room warning (fleetcast/config/kv_room.py, from published figures)."""
    return 2 * layers * kv_width * element_bytes


# Most engine processes on one instance (the sum of the copies a pool serves).
MAX_PROCESSES = 64
HIGHEST_PORT = 65535


# Read-only members, so the config's frozen models and `ServedModel` satisfy them.
class _Model(Protocol):
    @property
    def id(self) -> str: ...


class _Engine(Protocol):
    @property
    def port(self) -> int: ...


class _Served(Protocol):
    """What process_slots reads of a `fleetcast.config.model.ServedModel`."""

    @property
    def model(self) -> _Model: ...

    @property
    def engine(self) -> _Engine: ...

    @property
    def copies(self) -> int: ...


@dataclass(frozen=True)
class ProcessSlot:
    model_id: str
    copy_index: int
    port: int

    @property
    def address(self) -> str:
        return f"{LOOPBACK_HOST}:{self.port}"

    @property
    def name(self) -> str:
        """A label for logs, units and metrics: `<model>#<copy>`."""
        return f"{self.model_id}#{self.copy_index}"


def first_process_port(gateway_port: int) -> int:
    """The first engine process's port: the one after the gateway's (fleet-wide `engine.port`)."""
    return gateway_port + 1


def process_slots(served: Iterable[_Served], base: int | None = None) -> tuple[ProcessSlot, ...]:
    """The instance's engine processes in start order, each with its loopback port (from `base`, by default
    first_process_port of the served engines' fleet-wide port)."""
    served = tuple(served)
    if not served:
        return ()
    first = first_process_port(served[0].engine.port) if base is None else base
    slots: list[ProcessSlot] = []
    for entry in served:
        for copy_index in range(entry.copies):
            slots.append(ProcessSlot(entry.model.id, copy_index, first + len(slots)))
    if len(slots) > MAX_PROCESSES:
        raise ValueError(f"{len(slots)} engine processes on one instance; at most {MAX_PROCESSES}")
    if slots and slots[-1].port > HIGHEST_PORT:
        raise ValueError(f"engine process ports {first}-{slots[-1].port} go past {HIGHEST_PORT}")
    return tuple(slots)
