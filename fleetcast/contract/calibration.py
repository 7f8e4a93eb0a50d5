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

Shared by `fleetcast stage calibration` (which writes the layout, fleetcast/staging/calibration.py) and
the runtime (which hands `loader_dir` to the build steps).
"""

from __future__ import annotations

from pathlib import Path

from .errors import UserError

TEXT_COLUMN = "text"
LOADER_DIR = "lambada"
SPLITS = ("train", "validation")
MIN_ROWS = 512
FORMAT = "fleetcast.calibration/v1"  # recorded in the manifest's extra
# Substrings that send either loader down another branch (a hub dataset with other splits/columns).
_OTHER_BRANCHES = ("cnn_dailymail", "scienceqa", "science_qa", "pileval")


def loader_dir(calib_dir: Path) -> Path:
    """The directory to hand to convert_checkpoint.py / quantize.py as --calib_dataset."""
    path = Path(calib_dir) / LOADER_DIR
    hit = next((s for s in _OTHER_BRANCHES if s in str(path).lower()), None)
    if hit:
        raise UserError(f"calibration directory {path} contains {hit!r}: TensorRT-LLM's loaders would read it as "
                        "that hub dataset (other split and column); use a work directory without it")
    return path
