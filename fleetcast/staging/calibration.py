"""Calibration sets in the one layout both TensorRT-LLM 1.2.x calibration loaders read.

Input (`fleetcast stage calibration --dir DIR`): JSON Lines files (`*.jsonl`) directly in DIR,
one JSON object per line with a non-empty string under "text"; other files are ignored. At
least MIN_ROWS rows in all.

Staged layout (what instances download into <work>/calibration/):

    lambada/train.jsonl        {"text": ...} per line
    lambada/validation.jsonl   the same rows

and the runtime passes `<work>/calibration/lambada` as `--calib_dataset`. Why this shape:

- convert_checkpoint.py (SmoothQuant, INT8 KV cache) calls load_calib_dataset
  (tensorrt_llm/models/convert_utils.py). It picks split and column only from
  DEFAULT_HF_DATASET_META, by substring of the path: 'cnn_dailymail' -> ('3.0.0', 'train',
  'article'), 'lambada' -> (None, 'validation', 'text'); any other directory ends in
  `load_dataset(dir)[None]`, a KeyError. A directory named `lambada` gets split 'validation' and
  column 'text'. The GPT model then reads `dataset[i]` for i < 512
  (capture_activation_range(num_samples=512), tensorrt_llm/models/gpt/convert.py): hence MIN_ROWS.
- quantize.py (FP8) calls get_calib_dataloader (tensorrt_llm/quantization/quantize_by_modelopt.py):
  a local directory whose path names no cnn_dailymail/scienceqa is read as split 'train', column
  'text' (its first calib_size rows).
- `datasets.load_dataset(dir)` names splits after the files (train.*, validation.*), offline.

Stdlib only: the runtime imports `loader_dir`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from fleetcast.contract.errors import UserError

TEXT_COLUMN = "text"
LOADER_DIR = "lambada"
SPLITS = ("train", "validation")
MIN_ROWS = 512
# What a config whose precision calibrates is told to run (`fleetcast stage calibration`, scripts/stage_cmd.py).
STAGE_COMMAND = "fleetcast stage calibration --config FILE --dir DIR --name NAME"  # which sets calibration.dataset
FORMAT = "fleetcast.calibration/v1"  # recorded in the manifest's extra
# Substrings that send either loader down another branch (a hub dataset with other splits/columns).
_OTHER_BRANCHES = ("cnn_dailymail", "scienceqa", "science_qa", "pileval")


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_name(name: str) -> str:
    """A set's name becomes one S3 key segment (calibration/NAME/): one segment, no path tricks."""
    if not _NAME.fullmatch(name) or ".." in name:
        raise UserError(f"--name {name!r}: a calibration set name is 1-64 characters, letters, digits, '.', '_' and "
                        "'-', starting with a letter or digit (it becomes the S3 prefix calibration/NAME/)", 2)
    return name


def loader_dir(calib_dir: Path) -> Path:
    """The directory to hand to convert_checkpoint.py / quantize.py as --calib_dataset."""
    path = Path(calib_dir) / LOADER_DIR
    hit = next((s for s in _OTHER_BRANCHES if s in str(path).lower()), None)
    if hit:
        raise UserError(f"calibration directory {path} contains {hit!r}: TensorRT-LLM's loaders would read it as "
                        "that hub dataset (other split and column); use a work directory without it")
    return path


def read_rows(directory: Path) -> tuple[list[str], list[Path]]:
    """Every sample text of the *.jsonl files in `directory`; (rows, files read). Errors name file, line, column."""
    if not directory.is_dir():
        raise UserError(f"--dir {directory} is not a directory")
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix == ".jsonl")
    if not files:
        others = ", ".join(sorted(p.name for p in directory.iterdir())) or "nothing"
        raise UserError(f"--dir {directory} holds no *.jsonl file (found: {others}); the calibration format is "
                        f'JSON Lines, one {{"{TEXT_COLUMN}": "..."}} object per line')
    rows: list[str] = []
    for path in files:
        with path.open(encoding="utf-8", errors="strict") as handle:
            try:
                for number, line in enumerate(handle, 1):
                    if not line.strip():
                        continue
                    rows.append(_text_of(path, number, line))
            except UnicodeDecodeError as exc:
                raise UserError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if len(rows) < MIN_ROWS:
        raise UserError(f"{directory}: {len(rows)} calibration row(s) in {', '.join(p.name for p in files)}; "
                        f"convert_checkpoint.py's SmoothQuant/INT8-KV calibration reads {MIN_ROWS} rows: add rows")
    return rows, files


def _text_of(path: Path, number: int, line: str) -> str:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{number}: not JSON ({exc.msg}); each line is one object like "
                        f'{{"{TEXT_COLUMN}": "..."}}') from None
    if not isinstance(row, dict) or TEXT_COLUMN not in row:
        keys = ", ".join(map(str, row)) if isinstance(row, dict) else type(row).__name__
        raise UserError(f"{path}:{number}: no {TEXT_COLUMN!r} column (has: {keys}); the loaders read the "
                        f"{TEXT_COLUMN!r} column")
    text = row[TEXT_COLUMN]
    if not isinstance(text, str) or not text.strip():
        raise UserError(f"{path}:{number}: column {TEXT_COLUMN!r} must be a non-empty string, got {text!r:.60}")
    return text


def write_layout(rows: list[str], root: Path) -> Path:
    """Write the staged layout under `root`; returns the loader directory."""
    target = root / LOADER_DIR
    target.mkdir(parents=True, exist_ok=True)
    body = "".join(json.dumps({TEXT_COLUMN: text}, ensure_ascii=False) + "\n" for text in rows)
    for split in SPLITS:
        (target / f"{split}.jsonl").write_text(body, encoding="utf-8")
    return target
