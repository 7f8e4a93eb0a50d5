"""Generated TensorRT-LLM command lines parse against the 1.2.x tools' own option definitions."""

from pathlib import Path

import pytest

from fleetcast.config import Backend, KvCacheDtype, ModelFamily, Precision, load_config, parse_config
from fleetcast.contract import support
from runtime import trtllm
from tests.runtime import trtllm_1_2_llm_args as llm_args
from tests.runtime.trtllm_parsers import BUILD, CONVERT, QUANTIZE, SERVE, Refused as _Refused

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cfg():
    return load_config(REPO / "config" / "fleet.yaml")


def engine(cfg, precision, kv=KvCacheDtype.AUTO):
    return cfg.engine.model_copy(update={"precision": precision, "kv_cache_dtype": kv})


PATHS = trtllm.BuildPaths(work_dir=Path("/work"), model_dir=Path("/work/model"), checkpoint_dir=Path("/work/ckpt"),
                          engine_dir=Path("/work/artifact/engine"), calib_dir=Path("/work/calib"))

CASES = {
    "fp16": (Precision.FP16, KvCacheDtype.AUTO),
    "int8 weight-only": (Precision.INT8_WEIGHT_ONLY, KvCacheDtype.AUTO),
    "int8 smoothquant + int8 kv": (Precision.INT8_SMOOTHQUANT, KvCacheDtype.INT8),
    "fp8 + fp8 kv": (Precision.FP8, KvCacheDtype.FP8),
}


@pytest.mark.parametrize("case", list(CASES))
def test_gpt2_xl_build_commands_parse_against_release_options(cfg, case):
    precision, kv = CASES[case]
    e = engine(cfg, precision, kv)
    trtllm.check_supported(ModelFamily.GPT2, e, "8.9", "NVIDIA L40S")  # the seed's g6e GPU

    convert = trtllm.convert_command(e, PATHS, calib_samples=512)
    assert convert[0] == "python3"
    if precision is Precision.FP8:
        assert convert[1].endswith("examples/quantization/quantize.py")
        args = QUANTIZE.parse_args(convert[2:])
        assert (args.qformat, args.kv_cache_dtype, args.calib_dataset) == ("fp8", "fp8", "/work/calib/lambada")
        assert args.output_dir == "/work/ckpt"
    else:
        assert convert[1].endswith("examples/models/core/gpt/convert_checkpoint.py")
        args = CONVERT.parse_args(convert[2:])
        assert args.model_dir == "/work/model" and args.output_dir == "/work/ckpt"
        assert args.dtype == "float16"
        if precision is Precision.INT8_WEIGHT_ONLY:
            assert args.use_weight_only and args.weight_only_precision == "int8"
            assert args.calib_dataset is None  # W8A16 needs no calibration
        if precision is Precision.INT8_SMOOTHQUANT:
            assert args.smoothquant == 0.5 and args.per_token and args.per_channel
            assert args.int8_kv_cache and args.calib_dataset == "/work/calib/lambada"  # staged layout: no hub download
        if precision is Precision.FP16:
            assert not args.use_weight_only and args.smoothquant is None and not args.int8_kv_cache

    build = trtllm.build_command(e, cfg.model.max_input_len, cfg.model.max_output_len, PATHS)
    assert build[0] == "trtllm-build"
    b = BUILD.parse_args(build[1:])
    assert (b.checkpoint_dir, b.output_dir, b.gemm_plugin) == ("/work/ckpt", "/work/artifact/engine", "auto")
    assert b.max_seq_len == cfg.model.max_input_len + cfg.model.max_output_len <= 1024  # GPT-2 XL n_positions
    assert (b.max_batch_size, b.max_num_tokens) == (e.max_batch_size, e.max_num_tokens)
    # BuildConfig.output_timing_cache defaults to the relative "model.cache" (tensorrt_llm/builder.py):
    # the cache goes to the build's own directory, never the (read-only) working directory's default.
    assert b.output_timing_cache == "/work/model.cache"


