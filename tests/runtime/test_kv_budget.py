"""KV budgets on a shared GPU: what TensorRT-LLM 1.2.x honours, and budgets that no start order changes.

Sources (NVIDIA/TensorRT-LLM, read with this workplace's search tools; the v1.2.1 tag itself is over
the fetch limit, as tests/runtime/trtllm_1_2_1_cli.py explains):
- cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp (commit 002ba6a7cc5eb28f180d45d4a91142d9d927a606),
  `BaseKVCacheManager::calculateMaxNumBlocks`: tokens = allottedPrimaryMemBytes (free memory x
  freeGpuMemoryFraction) / cache bytes per token, then `if (config.maxTokens.has_value())
  maxTokens = std::min(maxTokensFromConfig, maxTokens)`; primary blocks = ceilDiv(tokens, tokensPerBlock).
  The engine flow (`--backend tensorrt`) sizes its KV cache here. `maxGpuTotalBytes` is a field of the
  executor's `KvCacheConfig` (cpp/include/tensorrt_llm/executor/executor.h) that this function never reads.
- tensorrt_llm/_torch/pyexecutor/_util.py, `KvCacheCreator.configure_kv_cache_capacity` (PyTorch
  backend): `kv_cache_max_memory = min(kv_cache_max_memory, self._max_kv_tokens_in *
  self._get_kv_size_per_token())` where `_max_kv_tokens_in = kv_cache_config.max_tokens`; then
  `max_gpu_total_bytes`, when > 0, is min'ed in as well.
So `kv_cache_config.max_tokens` is the one budget knob both backends honour; the fraction stays as a cap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetcast.config.memory import binding_fraction
from fleetcast.contract.errors import UserError
from fleetcast.contract.serving import HEADROOM_SHARE, mps_client_limit
from runtime import kv_budget, trtllm
from tests.runtime.trtllm_1_2_llm_args import ARGS_BY_BACKEND, KV_CACHE_CONFIG

GIB = 1 << 30
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cfg():
    from fleetcast.config import load_config

    return load_config(REPO / "config" / "fleet.yaml")


@dataclass(frozen=True)
class Slot:
    model_id: str
    copy_index: int
    port: int


def test_max_tokens_is_a_kv_cache_config_field_of_both_backends():
    assert "max_tokens" in KV_CACHE_CONFIG
    assert all("kv_cache_config" in fields for fields in ARGS_BY_BACKEND.values())


def test_a_budget_reaches_trtllm_serve_as_max_tokens_next_to_the_fraction(cfg):
    engine = cfg.engine
    options = trtllm.extra_llm_api_options(engine, kv_max_tokens=65536)
    assert options["kv_cache_config"] == {"free_gpu_memory_fraction": engine.kv_cache_free_gpu_memory_fraction,
                                          "max_tokens": 65536}
    assert set(options["kv_cache_config"]) <= KV_CACHE_CONFIG
    # No budget, no key: a single-model instance's options are what they were.
    assert "max_tokens" not in trtllm.extra_llm_api_options(engine)["kv_cache_config"]


def _engine_artifact(tmp_path, kv_quant=None):
    engine = tmp_path / "artifact" / "engine"
    engine.mkdir(parents=True)
    quant = {"quant_algo": "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN", "kv_cache_quant_algo": kv_quant}
    (engine / "config.json").write_text(json.dumps({"pretrained_config": {
        "architecture": "GPTForCausalLM", "dtype": "float16", "num_hidden_layers": 48, "num_attention_heads": 25,
        "num_key_value_heads": 25, "hidden_size": 1600, "quantization": quant}}))
    return tmp_path / "artifact"


def test_kv_bytes_per_token_of_a_gpt2_xl_engine(tmp_path):
    # 2 (K, V) x 48 layers x 25 heads x 64 head size x 2 bytes (fp16): 300 KiB a token.
    assert kv_budget.kv_bytes_per_token(_engine_artifact(tmp_path), "tensorrt", "auto") == 307_200
    assert kv_budget.kv_bytes_per_token(_engine_artifact(tmp_path / "i8", "INT8"), "tensorrt", "int8") == 153_600


def test_kv_bytes_per_token_of_a_hugging_face_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2, "hidden_size": 1536,
        "torch_dtype": "bfloat16"}))  # Qwen2.5-1.5B: grouped-query attention, 2 KV heads of 128
    assert kv_budget.kv_bytes_per_token(tmp_path, "pytorch", "auto") == 2 * 28 * 2 * 128 * 2
    assert kv_budget.kv_bytes_per_token(tmp_path, "pytorch", "fp8") == 2 * 28 * 2 * 128


def test_an_unreadable_config_is_named(tmp_path):
    with pytest.raises(UserError, match=r"kv_cache_gb: .*config.json"):
        kv_budget.kv_bytes_per_token(tmp_path, "pytorch", "auto")


def test_the_serve_command_carries_the_budget_in_tokens(cfg, tmp_path):
    artifact = _engine_artifact(tmp_path, "INT8")
    (artifact / "tokenizer").mkdir()
    backend = trtllm.TrtllmBackend(cfg, cfg.engine)
    argv = backend.server_command(artifact, "127.0.0.1", 8002, kv_cache_bytes=12 * GIB)
    options = json.loads(Path(argv[argv.index("--extra_llm_api_options") + 1]).read_text())
    assert options["kv_cache_config"]["max_tokens"] == 12 * GIB // 153_600


def test_budgets_do_not_depend_on_the_order_of_the_slots():
    slots = [Slot("gpt2-xl", 0, 8001), Slot("qwen", 0, 8002), Slot("qwen", 1, 8003), Slot("small", 0, 8004)]
    explicit = {"gpt2-xl": 12 * GIB, "qwen": None, "small": None}
    weights = {"gpt2-xl": 2 * GIB, "qwen": 3 * GIB, "small": GIB}
    forward = kv_budget.plan_budgets(slots, explicit, weights, free_bytes=46 * GIB, fraction=0.9)
    backward = kv_budget.plan_budgets(list(reversed(slots)), explicit, weights, free_bytes=46 * GIB, fraction=0.9)
    assert forward == backward
    assert forward[("gpt2-xl", 0)] == 12 * GIB
    # The three unbudgeted processes share what is left, equally.
    shares = {forward[("qwen", 0)], forward[("qwen", 1)], forward[("small", 0)]}
    assert len(shares) == 1
    used = 12 * GIB + 2 * GIB + 2 * 3 * GIB + GIB + 4 * kv_budget.PROCESS_OVERHEAD_BYTES + 3 * shares.pop()
    assert int(0.9 * 46 * GIB) - 3 < used <= int(0.9 * 46 * GIB)


def test_one_process_without_a_budget_keeps_the_engines_fraction():
    assert kv_budget.plan_budgets([Slot("m", 0, 8001)], {"m": None}, {"m": GIB}, 46 * GIB, 0.9) == {("m", 0): None}


def test_nothing_left_for_an_unbudgeted_model_is_refused_with_the_arithmetic():
    slots = [Slot("big", 0, 8001), Slot("small", 0, 8002)]
    with pytest.raises(UserError, match=r"kv_cache_gb: nothing is left for the KV cache of small: 0.9 x 24.0 GiB"):
        kv_budget.plan_budgets(slots, {"big": 20 * GIB, "small": None}, {"big": GIB, "small": GIB}, 24 * GIB, 0.9)


def test_the_measured_overhead_is_the_one_in_the_h200_dataset():
    data = json.loads((REPO / "bench/data/h200-colocate.json").read_text())
    measured = [p["overhead_bytes"] for start in data["starts"] for p in start["processes"]]
    # The planning figure covers every process measured, and is not far above the largest.
    assert max(measured) <= kv_budget.PROCESS_OVERHEAD_BYTES < max(measured) * 1.1


def test_a_budgeted_process_gets_the_highest_fraction_the_config_allows():
    """TensorRT-LLM takes min(max_tokens, fraction x free memory at start) (sources above; the LLM API's KvCacheConfig
    bounds the fraction to [0, 1], nvidia.github.io/TensorRT-LLM/llm-api/reference/KvCacheConfig.html). With the
    highest fraction the config accepts, the fraction is the smaller only where the memory is not there at all."""
    from fleetcast.config.model import EngineSpec

    assert binding_fraction() == 0.98
    with pytest.raises(ValueError):
        EngineSpec(tensorrt_llm_version="1.2.1", image="nvcr.io/nvidia/tensorrt-llm/release:1.2.1",
                   kv_cache_free_gpu_memory_fraction=binding_fraction() + 0.01)
    options = trtllm.extra_llm_api_options(EngineSpec(tensorrt_llm_version="1.2.1",
                                                      image="nvcr.io/nvidia/tensorrt-llm/release:1.2.1"),
                                           kv_max_tokens=4096, kv_fraction=0.98)
    assert options["kv_cache_config"] == {"free_gpu_memory_fraction": 0.98, "max_tokens": 4096}


def test_the_serve_command_carries_the_binding_fraction_in_the_flag_and_the_options(cfg, tmp_path):
    artifact = _engine_artifact(tmp_path, "INT8")
    (artifact / "tokenizer").mkdir()
    backend = trtllm.TrtllmBackend(cfg, cfg.engine)
    argv = backend.server_command(artifact, "127.0.0.1", 8002, kv_cache_bytes=12 * GIB, kv_fraction=0.98)
    options = json.loads(Path(argv[argv.index("--extra_llm_api_options") + 1]).read_text())
    assert options["kv_cache_config"]["free_gpu_memory_fraction"] == 0.98
    assert argv[argv.index("--kv_cache_free_gpu_memory_fraction") + 1] == "0.98"
    assert backend.planned_kv_tokens(artifact, 12 * GIB) == 12 * GIB // 153_600 == options["kv_cache_config"]["max_tokens"]


def test_a_plan_whose_budgets_bind_in_every_start_order_passes():
    slots = [Slot("a", 0, 8001), Slot("b", 0, 8002), Slot("c", 0, 8003)]
    weights = {"a": 2 * GIB, "b": GIB, "c": GIB}
    budgets = kv_budget.plan_budgets(slots, {"a": None, "b": None, "c": None}, weights, 40 * GIB, 0.9)
    kv_budget.check_budgets_bind(slots, budgets, weights, 40 * GIB, binding_fraction())
    # Planned with the engine's 0.9, the last of them to start finds about 10% of the GPU plus its own share
    # free; 0.98 of that is more than its share, so max_tokens binds (and with 0.9 itself it would too).
    kv_budget.check_budgets_bind(slots, budgets, weights, 40 * GIB, 0.9)


def test_a_budget_that_cannot_bind_in_the_worst_start_order_is_refused_with_the_arithmetic():
    """Explicit budgets that fill the GPU: started last, a process would find less than budget / fraction free,
    TensorRT-LLM would take the fraction and the process would come out short, so the plan is refused."""
    slots = [Slot("a", 0, 8001), Slot("b", 0, 8002)]
    weights = {"a": GIB, "b": GIB}
    budgets = {("a", 0): 20 * GIB, ("b", 0): 20 * GIB}
    overhead = kv_budget.PROCESS_OVERHEAD_BYTES
    free = 2 * GIB + 2 * overhead + 40 * GIB + GIB // 4  # everything fits, with a quarter GiB to spare
    with pytest.raises(UserError) as err:
        kv_budget.check_budgets_bind(slots, budgets, weights, free, 0.98)
    message = str(err.value)
    assert message.startswith("kv_cache_gb: a#0's KV budget of 20.00 GiB cannot bind: started last")
    assert "min(max_tokens, 0.98 x that = 19.84 GiB)" in message
    kv_budget.check_budgets_bind(slots, budgets, weights, free + GIB, 0.98)  # a GiB more, and both bind


def test_an_mps_limit_is_the_planned_share_with_its_part_of_the_headroom_and_room_for_the_fraction():
    """A client sees its CUDA_MPS_PINNED_DEVICE_MEM_LIMIT as its memory (runtime/mps.py). Its limit is its planned
    share over (1 - the validator's headroom share), so the limits of a packing planned within the usable memory less
    the headroom sum to at most the usable memory; and never less than its share with the KV part divided by its
    fraction, so fraction x (limit - weights - overhead) is still its whole budget and max_tokens binds."""
    overhead = kv_budget.PROCESS_OVERHEAD_BYTES
    planned = 2 * GIB + overhead + GIB + 49 * GIB
    limit = kv_budget.mps_memory_limit(2 * GIB, 49 * GIB, 0.98, lora=GIB)
    assert HEADROOM_SHARE == 0.10 and limit == planned * 10 // 9
    assert 0.98 * (limit - 2 * GIB - overhead - GIB) >= 49 * GIB
    # A fraction below 1 - the headroom share: the fraction's room is the larger, and it is what the limit gives.
    low = kv_budget.mps_memory_limit(2 * GIB, 49 * GIB, 0.5, lora=GIB)
    assert low == 2 * GIB + overhead + GIB + 98 * GIB and 0.5 * (low - 2 * GIB - overhead - GIB) >= 49 * GIB
    # Shares that fill the usable memory less the headroom: the limits sum to at most the usable memory.
    usable = 143 * GIB
    shares = [int(usable * 0.9) // 3 + d for d in (-7, 3, 4)]
    assert sum(mps_client_limit(s, s // 2, 0.98) for s in shares) <= usable


def test_the_h200_sharing_run_peaked_within_the_bare_share_and_leaves_a_tenth_of_the_new_limit_free():
    """Why the headroom part: on the H200 sharing run (bench/data/h200-sharing, MPS) each client's limit was its bare
    planned share with KV / 0.98, and at the end (its torch peak reached) 36-105 MB of it was left; the same clients
    under today's limit would have at least 8% of it left."""
    root = Path(__file__).resolve().parents[2] / "bench" / "data" / "h200-sharing"
    seen = 0
    for path in sorted(root.glob("mps-*/sharing.json")):
        run = json.loads(path.read_text())
        for proc in run["start"]["processes"]:
            stop = run["stop"]["memory_at_stop"][proc["model"]]
            old_limit = proc["mps_mem_limit_bytes"]
            used = old_limit - stop["cuda_free_bytes"]
            assert stop["torch_reserved_now_bytes"] == stop["torch_peak_reserved_bytes"]  # at its peak when read
            assert stop["cuda_free_bytes"] < 0.015 * old_limit  # the thin margin
            weights, kv = proc["weights_bytes"], proc["planned_kv_bytes"]
            overhead = old_limit - weights - -(-kv * 1_000_000 // int(binding_fraction() * 1_000_000))
            new_limit = kv_budget.mps_memory_limit(weights, kv, binding_fraction(), overhead=overhead)
            assert new_limit - used >= 0.08 * new_limit
            seen += 1
    assert seen == 4


def test_each_model_can_bring_its_own_overhead_and_the_share_counts_it():
    """The instance plans with the validator's per-process overhead of each model (activations, CUDA graphs on the
    PyTorch backend: fleetcast.config.memory.served_overhead), not one figure for all."""
    slots = [Slot("big", 0, 8001), Slot("small", 0, 8002)]
    explicit = {"big": None, "small": None}
    weights = {"big": 2 * GIB, "small": GIB}
    flat = kv_budget.plan_budgets(slots, explicit, weights, 40 * GIB, 0.9)
    own = kv_budget.plan_budgets(slots, explicit, weights, 40 * GIB, 0.9,
                                 overhead_bytes={"big": 3 * GIB, "small": kv_budget.PROCESS_OVERHEAD_BYTES})
    # big's overhead is 3 GiB, not 1.2: the two shares are smaller by half the difference each.
    extra = 3 * GIB - kv_budget.PROCESS_OVERHEAD_BYTES
    weights_and_overheads = 2 * GIB + GIB + 3 * GIB + kv_budget.PROCESS_OVERHEAD_BYTES
    assert own[("big", 0)] == own[("small", 0)] == (int(0.9 * 40 * GIB) - weights_and_overheads) // 2
    assert flat[("big", 0)] - own[("big", 0)] in (extra // 2, extra // 2 + 1)
    # A plan made with the flat figure binds by that figure, and not once big's own overhead is counted.
    flat = kv_budget.plan_budgets(slots, explicit, weights, 40 * GIB, 0.98)
    kv_budget.check_budgets_bind(slots, flat, weights, 40 * GIB, 0.98)
    with pytest.raises(UserError, match=r"big#0's KV budget .* cannot bind"):
        kv_budget.check_budgets_bind(slots, flat, weights, 40 * GIB, 0.98, overhead_bytes={"big": 3 * GIB})


def test_the_instance_counts_the_overhead_the_validator_checked():
    """runtime/bootstrap.py takes each model's overhead from served_overhead, the same figure plan_pool's rows use
    (the example's models declare parameters_b, so activations are counted beyond the measured 1.2 GiB)."""
    from fleetcast.config import load_config
    from fleetcast.config.memory import plan_pool, served_overhead

    cfg = load_config(REPO / "examples" / "multi-model" / "fleet.yaml")
    compared = 0
    for pool in (pool for region in cfg.regions for pool in region.pools):
        plan = plan_pool(cfg, pool)
        rows = {row.model_id: row for row in plan.processes}
        for served in cfg.served_by(pool):
            assert served_overhead(served).total_bytes == rows[served.model.id].overhead_bytes
            compared += served_overhead(served).total_bytes > kv_budget.PROCESS_OVERHEAD_BYTES
    assert compared
