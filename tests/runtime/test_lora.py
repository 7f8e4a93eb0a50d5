"""The engine's LoRA options: what a base model's process is started with where it serves adapters, on
TensorRT-LLM 1.2.x (PyTorch backend) and on the reference backend that stands in for it on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetcast.config import Backend, ModelFamily, Precision, load_config
from fleetcast.contract.adapters import lora_config
from fleetcast.contract.errors import UserError
from runtime import trtllm
from runtime.backends import ReferenceBackend
from runtime.devtools.harness import write_peft_adapter
from runtime.reference.server import RequestError, check_lora_request, parse_args
from tests.runtime import trtllm_1_2_llm_args as llm_args
from tests.runtime.test_trtllm_commands import llm_args_problems
from tests.runtime.trtllm_parsers import SERVE

REPO = Path(__file__).resolve().parents[2]
LORA = lora_config([(8, ("attn_q", "attn_v")), (16, ("attn_q", "attn_dense"))])


@pytest.fixture(scope="module")
def cfg():
    return load_config(REPO / "config" / "fleet.yaml")


def test_a_pytorch_engine_serving_adapters_gets_lora_config_in_its_llm_api_options(cfg, tmp_path):
    model = cfg.model.model_copy(update={"family": ModelFamily.QWEN2})
    engine = cfg.engine.model_copy(update={"backend": Backend.PYTORCH, "precision": Precision.BF16})
    backend = trtllm.TrtllmBackend(cfg.model_copy(update={"models": (model,)}), engine)
    cmd = backend.server_command(tmp_path / "key", "127.0.0.1", 8001, lora=LORA)
    options = json.loads(Path(SERVE.parse_args(cmd[1:]).config).read_text())
    assert options["lora_config"] == LORA
    # Only fields TorchLlmArgs and LoraConfig accept (both refuse unknown keys), per the 1.2.x sources.
    assert llm_args_problems("pytorch", options) == [], (llm_args.SOURCE, llm_args.LORA_HELPER_SOURCE)
    # With no single lora_dir, the PyTorch backend asserts lora_target_modules is not empty
    # (tensorrt_llm/_torch/pyexecutor/_util.py); max_lora_rank covers the largest adapter.
    assert options["lora_config"]["lora_dir"] == [] and options["lora_config"]["lora_target_modules"]
    assert options["lora_config"]["max_lora_rank"] == 16
    assert "lora_config" not in json.loads(Path(SERVE.parse_args(
        backend.server_command(tmp_path / "other", "127.0.0.1", 8002)[1:]).config).read_text())


def test_the_tensorrt_backend_is_never_given_lora_options(cfg, tmp_path):
    with pytest.raises(UserError, match="LoRA adapters need the pytorch backend; this engine is tensorrt"):
        trtllm.extra_llm_api_options(cfg.engine, lora=LORA)


def test_the_reference_backend_gets_the_same_options_as_its_lora_config(cfg, tmp_path):
    argv = ReferenceBackend(cfg, cfg.engine).server_command(tmp_path, "127.0.0.1", 8001, lora=LORA)
    assert json.loads(argv[argv.index("--lora-config") + 1]) == LORA
    assert parse_args(argv[3:]).lora_config == LORA  # after `python -m runtime.reference.server`


def lora_request(path, name="sql", number=1) -> dict:
    return {"lora_name": name, "lora_int_id": number, "lora_path": str(path)}


def test_the_reference_server_accepts_an_adapter_the_engine_could_load(tmp_path):
    adapter = write_peft_adapter(tmp_path / "sql", rank=16, modules=("q_proj", "o_proj"))
    assert check_lora_request(lora_request(adapter), LORA) == "sql"


@pytest.mark.parametrize(("case", "message"), [
    ("no lora_config", "started without lora_config"),
    ("unknown path", "does not exist"),
    ("no weights", "holds no adapter_config.json and adapter_model weights"),
    ("rank above max_lora_rank", "has rank 32, above max_lora_rank 16"),
    ("module outside the targets", "adapts mlp_4h_to_h, not among lora_target_modules"),
    ("lora_int_id 0", "lora_int_id must be a positive integer"),
])
def test_the_reference_server_refuses_what_the_engine_could_not_load(tmp_path, case, message):
    adapter = write_peft_adapter(tmp_path / "sql", rank=8)
    request, lora = lora_request(adapter), LORA
    if case == "no lora_config":
        lora = None
    elif case == "unknown path":
        request = lora_request(tmp_path / "elsewhere")
    elif case == "no weights":
        (adapter / "adapter_model.safetensors").unlink()
    elif case == "rank above max_lora_rank":
        request = lora_request(write_peft_adapter(tmp_path / "big", rank=32))
    elif case == "module outside the targets":
        request = lora_request(write_peft_adapter(tmp_path / "mlp", modules=("down_proj",)))
    else:
        request = lora_request(adapter, number=0)
    with pytest.raises(RequestError) as refused:
        check_lora_request(request, lora)
    assert refused.value.param == "lora_request" and message in str(refused.value)
