"""GPU memory of what one instance of a pool serves: the one home of that arithmetic.

Every engine process on a GPU holds its weights, a per-process overhead (CUDA context,
TensorRT activation memory sized at build time by max_num_tokens, runtime buffers) and its
KV cache: TensorRT-LLM docs/source/reference/memory.md, "Understand inference time GPU memory
usage" (weights, activation tensors, I/O tensors of which the KV cache is the major part).
A process of a model with LoRA adapters also holds its LoRA device cache; TensorRT-LLM sizes it from
the adapters' rank and modules and the model's dimensions, which only staging and the instance know,
so this check counts the reserve the instance sizes it within (LORA_DEVICE_RESERVE_BYTES,
fleetcast/contract/adapters.py), an upper bound.
The validator refuses a pool whose processes do not fit together (with the sum in its message) and
the synth summary shows each process's estimated share; on the instance runtime/kv_budget.py plans
the real budgets from the memory actually free, with the same per-process overhead and each model's
LoRA device cache as sized there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetcast.contract.adapters import LORA_DEVICE_RESERVE_BYTES
from fleetcast.contract.serving import GIB, PROCESS_OVERHEAD_BYTES

if TYPE_CHECKING:
    from .catalog import InstanceType
    from .model import FleetConfig, Pool


# Bytes each weight takes at a precision. Weight-only and SmoothQuant INT8 store one byte, INT4 and
# NVFP4 half a byte (their per-group scales are left out, a few percent); embeddings and norms are
# counted at the same width, a small underestimate for the quantized modes.
BYTES_PER_PARAMETER: dict[str, float] = {
    "fp16": 2.0, "bf16": 2.0, "int8_wo": 1.0, "int8_sq": 1.0, "fp8": 1.0, "int4_wo": 0.5, "nvfp4": 0.5,
}

# The measured per-process overhead (reference backend on an H200; TensorRT-LLM's own is not measured yet):
# one figure for this check and the instance's KV plan (runtime/kv_budget.py).
PROCESS_OVERHEAD_SOURCE = ("measured with the reference backend on an H200 (bench/data/h200-colocate.json); "
                           "TensorRT-LLM's own per-process overhead is not measured")

# Share of the GPU's listed memory the check leaves unplanned: the driver reserves some (nvidia-smi shows
# less than the listed size) and allocators fragment. A design margin, not a measured figure.
HEADROOM_SHARE = 0.10


@dataclass(frozen=True)
class ProcessMemory:
    """One served model's processes on an instance: each copy holds weights + overhead + KV."""

    model_id: str
    precision: str
    copies: int
    parameters: float | None  # None: unknown (models[].parameters_b unset)
    kv_bytes: int | None  # each copy's KV budget; None: not planned (one process on the kv fraction)
    kv_explicit: bool  # the pool's kv_cache_gb set it
    lora_bytes: int = 0  # each copy's LoRA device cache: the reserve where the model has adapters

    @property
    def weights_bytes(self) -> int | None:
        return None if self.parameters is None else int(self.parameters * BYTES_PER_PARAMETER[self.precision])

    @property
    def each_bytes(self) -> int | None:
        if self.weights_bytes is None:
            return None
        return self.weights_bytes + PROCESS_OVERHEAD_BYTES + self.lora_bytes + (self.kv_bytes or 0)

    def describe(self) -> str:
        weights = "weights unknown" if self.weights_bytes is None else \
            f"weights {_gib(self.weights_bytes)} at {self.precision}"
        kv = "" if self.kv_bytes is None else f" + KV {_gib(self.kv_bytes)}" + ("" if self.kv_explicit else " (share)")
        lora = f" + LoRA cache {_gib(self.lora_bytes)}" if self.lora_bytes else ""
        return f"{self.model_id} {self.copies} x ({weights} + overhead {_gib(PROCESS_OVERHEAD_BYTES)}{lora}{kv})"


@dataclass(frozen=True)
class PoolMemory:
    """What one instance of a pool holds, against what its GPU offers."""

    gpu: str
    gpu_bytes: int
    processes: tuple[ProcessMemory, ...]

    @property
    def usable_bytes(self) -> int:
        return int(self.gpu_bytes * (1 - HEADROOM_SHARE))

    @property
    def process_count(self) -> int:
        return sum(p.copies for p in self.processes)

    @property
    def planned_bytes(self) -> int | None:
        """Weights + overhead + KV of every process; None when a model's size is unknown."""
        each = [p.each_bytes for p in self.processes]
        if any(b is None for b in each):
            return None
        return sum(p.copies * b for p, b in zip(self.processes, each) if b is not None)

    @property
    def fits(self) -> bool | None:
        planned = self.planned_bytes
        return None if planned is None else planned <= self.usable_bytes

    def arithmetic(self) -> str:
        """The sum in words, e.g. for the validator's message."""
        planned = self.planned_bytes
        total = "?" if planned is None else _gib(planned)
        return (f"{' + '.join(p.describe() for p in self.processes)} = {total}; the {self.gpu} has "
                f"{_gib(self.gpu_bytes)}, {_gib(self.usable_bytes)} usable after {HEADROOM_SHARE:.0%} headroom")


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def plan_pool(cfg: FleetConfig, pool: Pool, instance: InstanceType | None = None) -> PoolMemory | None:
    """The memory plan of one instance of `pool`, or None when its instance type is unknown to the catalog.

    `instance` stands in for the catalog's entry (the planner's lab machines, which no catalog lists).

    KV budgets: a serve's kv_cache_gb; the serves without one share evenly what the usable memory leaves
    after every process's weights, overhead and the explicit budgets. A pool of a single process without a
    budget keeps its engine's kv_cache_free_gpu_memory_fraction (as one-model fleets always have): None.
    """
    from . import catalog

    instance = instance or catalog.instance_catalog().get(pool.instance_type)
    if instance is None:
        return None
    gpu_bytes = int(instance.gpu.memory_gib * GIB)
    serves = cfg.serves_of(pool)
    known = {m.id: m for m in cfg.models}
    rows = []
    for serve in serves:
        model = known.get(serve.model)
        if model is None:
            continue  # the validator names the unknown model
        precision = cfg.engine_for(pool, model.id).precision.value
        parameters = None if model.parameters_b is None else model.parameters_b * 1e9
        kv = None if serve.kv_cache_gb is None else int(serve.kv_cache_gb * GIB)
        lora = LORA_DEVICE_RESERVE_BYTES if model.adapters else 0
        rows.append(ProcessMemory(model.id, precision, serve.copies, parameters, kv, kv is not None, lora))
    plan = PoolMemory(instance.gpu.name, gpu_bytes, tuple(rows))
    unplanned = [r for r in rows if r.kv_bytes is None]
    if not unplanned or (plan.process_count == 1 and len(rows) == 1):
        return plan
    fixed = plan.planned_bytes
    if fixed is None:
        return plan
    share = max(0, (plan.usable_bytes - fixed) // sum(r.copies for r in unplanned))
    rows = [r if r.kv_bytes is not None else
            ProcessMemory(r.model_id, r.precision, r.copies, r.parameters, int(share), False, r.lora_bytes)
            for r in rows]
    return PoolMemory(plan.gpu, plan.gpu_bytes, tuple(rows))
