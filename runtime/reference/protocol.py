"""What the reference server's two processes say to each other (no PyTorch here: the HTTP process never imports it).

The HTTP process (server.py, through proxy.EngineProxy) and the engine process (worker.py) share one Unix stream
socket, the engine process's standard input. Each message is a 4-byte big-endian length and a pickle of a tuple
whose first item names it:

  HTTP -> engine   START args (the server's argparse namespace; first, once) | SUBMIT id prompt params salt |
                   CANCEL id | STATS ask | MEMORY ask | STOP | TRACE id (the next SUBMIT of that id is stamped:
                   runtime/ttft_trace.py, a test switch; sent only while it is on)
  engine -> HTTP   READY info | LOAD_FAILED message | EVENTS at [(id, token, reason, cached_tokens), ...] |
                   REPLY ask value | FAILED message | STOPPED

EVENTS carries one delivery point of the engine (a prefill group's first tokens, a decode step's tokens, the
sequences retired): every sequence's new token in one message, stamped with the engine process's monotonic clock
(CLOCK_MONOTONIC is one clock for every process of the machine, so the HTTP process's request log compares it
with its own arrival times).
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass
from typing import Any

WORKER_MODULE = "runtime.reference.worker"

START, SUBMIT, CANCEL, STATS, MEMORY, STOP, TRACE = "start", "submit", "cancel", "stats", "memory", "stop", "trace"
READY, LOAD_FAILED, EVENTS, REPLY, FAILED, STOPPED = "ready", "load_failed", "events", "reply", "failed", "stopped"

_LENGTH = struct.Struct("!I")


@dataclass
class SamplingParams:
    """Per-request generation controls (validated by the server)."""

    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None


def check_request(prompt: list[int], params: SamplingParams, vocab_size: int, max_seq_len: int) -> None:
    """Raise ValueError (naming the field) if an engine of this vocabulary and sequence length cannot serve it."""
    if not prompt:
        raise ValueError("prompt: must contain at least one token")
    bad = next((t for t in prompt if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"prompt: token id {bad} is outside the vocabulary [0, {vocab_size})")
    if len(prompt) + params.max_tokens > max_seq_len:
        raise ValueError(
            f"max_tokens: prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds "
            f"the max sequence length {max_seq_len}"
        )


def frame(message: tuple[Any, ...]) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(body)) + body


class Frames:
    """Splits a byte stream into messages: feed() what arrived, then iterate the whole messages it completed."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[Any, ...]]:
        self._buffer += data
        out = []
        start, size = 0, len(self._buffer)
        while size - start >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buffer, start)
            end = start + _LENGTH.size + length
            if end > size:
                break
            out.append(pickle.loads(self._buffer[start + _LENGTH.size:end]))
            start = end
        del self._buffer[:start]
        return out
