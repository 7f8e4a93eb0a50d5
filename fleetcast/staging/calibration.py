"""`fleetcast stage calibration`: read a JSON Lines calibration set and write it in the staged layout
(the layout, and why TensorRT-LLM's loaders need it: fleetcast/contract/calibration.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fleetcast.contract.calibration import LOADER_DIR, MIN_ROWS, SPLITS, TEXT_COLUMN
from fleetcast.contract.errors import EXIT_USAGE, UserError

# What a config whose precision calibrates is told to run (`fleetcast stage calibration`, scripts/stage_cmd.py).
STAGE_COMMAND = "fleetcast stage calibration --config FILE --dir DIR --name NAME"  # which sets calibration.dataset

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_name(name: str) -> str:
    """A set's name becomes one S3 key segment (calibration/NAME/): one segment, no path tricks."""
    if not _NAME.fullmatch(name) or ".." in name:
        raise UserError(f"--name {name!r}: a calibration set name is 1-64 characters, letters, digits, '.', '_' and "
                        "'-', starting with a letter or digit (it becomes the S3 prefix calibration/NAME/)", EXIT_USAGE)
    return name


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
