"""Build a reference-backend artifact: deterministic random GPT-2 weights, config and tokenizer.

This is the reference path's stand-in for `trtllm-build`: it produces real files (weights in
safetensors, or torch.save when safetensors is absent; config.json; a byte-level tokenizer)
that the engine cache uploads, downloads, verifies and serves. Weights are drawn from a
generator seeded by `seed`, so the same (size, seed, dtype, device) gives byte-identical files.
A CPU build and a CUDA build of the same seed differ (different random generators); the CUDA
path exists because 3 GB of gpt2-xl weights are generated on the GPU in seconds.

CLI: python -m runtime.reference.build --out DIR --size tiny [--seed N] [--dtype float16] [--device cuda]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

from .configs import SIZES, ModelShape, shape_for
from .tokenizer import EOS_ID, VOCAB_SIZE, write_tokenizer

WEIGHTS_SAFETENSORS = "model.safetensors"
WEIGHTS_TORCH = "pytorch_model.bin"
DTYPES = ("float32", "float16", "bfloat16")
FORMAT = "fleetcast-reference/1"


def _torch() -> types.ModuleType:
    try:
        import torch
    except ImportError:
        raise RuntimeError(
            "the reference backend needs PyTorch: install the 'reference' extra (pip install -e '.[reference]')"
        ) from None
    return torch


def _have_safetensors() -> bool:
    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        return False
    return True


def random_weights(shape: ModelShape, seed: int, dtype: str = "float32", device: str = "cpu") -> dict[str, Any]:
    """Random GPT-2 weights: embeddings N(0, 0.02), projections N(0, 1/fan_in), LayerNorms identity."""
    torch = _torch()
    from .model import weight_names

    tdtype = getattr(torch, dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, dims in weight_names(shape):
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            t = torch.ones(dims, device=device, dtype=tdtype)
        elif name.endswith(".bias") or len(dims) == 1:
            t = torch.zeros(dims, device=device, dtype=tdtype)
        else:
            # Projections use 1/sqrt(fan_in) rather than GPT-2's 0.02: with tied embeddings and
            # tiny weights, an untrained model just repeats its last token, which would make the
            # cached-vs-naive test and the served text trivially constant.
            std = dims[0] ** -0.5 if ".h." in name else (0.01 if "wpe" in name else 0.02)
            t = torch.empty(dims, device=device, dtype=tdtype).normal_(0.0, std, generator=gen)
        out[name] = t
    return out


def build_artifact(out_dir: str | Path, *, size: str = "tiny", seed: int = 0, dtype: str = "float32", device: str = "cpu") -> dict[str, Any]:
    """Write the artifact for `size` into `out_dir`; return {"files": [...], "sha256": {...}, ...}.

    `out_dir` is created if needed and must not already hold an artifact (the engine cache builds
    into a fresh directory, so a leftover means a caller bug, not something to overwrite silently).
    """
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not supported; allowed: {', '.join(DTYPES)}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device: {device!r} is not supported; allowed: cpu, cuda")
    shape = shape_for(size)
    torch = _torch()
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: cuda was asked for but torch sees no CUDA device")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "config.json").exists():
        raise FileExistsError(f"out_dir: {out} already holds an artifact (config.json exists)")

    started = time.monotonic()
    weights = random_weights(shape, seed, dtype, device)
    weights = {k: v.cpu().contiguous() for k, v in weights.items()}
    if _have_safetensors():
        from safetensors.torch import save_file

        weights_file = WEIGHTS_SAFETENSORS
        # One metadata key only: safetensors keeps metadata in a hash map, so two keys are written
        # in a random order and the same weights would hash differently (the format is in config.json).
        save_file(weights, str(out / weights_file), metadata={"format": "pt"})
    else:
        weights_file = WEIGHTS_TORCH
        torch.save(weights, out / weights_file)
    del weights

    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": shape.vocab_size,
        "n_positions": shape.n_positions,
        "n_ctx": shape.n_positions,
        "n_embd": shape.n_embd,
        "n_layer": shape.n_layer,
        "n_head": shape.n_head,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": shape.layer_norm_epsilon,
        "bos_token_id": EOS_ID,
        "eos_token_id": EOS_ID,
        "tie_word_embeddings": True,
        "torch_dtype": dtype,
        "fleetcast_reference": {
            "format": FORMAT,
            "size": size,
            "seed": seed,
            "dtype": dtype,
            "generated_on": device,
            "weights_file": weights_file,
            "tokenizer_vocab_size": VOCAB_SIZE,
            "param_count": shape.param_count(),
        },
    }
    (out / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    files = [weights_file, "config.json", *write_tokenizer(out, shape.n_positions)]
    digests = {name: _sha256(out / name) for name in files}
    return {
        "dir": str(out),
        "files": files,
        "sha256": digests,
        "bytes": sum((out / f).stat().st_size for f in files),
        "size": size,
        "seed": seed,
        "dtype": dtype,
        "device": device,
        "seconds": round(time.monotonic() - started, 3),
    }


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def read_config(artifact_dir: str | Path) -> dict[str, Any]:
    """The artifact's config.json, checked to be a reference-backend artifact."""
    path = Path(artifact_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"artifact: {path} is missing")
    config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    meta = config.get("fleetcast_reference")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"artifact: {path} was not written by runtime.reference.build (format {FORMAT})")
    return config


def load_weights(artifact_dir: str | Path, device: str = "cpu") -> dict[str, Any]:
    """The artifact's tensors by name, loaded onto `device`."""
    torch = _torch()
    config = read_config(artifact_dir)
    path = Path(artifact_dir) / config["fleetcast_reference"]["weights_file"]
    if not path.is_file():
        raise FileNotFoundError(f"artifact: weights file {path} is missing")
    if path.name == WEIGHTS_SAFETENSORS:
        if not _have_safetensors():
            raise RuntimeError("artifact: weights are safetensors but the safetensors package is not installed")
        from safetensors.torch import load_file

        weights: dict[str, Any] = load_file(str(path), device=device)
    else:
        weights = torch.load(path, map_location=device, weights_only=True)
    return weights


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime.reference.build", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory to write the artifact into")
    ap.add_argument("--size", default="tiny", choices=list(SIZES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default=None, choices=DTYPES, help="default: float16 on cuda, float32 on cpu")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the random weights are generated")
    args = ap.parse_args(argv)
    dtype = args.dtype or ("float16" if args.device == "cuda" else "float32")
    try:
        result = build_artifact(args.out, size=args.size, seed=args.seed, dtype=dtype, device=args.device)
    except (ValueError, RuntimeError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
