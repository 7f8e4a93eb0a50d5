"""`fleetcast stage adapter`: LoRA adapters staged like weights, checked where TensorRT-LLM would refuse them,
with their rank and modules in the manifest instances read (loopback S3, no AWS)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from fleetcast.config import parse_config
from fleetcast.contract.adapters import (
    HF_TO_TRTLLM_MODULES,
    MODULES_KEY,
    RANK_KEY,
    AdapterConfigError,
    adapter_shape,
    lora_config,
)
from fleetcast.contract.bucket import adapter_prefix
from fleetcast.contract.errors import UserError
from fleetcast.staging.adapters import stage_adapter, stage_adapters
from fleetcast.staging.readiness import adapter_problems
from fleetcast.staging.transfer import read_manifest

ROOT = Path(__file__).resolve().parents[2]
SEOUL, VIRGINIA = "ap-northeast-2", "us-east-1"


def config_with_adapters(source: str = "org/qwen-sql-lora"):
    doc = YAML(typ="safe").load((ROOT / "examples" / "multi-model" / "fleet.yaml").read_text())
    doc = copy.deepcopy(doc)
    doc["models"][2]["adapters"] = [{"id": "qwen-sql", "source": source, "revision": "v1"},
                                    {"id": "qwen-chat", "source": source, "revision": "v1"}]
    return parse_config(doc)


def peft_dir(tmp_path: Path, name: str = "sql", r: int = 16, modules=("q_proj", "v_proj", "o_proj"), **extra) -> Path:
    """A PEFT LoRA directory as peft's save_pretrained writes it (adapter_config.json + weights)."""
    d = tmp_path / name
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": r, "lora_alpha": 32,
                                                       "target_modules": list(modules), **extra}))
    (d / "adapter_model.safetensors").write_bytes(b"\0" * 4096)
    (d / "README.md").write_text("model card, not staged")
    return d


def test_an_adapter_is_staged_to_every_region_with_its_rank_and_modules_in_the_manifest(tmp_path, clients, make_bucket):
    cfg = config_with_adapters()
    buckets = {SEOUL: make_bucket(SEOUL), VIRGINIA: make_bucket(VIRGINIA)}
    assert [p.split(" MISSING")[0] for p in adapter_problems(cfg, clients("s3", SEOUL), buckets[SEOUL])] == \
        ["adapter qwen-sql of qwen2.5-3b", "adapter qwen-chat of qwen2.5-3b"]
    result = stage_adapter(cfg, "qwen2.5-3b", "qwen-sql", buckets, clients, local_dir=peft_dir(tmp_path),
                           log=lambda _: None)
    prefix = adapter_prefix("qwen2.5-3b", "main", "qwen-sql", "v1")
    assert result.prefix == prefix == "models/qwen2.5-3b/main/adapters/qwen-sql/v1/"
    for region, bucket in buckets.items():
        manifest = read_manifest(clients("s3", region), bucket, prefix)
        assert manifest is not None and manifest.kind == "adapter"
        assert {f.path for f in manifest.files} == {"adapter_config.json", "adapter_model.safetensors"}
        # q_proj, v_proj, o_proj -> TensorRT-LLM's names (tensorrt_llm/lora_helper.py).
        assert manifest.extra[RANK_KEY] == 16 and manifest.extra[MODULES_KEY] == ["attn_dense", "attn_q", "attn_v"]
    problems = adapter_problems(cfg, clients("s3", VIRGINIA), buckets[VIRGINIA])
    assert len(problems) == 1 and problems[0].startswith("adapter qwen-chat of qwen2.5-3b MISSING")


