"""Staging moves what the build reads, not every weight format a hub repository carries.

Sources: tensorrt_llm/models/convert_utils.py (NVIDIA/TensorRT-LLM, iterate_shard_files: "In case
that both exist, '.safetensor' files will be loaded first"); huggingface_hub's snapshot_download
filters the repository listing with `filter_repo_objects(allow_patterns=...)`, the function used here
to check what a download with our patterns would fetch.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from huggingface_hub.utils import filter_repo_objects

from fleetcast.config import load_config
from fleetcast.contract.errors import UserError
from fleetcast.contract.selection import staged, tokenizer_file
from fleetcast.staging import model as staging_model
from runtime.trtllm import copy_tokenizer

CONFIG = Path(__file__).resolve().parents[2] / "config" / "fleet.yaml"
MiB = 1024 * 1024

# A GPT-2-style hub repository: one model in five weight formats, plus ONNX exports in a subfolder
# (file names as such repositories use them; sizes illustrative, in MiB).
REPO_FILES = {
    ".gitattributes": 0, "README.md": 0, "config.json": 0, "generation_config.json": 0,
    "tokenizer.json": 1, "vocab.json": 1, "merges.txt": 0,
    "model.safetensors": 6000, "pytorch_model.bin": 6000, "tf_model.h5": 6000, "flax_model.msgpack": 6000,
    "rust_model.ot": 6000, "64-8bits.tflite": 1500, "onnx/decoder_model.onnx": 6000, "onnx/config.json": 0,
}
BUILD_READS = {"config.json", "generation_config.json", "tokenizer.json", "vocab.json", "merges.txt", "model.safetensors"}


def test_only_what_the_build_reads_is_selected():
    assert {p for p in REPO_FILES if staged(p)} == BUILD_READS


def test_sharded_safetensors_and_their_index_are_selected():
    assert staged("model-00001-of-00002.safetensors") and staged("model.safetensors.index.json")
    assert not staged("pytorch_model.bin.index.json")


def test_config_can_ask_for_more():
    assert staged("pytorch_model.bin", ("*.bin",)) and staged("onnx/decoder_model.onnx", ("onnx/*",))


def test_a_hub_download_with_the_selection_fetches_exactly_it(monkeypatch, tmp_path):
    """fetch_from_hub hands snapshot_download patterns; the hub client's own filter applied to the
    listing must yield the selection and nothing else."""
    asked = {}
    siblings = [SimpleNamespace(rfilename=p, size=n * MiB) for p, n in REPO_FILES.items()]

    class Api:
        def __init__(self, token=None):
            pass

        def model_info(self, repo_id, revision=None, files_metadata=False):
            assert files_metadata  # sizes are needed for the report
            return SimpleNamespace(sha="a" * 40, siblings=siblings)

    def snapshot_download(repo_id, **kwargs):
        asked.update(kwargs)

    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    logged = []
    staging_model.fetch_from_hub("openai-community/gpt2-xl", "main", tmp_path, None, log=logged.append)
    assert asked["allow_patterns"], "a download without allow_patterns fetches every file"
    fetched = set(filter_repo_objects(list(REPO_FILES), allow_patterns=asked["allow_patterns"]))
    assert fetched == BUILD_READS
    # The report names the staged size and what was left out.
    assert "staging 6 file(s), 5.9 GiB" in logged[0] and "left out 9 file(s)" in logged[0]


def test_a_hub_answer_without_a_commit_is_refused_rather_than_staging_the_default_branch(monkeypatch, tmp_path):
    """huggingface_hub's ModelInfo.sha is Optional (hf_api.py); snapshot_download(revision=None) would fetch
    the default branch instead of the configured revision."""
    downloaded = []

    class Api:
        def __init__(self, token=None):
            pass

        def model_info(self, repo_id, revision=None, files_metadata=False):
            return SimpleNamespace(sha=None, siblings=[SimpleNamespace(rfilename=p, size=n * MiB)
                                                       for p, n in REPO_FILES.items()])

    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kw: downloaded.append(kw))
    with pytest.raises(UserError, match="named no commit"):
        staging_model.fetch_from_hub("openai-community/gpt2-xl", "v1", tmp_path, None, log=lambda m: None)
    assert downloaded == []


def test_a_repository_without_safetensors_is_refused_with_the_setting_to_change():
    files = {k: v for k, v in REPO_FILES.items() if not k.endswith(".safetensors")}
    with pytest.raises(UserError, match=r"stage_patterns.*\*\.bin"):
        staging_model.Selection.of(files).check("x@y")
    staging_model.Selection.of(files, ("*.bin",)).check("x@y")  # pytorch_model.bin asked for: accepted


def repo_dir(root: Path) -> Path:
    for rel, size in REPO_FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(min(size, 1) * 1024 + 1))
    return root


def test_stage_model_from_a_local_dir_uploads_only_the_selection(tmp_path, clients, make_bucket):
    cfg = load_config(CONFIG)
    bucket = make_bucket("ap-northeast-2")
    logged = []
    result = staging_model.stage_model(cfg, {"ap-northeast-2": bucket}, clients, local_dir=repo_dir(tmp_path / "m"),
                                       log=logged.append)
    assert {f.path for f in result.manifest.files} == BUILD_READS
    listed = clients("s3", "ap-northeast-2").list_objects_v2(Bucket=bucket)["Contents"]
    prefix = result.prefix
    assert {o["Key"][len(prefix):] for o in listed} == BUILD_READS | {"manifest.json"}
    assert any("left out 8 file(s)" in line for line in logged)  # hidden files (.gitattributes) never count
    assert "staged" in result.lines()[0]


def test_the_engine_artifact_gets_tokenizer_and_config_never_weights(tmp_path):
    src = repo_dir(tmp_path / "m")
    (src / "manifest.json").write_text("{}")
    copy_tokenizer(src, tmp_path / "tok")
    assert {p.name for p in (tmp_path / "tok").iterdir()} == BUILD_READS - {"model.safetensors"}
    # Asking staging for more weights does not put them next to the engine either.
    copy_tokenizer(src, tmp_path / "tok2", ("*.bin", "*.ot"))
    assert {p.name for p in (tmp_path / "tok2").iterdir()} == BUILD_READS - {"model.safetensors"}
    assert tokenizer_file("tokenizer.model") and not tokenizer_file("rust_model.ot")
