"""Prompts of a requested token length.

Two ways, best first:
1. A local Hugging Face tokenizer directory (`--tokenizer DIR` with
   tokenizer.json; needs the `tokenizers` package): prompts are slices of a
   token stream, decoded and re-encoded until the count is exact.
2. Fallback, calibrated on the server: prompts are random common English words;
   two probe requests (4 and 16 words) with known word counts read `usage.prompt_tokens` back,
   giving tokens per word and the fixed overhead (chat template, BOS), which
   size every later prompt. The words all have three letters and each gets a
   leading space, so tokens per word is constant for BPE (1) and byte-level (4)
   tokenizers alike and lengths are exact up to rounding to whole words; for
   other tokenizers they are close. The results still record the server-reported prompt length of every
   request, so throughput figures use true counts. If the server returns no
   usage, one word is taken as one token and the lengths spec says so.
Prompts are random per request so a server's prefix cache cannot short-cut them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fleetcast.contract.errors import UserError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# Frequent three-letter words. With a leading space each is one token in GPT-2/Llama-style
# BPE vocabularies and exactly four in byte-level ones, so tokens per word is the same for
# every word and the calibrated fallback lands on the requested length.
WORDS = (
    "the and for was are his her not but had has one all can out who its may any new two now our "
    "she him how man did get use see own way too day old end put say set yet war far few big try "
    "ask let got run"
).split()


@dataclass
class Calibration:
    tokens_per_word: float = 1.0
    overhead_tokens: float = 0.0
    source: str = "assumed 1 token per word (server returned no usage)"


class PromptFactory:
    """Makes a prompt of `n` tokens; `describe()` says how exact that is."""

    def __init__(self, tokenizer_dir: str | None = None, calibration: Calibration | None = None) -> None:
        self._tok: Tokenizer | None = None
        self._stream: list[int] = []
        self.calibration = calibration or Calibration()
        if tokenizer_dir:
            self._tok = _load_tokenizer(tokenizer_dir)
            text = " ".join(random.Random(0).choices(WORDS, k=4096))
            self._stream = self._tok.encode(text, add_special_tokens=False).ids

    @property
    def exact(self) -> bool:
        return self._tok is not None

    def describe(self) -> str:
        if self._tok is not None:
            return "tokenizer"
        c = self.calibration
        return f"words ({c.source}; {c.tokens_per_word:.3f} tok/word, overhead {c.overhead_tokens:.1f})"

    def prompt(self, n: int, rng: random.Random) -> str:
        if self._tok is not None:
            return self._exact_prompt(self._tok, n, rng)
        c = self.calibration
        words = max(1, round((n - c.overhead_tokens) / c.tokens_per_word))
        # Leading space on every word, the first included: each word then tokenizes alike.
        return "".join(" " + w for w in rng.choices(WORDS, k=words))

    def count(self, text: str) -> int | None:
        if self._tok is None:
            return None
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def _exact_prompt(self, tok: Tokenizer, n: int, rng: random.Random) -> str:
        stream = self._stream
        want = n
        text = ""
        for _ in range(8):
            start = rng.randrange(0, max(1, len(stream) - want))
            ids = (stream * (1 + want // len(stream) + 1))[start : start + want]
            text = tok.decode(ids)
            got = len(tok.encode(text, add_special_tokens=False).ids)
            if got == n:
                return text
            want = max(1, want + (n - got))
        return text  # decode/re-encode did not converge; the record keeps the server's count


def tokenizer_file(tokenizer_dir: str, flag: str = "--tokenizer") -> Path:
    """The directory's tokenizer.json; a UserError naming `flag` (the option that gave the directory) otherwise."""
    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        raise UserError(f"{flag}: {tokenizer_dir} has no tokenizer.json (a Hugging Face tokenizer directory)")
    return path


def _load_tokenizer(tokenizer_dir: str) -> Tokenizer:
    path = tokenizer_file(tokenizer_dir)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UserError("--tokenizer needs the `tokenizers` package: pip install 'fleetcast[bench]'") from None
    return Tokenizer.from_file(str(path))


def calibrate_from_usage(samples: list[tuple[int, int | None]]) -> Calibration:
    """Fit tokens-per-word and overhead from (word count, server prompt_tokens) pairs."""
    pts = [(w, t) for w, t in samples if t is not None]
    if len(pts) < 2 or pts[0][0] == pts[1][0]:
        return Calibration()
    (w1, t1), (w2, t2) = pts[0], pts[1]
    tpw = (t2 - t1) / (w2 - w1)
    if tpw <= 0:
        return Calibration()
    return Calibration(tpw, t1 - w1 * tpw, "calibrated on server usage.prompt_tokens")
