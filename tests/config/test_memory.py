"""The memory arithmetic of one instance (fleetcast/config/memory.py): the sum the validator and the packing
planner both ask about, TensorRT-LLM's KV min(), the overhead by provenance, usable GPU memory and the host.

Sources. TensorRT-LLM 1.2.x (NVIDIA/TensorRT-LLM), read with this workplace's search tools: the v1.2.1 tag is
over the fetch limit (tests/runtime/trtllm_1_2_1_cli.py), so these are the stored file versions of the 1.1/1.2
line, by index id:
- tensorrt_llm/llmapi/llm_args.py (id 1090804222, the version tests/runtime/trtllm_1_2_llm_args.py reads):
  `KvCacheConfig.free_gpu_memory_fraction` default 0.9, described "If both `max_tokens` and
  `free_gpu_memory_fraction` are specified, memory corresponding to the minimum will be used";
  `TorchLlmArgs.cuda_graph_config` default_factory=CudaGraphConfig, described "each CUDA graph can use up to
  200 MB of extra memory"; `CudaGraphConfig` batch_sizes None, max_batch_size 0, enable_padding False;
  `validate_cuda_graph_config`: `max_batch_size = config.max_batch_size or 128`, then
  `_generate_cuda_graph_batch_sizes`: without padding `list(range(1, 32)) + [32, 64, 128]`, plus powers of two
  from 256 below max_batch_size, cut to <= max_batch_size; `ExtendedRuntimePerfKnobConfig.cuda_graph_mode` (the
  engine flow's C++ runtime) default False.
- tensorrt_llm/_torch/pyexecutor/model_engine.py (id 707893322) `_filter_cuda_graph_batch_sizes`: keeps the
  sizes <= min(max_batch_size, max_num_tokens / (1 + draft tokens)).
- tensorrt_llm/_torch/pyexecutor/cuda_graph_runner.py (id 2436362266): every capture
  `torch.cuda.graph(graph, pool=self.memory_pool)`, then `self.memory_pool = graph.pool()`: one shared pool.
- tensorrt_llm/_torch/pyexecutor/_util.py (id 843526953) `KvCacheCreator`: `_create_dummy_context_requests`
  makes requests totalling max_num_tokens for the profiling pass; `configure_kv_cache_capacity` reads
  `torch.cuda.mem_get_info()` (device-wide, so other processes count) and `_cal_max_memory` gives
  `(total_gpu_memory - peak_memory + allocated_bytes) * fraction`, then `min(kv_cache_max_memory,
  max_tokens * kv size per token)`.
- cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp (id 1277673704): `calculateFreeMemBytes` takes
  `getDeviceMemoryInfo` free x freeGpuMemoryFraction (TLLM_CHECK fraction < 1.0, default
  `kDefaultGpuMemFraction = 0.9F`); `calculateMaxNumBlocks`: `maxTokens = std::min(maxTokensFromConfig,
  maxTokens)` (the engine flow).
- tensorrt_llm/executor/executor.py (id 697825693) `GenerationExecutor.create`: on one GPU, "Partition the
  workload to multiple process", a GenerationExecutorProxy and a worker spawned through mpi4py.
- docs/source/reference/memory.md: the engine's activation memory is sized at build time, "close to `max number
  of input tokens * some constant factor`".
Usable GPU memory: the total nvidia-smi prints on each GPU (published outputs, found with the search tools:
"0MiB / 23028MiB" on an A10G, "0MiB / 23034MiB" on an L4, "0MiB / 46068MiB" on an L40S, "97887MiB" on a
g7e.2xlarge's RTX PRO 6000 Blackwell Server Edition, "143771MiB" on an H200). Host: the Amazon EC2 Instance
Types guide, accelerated computing specifications (g5/g6/g6e/g7e vCPUs and memory).
"""

import copy

import pytest
from ruamel.yaml import YAML

from fleetcast.config import catalog, parse_config
from fleetcast.config.memory import (
    BYTES_PER_PARAMETER,
    CUDA_GRAPH_POOL_BYTES,
    GIB,
    HEADROOM_SHARE,
    HOST_RESERVED_BYTES,
    MIB,
    PROCESS_OVERHEAD_BYTES,
    PROCESS_OVERHEAD_SOURCE,
    PYTHON_PROCESS_HOST_BYTES,
    SERVER_PYTHON_PROCESSES,
    PoolMemory,
    ProcessMemory,
    activation_bytes,
    binding_fraction,
    cuda_graph_batch_sizes,
    estimated_hidden,
    plan_pool,
    process_overhead,
)
from fleetcast.config.model import EngineSpec, Precision

