"""Stand-ins for the TensorRT-LLM tools (TEST DOUBLES: TensorRT-LLM cannot be installed here).

Each one first parses its command line with the parser rebuilt from the 1.2.x
option data, exactly as the release would (a wrong flag exits 2 and fails the
build), records it, then produces what the real tool leaves behind:
  convert_checkpoint.py / quantize.py -> a TRT-LLM checkpoint dir (config.json, rank0.safetensors)
  trtllm-build -> first the timing cache, to --output_timing_cache or else to `model.cache`
                  in its working directory (BuildConfig.output_timing_cache's default, a
                  relative path; builder.build() asserts the save, tensorrt_llm/builder.py),
                  failing the build before any engine is written when that cannot be saved;
                  then an engine dir (config.json, rank0.engine); the weights inside are a
                  reference-backend artifact so the engine can really be served
  trtllm-serve -> the reference server on the requested host/port
`install(dir)` writes the executables and the examples tree; point PATH and
FLEETCAST_TRTLLM_EXAMPLES at them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


# What a tool saw of its process environment, for the tests to check.
_SEEN_ENV = ("PYTHONPATH", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def _record(tool: str, argv: list[str]) -> None:
    log = os.environ.get("FAKE_TRTLLM_LOG")
    if log:
        with open(log, "a") as handle:
            handle.write(json.dumps({"tool": tool, "argv": argv, "cwd": os.getcwd(),
                                     "env": {k: os.environ.get(k) for k in _SEEN_ENV}}) + "\n")


def _calibration_problem(tool: str, args) -> str | None:
    """Read the calibration directory the way the real loader picks split and column (see
    tests/staging/test_calibration.py, which runs the real `datasets` calls): convert_checkpoint.py
    keys them on a 'lambada'/'cnn_dailymail' substring of the path (else KeyError) and reads 512 rows;
    quantize.py reads a local directory's train split, text column."""
    path = str(args.calib_dataset)
    if tool == "quantize.py":
        split, key, need = "train", "text", 1
    elif "cnn_dailymail" in path:
        split, key, need = "train", "article", 512
    elif "lambada" in path:
        split, key, need = "validation", "text", 512
    else:
        return f"KeyError: None (load_calib_dataset({path!r}) found no split/column for this path)"
    file = Path(path, f"{split}.jsonl")
    if not file.is_file():
        return f"no {split} split in {path}"
    rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
    if len(rows) < need or not all(isinstance(r.get(key), str) and r[key] for r in rows[:need]):
        return f"calibration dataset {path}: needs {need} rows with a {key!r} string, has {len(rows)}"
    return None


def main(tool: str, argv: list[str]) -> int:
    from tests.runtime.trtllm_parsers import BUILD, CONVERT, QUANTIZE, SERVE, Refused

    parser = {"convert_checkpoint.py": CONVERT, "quantize.py": QUANTIZE, "trtllm-build": BUILD,
              "trtllm-serve": SERVE}[tool]
    try:
        args = parser.parse_args(argv)
    except Refused as exc:
        print(f"{tool}: error: {exc}", file=sys.stderr)
        return 2
    _record(tool, argv)
    if os.environ.get("FAKE_TRTLLM_FAIL") == tool:
        print(f"{tool}: [TensorRT-LLM][ERROR] CUDA runtime error: out of memory", file=sys.stderr)
        return 1
    if tool in ("convert_checkpoint.py", "quantize.py"):
        if not Path(args.model_dir, "config.json").is_file():
            print(f"{tool}: {args.model_dir} is not a Hugging Face model directory", file=sys.stderr)
            return 1
        if getattr(args, "calib_dataset", None):
            problem = _calibration_problem(tool, args)
            if problem:
                print(f"{tool}: {problem}", file=sys.stderr)
                return 1
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps({"architecture": "GPT2LMHeadModel", "tool": tool}))
        (out / "rank0.safetensors").write_bytes(b"checkpoint")
        return 0
    if tool == "trtllm-build":
        if not Path(args.checkpoint_dir, "rank0.safetensors").is_file():
            print(f"trtllm-build: no checkpoint in {args.checkpoint_dir}", file=sys.stderr)
            return 1
        timing_cache = args.output_timing_cache or "model.cache"  # relative: the working directory
        try:
            with open(timing_cache, "wb") as handle:
                handle.write(b"timing cache")
        except OSError as exc:
            print(f"trtllm-build: {exc}\nAssertionError: Failed to save timing cache.", file=sys.stderr)
            return 1
        from runtime.reference.build import build_artifact

        build_artifact(args.output_dir, size="tiny")
        Path(args.output_dir, "rank0.engine").write_bytes(os.urandom(4096))
        return 0
    # trtllm-serve: serve the engine dir with the reference server (it holds a reference artifact).
    server = [sys.executable, "-m", "runtime.reference.server", "--artifact", args.model, "--host", args.host,
              "--port", str(args.port), "--served-model-name", os.environ.get("FAKE_TRTLLM_MODEL", "model")]
    zygote = sys.modules.get("tests.runtime.zygote")
    if zygote is not None:  # a fork of the tests' fork server: PyTorch is imported, no interpreter to start
        zygote.exec_in_place(server)
    os.execv(sys.executable, server)
    return 0  # not reached


_WRAPPER = """#!{python}
import sys
sys.path.insert(0, {repo!r})
from tests.runtime.fake_trtllm import main
sys.exit(main({tool!r}, sys.argv[1:]))
"""


def install(root: Path) -> tuple[Path, Path]:
    """Write bin/ (trtllm-build, trtllm-serve, python3) and examples/; return (bin dir, examples dir)."""
    bin_dir, examples = root / "bin", root / "examples"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in ("trtllm-build", "trtllm-serve"):
        exe = bin_dir / tool
        exe.write_text(_WRAPPER.format(python=sys.executable, repo=str(REPO), tool=tool))
        exe.chmod(0o755)
    python3 = bin_dir / "python3"  # the runtime calls `python3 <example script>`: make it this venv's
    python3.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python3.chmod(0o755)
    for rel in ("models/core/gpt/convert_checkpoint.py", "quantization/quantize.py"):
        script = examples / rel
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(_WRAPPER.format(python=sys.executable, repo=str(REPO), tool=Path(rel).name))
    return bin_dir, examples