def test_an_s3_source_is_read_with_the_operators_credentials(tmp_path, clients, make_bucket):
    source_bucket = make_bucket(SEOUL)
    s3 = clients("s3", SEOUL)
    src = peft_dir(tmp_path, r=8, modules=("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj"))
    for name in ("adapter_config.json", "adapter_model.safetensors", "README.md"):
        s3.upload_file(str(src / name), source_bucket, f"trained/sql/{name}")
    cfg = config_with_adapters(f"s3://{source_bucket}/trained/sql/")
    bucket = make_bucket(SEOUL)
    (result, _) = stage_adapters(cfg, {SEOUL: bucket}, clients, model_id="qwen2.5-3b", log=lambda _: None)
    assert result.manifest.source == f"s3://{source_bucket}/trained/sql/"
    assert result.manifest.extra[MODULES_KEY] == ["attn_k", "attn_q", "attn_v", "mlp_4h_to_h", "mlp_gate",
                                                  "mlp_h_to_4h"]
    assert {f.path for f in result.manifest.files} == {"adapter_config.json", "adapter_model.safetensors"}


def test_a_directory_without_adapter_weights_is_refused_naming_what_is_missing(tmp_path, clients, make_bucket):
    d = peft_dir(tmp_path)
    (d / "adapter_model.safetensors").unlink()
    with pytest.raises(UserError, match=r"is not a PEFT LoRA adapter: no adapter_model.safetensors or "
                                        r"adapter_model.bin \(files: README.md, adapter_config.json\)"):
        stage_adapter(config_with_adapters(), "qwen2.5-3b", "qwen-sql", {SEOUL: make_bucket(SEOUL)}, clients,
                      local_dir=d, log=lambda _: None)


def test_an_adapter_the_engine_cannot_load_is_refused_at_stage_time(tmp_path, clients, make_bucket):
    # GPT-2's fused c_attn has no TensorRT-LLM LoRA module name (tensorrt_llm/lora_helper.py
    # get_default_trtllm_modules_to_hf_modules maps q/k/v/o, gate/up/down and MoE names only).
    d = peft_dir(tmp_path, modules=("c_attn",))
    bucket = make_bucket(SEOUL)
    with pytest.raises(UserError, match="target_modules c_attn have no TensorRT-LLM LoRA module"):
        stage_adapter(config_with_adapters(), "qwen2.5-3b", "qwen-sql", {SEOUL: bucket}, clients, local_dir=d,
                      log=lambda _: None)
    assert clients("s3", SEOUL).list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0  # nothing written


@pytest.mark.parametrize(("config", "message"), [
    ({"peft_type": "PREFIX_TUNING", "r": 8, "target_modules": ["q_proj"]}, "peft_type 'PREFIX_TUNING'; allowed: LORA"),
    ({"r": 0, "target_modules": ["q_proj"]}, "r (the LoRA rank) is 0; allowed: a positive integer"),
    ({"r": 8, "target_modules": "all-linear"}, "target_modules is the pattern 'all-linear'; allowed: a list"),
    ({"r": 8, "target_modules": []}, "target_modules is []; allowed: a non-empty list"),
])
def test_adapter_config_refusals_name_the_field_and_what_is_allowed(config, message):
    with pytest.raises(AdapterConfigError) as refused:
        adapter_shape(json.dumps(config), "adapter x")
    assert str(refused.value).startswith("adapter x: ") and message in str(refused.value)


def test_the_module_map_is_tensorrt_llms_default_inverted():
    """tensorrt_llm/lora_helper.py get_default_trtllm_modules_to_hf_modules (TensorRT-LLM 1.2.x), read with
    this workplace's source tools: attn_q/k/v/dense -> q/k/v/o_proj, mlp_h_to_4h -> gate_proj, mlp_4h_to_h ->
    down_proj, mlp_gate -> up_proj, mlp_gate_up -> gate_up_proj, moe_h_to_4h/4h_to_h/gate/router -> w1/w2/w3/gate."""
    assert HF_TO_TRTLLM_MODULES == {
        "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_dense",
        "gate_proj": "mlp_h_to_4h", "down_proj": "mlp_4h_to_h", "up_proj": "mlp_gate", "gate_up_proj": "mlp_gate_up",
        "w1": "moe_h_to_4h", "w2": "moe_4h_to_h", "w3": "moe_gate", "gate": "moe_router"}