from .conftest import DEFAULT, problems
from .test_models import EXAMPLE


@pytest.fixture
def example() -> dict:
    return YAML(typ="safe").load(EXAMPLE.read_text())


def _pool_problems(data: dict, pool: int) -> list[str]:
    return [p for p in problems(data) if p.startswith(f"regions[0].pools[{pool}].serves:")]


# ---------------------------------------------------------------- the figures and their sources


def test_every_precision_has_a_weight_width():
    assert set(BYTES_PER_PARAMETER) == {p.value for p in Precision}
    # 16-bit floats are two bytes; the 8-bit modes one; INT4 and NVFP4 (4-bit) half a byte.
    assert BYTES_PER_PARAMETER["fp16"] == BYTES_PER_PARAMETER["bf16"] == 2
    assert BYTES_PER_PARAMETER["int8_wo"] == BYTES_PER_PARAMETER["int8_sq"] == BYTES_PER_PARAMETER["fp8"] == 1
    assert BYTES_PER_PARAMETER["int4_wo"] == BYTES_PER_PARAMETER["nvfp4"] == 0.5


def test_the_measured_overhead_is_the_one_the_instance_plans_with_and_says_it_is_the_reference_backends():
    from runtime import kv_budget

    assert PROCESS_OVERHEAD_BYTES == kv_budget.PROCESS_OVERHEAD_BYTES == 1200 * 2**20
    assert "measured with the reference backend" in PROCESS_OVERHEAD_SOURCE
    assert "TensorRT-LLM's own per-process overhead is not measured" in PROCESS_OVERHEAD_SOURCE


def test_the_kv_fraction_default_is_tensorrt_llms_and_below_the_engine_flows_limit():
    # llm_args.py KvCacheConfig.free_gpu_memory_fraction default 0.9; kvCacheManager.cpp kDefaultGpuMemFraction
    # 0.9F and TLLM_CHECK(freeMemFraction < 1.0F): the config's bound (le=0.98) stays below it.
    engine = EngineSpec()
    assert engine.kv_cache_free_gpu_memory_fraction == 0.9
    assert EngineSpec.model_fields["kv_cache_free_gpu_memory_fraction"].metadata[-1].le == 0.98 < 1.0


def test_the_pytorch_backend_captures_cuda_graphs_for_the_default_batch_sizes_up_to_the_engines_batch():
    # Default CudaGraphConfig: 1..31, 32, 64, 128, cut to min(max_batch_size, max_num_tokens).
    assert cuda_graph_batch_sizes(64, 8192) == (*range(1, 32), 32, 64)
    assert len(cuda_graph_batch_sizes(32, 8192)) == 32
    assert cuda_graph_batch_sizes(128, 8192)[-3:] == (32, 64, 128) and len(cuda_graph_batch_sizes(128, 8192)) == 34
    assert cuda_graph_batch_sizes(2048, 8192) == cuda_graph_batch_sizes(128, 8192)  # no size above 128 by default
    assert cuda_graph_batch_sizes(64, 16) == tuple(range(1, 17))  # a pure decode batch needs a token each


def test_overhead_is_measured_plus_activations_plus_one_shared_cuda_graph_pool_on_the_pytorch_backend():
    pytorch = process_overhead("pytorch", 3.09e9, 32, 8192)
    assert pytorch.measured_bytes == PROCESS_OVERHEAD_BYTES
    assert pytorch.activation_bytes == activation_bytes(3.09e9, 8192) > 0
    assert pytorch.cuda_graphs == 32 and pytorch.cuda_graph_bytes == CUDA_GRAPH_POOL_BYTES == 200 * MIB
    assert pytorch.total_bytes == PROCESS_OVERHEAD_BYTES + pytorch.activation_bytes + CUDA_GRAPH_POOL_BYTES
    # The engine flow's C++ runtime captures no CUDA graph by default; its activations are sized at build time.
    engine = process_overhead("tensorrt", 3.09e9, 32, 8192)
    assert engine.cuda_graphs == 0 and engine.total_bytes == PROCESS_OVERHEAD_BYTES + engine.activation_bytes
    # Activations grow with the tokens one forward pass may hold (memory.md: tokens x a constant factor).
    assert activation_bytes(3.09e9, 4096) * 2 == activation_bytes(3.09e9, 8192)
    assert "measured" in pytorch.describe() and "estimated" in pytorch.describe() and "from source" in \
        pytorch.describe()


