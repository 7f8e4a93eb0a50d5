"""One support matrix: what `fleetcast config validate` accepts the instance accepts, and the
planner refuses with the validator's words. Its facts are checked against TensorRT-LLM 1.2.x."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from fleetcast.config import Backend, KvCacheDtype, ModelFamily, Precision, catalog, load_config, rules
from fleetcast.contract import support
from fleetcast.plan.curves import Candidate, Curve, LoadPoint
from fleetcast.plan.packing import ModelCurve, _options
from runtime import trtllm
from tests.runtime import trtllm_1_2_1_cli as cli, trtllm_1_2_llm_args as llm_args

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "fleetcast" / "contract"

# docs/source/features/quantization.md ("Hardware Support Matrix"), NVIDIA/TensorRT-LLM, 1.x line:
# the columns marked Y per architecture (extracted data).
QUANTIZATION_HARDWARE = {
    "sm120": {"NVFP4", "MXFP4", "FP8(per tensor)", "FP8 KV Cache"},
    "sm90": {"FP8(per tensor)", "FP8(block scaling)", "FP8(rowwise)", "FP8 KV Cache", "W4A8 AWQ", "W4A16 AWQ",
             "W4A8 GPTQ", "W4A16 GPTQ"},
    "sm89": {"FP8(per tensor)", "FP8 KV Cache", "W4A8 AWQ", "W4A16 AWQ", "W4A8 GPTQ", "W4A16 GPTQ"},
    "sm86": {"FP8 KV Cache", "W4A16 AWQ", "W4A16 GPTQ"},  # the "Ampere" row
}
# docs/source/reference/support-matrix.md ("Precision"): Ampere (SM80, SM86) FP32, FP16, BF16, INT8, INT4;
# Ada Lovelace (SM89) and Hopper (SM90) add FP8.
PRECISION_SUPPORT_MATRIX = {"sm86": {"FP16", "BF16", "INT8", "INT4"}, "sm89": {"FP16", "BF16", "FP8", "INT8", "INT4"},
                            "sm90": {"FP16", "BF16", "FP8", "INT8", "INT4"}}
NEEDS = {"fp8": "FP8", "nvfp4": "NVFP4", "int8_wo": "INT8", "int8_sq": "INT8", "int4_wo": "INT4"}


def test_the_contract_speaks_the_config_vocabulary():
    assert set(support.PRECISIONS) == {p.value for p in Precision}
    assert set(support.KV_CACHE_DTYPES) == {k.value for k in KvCacheDtype}
    assert set(support.BACKENDS) == {b.value for b in Backend}
    assert set(support.FAMILIES) == {f.value for f in ModelFamily}
    assert {g.arch for g in (i.gpu for i in catalog.instance_catalog().values())} <= set(support.PRECISIONS_BY_ARCH)


@pytest.mark.parametrize("arch", sorted(support.PRECISIONS_BY_ARCH))
def test_precisions_allowed_per_architecture_are_in_the_release_hardware_tables(arch):
    for precision in support.PRECISIONS_BY_ARCH[arch]:
        if precision == "fp8":
            assert "FP8(per tensor)" in QUANTIZATION_HARDWARE[arch]
        elif precision == "nvfp4":
            assert "NVFP4" in QUANTIZATION_HARDWARE[arch]
        elif precision in NEEDS:
            assert NEEDS[precision] in PRECISION_SUPPORT_MATRIX[arch], (arch, precision)
    if "fp8" in support.KV_CACHE_BY_ARCH[arch]:
        assert "FP8 KV Cache" in QUANTIZATION_HARDWARE[arch]


def test_engine_flow_kv_caches_are_what_the_build_scripts_offer():
    # examples/models/core/gpt/convert_checkpoint.py: --int8_kv_cache only; quantize.py: --kv_cache_dtype int8|fp8.
    assert "--int8_kv_cache" in cli.CONVERT_CHECKPOINT_GPT
    assert not [o for o in cli.CONVERT_CHECKPOINT_GPT if "kv" in o and o != "--int8_kv_cache"]
    for precision, kvs in support.TENSORRT_KV_BY_PRECISION.items():
        offered = {"auto", *cli.QUANTIZE["--kv_cache_dtype"]["choices"]} if precision == "fp8" else {"auto", "int8"}
        assert kvs <= offered, precision


def test_pytorch_kv_caches_are_what_torch_llm_args_acts_on():
    assert support.KV_CACHE_BY_BACKEND["pytorch"] <= llm_args.KV_CACHE_DTYPE_BY_BACKEND["pytorch"], llm_args.SOURCE


@pytest.fixture(scope="module")
def cfg():
    from fleetcast.config.model import CalibrationSpec

    c = load_config(REPO / "config" / "fleet.yaml")
    # A staged calibration set, so that only the support rules can refuse below.
    calibration = CalibrationSpec(dataset="s3://bucket/calibration/lambada/")
    return c.model_copy(update={"models": (c.model.model_copy(update={"calibration": calibration}),)})


def one_pool(cfg, instance_type, family, backend, precision, kv):
    region = cfg.regions[0]
    pool = region.pools[0].model_copy(update={"instance_type": instance_type, "engine": region.pools[0].engine.model_copy(
        update={"backend": None, "precision": None, "kv_cache_dtype": None})})
    engine = cfg.engine.model_copy(update={"backend": backend, "precision": precision, "kv_cache_dtype": kv})
    model = cfg.model.model_copy(update={"family": family})
    return cfg.model_copy(update={"models": (model,), "engine": engine,
                                  "regions": (region.model_copy(update={"pools": (pool,)}),), "consumers": ()})


SUPPORT_FIELDS = {"backend", "precision", "kv_cache_dtype"}


def support_issues(c) -> list[str]:
    return [i.message for i in rules.check(c)
            if i.path[-1] in SUPPORT_FIELDS or (i.path[-1] == "instance_type" and "architecture" in i.message)]


CURVE = Curve((LoadPoint(concurrency=1, ttft_p99=100.0, itl_p99=5.0, e2e_mean=400.0, itl_mean=2.0),))
ALL = list(itertools.product(ModelFamily, Backend, Precision, KvCacheDtype))


@pytest.mark.parametrize("instance_type", sorted(catalog.instance_catalog()))
def test_validate_runtime_and_planner_decide_every_combination_alike(cfg, instance_type):
    instance = catalog.instance_catalog()[instance_type]
    gpu = instance.gpu
    accepted = 0
    for family, backend, precision, kv in ALL:
        c = one_pool(cfg, instance_type, family, backend, precision, kv)
        issues = support_issues(c)
        assert len(issues) <= 1, issues
        try:
            trtllm.check_supported(family, c.engine, gpu.compute_capability, gpu.name)
            refused_on_instance = None
        except trtllm.UnsupportedCombination as exc:
            refused_on_instance = str(exc)
        combo = (instance_type, family.value, backend.value, precision.value, kv.value)
        assert bool(issues) == bool(refused_on_instance), (combo, issues, refused_on_instance)
        # The planner's precisions for this model on this type (packing._options), the engine the config gives it.
        refused: list[tuple[str, str]] = []
        model = c.model.id
        allowed = _options([ModelCurve(model, Candidate(instance_type, precision.value, CURVE, backend=backend.value))],
                           model, instance_type, c, lambda _, f=family.value: f, {}, refused=refused)
        if issues:
            assert allowed == [] and refused == [(f"{model} {precision.value} on {instance_type}",
                                                  f"{issues[0]}; the config validator would refuse it")], combo
            # The instance names the same rule; only its description of the GPU differs.
            refusal = support.check(family.value, backend.value, precision.value, kv.value, gpu.arch, "@")
            assert refused_on_instance.split(": ", 1)[1].split(" on ")[0] == refusal.reason.split(" on ")[0]
        else:
            accepted += 1
            assert allowed == [precision.value] and refused == [], (combo, refused)
    assert accepted  # every GPU in the catalog serves something


@pytest.mark.parametrize("precision,kv", [("int8_wo", "fp8"), ("int4_wo", "int8"), ("fp16", "fp8")])
def test_engine_flow_kv_caches_the_build_cannot_make_are_refused_at_validation(cfg, precision, kv):
    c = one_pool(cfg, "g6e.xlarge", ModelFamily.GPT2, Backend.TENSORRT, Precision(precision), KvCacheDtype(kv))
    found = [(i.dotted, i.message) for i in rules.check(c) if i.path[-1] in SUPPORT_FIELDS]
    assert found == [("engine.kv_cache_dtype",
                      support.check("gpt2", "tensorrt", precision, kv, "sm89",
                                    support.instance_where("g6e.xlarge", "L40S", "sm89")).reason)]


def test_pytorch_fp8_kv_cache_validates_without_a_calibration_set(cfg):
    c = one_pool(cfg, "g6e.xlarge", ModelFamily.LLAMA, Backend.PYTORCH, Precision.BF16, KvCacheDtype.FP8)
    c = c.model_copy(update={"models": (c.model.model_copy(update={"calibration": None}),)})
    assert [i.message for i in rules.check(c) if "calibrat" in i.message] == []
    assert not trtllm.needs_calibration(c.engine)


def test_the_runtime_bundle_carries_the_contract_layer():
    """The instance imports fleetcast.contract (runtime/trtllm.py), so the bundle must ship it."""
    from stacks.runtime_bundle import SERVING, bundle_files

    assert Path("fleetcast/contract/support.py") in bundle_files(SERVING)
    assert "fleetcast.contract" in (REPO / "runtime" / "trtllm.py").read_text()


def test_the_engine_flow_on_sm120_is_refused_until_measured(cfg):
    # docs/source/features/quantization.md's sm120 row (QUANTIZATION_HARDWARE above) holds only the PyTorch path's
    # formats, and no 1.2.x document, example or test builds an engine for sm120 (issue 25 §5).
    for precision in ("fp16", "fp8"):
        c = one_pool(cfg, "g7e.2xlarge", ModelFamily.GPT2, Backend.TENSORRT, Precision(precision), KvCacheDtype.AUTO)
        found = [i for i in rules.check(c) if "backend is not supported" in i.message]
        assert len(found) == 1 and found[0].path[-1] == "instance_type", found
        assert "tensorrt backend is not supported on g7e.2xlarge" in found[0].message
        assert "refused until measured" in found[0].message
    # The PyTorch backend on the same GPU stays allowed (sm120 is in its quantization rows).
    assert support.check("llama", "pytorch", "fp8", "fp8", "sm120") is None


def test_fp8_weights_with_an_int8_kv_cache_on_the_engine_flow_are_refused_with_the_reason():
    # quantize.py itself would take the pair (its --kv_cache_dtype choices), so the refusal is for want of a source.
    assert "int8" in cli.QUANTIZE["--kv_cache_dtype"]["choices"]
    refusal = support.check("gpt2", "tensorrt", "fp8", "int8", "sm89")
    assert refusal.field == "kv_cache_dtype"
    assert "no TensorRT-LLM 1.2.x document or test pairs fp8 weights with an INT8 KV cache" in refusal.reason
    assert support.check("gpt2", "tensorrt", "fp8", "fp8", "sm89") is None
