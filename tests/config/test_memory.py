"""The GPU memory arithmetic of one instance (fleetcast/config/memory.py): the validator's sum, the KV budgets
served_by hands each process, and the figures it rests on."""

import copy

import pytest
from ruamel.yaml import YAML

from fleetcast.config import parse_config
from fleetcast.config.memory import (
    BYTES_PER_PARAMETER,
    GIB,
    HEADROOM_SHARE,
    PROCESS_OVERHEAD_BYTES,
    PROCESS_OVERHEAD_SOURCE,
    plan_pool,
)
from fleetcast.config.model import Precision

from .conftest import DEFAULT, problems
from .test_models import EXAMPLE


@pytest.fixture
def example() -> dict:
    return YAML(typ="safe").load(EXAMPLE.read_text())


def test_every_precision_has_a_weight_width():
    assert set(BYTES_PER_PARAMETER) == {p.value for p in Precision}
    # 16-bit floats are two bytes; the 8-bit modes one; INT4 and NVFP4 (4-bit) half a byte.
    assert BYTES_PER_PARAMETER["fp16"] == BYTES_PER_PARAMETER["bf16"] == 2
    assert BYTES_PER_PARAMETER["int8_wo"] == BYTES_PER_PARAMETER["int8_sq"] == BYTES_PER_PARAMETER["fp8"] == 1
    assert BYTES_PER_PARAMETER["int4_wo"] == BYTES_PER_PARAMETER["nvfp4"] == 0.5


def test_the_per_process_overhead_is_the_measured_one_the_instance_plans_with():
    from runtime import kv_budget

    assert PROCESS_OVERHEAD_BYTES == kv_budget.PROCESS_OVERHEAD_BYTES == 1200 * 2**20
    assert "measured" in PROCESS_OVERHEAD_SOURCE and "TensorRT-LLM's own per-process overhead is not measured" \
        in PROCESS_OVERHEAD_SOURCE


def test_the_sum_is_weights_plus_overhead_plus_kv_per_copy(example):
    cfg = parse_config(example)
    plan = plan_pool(cfg, cfg.regions[0].pools[0])
    expected = (1 * (1.56e9 * 1 + PROCESS_OVERHEAD_BYTES + 8 * GIB)
                + 2 * (0.49e9 * 2 + PROCESS_OVERHEAD_BYTES + 4 * GIB)
                + 1 * (3.09e9 * 2 + PROCESS_OVERHEAD_BYTES + 8 * GIB))
    assert plan.planned_bytes == pytest.approx(expected, abs=4)
    assert plan.gpu == "L40S" and plan.gpu_bytes == 48 * GIB
    assert plan.usable_bytes == int(48 * GIB * (1 - HEADROOM_SHARE))
    assert plan.process_count == 4 and plan.fits


def test_budgets_left_out_share_what_the_explicit_ones_leave(example):
    serves = example["regions"][0]["pools"][0]["serves"]
    del serves[0]["kv_cache_gb"], serves[1]["kv_cache_gb"]
    cfg = parse_config(example)
    pool = cfg.regions[0].pools[0]
    plan = plan_pool(cfg, pool)
    shares = [p.kv_bytes for p in plan.processes]
    assert shares[2] == 8 * GIB and shares[0] == shares[1]
    fixed = 1.56e9 + 2 * 0.49e9 * 2 + 3.09e9 * 2 + 4 * PROCESS_OVERHEAD_BYTES + 8 * GIB
    assert shares[0] == pytest.approx((plan.usable_bytes - fixed) / 3, abs=1)
    # served_by hands the instance the explicit budgets only: it plans the shares from the memory really free.
    assert [s.kv_cache_bytes for s in cfg.served_by(pool)] == [None, None, 8 * GIB]


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
    found = problems(example)
    assert any(p.startswith("regions[0].pools[1].serves:") for p in found), found


def test_each_copy_of_a_model_with_adapters_counts_its_lora_device_reserve(example):
    """The LoRA device cache is sized on the instance from what staging read (ranks, modules) and the model's
    config.json; validate knows neither, so it counts the reserve the instance sizes the cache within."""
    from fleetcast.contract.adapters import LORA_DEVICE_RESERVE_BYTES

    before = plan_pool(parse_config(example), parse_config(example).regions[0].pools[0])
    example["models"][1]["adapters"] = [{"id": "qwen-sql", "source": "example-org/qwen-sql-lora"}]  # 2 copies
    cfg = parse_config(example)
    plan = plan_pool(cfg, cfg.regions[0].pools[0])
    assert plan.planned_bytes - before.planned_bytes == 2 * LORA_DEVICE_RESERVE_BYTES == 2 * GIB
    assert "qwen2.5-0.5b 2 x (weights 0.91 GiB at bf16 + overhead 1.17 GiB + LoRA cache 1.00 GiB + KV 4.00 GiB)" \
        in plan.arithmetic()
    assert "LoRA" not in before.arithmetic()


def test_validate_names_the_lora_reserve_in_the_sum_of_a_pool_it_refuses(example):
    example["regions"][0]["pools"][0]["serves"][2]["kv_cache_gb"] = 13  # 0.48 GiB to spare: fits without adapters
    assert not [p for p in problems(example) if p.startswith("regions[0].pools[0].serves:")]
    example["models"][2]["adapters"] = [{"id": "qwen3b-sql", "source": "example-org/qwen3b-sql-lora"}]
    found = [p for p in problems(example) if p.startswith("regions[0].pools[0].serves:")]
    assert found and "qwen2.5-3b 1 x (weights 5.76 GiB at bf16 + overhead 1.17 GiB + LoRA cache 1.00 GiB + KV " \
        "13.00 GiB)" in found[0] and "= 43.72 GiB" in found[0], found
