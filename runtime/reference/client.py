"""A small streaming /v1/completions client (aiohttp): the measurements the checks and tests need.

It records, per request, the time to the first non-empty content chunk (DESIGN.md's TTFT), the
arrival time of every content chunk, the text, the finish reason and the server's usage chunk.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class StreamResult:
    status: int
    text: str = ""
    chunks: int = 0  # content chunks (one per token for the reference backend)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # seconds since the request was sent
    done: bool = False  # saw "data: [DONE]"
    error: str | None = None

    @property
    def itl_s(self) -> float | None:
        if self.e2e_s is None or self.ttft_s is None or self.chunks < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.chunks - 1)


async def stream_completion(
    session: aiohttp.ClientSession, base_url: str, prompt: str | list[int], max_tokens: int, *,
    first_chunk: asyncio.Event | None = None, **extra: Any
) -> StreamResult:
    """POST a streamed completion with usage; read it to the end. `first_chunk` (an asyncio.Event)
    is set when the first content chunk arrives, so a caller can act while the stream is in flight."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    sent = time.monotonic()
    async with session.post(base_url.rstrip("/") + "/v1/completions", json=body) as resp:
        result = StreamResult(status=resp.status)
        if resp.status != 200:
            result.error = await resp.text()
            return result
        buffer = b""
        async for data in resp.content.iter_any():
            buffer += data
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                payload = event[len(b"data: "):]
                if payload == b"[DONE]":
                    result.done = True
                    continue
                doc = json.loads(payload)
                if "error" in doc:
                    result.error = json.dumps(doc["error"])
                    continue
                if doc.get("usage"):
                    result.usage = doc["usage"]
                for choice in doc.get("choices", []):
                    now = time.monotonic() - sent
                    result.chunks += 1
                    if first_chunk is not None:
                        first_chunk.set()
                    result.chunk_times.append(now)
                    result.text += choice.get("text", "")
                    if choice.get("text") and result.ttft_s is None:
                        result.ttft_s = now
                    if choice.get("finish_reason"):
                        result.finish_reason = choice["finish_reason"]
        if result.chunk_times:
            result.e2e_s = result.chunk_times[-1]
            if result.ttft_s is None:
                result.ttft_s = result.chunk_times[0]
        return result
