"""How a pool's engine processes share the GPU (issue 33 §1): `gpu_sharing` per pool, the optional per-model SM cap,
and what reaches the instance. docs/runtime.md, "GPU sharing", says why time slicing is the default."""

import copy
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from fleetcast.config import GpuSharing, parse_config

from .conftest import problems

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "multi-model" / "fleet.yaml"


@pytest.fixture
def doc() -> dict:
    return copy.deepcopy(YAML(typ="safe").load(EXAMPLE.read_text()))


def pools(doc: dict) -> list[dict]:
    return doc["regions"][0]["pools"]


def test_the_example_shares_one_pools_gpu_under_mps_and_the_other_by_time_slicing(doc):
    cfg = parse_config(doc)
    region = cfg.regions[0]
    assert [p.gpu_sharing for p in region.pools] == [GpuSharing.MPS, GpuSharing.TIME_SLICING]


def test_time_slicing_is_the_default_and_leaves_the_dump_and_digests_as_before(doc):
    for pool in pools(doc):
        pool.pop("gpu_sharing", None)
    plain = parse_config(doc)
    for pool in pools(doc):
        pool["gpu_sharing"] = "time_slicing"
    explicit = parse_config(doc)
    assert all(p.gpu_sharing is GpuSharing.TIME_SLICING for p in plain.regions[0].pools)
    assert "gpu_sharing" not in plain.model_dump(mode="json")["regions"][0]["pools"][0]
    assert plain.digest() == explicit.digest()
    assert all(plain.instance_digest(plain.regions[0].region, p.name)
               == explicit.instance_digest(plain.regions[0].region, p.name) for p in plain.regions[0].pools)


def test_mps_reaches_that_pools_instances_and_rolls_only_that_pool(doc):
    for pool in pools(doc):
        pool.pop("gpu_sharing", None)
    before = parse_config(doc)
    pools(doc)[1]["gpu_sharing"] = "mps"
    after = parse_config(doc)
    region = before.regions[0].region
    first, second = (p.name for p in before.regions[0].pools)
    assert before.instance_digest(region, first) == after.instance_digest(region, first)
    assert before.instance_digest(region, second) != after.instance_digest(region, second)
    # What the instance reads (the config parameter's JSON, validated again there) carries it.
    assert after.model_dump(mode="json")["regions"][0]["pools"][1]["gpu_sharing"] == "mps"


def test_a_models_size_rolls_the_pools_that_plan_several_processes_from_it_and_no_other(doc):
    """parameters_b sets each process's overhead on an instance of several processes (its KV budget and MPS limit,
    runtime/bootstrap.py through served_overhead), so it is an input of those pools; a one-process pool reads none."""
    before = parse_config(doc)
    region = before.regions[0]
    several = [p.name for p in region.pools if sum(s.copies for s in p.serves) > 1]
    assert several, "the example has a pool of several processes"
    for model in doc["models"]:
        model["parameters_b"] = (model.get("parameters_b") or 1.0) * 1.05
    after = parse_config(doc)
    for name in several:
        assert before.instance_digest(region.region, name) != after.instance_digest(region.region, name)
    for pool in pools(doc):  # one copy of one model: the engine's fraction, no planned budget, no MPS limit
        pool["serves"] = pool["serves"][:1]
        pool["serves"][0]["copies"] = 1
        pool["serves"][0].pop("kv_cache_gb", None)
        pool["serves"][0].pop("mps_active_thread_percentage", None)
    doc["models"] = [m for m in doc["models"] if m["id"] in {p["serves"][0]["model"] for p in pools(doc)}]
    single_after = parse_config(doc)
    for model in doc["models"]:
        model["parameters_b"] /= 1.05
    single_before = parse_config(doc)
    for pool in single_before.regions[0].pools:
        assert single_before.instance_digest(region.region, pool.name) == single_after.instance_digest(region.region, pool.name)


def test_an_sm_cap_is_per_served_model_only_under_mps_and_never_a_default(doc):
    cfg = parse_config(doc)
    assert all(s.mps_active_thread_percentage is None for p in cfg.regions[0].pools for s in p.serves)
    assert all("mps_active_thread_percentage" not in s
               for s in cfg.model_dump(mode="json")["regions"][0]["pools"][0]["serves"])
    pools(doc)[0]["serves"][0]["mps_active_thread_percentage"] = 60
    capped = parse_config(doc)
    served = capped.served_by(capped.regions[0].pools[0])
    assert [s.mps_active_thread_percentage for s in served] == [60, None, None]


def test_an_sm_cap_on_a_time_sliced_pool_is_one_error_naming_the_pool_and_the_fix(doc):
    pools(doc)[1]["serves"][0]["mps_active_thread_percentage"] = 50
    found = problems(doc)
    assert len(found) == 1
    assert found[0].startswith("regions[0].pools[1]: serves[0].mps_active_thread_percentage (gpt2-xl) is set")
    assert "needs gpu_sharing: mps" in found[0]


@pytest.mark.parametrize("value", [0, 101, 50.5, "half"])
def test_an_sm_cap_outside_1_to_100_is_refused(doc, value):
    pools(doc)[0]["serves"][0]["mps_active_thread_percentage"] = value
    found = problems(doc)
    assert len(found) == 1 and "mps_active_thread_percentage" in found[0]


def test_an_unknown_sharing_mode_names_the_allowed_ones(doc):
    pools(doc)[0]["gpu_sharing"] = "mig"
    found = problems(doc)
    assert len(found) == 1 and "gpu_sharing" in found[0] and "time_slicing" in found[0] and "mps" in found[0]
