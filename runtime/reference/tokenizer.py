"""Byte-level tokenizer for the reference backend, saved in Hugging Face's tokenizer.json format.

Why byte-level: the backend must work offline (no hub download) and deterministically. Every
UTF-8 byte is one token (ids 0-255, with GPT-2's byte-to-unicode mapping) and id 256 is
`<|endoftext|>`. The file written here is a real ByteLevel BPE tokenizer with no merges, so
`tokenizers`/`transformers` (and therefore AIPerf) load the same directory and produce the same
ids as this pure-Python implementation. The model's vocabulary is larger (50257 for GPT-2
shapes); ids from 257 up are padding rows the server never emits.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any

EOS_TOKEN = "<|endoftext|>"
EOS_ID = 256
VOCAB_SIZE = 257  # tokens the tokenizer can produce and decode

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character mapping (ByteLevel pre-tokenizer)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


class ByteTokenizer:
    """Encodes text to byte ids and decodes ids back; ids >= 256 decode to nothing."""

    vocab_size = VOCAB_SIZE
    eos_id = EOS_ID

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder()


class StreamDecoder:
    """Turns a token stream into text pieces; a multi-byte character is released once complete."""

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if 0 <= token_id < 256:
            return self._dec.decode(bytes([token_id]))
        return ""

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


def tokenizer_json(model_max_length: int) -> dict[str, Any]:
    """The tokenizer.json document (ByteLevel BPE, no merges) equivalent to ByteTokenizer."""
    b2u = _bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    vocab[EOS_TOKEN] = EOS_ID
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": EOS_ID, "content": EOS_TOKEN, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True}
        ],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": {**byte_level, "trim_offsets": False},
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False, "vocab": vocab, "merges": [],
        },
    }


def write_tokenizer(out_dir: Path, model_max_length: int) -> list[str]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json; return the names."""
    out_dir = Path(out_dir)
    docs = {
        "tokenizer.json": tokenizer_json(model_max_length),
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": model_max_length,
            "bos_token": EOS_TOKEN,
            "eos_token": EOS_TOKEN,
            "unk_token": EOS_TOKEN,
            "add_bos_token": False,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
        },
        "special_tokens_map.json": {"bos_token": EOS_TOKEN, "eos_token": EOS_TOKEN, "unk_token": EOS_TOKEN},
    }
    for name, doc in docs.items():
        (out_dir / name).write_text(json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return list(docs)


def load_tokenizer(artifact_dir: Path) -> ByteTokenizer:
    """Check the artifact's tokenizer is the byte-level one this backend implements, and return it."""
    path = Path(artifact_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"artifact: {path} is missing (build the artifact with runtime.reference.build)")
    doc = json.loads(path.read_text(encoding="utf-8"))
    model = doc.get("model", {})
    if model.get("type") != "BPE" or model.get("merges") or len(model.get("vocab", {})) != VOCAB_SIZE:
        raise ValueError(f"artifact: {path} is not the reference byte-level tokenizer (257 tokens, no merges)")
    return ByteTokenizer()