def test_the_engine_lora_options_cover_every_adapter_of_the_model():
    options = lora_config([(16, ("attn_q", "attn_v")), (64, ("attn_q", "mlp_gate"))])
    # The largest rank sizes the LoRA cache; every module any adapter touches is a target; every adapter
    # has a GPU and a host cache slot.
    assert options == {"lora_dir": [], "max_lora_rank": 64, "lora_target_modules": ["attn_q", "attn_v", "mlp_gate"],
                       "max_loras": 2, "max_cpu_loras": 2}


def test_the_cli_stages_an_adapter_and_refuses_a_config_without_any(tmp_path, aws_env, make_bucket):
    from tests.cli import run_cli

    config = tmp_path / "fleet.yaml"
    config.write_text(json.dumps(config_with_adapters().model_dump(mode="json")))  # JSON is YAML
    bucket = make_bucket(SEOUL)
    env = {"AWS_ENDPOINT_URL": aws_env, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}

    def fleetcast(*args):  # in this process (tests/cli.py): an interpreter importing the CLI is 1.5 s of CPU a call
        return run_cli("stage", "adapter", *args, "--bucket", f"{SEOUL}={bucket}", "--region", SEOUL, env=env)

    done = fleetcast("--config", str(config), "--adapter", "qwen-sql", "--local-dir", str(peft_dir(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert "adapter qwen-sql of qwen2.5-3b: LoRA rank 16, TensorRT-LLM modules attn_dense, attn_q, attn_v" in done.stdout
    assert "adapter qwen-sql@v1: 2 file(s)" in done.stdout
    none = fleetcast("--config", str(ROOT / "config" / "fleet.yaml"))
    assert none.returncode == 2 and "the config has no adapters to stage (models[].adapters)" in none.stderr
    assert "Traceback" not in none.stderr


def test_a_hub_adapter_is_fetched_at_its_revision_with_only_the_files_the_engine_loads(monkeypatch, tmp_path, clients,
                                                                                        make_bucket):
    """The hub listing holds more than the adapter (a card, an optimizer state, a .bin next to the safetensors):
    only adapter_config.json and the safetensors weights are downloaded and staged, and the commit the revision
    resolved to is recorded."""
    from types import SimpleNamespace

    import huggingface_hub
    from huggingface_hub.utils import filter_repo_objects

    src = peft_dir(tmp_path, r=4, modules=("q_proj",))
    listing = ["adapter_config.json", "adapter_model.safetensors", "adapter_model.bin", "README.md", "optimizer.pt"]
    asked: dict = {}

    class Api:
        def __init__(self, token=None):
            pass

        def model_info(self, repo_id, revision=None, files_metadata=False):
            asked["revision"] = revision
            return SimpleNamespace(sha="b" * 40, siblings=[SimpleNamespace(rfilename=p, size=10) for p in listing])

    def snapshot_download(repo_id, revision, local_dir, token, allow_patterns):
        asked.update(repo=repo_id, commit=revision, patterns=allow_patterns)
        for name in filter_repo_objects(listing, allow_patterns=allow_patterns):
            (Path(local_dir) / name).write_bytes((src / name).read_bytes())

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    logged: list[str] = []
    result = stage_adapter(config_with_adapters(), "qwen2.5-3b", "qwen-sql", {SEOUL: make_bucket(SEOUL)}, clients,
                           log=logged.append)
    assert asked["repo"] == "org/qwen-sql-lora" and asked["revision"] == "v1" and asked["commit"] == "b" * 40
    assert sorted(filter_repo_objects(listing, allow_patterns=asked["patterns"])) == \
        ["adapter_config.json", "adapter_model.safetensors"]
    assert result.manifest.source == "hub:org/qwen-sql-lora" and result.manifest.extra["commit"] == "b" * 40
    assert any("resolved to commit" in line for line in logged)  # v1 is a tag: pin the sha
