"""Memory of what one instance of a pool serves, GPU and host: the one home of that arithmetic.

The validator (fleetcast/config/rules.py) and the packing planner (fleetcast/plan/packing.py, through
plan_pool) both ask `PoolMemory.problems()` whether a packing fits; the synth summary shows each process's
share. Every figure below says whether it is measured, taken from TensorRT-LLM 1.2.x's source, or estimated
(tests/config/test_memory.py names the sources).

GPU, per engine process: weights at the precision + overhead + LoRA device reserve + KV budget.
- Overhead (`process_overhead`): the per-process figure measured with the reference backend on an H200
  (CUDA context, torch, cuBLAS: PROCESS_OVERHEAD_BYTES), plus what TensorRT-LLM adds by its own rules:
  the activations of one forward pass of max_num_tokens tokens (the engine flow sizes them at build time,
  docs/source/reference/memory.md "Activation size"; the PyTorch backend's profiling pass runs dummy requests
  totalling max_num_tokens before it sizes the KV cache, _torch/pyexecutor/_util.py
  `KvCacheCreator._create_dummy_context_requests`, and counts their peak), and on the PyTorch backend the
  CUDA graphs it captures by default (llm_args.py `TorchLlmArgs.cuda_graph_config` default_factory
  CudaGraphConfig; batch sizes 1..31, 32, 64, 128 cut to min(max_batch_size, max_num_tokens)).
- The KV budget is a minimum, not a fixed size: TensorRT-LLM takes min(kv_cache_config.max_tokens,
  free_gpu_memory_fraction x the memory free when that process sizes its cache), and the free memory counts
  the other processes on the GPU (kvCacheManager.cpp `calculateFreeMemBytes`/`calculateMaxNumBlocks` on the
  engine flow; `KvCacheCreator.configure_kv_cache_capacity`/`_cal_max_memory` on the PyTorch backend). A
  process restarted alone starts last, after every other one holds its memory, so each process is checked as
  the last to start: fraction x (usable - everything the others hold - its own weights and overhead) must
  reach its budget, or max_tokens does not bind and the process gets less KV than planned.
- Usable memory is what nvidia-smi reports (the catalog's usable_memory_mib), not the listed size; the
  sum must leave HEADROOM_SHARE of it unplanned.
- Under MPS each process runs with a hard device-memory limit: its planned share plus its part of that
  headroom (fleetcast.contract.serving.mps_client_limit, which the instance sets), and the limits must sum to
  at most the usable memory.

Host, per engine process (trtllm-serve): RAM and a vCPU (`HOST_*` below), plus what the instance itself runs.

On the instance runtime/kv_budget.py plans the real budgets from the memory actually free.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fleetcast.contract.adapters import LORA_DEVICE_RESERVE_BYTES
from fleetcast.contract.serving import GIB, HEADROOM_SHARE, PROCESS_OVERHEAD_BYTES, mps_client_limit

if TYPE_CHECKING:
    from .catalog import InstanceType
    from .model import FleetConfig, Pool, ServedModel

MIB = 2**20

# Bytes each weight takes at a precision. Weight-only and SmoothQuant INT8 store one byte, INT4 and
# NVFP4 half a byte (their per-group scales are left out, a few percent); embeddings and norms are
# counted at the same width, a small underestimate for the quantized modes.
BYTES_PER_PARAMETER: dict[str, float] = {
    "fp16": 2.0, "bf16": 2.0, "int8_wo": 1.0, "int8_sq": 1.0, "fp8": 1.0, "int4_wo": 0.5, "nvfp4": 0.5,
}

# ---------------------------------------------------------------- GPU: overhead beyond weights and KV

# Measured: CUDA context, torch's allocator and cuBLAS workspaces of one process (reference backend on an
# H200, bench/data/h200-colocate.json); fleetcast/contract/serving.py holds the figure the instance shares.
PROCESS_OVERHEAD_SOURCE = ("measured with the reference backend on an H200 (bench/data/h200-colocate.json); "
                           "TensorRT-LLM's own per-process overhead is not measured")

# Taken from source (TensorRT-LLM 1.2.x, tensorrt_llm/llmapi/llm_args.py): the PyTorch backend captures CUDA
# graphs unless cuda_graph_config is None (default_factory=CudaGraphConfig). With batch_sizes and
# max_batch_size unset, validate_cuda_graph_config generates them for max_batch_size 128 without padding:
# 1..31, 32, 64, 128; the model engine keeps those <= min(max_batch_size, max_num_tokens)
# (_torch/pyexecutor/model_engine.py _filter_cuda_graph_batch_sizes). The field's description says "each CUDA
# graph can use up to 200 MB of extra memory"; the captures share one memory pool
# (_torch/pyexecutor/cuda_graph_runner.py: every capture passes pool=self.memory_pool, then keeps graph.pool()),
# so the pool is counted once at that figure (200 MB, rounded up to MiB), not once per graph. The engine flow's
# C++ runtime captures none by default (ExtendedRuntimePerfKnobConfig.cuda_graph_mode defaults to False).
CUDA_GRAPH_DEFAULT_MAX_BATCH = 128
CUDA_GRAPH_POOL_BYTES = 200 * MIB

# Estimated from source rules: activations of one forward pass of max_num_tokens tokens (engine flow: TensorRT
# sizes them at build time for the largest shape, docs/source/reference/memory.md; PyTorch backend: the
# profiling pass's dummy requests total max_num_tokens, _util.py). Per token the largest live set is the MLP's:
# the residual (hidden) + gate/up (2 x intermediate) + activation (intermediate), at 16 bits; intermediate is at
# most 5.43 x hidden in the supported families (Qwen2.5-0.5B: 4864/896), so 18 x hidden x 2 bytes. Validate knows
# parameters, not dimensions: hidden <= 2.1 x parameters^(1/3) for the published configs the test lists.
ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN = 36
HIDDEN_PER_CUBE_ROOT_OF_PARAMETERS = 2.1


@functools.lru_cache(maxsize=256)
def cuda_graph_batch_sizes(max_batch_size: int, max_num_tokens: int) -> tuple[int, ...]:
    """The decode batch sizes the PyTorch backend captures CUDA graphs for under the default CudaGraphConfig."""
    generated = [*range(1, 32), 32, 64, CUDA_GRAPH_DEFAULT_MAX_BATCH]
    limit = min(max_batch_size, max_num_tokens)
    return tuple(b for b in generated if b <= limit)


def estimated_hidden(parameters: float) -> int:
    root: float = parameters ** (1 / 3)
    return math.ceil(HIDDEN_PER_CUBE_ROOT_OF_PARAMETERS * root)


def activation_bytes(parameters: float, max_num_tokens: int) -> int:
    return max_num_tokens * ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN * estimated_hidden(parameters)


@dataclass(frozen=True)
class ProcessOverhead:
    """GPU memory one engine process holds beyond its weights, LoRA reserve and KV cache, by provenance."""

    measured_bytes: int  # reference backend, H200
    activation_bytes: int  # estimated from TensorRT-LLM's sizing rules
    cuda_graphs: int  # how many the PyTorch backend captures (0 on the engine flow)
    cuda_graph_bytes: int  # from source: the shared pool at the per-graph figure

    @property
    def total_bytes(self) -> int:
        return self.measured_bytes + self.activation_bytes + self.cuda_graph_bytes

    def describe(self) -> str:
        parts = [f"{_gib(self.measured_bytes)} measured", f"activations {_gib(self.activation_bytes)} estimated"]
        if self.cuda_graphs:
            parts.append(f"{self.cuda_graphs} CUDA graphs {_gib(self.cuda_graph_bytes)} from source")
        return f"overhead {_gib(self.total_bytes)} ({', '.join(parts)})"


# Pure in its arguments, and its result is frozen: the planner's packing search asks it for each process of each
# packing it tries (thousands, for a handful of distinct engines), several times over (weights, KV, the arithmetic).
@functools.lru_cache(maxsize=1024)
def process_overhead(backend: str, parameters: float | None, max_batch_size: int, max_num_tokens: int
                     ) -> ProcessOverhead:
    graphs = len(cuda_graph_batch_sizes(max_batch_size, max_num_tokens)) if backend == "pytorch" else 0
    return ProcessOverhead(
        measured_bytes=PROCESS_OVERHEAD_BYTES,
        activation_bytes=0 if parameters is None else activation_bytes(parameters, max_num_tokens),
        cuda_graphs=graphs, cuda_graph_bytes=CUDA_GRAPH_POOL_BYTES if graphs else 0)


def served_overhead(served: ServedModel) -> ProcessOverhead:
    """The overhead of one process of a served model: the validator's figure, which the instance's KV plan and
    MPS memory limits (runtime/bootstrap.py) count too."""
    engine, parameters_b = served.engine, served.model.parameters_b
    return process_overhead(engine.backend.value, None if parameters_b is None else parameters_b * 1e9,
                            engine.max_batch_size, engine.max_num_tokens)


# ---------------------------------------------------------------- GPU: usable memory and headroom

# HEADROOM_SHARE (fleetcast/contract/serving.py, which the instance's MPS limits read too): the share of the usable
# memory (nvidia-smi's total, the catalog's usable_memory_mib) a packing leaves unplanned. Before it was taken of
# the listed size (48 GiB on an L40S), which left 4% of the 44.99 GiB really there.

# ---------------------------------------------------------------- host: RAM and vCPUs per engine process

# Taken from source: trtllm-serve on one GPU runs two Python processes, the HTTP server's GenerationExecutorProxy
# and an executor worker it spawns through mpi4py (tensorrt_llm/executor/executor.py GenerationExecutor.create,
# "For single-gpu case: Partition the workload to multiple process"); each imports tensorrt_llm, torch and the
# CUDA libraries, and the proxy holds the tokenizer.
SERVER_PYTHON_PROCESSES = 2
# Estimated, not measured: resident memory of one such Python process.
PYTHON_PROCESS_HOST_BYTES = 2 * GIB
# Estimated: one vCPU per engine process for its executor loop, a Python thread that drives every iteration
# (_torch/pyexecutor/py_executor.py): two such loops on one vCPU take turns, and each step of both waits.
SERVER_VCPUS = 1
# Estimated: the OS, Docker, the CloudWatch agent, the supervisor and the gateway (runtime/gateway).
HOST_RESERVED_BYTES = 2 * GIB
HOST_RESERVED_VCPUS = 1
HOST_SOURCE = (f"{SERVER_PYTHON_PROCESSES} Python processes per trtllm-serve from source (executor.py), "
               f"{PYTHON_PROCESS_HOST_BYTES / GIB:g} GiB each and {SERVER_VCPUS} vCPU per process estimated, "
               "not measured")


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
    backend: str = "tensorrt"
    max_batch_size: int = 64
    max_num_tokens: int = 8192
    kv_fraction: float = 0.9  # kv_cache_free_gpu_memory_fraction the process runs with

    @property
    def weights_bytes(self) -> int | None:
        return None if self.parameters is None else int(self.parameters * BYTES_PER_PARAMETER[self.precision])

    @property
    def overhead(self) -> ProcessOverhead:
        return process_overhead(self.backend, self.parameters, self.max_batch_size, self.max_num_tokens)

    @property
    def overhead_bytes(self) -> int:
        return self.overhead.total_bytes

    @property
    def before_kv_bytes(self) -> int | None:
        """What the process holds when it sizes its KV cache: weights, overhead, LoRA reserve."""
        if self.weights_bytes is None:
            return None
        return self.weights_bytes + self.overhead_bytes + self.lora_bytes

    @property
    def each_bytes(self) -> int | None:
        before = self.before_kv_bytes
        return None if before is None else before + (self.kv_bytes or 0)

    @property
    def mps_limit_bytes(self) -> int | None:
        """Each copy's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT under MPS (the instance's rule, runtime/bootstrap.py); None:
        no limit (a process without a KV budget: its engine's fraction sizes its cache) or its size is unknown."""
        each = self.each_bytes
        if each is None or self.kv_bytes is None:
            return None
        return mps_client_limit(each, self.kv_bytes, self.kv_fraction)

    def describe(self) -> str:
        weights = "weights unknown" if self.weights_bytes is None else \
            f"weights {_gib(self.weights_bytes)} at {self.precision}"
        kv = "" if self.kv_bytes is None else f" + KV {_gib(self.kv_bytes)}" + ("" if self.kv_explicit else " (share)")
        lora = f" + LoRA cache {_gib(self.lora_bytes)}" if self.lora_bytes else ""
        return f"{self.model_id} {self.copies} x ({weights} + {self.overhead.describe()}{lora}{kv})"


@functools.cache
def binding_fraction() -> float:
    """The KV fraction a process with a budget gets on the instance (runtime/bootstrap.py), and so the one the
    validator checks its budget against: the highest the config allows for
    engine.kv_cache_free_gpu_memory_fraction (its `le` bound, fleetcast/config/model.py), so that
    max_tokens, not the fraction, is the smaller of the two wherever the memory is there."""
    from annotated_types import Le

    from .model import EngineSpec

    bound = next(m.le for m in EngineSpec.model_fields["kv_cache_free_gpu_memory_fraction"].metadata
                 if isinstance(m, Le))
    assert isinstance(bound, float)
    return bound


@dataclass(frozen=True)
class KvShortfall:
    """A process whose KV budget (max_tokens) would not bind were it the last to start."""

    process: ProcessMemory
    free_bytes: int  # what is free when it sizes its cache, every other process up
    granted_bytes: int  # fraction x free: what TensorRT-LLM would give it

    @property
    def fraction_needed(self) -> float:
        return (self.process.kv_bytes or 0) / self.free_bytes if self.free_bytes > 0 else math.inf


@dataclass(frozen=True)
class PoolMemory:
    """What one instance of a pool holds, against what its GPU and host offer."""

    gpu: str
    gpu_bytes: int  # the listed size
    processes: tuple[ProcessMemory, ...]
    usable_gpu_bytes: int = 0  # nvidia-smi's total; 0: unknown, the listed size stands in
    host_bytes: int = 0  # the instance's RAM; 0: unknown (a lab machine), not checked
    vcpus: int = 0  # the instance's vCPUs; 0: unknown, not checked
    mps: bool = False  # the pool shares its GPU under MPS: each process runs with a hard memory limit

    @property
    def mps_limits_bytes(self) -> int | None:
        """The sum of the processes' MPS memory limits; None when a model's size is unknown."""
        if self.planned_bytes is None:
            return None
        return sum(p.copies * (p.mps_limit_bytes or 0) for p in self.processes)

    @property
    def device_bytes(self) -> int:
        """What CUDA offers: nvidia-smi's total where the catalog knows it, else the listed size."""
        return self.usable_gpu_bytes or self.gpu_bytes

    @property
    def usable_bytes(self) -> int:
        """What a packing may plan: the device's memory less the headroom."""
        return int(self.device_bytes * (1 - HEADROOM_SHARE))

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

    def kv_shortfalls(self) -> list[KvShortfall]:
        """Processes with a KV budget that TensorRT-LLM's min() would cut, each checked as the last to start."""
        planned = self.planned_bytes
        if planned is None:
            return []
        out = []
        for p in self.processes:
            if p.kv_bytes is None or p.kv_bytes <= 0:
                continue
            free = self.device_bytes - planned + p.kv_bytes
            granted = int(p.kv_fraction * free)
            if granted < p.kv_bytes:
                out.append(KvShortfall(p, free, granted))
        return out

    @property
    def host_planned_bytes(self) -> int | None:
        """Host RAM: the instance's own + each engine process's Python processes + the largest weights passing
        through host memory while one process loads (runtime/serve.py starts them one after another)."""
        weights = [p.weights_bytes for p in self.processes]
        if any(w is None for w in weights):
            return None
        return (HOST_RESERVED_BYTES + self.process_count * SERVER_PYTHON_PROCESSES * PYTHON_PROCESS_HOST_BYTES
                + max((w for w in weights if w is not None), default=0))

    @property
    def vcpus_needed(self) -> int:
        return HOST_RESERVED_VCPUS + self.process_count * SERVER_VCPUS

    @property
    def fits(self) -> bool | None:
        """Whether GPU and host hold the packing; None when a model's size is unknown."""
        if self.planned_bytes is None:
            return None
        return not self.problems()

    def problems(self) -> list[str]:
        """What breaks, each with its arithmetic: the GPU sum, TensorRT-LLM's KV min(), host RAM, vCPUs."""
        out = []
        planned = self.planned_bytes
        if planned is not None and planned > self.usable_bytes:
            out.append(f"does not fit its GPU: {self.arithmetic()}; allowed: at most {_gib(self.usable_bytes)} "
                       "(lower kv_cache_gb or copies, a lower precision, or a larger GPU)")
        elif planned is not None:
            limits = self.mps_limits_bytes if self.mps else None
            if limits is not None and limits > self.device_bytes:
                out.append(
                    f"its MPS memory limits do not fit its GPU: each client's limit is its planned share / "
                    f"(1 - {HEADROOM_SHARE:g} headroom), at least its share with KV / its fraction: "
                    f"{' + '.join(f'{p.copies} x {_gib(p.mps_limit_bytes or 0)} ({p.model_id})' for p in self.processes)}"
                    f" = {_gib(limits)} > {_gib(self.device_bytes)} ({self.arithmetic()}); allowed: limits summing to "
                    f"at most {_gib(self.device_bytes)} (a KV fraction of at least {1 - HEADROOM_SHARE:g}, smaller "
                    "kv_cache_gb or fewer copies)")
            for s in self.kv_shortfalls():
                p = s.process
                out.append(
                    f"{p.model_id}'s KV budget would not bind: TensorRT-LLM gives a process min(max_tokens, "
                    f"free_gpu_memory_fraction x free memory), and started last (or restarted alone) it finds "
                    f"{_gib(self.device_bytes)} - {_gib(planned - (p.kv_bytes or 0))} held by the others and its own "
                    f"weights and overhead = {_gib(s.free_bytes)} free, {p.kv_fraction:g} x {_gib(s.free_bytes)} = "
                    f"{_gib(s.granted_bytes)} < its planned KV {_gib(p.kv_bytes or 0)} ({self.arithmetic()}); "
                    f"allowed: a fraction of at least {min(s.fraction_needed, 1):.3f} (at most 0.98), a smaller "
                    "kv_cache_gb or fewer copies")
        host = self.host_planned_bytes
        if self.host_bytes and host is not None and host > self.host_bytes:
            out.append(f"does not fit the host's RAM: {_gib(HOST_RESERVED_BYTES)} for the instance itself + "
                       f"{self.process_count} engine processes x {SERVER_PYTHON_PROCESSES} Python processes x "
                       f"{_gib(PYTHON_PROCESS_HOST_BYTES)} + {_gib(host - HOST_RESERVED_BYTES - self.process_count * SERVER_PYTHON_PROCESSES * PYTHON_PROCESS_HOST_BYTES)} "
                       f"of weights loading through host memory = {_gib(host)} > {_gib(self.host_bytes)} "
                       f"({HOST_SOURCE}); allowed: at most {_gib(self.host_bytes)} (fewer copies or a larger instance)")
        if self.vcpus and self.vcpus_needed > self.vcpus:
            out.append(f"does not fit the host's vCPUs: {HOST_RESERVED_VCPUS} for the gateway and the instance + "
                       f"{self.process_count} engine processes x {SERVER_VCPUS} = {self.vcpus_needed} > "
                       f"{self.vcpus} vCPUs ({HOST_SOURCE}); allowed: at most {self.vcpus - HOST_RESERVED_VCPUS} "
                       "engine processes (fewer copies or a larger instance)")
        return out

    def arithmetic(self) -> str:
        """The GPU sum in words, e.g. for the validator's message."""
        planned = self.planned_bytes
        total = "?" if planned is None else _gib(planned)
        usable = (f"{_gib(self.device_bytes)} usable (nvidia-smi)" if self.usable_gpu_bytes else
                  f"{_gib(self.device_bytes)} listed (no nvidia-smi figure in the catalog)")
        return (f"{' + '.join(p.describe() for p in self.processes)} = {total}; the {self.gpu} has {usable}, "
                f"{_gib(self.usable_bytes)} after {HEADROOM_SHARE:.0%} headroom; the {_gib(PROCESS_OVERHEAD_BYTES)} "
                f"per process is {PROCESS_OVERHEAD_SOURCE}, activations are estimated for one forward pass of "
                "max_num_tokens tokens, CUDA graphs counted from TensorRT-LLM 1.2.x's defaults")


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
    from .model import GpuSharing

    instance = instance or catalog.instance_catalog().get(pool.instance_type)
    if instance is None:
        return None
    gpu_bytes = int(instance.gpu.memory_gib * GIB)
    usable = int(instance.gpu.usable_memory_mib * MIB) if instance.gpu.usable_memory_mib else 0
    serves = cfg.serves_of(pool)
    known = {m.id: m for m in cfg.models}
    rows = []
    for serve in serves:
        model = known.get(serve.model)
        if model is None:
            continue  # the validator names the unknown model
        engine = cfg.engine_for(pool, model.id)
        parameters = None if model.parameters_b is None else model.parameters_b * 1e9
        kv = None if serve.kv_cache_gb is None else int(serve.kv_cache_gb * GIB)
        lora = LORA_DEVICE_RESERVE_BYTES if model.adapters else 0
        rows.append(ProcessMemory(model.id, engine.precision.value, serve.copies, parameters, kv, kv is not None, lora,
                                  backend=engine.backend.value, max_batch_size=engine.max_batch_size,
                                  max_num_tokens=engine.max_num_tokens,
                                  kv_fraction=engine.kv_cache_free_gpu_memory_fraction if kv is None
                                  else binding_fraction()))
    host = int(instance.memory_gib * GIB) if instance.memory_gib > 0 else 0
    vcpus = max(instance.vcpus, 0)
    plan = PoolMemory(instance.gpu.name, gpu_bytes, tuple(rows), usable, host, vcpus,
                      mps=pool.gpu_sharing is GpuSharing.MPS)
    unplanned = [r for r in rows if r.kv_bytes is None]
    if not unplanned or (plan.process_count == 1 and len(rows) == 1):
        return plan
    fixed = plan.planned_bytes
    if fixed is None:
        return plan
    share = max(0, (plan.usable_bytes - fixed) // sum(r.copies for r in unplanned))
    # The instance gives each of these processes its share as a budget, at the binding fraction (runtime/bootstrap.py).
    rows = [r if r.kv_bytes is not None else replace(r, kv_bytes=int(share), kv_fraction=binding_fraction())
            for r in rows]
    return replace(plan, processes=tuple(rows))