@pytest.mark.parametrize(("model", "parameters", "hidden"), [
    # hidden_size / n_embd and parameter counts of the published config.json files on the Hugging Face hub.
    ("openai-community/gpt2-xl", 1.56e9, 1600),
    ("Qwen/Qwen2.5-0.5B-Instruct", 0.49e9, 896),
    ("Qwen/Qwen2.5-3B-Instruct", 3.09e9, 2048),
    ("meta-llama/Llama-3.1-8B-Instruct", 8.03e9, 4096),
    ("meta-llama/Llama-3.1-70B-Instruct", 70.6e9, 8192),
])
def test_the_hidden_size_estimated_from_parameters_is_not_below_the_published_one(model, parameters, hidden):
    assert hidden <= estimated_hidden(parameters) < 2.2 * hidden, model


def test_usable_gpu_memory_is_what_nvidia_smi_reports_not_the_listed_size():
    gpus = {name: catalog.gpu_by_name(name) for name in ("A10G", "L4", "L40S", "RTXPRO6000", "H200")}
    assert {name: gpu.usable_memory_mib for name, gpu in gpus.items()} == {
        "A10G": 23028, "L4": 23034, "L40S": 46068, "RTXPRO6000": 97887, "H200": 143771}
    assert all(gpu.usable_memory_mib < gpu.memory_gib * 1024 for gpu in gpus.values())


def test_the_h200_figure_agrees_with_what_the_colocation_run_saw_free():
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).resolve().parents[2] / "bench" / "data" / "h200-colocate.json").read_text())
    first = data["starts"][0]["processes"][0]
    seen = first["free_before_kv_bytes"] + first["weights_bytes"] + first["overhead_bytes"]
    assert seen <= catalog.gpu_by_name("H200").usable_memory_mib * MIB < seen + GIB


def test_the_headroom_is_ten_percent_of_the_memory_really_there():
    cfg = parse_config(YAML(typ="safe").load(EXAMPLE.read_text()))
    plan = plan_pool(cfg, cfg.regions[0].pools[0])
    assert plan.gpu == "L40S" and plan.gpu_bytes == 48 * GIB and plan.device_bytes == 46068 * MIB
    assert HEADROOM_SHARE == 0.10 and plan.usable_bytes == int(46068 * MIB * 0.9)
    assert "44.99 GiB usable (nvidia-smi), 40.49 GiB after 10% headroom" in plan.arithmetic()


def test_instance_hosts_are_the_aws_table():
    table = {name: (i.vcpus, i.memory_gib) for name, i in catalog.instance_catalog().items()}
    assert table == {"g5.xlarge": (4, 16), "g5.2xlarge": (8, 32), "g6.xlarge": (4, 16), "g6.2xlarge": (8, 32),
                     "g6e.xlarge": (4, 32), "g6e.2xlarge": (8, 64), "g7e.2xlarge": (8, 64)}


# ---------------------------------------------------------------- the sum


def test_the_sum_is_weights_plus_overhead_plus_kv_per_copy(example):
    cfg = parse_config(example)
    plan = plan_pool(cfg, cfg.regions[0].pools[0])

    def each(params, width, backend, batch, kv_gib):
        return params * width + process_overhead(backend, params, batch, 8192).total_bytes + kv_gib * GIB

    expected = (1 * each(1.56e9, 1, "tensorrt", 64, 8) + 2 * each(0.49e9, 2, "pytorch", 64, 4)
                + 1 * each(3.09e9, 2, "pytorch", 32, 4))
    assert plan.planned_bytes == pytest.approx(expected, abs=4)
    assert plan.process_count == 4 and plan.fits


