"""Calibration sets: validated when staged, laid out so both TensorRT-LLM 1.2.x loaders read them.

Each loader is reproduced here as the call it makes, with the `datasets` version TensorRT-LLM 1.2.x
pins (requirements.txt: datasets==3.1.0), offline, on the staged files:

- convert_checkpoint.py (SmoothQuant, INT8 KV cache) -> load_calib_dataset in
  tensorrt_llm/models/convert_utils.py: split and column come only from DEFAULT_HF_DATASET_META,
  matched as a substring of the path (reproduced below as data), then
  `load_dataset(path, name=config_name, split=split)[key]`; the GPT model reads `dataset[i]` for
  i < 512 (capture_activation_range, tensorrt_llm/models/gpt/convert.py).
- quantize.py (FP8) -> get_calib_dataloader in tensorrt_llm/quantization/quantize_by_modelopt.py:
  a local directory (no cnn_dailymail/scienceqa in its path) is
  `load_dataset(dir, split="train", trust_remote_code=True)["text"][:calib_size]`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fleetcast.contract.calibration import MIN_ROWS, loader_dir
from fleetcast.contract.errors import UserError
from fleetcast.staging.calibration import read_rows, write_layout

# `datasets` (a dev extra: a missing install must fail, not skip) is imported where it is used, by the two tests
# that read through it, and they run on one xdist worker: its import (pandas, pyarrow) is 2 s of CPU in each
# process that makes it, and the module's other tests, spread over the workers, made it in two or three.

# tensorrt_llm/models/convert_utils.py, DEFAULT_HF_DATASET_META: path substring -> (config name, split, column).
DEFAULT_HF_DATASET_META = {
    "ccdv/cnn_dailymail": ("3.0.0", "train", "article"),
    "cnn_dailymail": ("3.0.0", "train", "article"),
    "lambada": (None, "validation", "text"),
}


@pytest.fixture
def offline(monkeypatch, tmp_path):
    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets-cache")


def convert_checkpoint_reads(path: str) -> list[str]:
    """What load_calib_dataset(path) returns, and the 512 rows capture_activation_range indexes."""
    import datasets

    config_name = split = key = None
    for name, meta in DEFAULT_HF_DATASET_META.items():
        if name in path:
            config_name, split, key = meta
            break
    column = datasets.load_dataset(path, name=config_name, split=split)[key]
    return [column[i] for i in range(512)]


def quantize_reads(path: str, calib_size: int) -> list[str]:
    import datasets

    assert os.path.isdir(path) and "cnn_dailymail" not in path and "scienceqa" not in path.lower()
    return datasets.load_dataset(path, split="train", trust_remote_code=True)["text"][:calib_size]


def source(tmp_path: Path, n: int = MIN_ROWS, name: str = "prompts.jsonl") -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / name).write_text("".join(json.dumps({"text": f"sample prompt number {i}", "id": i}) + "\n"
                                    for i in range(n)))
    return src


@pytest.mark.usefixtures("offline")
@pytest.mark.xdist_group("datasets")
def test_both_loaders_read_the_staged_layout(tmp_path):
    rows, _ = read_rows(source(tmp_path, 600))
    work = tmp_path / "work" / "calibration"  # where the instance downloads the staged prefix
    write_layout(rows, work)
    path = str(loader_dir(work))  # what the runtime passes as --calib_dataset
    assert convert_checkpoint_reads(path) == rows[:512]
    assert quantize_reads(path, 512) == rows[:512]


@pytest.mark.usefixtures("offline")
@pytest.mark.xdist_group("datasets")
def test_a_staged_directory_in_the_old_layout_fails_in_convert_checkpoint(tmp_path):
    """The defect: a plain directory (no known name in its path) has no split/column -> KeyError."""
    plain = tmp_path / "calibration"
    plain.mkdir()
    (plain / "data.jsonl").write_text("".join(json.dumps({"text": f"s{i}"}) + "\n" for i in range(600)))
    with pytest.raises(KeyError):
        convert_checkpoint_reads(str(plain))
    assert len(quantize_reads(str(plain), 512)) == 512  # FP8 reads it: only SmoothQuant/INT8 KV broke


def test_rows_must_carry_the_text_column(tmp_path):
    src = source(tmp_path)
    (src / "more.jsonl").write_text('{"text": "fine"}\n{"prompt": "wrong key"}\n')
    with pytest.raises(UserError, match=r"more\.jsonl:2: no 'text' column \(has: prompt\)"):
        read_rows(src)


@pytest.mark.parametrize("line, message", [
    ("not json", r"bad\.jsonl:1: not JSON"),
    ('{"text": ""}', r"bad\.jsonl:1: column 'text' must be a non-empty string"),
    ('{"text": 42}', r"bad\.jsonl:1: column 'text' must be a non-empty string, got 42"),
    ('["text"]', r"bad\.jsonl:1: no 'text' column \(has: list\)"),
])
def test_malformed_lines_are_named_with_file_and_line(tmp_path, line, message):
    src = source(tmp_path)
    (src / "bad.jsonl").write_text(line + "\n")
    with pytest.raises(UserError, match=message):
        read_rows(src)


def test_too_few_rows_for_convert_checkpoint_are_refused(tmp_path):
    with pytest.raises(UserError, match=r"511 calibration row\(s\).*reads 512"):
        read_rows(source(tmp_path, MIN_ROWS - 1))


def test_a_directory_without_jsonl_says_what_the_format_is(tmp_path):
    (tmp_path / "data.parquet").write_bytes(b"PAR1")
    with pytest.raises(UserError, match=r"no \*\.jsonl file \(found: data\.parquet\).*\"text\""):
        read_rows(tmp_path)


def test_a_work_directory_that_names_another_dataset_is_refused(tmp_path):
    with pytest.raises(UserError, match="cnn_dailymail"):
        loader_dir(tmp_path / "cnn_dailymail" / "calibration")


def test_stage_calibration_uploads_the_layout(tmp_path, clients, make_bucket):
    from fleetcast.staging.model import stage_calibration

    bucket = make_bucket("us-east-1")
    logged = []
    result = stage_calibration("prompts-v1", source(tmp_path), {"us-east-1": bucket}, clients, samples=1024,
                               log=logged.append)
    assert sorted(f.path for f in result.manifest.files) == ["lambada/train.jsonl", "lambada/validation.jsonl"]
    assert result.manifest.extra["rows"] == MIN_ROWS
    assert any("quantize.py) will use 512" in line for line in logged)
    keys = {o["Key"] for o in clients("s3", "us-east-1").list_objects_v2(Bucket=bucket)["Contents"]}
    assert keys == {"calibration/prompts-v1/manifest.json", "calibration/prompts-v1/lambada/train.jsonl",
                    "calibration/prompts-v1/lambada/validation.jsonl"}