def test_serve_command_parses_and_carries_config(cfg, tmp_path):
    e = engine(cfg, Precision.INT8_WEIGHT_ONLY)
    backend = trtllm.TrtllmBackend(cfg, e)
    artifact = tmp_path / "key"
    artifact.mkdir()
    cmd = backend.server_command(artifact, "127.0.0.1", 8001)
    assert cmd[0] == "trtllm-serve"
    a = SERVE.parse_args(cmd[1:])
    assert a.model == str(artifact / "engine") and a.tokenizer == str(artifact / "tokenizer")
    assert (a.backend, a.host, a.port) == ("tensorrt", "127.0.0.1", 8001)
    assert a.free_gpu_memory_fraction == e.kv_cache_free_gpu_memory_fraction
    assert a.max_batch_size == e.max_batch_size and a.max_num_tokens == e.max_num_tokens
    import json
    options = json.loads(Path(a.config).read_text())  # JSON is YAML
    assert llm_args_problems("tensorrt", options) == []
    assert "enable_iter_perf_stats" not in options  # a TorchLlmArgs field: TrtLlmArgs would refuse it


def test_pytorch_backend_serves_the_checkpoint_without_engine(cfg, tmp_path):
    model = cfg.model.model_copy(update={"family": ModelFamily.LLAMA})
    c = cfg.model_copy(update={"models": (model,)})
    e = cfg.engine.model_copy(update={"backend": Backend.PYTORCH, "precision": Precision.BF16})
    backend = trtllm.TrtllmBackend(c, e)
    backend.check("9.0", "NVIDIA H100")
    assert not backend.needs_calibration
    cmd = backend.server_command(tmp_path / "key", "127.0.0.1", 8001)
    a = SERVE.parse_args(cmd[1:])
    assert a.backend == "pytorch" and a.model == str(tmp_path / "key") and a.tokenizer is None


def test_spec_rejects_what_the_release_rejects():
    """The rebuilt parsers are strict: an unknown option or a wrong choice fails (so the checks can fail)."""
    with pytest.raises(_Refused):
        BUILD.parse_args(["--checkpoint_dir", "x", "--gemm_plugin", "int8"])
    with pytest.raises(_Refused):
        CONVERT.parse_args(["--model_dir", "x", "--qformat", "fp8"])
    with pytest.raises(_Refused):
        QUANTIZE.parse_args(["--qformat", "int8"])


UNSUPPORTED = [
    # (family, backend, precision, kv, compute capability, words the message must contain)
    (ModelFamily.GPT2, Backend.TENSORRT, Precision.FP8, KvCacheDtype.AUTO, "8.6", ["fp8", "8.6", "allowed there"]),
    (ModelFamily.GPT2, Backend.PYTORCH, Precision.FP16, KvCacheDtype.AUTO, "8.9", ["engine.backend", "gpt2"]),
    (ModelFamily.LLAMA, Backend.PYTORCH, Precision.INT8_SMOOTHQUANT, KvCacheDtype.AUTO, "8.9", ["int8_sq", "pytorch"]),
    (ModelFamily.GPT2, Backend.TENSORRT, Precision.INT8_WEIGHT_ONLY, KvCacheDtype.AUTO, "12.0", ["int8_wo", "sm120"]),
    (ModelFamily.GPT2, Backend.TENSORRT, Precision.FP16, KvCacheDtype.FP8, "8.9", ["kv_cache_dtype", "fp8"]),
    (ModelFamily.GPT2, Backend.TENSORRT, Precision.FP16, KvCacheDtype.AUTO, "7.5", ["not a supported architecture"]),
]


@pytest.mark.parametrize("family,backend,precision,kv,cc,words", UNSUPPORTED)
def test_unsupported_combinations_are_refused_with_a_clear_message(cfg, family, backend, precision, kv, cc, words):
    e = cfg.engine.model_copy(update={"backend": backend, "precision": precision, "kv_cache_dtype": kv})
    with pytest.raises(trtllm.UnsupportedCombination) as err:
        trtllm.check_supported(family, e, cc, "GPU")
    for word in words:
        assert word in str(err.value)


def llm_args_problems(backend: str, options: dict) -> list[str]:
    """What TrtLlmArgs/TorchLlmArgs (extra="forbid", tensorrt_llm/llmapi/llm_args.py) would refuse."""
    out = [f"{k}: not a field of the {backend} backend's LLM args" for k in options
           if k not in llm_args.ARGS_BY_BACKEND[backend]]
    for key, fields in llm_args.NESTED.items():
        out += [f"{key}.{k}: not a field" for k in options.get(key, {}) if k not in fields]
    fields = llm_args.ARGS_BY_BACKEND[backend]
    for key, reads in llm_args.SERVER_READS_WHEN_SET.items():
        if options.get(key):
            out += [f"{key}: trtllm-serve then reads {r}, which the {backend} backend's LLM args lack "
                    f"({llm_args.OPENAI_SERVER_SOURCE}; NVIDIA/TensorRT-LLM #9678)" for r in reads if r not in fields]
    dtype = options.get("kv_cache_config", {}).get("dtype", "auto")
    if dtype not in llm_args.KV_CACHE_DTYPE_BY_BACKEND[backend]:
        out.append(f"kv_cache_config.dtype: {dtype} is not accepted by the {backend} backend")
    return out


