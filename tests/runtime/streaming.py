"""A streaming /v1/completions client that speaks through the gateway (PROXY v2 header first)."""

from __future__ import annotations

import http.client
import json
import socket
import time
from dataclasses import dataclass, field

from runtime.devtools.harness import DEMO_VPCE
from runtime.gateway import ppv2


class _PPv2Connection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, vpce_id: str | None, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self.vpce_id = vpce_id

    def connect(self) -> None:
        self.sock = socket.create_connection((self.host, self.port), self.timeout)
        if self.vpce_id is not None:
            self.sock.sendall(ppv2.build(vpce_id=self.vpce_id))


@dataclass
class StreamResult:
    status: int = 0
    chunks: list[str] = field(default_factory=list)
    usage: dict | None = None
    done: bool = False
    first_chunk_at: float | None = None
    finished_at: float | None = None
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.chunks)


def stream_completion(port: int, prompt: str, max_tokens: int, result: StreamResult | None = None,
                      vpce_id: str | None = DEMO_VPCE, model: str = "gpt2-tiny", timeout_s: float = 60.0,
                      on_chunk=None) -> StreamResult:
    result = result or StreamResult()
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "temperature": 0, "stream_options": {"include_usage": True}}
    try:
        conn = _PPv2Connection("127.0.0.1", port, vpce_id, timeout_s)
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        result.status = resp.status
        if resp.status != 200:
            result.error = resp.read().decode(errors="replace")
            return result
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                result.done = True
                break
            event = json.loads(data)
            if event.get("usage"):
                result.usage = event["usage"]
            for choice in event.get("choices") or []:
                if choice.get("text"):
                    if result.first_chunk_at is None:
                        result.first_chunk_at = time.monotonic()
                    result.chunks.append(choice["text"])
                    if on_chunk:
                        on_chunk(choice["text"])
        conn.close()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.finished_at = time.monotonic()
    return result