def test_budgets_left_out_share_what_the_explicit_ones_leave(example):
    serves = example["regions"][0]["pools"][0]["serves"]
    del serves[0]["kv_cache_gb"], serves[1]["kv_cache_gb"]
    cfg = parse_config(example)
    pool = cfg.regions[0].pools[0]
    plan = plan_pool(cfg, pool)
    shares = [p.kv_bytes for p in plan.processes]
    assert shares[2] == 4 * GIB and shares[0] == shares[1]
    fixed = sum(p.copies * p.before_kv_bytes for p in plan.processes) + 4 * GIB
    assert shares[0] == pytest.approx((plan.usable_bytes - fixed) / 3, abs=1)
    # served_by hands the instance the explicit budgets only: it plans the shares from the memory really free.
    assert [s.kv_cache_bytes for s in cfg.served_by(pool)] == [None, None, 4 * GIB]


def test_planned_shares_do_not_depend_on_the_serves_order(example):
    """Each process's KV share is planned from the whole pool, never from what is free when it starts."""
    cfg = parse_config(example)
    reordered = copy.deepcopy(example)
    for pool in reordered["regions"][0]["pools"]:
        pool["serves"].reverse()
    other = parse_config(reordered)
    for a, b in zip(cfg.regions[0].pools, other.regions[0].pools):
        assert {p.model_id: p.kv_bytes for p in plan_pool(cfg, a).processes} == \
               {p.model_id: p.kv_bytes for p in plan_pool(other, b).processes}


def test_a_single_process_without_a_budget_keeps_the_kv_fraction():
    from fleetcast.config import load_config

    cfg = load_config(DEFAULT)
    (served,) = cfg.served_by(cfg.regions[0].pools[0])
    assert served.kv_cache_bytes is None  # trtllm-serve's kv_cache_free_gpu_memory_fraction, as before


def test_a_pool_that_leaves_no_kv_for_its_shares_is_refused(example):
    pool = example["regions"][0]["pools"][1]
    pool["serves"][2]["copies"] = 3
    assert _pool_problems(example, 1)


# ---------------------------------------------------------------- what the validator refuses, with the arithmetic


def test_a_packing_over_the_usable_gpu_memory_is_refused_though_it_fits_the_listed_size(example):
    # 40.73 GiB: under 48 GiB x 0.9 = 43.2 (the old check) but over 44.99 GiB x 0.9 = 40.49.
    example["regions"][0]["pools"][0]["serves"][2]["kv_cache_gb"] = 8
    (found,) = _pool_problems(example, 0)
    assert "does not fit its GPU" in found and "= 40.73 GiB" in found, found
    assert "44.99 GiB usable (nvidia-smi), 40.49 GiB after 10% headroom" in found
    assert "1.17 GiB measured" in found and "activations" in found and "estimated" in found
    assert "32 CUDA graphs 0.20 GiB from source" in found


def test_a_budgeted_process_is_checked_at_the_fraction_the_instance_gives_it(example):
    """TensorRT-LLM gives min(max_tokens, fraction x free). The instance runs every process that has a KV budget
    at binding_fraction() (runtime/bootstrap.py), whatever engine.kv_cache_free_gpu_memory_fraction says, so the
    validator checks the budget at that fraction: a low configured one refuses nothing it would not run."""
    assert binding_fraction() == 0.98  # the config's upper bound for the fraction (EngineSpec)
    example["models"][2]["engine"]["kv_cache_free_gpu_memory_fraction"] = 0.3  # qwen2.5-3b, budgeted in pool 0
    plan = plan_pool(parse_config(example), parse_config(example).regions[0].pools[0])
    assert {p.kv_fraction for p in plan.processes if p.kv_bytes} == {binding_fraction()}
    assert _pool_problems(example, 0) == []


def test_a_kv_budget_even_the_binding_fraction_would_cut_is_named_with_the_fraction_it_needed():
    """Started last, a process finds the others' memory taken; on a device its processes nearly fill, even the
    binding fraction falls short of its budget, and the shortfall says what it would need."""
    proc = ProcessMemory("m", "fp16", 2, 1e9, 8 * GIB, True, kv_fraction=binding_fraction())
    device = 2 * proc.before_kv_bytes + 16 * GIB + 64 * (1 << 20)  # 64 MiB beyond the two budgets
    (cut,) = PoolMemory("GPU", device, (proc,), usable_gpu_bytes=device).kv_shortfalls()
    assert cut.free_bytes == 8 * GIB + 64 * (1 << 20) and cut.granted_bytes == int(binding_fraction() * cut.free_bytes)
    assert cut.granted_bytes < 8 * GIB and 0.99 < cut.fraction_needed < 1