COMBINATIONS = [(b, p, k) for b in Backend for p in Precision for k in KvCacheDtype]


@pytest.mark.parametrize("backend,precision,kv", COMBINATIONS, ids=lambda v: v.value)
def test_extra_llm_api_options_hold_only_fields_the_backend_accepts(cfg, backend, precision, kv):
    e = cfg.engine.model_copy(update={"backend": backend, "precision": precision, "kv_cache_dtype": kv})
    options = trtllm.extra_llm_api_options(e)
    assert llm_args_problems(backend.value, options) == [], llm_args.SOURCE
    assert options["kv_cache_config"]["free_gpu_memory_fraction"] == e.kv_cache_free_gpu_memory_fraction
    runs_somewhere = any(support.check(None, backend.value, precision.value, kv.value, arch) is None
                         for arch in support.PRECISIONS_BY_ARCH)
    if backend is Backend.PYTORCH and runs_somewhere:
        # The PyTorch backend's KV cache dtype is this option; without it the setting would do nothing.
        assert options["kv_cache_config"].get("dtype", "auto") == kv.value
        assert options["enable_iter_perf_stats"] is True  # /metrics iteration stats


def test_llm_args_check_refuses_what_the_release_refuses():
    assert llm_args_problems("tensorrt", {"enable_iter_perf_stats": True})
    assert llm_args_problems("tensorrt", {"kv_cache_config": {"dtype": "fp8"}})
    assert llm_args_problems("pytorch", {"kv_cache_config": {"fp8": True}})
    assert llm_args_problems("pytorch", {"kv_cache_config": {"dtype": "int8"}})
    # A field of both backends that makes the server read one only the PyTorch backend has (#9678).
    assert llm_args_problems("tensorrt", {"return_perf_metrics": True})
    assert not llm_args_problems("pytorch", {"return_perf_metrics": True})


@pytest.mark.parametrize("backend", list(Backend), ids=lambda v: v.value)
def test_no_per_request_perf_metrics_are_asked_for(cfg, backend):
    """Nothing in Fleetcast reads them (the gateway refuses /perf_metrics), so no backend is asked to keep them."""
    e = cfg.engine.model_copy(update={"backend": backend})
    assert "return_perf_metrics" not in trtllm.extra_llm_api_options(e)


@pytest.mark.parametrize("backend", list(Backend), ids=lambda v: v.value)
def test_a_process_shared_across_salt_groups_runs_without_block_reuse(cfg, backend):
    """KvCacheConfig.enable_block_reuse (both backends, default True): off only where asked, and a field the
    release accepts (tests/runtime/trtllm_1_2_llm_args.py)."""
    e = cfg.engine.model_copy(update={"backend": backend})
    shared = trtllm.extra_llm_api_options(e, block_reuse=False)
    assert shared["kv_cache_config"]["enable_block_reuse"] is False
    assert llm_args_problems(backend.value, shared) == [], llm_args.SOURCE
    assert "enable_block_reuse" not in trtllm.extra_llm_api_options(e)["kv_cache_config"]  # the engine's default


def test_the_block_reuse_decision_follows_the_models_salt_groups(cfg):
    from fleetcast.contract.isolation import block_reuse

    model = cfg.models[0].id
    assert cfg.salt_groups_of(model) is None  # no `consumers`: open to every consumer, now and later
    assert block_reuse("tensorrt-llm", cfg.salt_groups_of(model)) is False
    data = cfg.model_dump(mode="json")
    names = [c["name"] for c in data["consumers"]]
    data["model"]["consumers"] = names  # the shipped config's single-model form
    two = parse_config(data, "<test>")
    assert block_reuse("tensorrt-llm", two.salt_groups_of(model)) is (len(names) < 2)
    for consumer in data["consumers"]:
        consumer["cache_group"] = "one-team"
    trusted = parse_config(data, "<test>")
    assert trusted.salt_groups_of(model) == frozenset({"group:one-team"})
    assert block_reuse("tensorrt-llm", trusted.salt_groups_of(model)) is True
