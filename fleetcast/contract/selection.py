"""Which files of a Hugging Face model repository are staged, and which reach the engine artifact.

A hub repository often carries the same weights in several formats (PyTorch .bin, TensorFlow
.h5, Flax .msgpack, Rust .ot, ONNX, TFLite): several times the bytes the build reads.
Staging takes only what the build and the server read (top-level files):

- weights: `*.safetensors` (+ the shard index). TensorRT-LLM reads safetensors first when both
  exist (tensorrt_llm/models/convert_utils.py, iterate_shard_files), and so does transformers'
  from_pretrained, which the GPT convert_checkpoint.py and the PyTorch backend use;
- the model config, generation config and a ModelOpt `hf_quant_config.json`;
- tokenizer files (fast tokenizer JSON, BPE vocab/merges, SentencePiece, tiktoken, chat template);

plus what `model.stage_patterns` adds (fnmatch patterns on the repository path, e.g. `*.bin` for a
model published without safetensors). The engine artifact's tokenizer directory gets the same
non-weight files, never a weight format. Shared by `fleetcast stage` and the runtime (runtime/trtllm.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json")
CONFIG_FILES = ("config.json", "generation_config.json", "hf_quant_config.json")
TOKENIZER_PATTERNS = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "*.tiktoken",
    "chat_template.jinja", "chat_template.json",
)
BUILD_PATTERNS = WEIGHT_PATTERNS + CONFIG_FILES + TOKENIZER_PATTERNS
# Weight formats: never copied next to an engine (the engine replaces them).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".ot", ".onnx", ".onnx_data",
                   ".gguf", ".tflite", ".ckpt", ".npz", ".pkl")


def staged(path: str, extra: Iterable[str] = ()) -> bool:
    """Whether staging copies the repository file at `path` (posix, relative to the repo root)."""
    extra = tuple(extra)
    if any(fnmatchcase(path, pattern) for pattern in extra):
        return True
    return "/" not in path and any(fnmatchcase(path, pattern) for pattern in BUILD_PATTERNS)


def has_weights(paths: Iterable[str]) -> bool:
    """Some weight file is staged: safetensors, or a format the config's stage_patterns asked for."""
    return any(p.endswith(WEIGHT_SUFFIXES) for p in paths)


def tokenizer_file(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether a top-level staged file belongs in the engine artifact's tokenizer directory."""
    if name.endswith(WEIGHT_SUFFIXES) or fnmatchcase(name, "*.index.json"):
        return False
    return any(fnmatchcase(name, p) for p in CONFIG_FILES + TOKENIZER_PATTERNS + tuple(extra))