def test_the_min_rule_checks_every_process_as_the_last_to_start():
    """Two processes that each hold W before their KV, on a device of 2 W + 20 GiB; A plans 8 GiB, B 6 GiB.
    Started last, A finds (2 W + 20) - (W + 6) - W = 14 GiB free: 0.9 x 14 >= 8 binds; B finds 12: binds. At a
    fraction of 0.5, A gets 7 < 8: cut, and a fraction of 8 / 14 would have bound."""
    def proc(name, kv_gib, fraction):
        return ProcessMemory(name, "fp16", 1, 1e9, kv_gib * GIB, True, kv_fraction=fraction)

    w = proc("x", 1, 0.9).before_kv_bytes
    device = 2 * w + 20 * GIB
    b = proc("b", 6, 0.9)
    assert PoolMemory("GPU", device, (proc("a", 8, 0.9), b), usable_gpu_bytes=device).kv_shortfalls() == []
    (cut,) = PoolMemory("GPU", device, (proc("a", 8, 0.5), b), usable_gpu_bytes=device).kv_shortfalls()
    assert cut.process.model_id == "a" and cut.free_bytes == 14 * GIB
    assert cut.granted_bytes == 7 * GIB and cut.fraction_needed == pytest.approx(8 / 14)


def test_three_servers_on_a_g6_xlarge_are_refused_for_host_ram(example):
    example["regions"][0]["pools"][1]["instance_type"] = "g6.xlarge"
    (found,) = _pool_problems(example, 1)
    assert found.endswith("(fewer copies or a larger instance)")
    expected = HOST_RESERVED_BYTES + 3 * SERVER_PYTHON_PROCESSES * PYTHON_PROCESS_HOST_BYTES + int(3.09e9 * 2)
    assert (f"2.00 GiB for the instance itself + 3 engine processes x 2 Python processes x 2.00 GiB + 5.76 GiB of "
            f"weights loading through host memory = {expected / GIB:.2f} GiB > 16.00 GiB") in found, found
    assert "from source (executor.py)" in found and "estimated, not measured" in found


def test_more_engine_processes_than_the_hosts_vcpus_allow_are_refused(example):
    example["regions"][0]["pools"][0]["instance_type"] = "g6e.xlarge"  # 4 vCPUs for 4 processes and the gateway
    (found,) = _pool_problems(example, 0)
    assert "1 for the gateway and the instance + 4 engine processes x 1 = 5 > 4 vCPUs" in found, found
    assert "allowed: at most 3 engine processes" in found


def test_a_single_process_pool_is_checked_against_its_host_where_its_size_is_known(doc):
    doc["model"]["parameters_b"] = 13  # 12.1 GiB of int8 weights through a 16 GiB host on load
    doc["regions"][0]["pools"][0]["instance_type"] = "g6.xlarge"
    found = [p for p in problems(doc) if "host's RAM" in p]
    assert found and "1 engine processes" in found[0]


def test_a_lab_machine_without_host_figures_is_not_checked_for_its_host(example):
    from fleetcast.plan.packing import lab_instance

    cfg = parse_config(example)
    lab = lab_instance("h200-lab", {"H200": "h200-lab"})
    plan = plan_pool(cfg, cfg.regions[0].pools[0], lab)
    assert plan.host_bytes == 0 and plan.vcpus == 0 and plan.fits
    assert plan.device_bytes == 143771 * MIB


def test_each_copy_of_a_model_with_adapters_counts_its_lora_device_reserve(example):
    """The LoRA device cache is sized on the instance from what staging read (ranks, modules) and the model's
    config.json; validate knows neither, so it counts the reserve the instance sizes the cache within."""
    from fleetcast.contract.adapters import LORA_DEVICE_RESERVE_BYTES

    example["regions"][0]["pools"][0]["serves"][1]["kv_cache_gb"] = 3  # room for two reserves
    before = plan_pool(parse_config(example), parse_config(example).regions[0].pools[0])
    example["models"][1]["adapters"] = [{"id": "qwen-sql", "source": "example-org/qwen-sql-lora"}]  # 2 copies
    cfg = parse_config(example)
    plan = plan_pool(cfg, cfg.regions[0].pools[0])
    assert plan.planned_bytes - before.planned_bytes == 2 * LORA_DEVICE_RESERVE_BYTES == 2 * GIB
    assert "+ LoRA cache 1.00 GiB + KV 3.00 GiB)" in plan.arithmetic()
    assert "LoRA" not in before.arithmetic()


