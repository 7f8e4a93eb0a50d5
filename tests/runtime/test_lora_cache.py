"""The LoRA device cache of a base model's engine process: sized as TensorRT-LLM 1.2.x sizes it, pinned by
`lora_config.max_loras` instead of a share of the GPU memory free at start, and counted in the instance's memory
plan (fleetcast.contract.adapters; runtime/bootstrap.py, runtime/kv_budget.py).

Sources (NVIDIA/TensorRT-LLM, the 1.2.x-era files read with this workplace's search tools):
- tensorrt_llm/_torch/pyexecutor/_util.py create_py_executor_instance: `num_lora_modules =
  pretrained_config.num_hidden_layers * len(lora_target_modules + missing_qkv_modules)`; `if lora_config.max_loras
  is not None: peft_cache_config_model.num_device_module_layer = max_lora_rank * num_lora_modules *
  lora_config.max_loras` (and num_host_module_layer from max_cpu_loras), so with max_loras set a
  peft_cache_config's own num_device_module_layer is overwritten: max_loras is the knob the backend honours.
- tensorrt_llm/llmapi/llm_args.py PeftCacheConfig: num_device_module_layer 0 "overrides value of
  device_cache_percent"; device_cache_percent default 0.02, "Proportion of free device memory after engine load";
  optimal_adapter_size 8, max_adapter_size 64.
- cpp/tensorrt_llm/batch_manager/peftCacheManager.cpp getMaxNumSlots: numDeviceModuleLayer > 0 -> slots =
  numDeviceModuleLayer * ceilDiv(max1dModSize, pageWidth); otherwise deviceCachePercent * (free memory + pool
  free) / page bytes, the share of free memory that makes a second process's cache depend on start order.
  getPageManagerConfig: page width = smallest module's in + out, slots per page = max(layers x sum of
  optimalAdapterSize x ceilDiv(in + out, pageWidth), ceilDiv(maxAdapterSize x widest, pageWidth)), pages =
  ceilDiv(slots, slots per page); the PeftCacheManager constructor caps both adapter sizes at max_lora_rank.
- cpp/tests/unit_tests/batch_manager/peftCacheManagerTest.cpp getMaxNumSlots: numDeviceModuleLayer 8292 x 2,
  page width 256, max1dModSize 4 x 256 -> 66336 device slots.
- cpp/tensorrt_llm/runtime/loraModule.cpp LoraModule::createLoraModules: each module's (in, out).
- tensorrt_llm/_torch/model_config.py ModelConfig.get_bindings_model_config: the dimensions those are made from
  (hidden_size, intermediate_size as mlp_hidden_size, num_key_value_heads else the heads, head_size or head_dim
  else hidden / heads, data_type from torch_dtype).
- tensorrt_llm/lora_helper.py get_missing_qkv_modules_from_lora_modules: q, k, v all or none.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from fleetcast.contract.adapters import (
    LORA_DEVICE_RESERVE_BYTES,
    ModelDims,
    ModelDimsError,
    device_slots,
    lora_cache_plan,
    lora_device_cache_bytes,
    missing_qkv_modules,
    model_dims,
    module_dims,
)
from fleetcast.contract.serving import ProcessSlot
from runtime import kv_budget
from runtime.reference.build import build_artifact
from runtime.reference.server import parse_args

from .reference_helpers import ONE_FORK_SERVER, ServerProcess

pytestmark = ONE_FORK_SERVER

MIB = 2**20
GIB = 2**30
# Qwen/Qwen2.5-1.5B's config.json (hub): the figures the cache is sized from.
QWEN_1_5B = {"num_hidden_layers": 28, "hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 2,
             "intermediate_size": 8960, "torch_dtype": "bfloat16"}
ALL_DENSE = ["attn_dense", "attn_k", "attn_q", "attn_v", "mlp_4h_to_h", "mlp_gate", "mlp_h_to_4h"]


def test_slots_match_tensorrt_llms_own_unit_test():
    assert device_slots(8292 * 2, 4 * 256, 256) == 66336


def test_module_sizes_follow_create_lora_modules():
    dims = model_dims(QWEN_1_5B, "qwen")
    assert dims == ModelDims(layers=28, hidden=1536, mlp_hidden=8960, heads=12, kv_heads=2, head_size=128,
                             element_bytes=2)
    assert module_dims("attn_q", dims) == (1536, 1536)
    assert module_dims("attn_k", dims) == module_dims("attn_v", dims) == (1536, 256)  # KV heads x head size
    assert module_dims("attn_dense", dims) == (1536, 1536)
    assert module_dims("mlp_h_to_4h", dims) == module_dims("mlp_gate", dims) == (1536, 8960)
    assert module_dims("mlp_4h_to_h", dims) == (8960, 1536)
    assert module_dims("mlp_gate_up", dims) == (1536, 2 * 8960)


def test_a_gpt2_config_has_its_own_names():
    dims = model_dims({"n_layer": 48, "n_embd": 1600, "n_head": 25, "n_inner": None, "torch_dtype": "float16"}, "xl")
    assert (dims.layers, dims.hidden, dims.mlp_hidden, dims.kv_heads, dims.head_size) == (48, 1600, 6400, 25, 64)


def test_q_k_and_v_are_counted_together():
    assert missing_qkv_modules(["attn_q", "attn_v"]) == ["attn_k"]
    assert missing_qkv_modules(["attn_dense"]) == []
    dims = model_dims(QWEN_1_5B, "qwen")
    # attn_k is filled with zeros by the engine, so it takes cache as if adapted: 16 x 28 x 3 module layers x 2
    # slots (q is 3072 wide, pages 1792) = 2688 slots = 4 pages of max(28 x 8 x (2 + 1), 28) = 672 slots; counting
    # q and v alone would give 1792 slots, 3 pages.
    assert lora_device_cache_bytes(dims, ["attn_q", "attn_v"], 16, 1) == 4 * 672 * 1792 * 2


def test_the_device_cache_of_rank_64_adapters_over_every_module_of_qwen2_5_1_5b():
    dims = model_dims(QWEN_1_5B, "qwen")
    # in + out per module: q 3072, k 1792, v 1792, o 3072, three MLP 10496; page width 1792 (k), the widest
    # module 6 pages wide; slots per page max(28 x 8 x (2+1+1+2+6+6+6), ceil(64 x 10496 / 1792)) = 5376;
    # slots 64 x 28 x 7 x max_loras x 6 = 75264 per adapter = 14 pages of 5376 x 1792 bf16 elements.
    assert lora_device_cache_bytes(dims, ALL_DENSE, 64, 1) == 14 * 5376 * 1792 * 2 == int(257.25 * MIB)
    assert lora_device_cache_bytes(dims, ALL_DENSE, 64, 3) == 42 * 5376 * 1792 * 2


def test_the_plan_puts_as_many_adapters_on_the_device_as_the_reserve_holds_and_every_one_on_the_host():
    dims = model_dims(QWEN_1_5B, "qwen")
    options, size = lora_cache_plan(dims, [(64, ALL_DENSE)] * 5)
    assert LORA_DEVICE_RESERVE_BYTES == 2**30
    assert options["max_loras"] == 3 and options["max_cpu_loras"] == 5  # 4 would take 1029 MiB
    assert size == lora_device_cache_bytes(dims, ALL_DENSE, 64, 3) <= LORA_DEVICE_RESERVE_BYTES
    # max_loras is always set: the engine then never falls back to a share of the memory free at its start.
    small, _ = lora_cache_plan(dims, [(8, ["attn_q"]), (16, ["attn_v"])])
    assert small["max_loras"] == 2 and small["max_lora_rank"] == 16
    assert "peft_cache_config" not in small  # its num_device_module_layer would be overwritten from max_loras


def test_an_adapter_too_large_for_the_reserve_is_refused_with_the_figures():
    llama_8b = model_dims({"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                           "num_key_value_heads": 8, "intermediate_size": 14336, "torch_dtype": "bfloat16"}, "llama")
    assert lora_cache_plan(llama_8b, [(64, ALL_DENSE)])[0]["max_loras"] == 1
    with pytest.raises(ModelDimsError, match=r"max_lora_rank 128 over .* takes 1\.\d\d GiB of LoRA device cache on "
                                             r"this model \(32 layers, hidden 4096\), above the 1\.00 GiB"):
        lora_cache_plan(llama_8b, [(128, ALL_DENSE)])


def test_a_config_without_dimensions_is_named():
    with pytest.raises(ModelDimsError, match="cfg.json: names no layer count"):
        model_dims({"hidden_size": 64}, "cfg.json")
    with pytest.raises(ModelDimsError, match="torch_dtype 'int8'"):
        model_dims({**QWEN_1_5B, "torch_dtype": "int8"}, "cfg.json")


def test_the_instance_plan_counts_each_processs_lora_cache():
    slots = [ProcessSlot("base", 0, 8001), ProcessSlot("base", 1, 8002), ProcessSlot("other", 0, 8003)]
    explicit, weights = {"base": None, "other": None}, {"base": GIB, "other": GIB}
    without = kv_budget.plan_budgets(slots, explicit, weights, 40 * GIB, 0.9)
    with_lora = kv_budget.plan_budgets(slots, explicit, weights, 40 * GIB, 0.9, lora_bytes={"base": 300 * MIB})
    # Two processes hold 300 MiB each: the three equal shares give up 600 MiB between them.
    assert without[("other", 0)] - with_lora[("other", 0)] == pytest.approx(200 * MIB, abs=1)
    reversed_ = kv_budget.plan_budgets(list(reversed(slots)), explicit, weights, 40 * GIB, 0.9,
                                       lora_bytes={"base": 300 * MIB})
    assert reversed_ == with_lora


def test_the_reference_server_allocates_the_cache_max_loras_sizes(tmp_path):
    artifact = tmp_path / "artifact"
    build_artifact(artifact, size="tiny", seed=5)
    lora = {"lora_dir": [], "max_lora_rank": 8, "lora_target_modules": ["attn_q", "attn_v"], "max_loras": 2,
            "max_cpu_loras": 2}
    config = json.loads((artifact / "config.json").read_text())
    expected = lora_device_cache_bytes(model_dims(config, "tiny"), ["attn_q", "attn_v"], 8, 2)
    # tiny: 2 layers, hidden 64; q, v and the zero-filled k are 64 + 64 wide, one slot each; 8 x 2 x 3 x 2 = 96
    # slots in pages of max(2 x 8 x 2, 8) = 32 slots of 128 elements.
    assert expected == 3 * 32 * 128 * model_dims(config, "tiny").element_bytes
    server = ServerProcess(artifact, "--lora-config", json.dumps(lora), log_path=tmp_path / "server.log")
    try:
        server.wait_healthy()
        with urllib.request.urlopen(server.base + "/memory", timeout=10) as resp:
            memory = json.loads(resp.read())
    finally:
        server.stop()
    assert memory["lora_cache_bytes"] == expected and memory["lora_max_loras"] == 2


def test_the_reference_server_refuses_a_max_loras_that_is_not_a_count():
    with pytest.raises(SystemExit):
        parse_args(["--artifact", "x", "--lora-config",
                    json.dumps({"max_lora_rank": 8, "lora_target_modules": ["attn_q"], "max_loras": 0})])


def test_head_size_is_read_before_head_dim_and_defaults_to_hidden_over_heads():
    assert model_dims({**QWEN_1_5B, "head_size": 96, "head_dim": 64}, "c").head_size == 96
    assert model_dims({**QWEN_1_5B, "head_dim": 64}, "c").head_size == 64
    assert model_dims(QWEN_1_5B, "c").head_size == 1536 // 12


def test_requests_of_more_adapters_than_max_loras_wait_for_a_slot_and_those_of_a_held_one_join():
    import asyncio

    from runtime.reference.server import AdapterSlots

    async def scenario() -> list[str]:
        slots, order = AdapterSlots(max_loras=1), []

        async def run(name: str, tag: str) -> None:
            await slots.acquire(name)
            order.append(tag)

        await run("sql", "sql-1")
        other = asyncio.create_task(run("chat", "chat"))
        for _ in range(5):  # however often the loop turns, the cache holds sql
            await asyncio.sleep(0)
        assert not other.done()
        await run("sql", "sql-2")  # sql is on the device already: no wait
        slots.release("sql")
        await asyncio.sleep(0)
        assert not other.done()  # sql still has a request
        slots.release("sql")
        await asyncio.wait_for(other, 60)
        return order

    assert asyncio.run(scenario()) == ["sql-1", "sql-2", "chat"]


def test_the_reference_server_runs_a_second_adapter_only_once_the_first_has_no_request(tmp_path):
    import threading

    from runtime.devtools.harness import write_peft_adapter

    artifact = tmp_path / "artifact"
    build_artifact(artifact, size="tiny", seed=5)
    adapters = {name: write_peft_adapter(tmp_path / name, rank=8) for name in ("sql", "chat")}
    lora = {"lora_dir": [], "max_lora_rank": 8, "lora_target_modules": ["attn_q", "attn_v"], "max_loras": 1,
            "max_cpu_loras": 2}
    log = tmp_path / "requests.jsonl"
    server = ServerProcess(artifact, "--max-batch-size", "4", "--lora-config", json.dumps(lora),
                           "--request-log", str(log), log_path=tmp_path / "server.log")
    first_token = threading.Event()

    def stream(adapter: str, max_tokens: int) -> None:
        body = {"model": "m", "prompt": "hi", "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                "lora_request": {"lora_name": adapter, "lora_int_id": 1 if adapter == "sql" else 2,
                                 "lora_path": str(adapters[adapter])}}
        req = urllib.request.Request(server.base + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            for line in resp:
                if b'"text"' in line:
                    first_token.set()

    try:
        server.wait_healthy()
        long = threading.Thread(target=stream, args=("sql", 120))
        long.start()
        assert first_token.wait(120), server.log()
        short = threading.Thread(target=stream, args=("chat", 2))  # sent while sql has 100+ tokens to go
        short.start()
        for thread in (long, short):
            thread.join(180)
        # The server writes a request's log line after the response's last byte: the client can be done
        # first, so wait (bounded) for both lines rather than stop the server between the two.
        for _ in range(600):
            if len(log.read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
    finally:
        server.stop()
    # The server logs a request as it ends, and releases its adapter just before: chat, 2 tokens, ends after
    # sql's 120 only because it waited for the one slot (free, it would join sql's batch at once).
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["lora_name"], r["completion_tokens"]) for r in records] == [("sql", 120), ("chat", 2)]