def test_validate_names_the_lora_reserve_in_the_sum_of_a_pool_it_refuses(example):
    example["regions"][0]["pools"][0]["serves"][2]["kv_cache_gb"] = 7.5
    assert not _pool_problems(example, 0)  # 0.26 GiB to spare: fits without adapters
    example["models"][2]["adapters"] = [{"id": "qwen3b-sql", "source": "example-org/qwen3b-sql-lora"}]
    found = _pool_problems(example, 0)
    assert found and "+ LoRA cache 1.00 GiB + KV 7.50 GiB)" in found[0] and "does not fit its GPU" in found[0], found


def test_the_planner_asks_the_same_question(example):
    """fleetcast/plan/packing.py's packing_memory is plan_pool for a packing the config does not hold yet:
    its `fits` is the validator's problems() being empty, host included."""
    from fleetcast.plan.packing import packing_memory

    cfg = parse_config(example)
    packing = (("gpt2-xl", "int8_wo", 1), ("qwen2.5-0.5b", "bf16", 1), ("qwen2.5-3b", "bf16", 1))
    small = packing_memory(cfg, "g6.xlarge", packing)
    large = packing_memory(cfg, "g6.2xlarge", packing)
    assert small.arithmetic() == large.arithmetic()
    assert small.fits is False and any("host's RAM" in p for p in small.problems())
    assert large.fits is True and large.problems() == []


# ---------------------------------------------------------------- MPS: each client's hard limit


def test_under_mps_each_limit_is_the_instances_and_the_limits_sum_to_at_most_the_usable_memory(example):
    """An MPS pool's processes each run with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: the validator's figure is the one
    runtime/bootstrap.py sets (runtime.kv_budget.mps_memory_limit from weights, the validator's overhead and the
    budget at the binding fraction), its planned share plus its part of the headroom; planned within the usable
    memory less the headroom, the limits sum to at most the usable memory."""
    from runtime.kv_budget import mps_memory_limit

    serves = example["regions"][0]["pools"][0]["serves"]
    for serve in serves:
        serve.pop("kv_cache_gb", None)  # every process shares what the usable memory leaves: the fullest plan
        serve.pop("mps_active_thread_percentage", None)
    example["regions"][0]["pools"][0]["gpu_sharing"] = "mps"
    cfg = parse_config(example)
    plan = plan_pool(cfg, cfg.regions[0].pools[0])
    assert plan.mps and plan.planned_bytes == pytest.approx(plan.usable_bytes, abs=plan.process_count)
    for p in plan.processes:
        assert p.mps_limit_bytes == mps_memory_limit(p.weights_bytes, p.kv_bytes, binding_fraction(), p.lora_bytes,
                                                     p.overhead_bytes)
        assert p.mps_limit_bytes >= p.each_bytes / (1 - HEADROOM_SHARE) - 1
    assert plan.mps_limits_bytes <= plan.device_bytes and plan.fits
    assert plan.mps_limits_bytes == pytest.approx(plan.device_bytes, abs=64)  # within the shares' rounding


def test_mps_limits_over_the_usable_memory_are_refused_with_their_arithmetic():
    """A budget at a fraction below 1 - the headroom share: its limit must leave room for KV / fraction, more than
    its share of the headroom, and two such clients' limits pass the GPU though their shares fit."""
    proc = ProcessMemory("m", "fp16", 2, 1e9, 8 * GIB, True, kv_fraction=0.5)
    # Each started last binds (0.5 x (device - the other's share - its own before-KV) = 10 GiB >= 8): the min() rule
    # holds; but each limit needs before-KV + 16 GiB, and two pass the device by 4 GiB.
    device = 2 * proc.before_kv_bytes + 28 * GIB
    assert PoolMemory("GPU", device, (proc,), usable_gpu_bytes=device).problems() == []  # time-sliced: no limits
    plan = PoolMemory("GPU", device, (proc,), usable_gpu_bytes=device, mps=True)
    assert proc.mps_limit_bytes == proc.before_kv_bytes + 16 * GIB
    (problem,) = plan.problems()
    assert problem.startswith("its MPS memory limits do not fit its GPU: each client's limit is its planned share / "
                              "(1 - 0.1 headroom)")
    assert f"2 x {proc.mps_limit_bytes / GIB:.2f} GiB (m)" in problem and f"> {device / GIB:.2f} GiB" in problem
