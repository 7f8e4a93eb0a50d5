"""`fleetcast smoke`: one streamed completion through an endpoint, with its TTFT and token count.

The last step of the deployment guide: proof that a consumer reaches the
fleet and gets tokens back. TTFT is measured as `fleetcast bench` defines it
(request sent -> first non-empty content chunk), on the same
`/v1/completions` API that GPT-2 serves (it has no chat template).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass

from fleetcast.contract.errors import UserError


@dataclass
class SmokeResult:
    endpoint: str
    model: str
    ttft_ms: float
    e2e_ms: float
    prompt_tokens: int | None
    completion_tokens: int
    text: str

    def lines(self) -> list[str]:
        return [
            f"endpoint: {self.endpoint}  model: {self.model}",
            f"TTFT: {self.ttft_ms:.1f} ms  end-to-end: {self.e2e_ms:.1f} ms",
            f"tokens: prompt {self.prompt_tokens if self.prompt_tokens is not None else '?'}, "
            f"completion {self.completion_tokens}",
            f"text: {self.text!r}",
        ]

    def to_json(self) -> str:
        return json.dumps(asdict(self))


async def _smoke(endpoint: str, prompt: str, max_tokens: int, model: str | None, api_key: str | None,
                 timeout_s: float) -> SmokeResult:
    import aiohttp

    base = endpoint.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
            if model is None:
                async with session.get(f"{base}/v1/models") as resp:
                    if resp.status != 200:
                        raise UserError(f"GET {base}/v1/models answered {resp.status}: {(await resp.text())[:200]}")
                    models = (await resp.json()).get("data") or []
                    if not models:
                        raise UserError(f"{base}/v1/models lists no model")
                    model = models[0]["id"]
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                    "temperature": 0, "stream_options": {"include_usage": True}}
            sent = time.perf_counter()
            first = None
            text, chunks, usage = [], 0, {}
            async with session.post(f"{base}/v1/completions", json=body) as resp:
                if resp.status != 200:
                    raise UserError(f"POST {base}/v1/completions answered {resp.status}: {(await resp.text())[:300]}")
                async for raw_line in resp.content:
                    line = raw_line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    event = json.loads(data)
                    if event.get("error"):
                        raise UserError(f"the server sent an error mid-stream: {event['error']}")
                    usage = event.get("usage") or usage
                    for choice in event.get("choices") or ():
                        if choice.get("text"):
                            first = first or time.perf_counter()
                            text.append(choice["text"])
                            chunks += 1
            done = time.perf_counter()
    except aiohttp.ClientError as exc:
        raise UserError(f"cannot reach {endpoint}: {exc}") from None
    except TimeoutError:
        raise UserError(f"no complete answer from {endpoint} within {timeout_s:.0f} s") from None
    if first is None:
        raise UserError(f"{endpoint} streamed no tokens")
    return SmokeResult(endpoint=endpoint, model=model, ttft_ms=(first - sent) * 1000, e2e_ms=(done - sent) * 1000,
                       prompt_tokens=usage.get("prompt_tokens"),
                       completion_tokens=usage.get("completion_tokens", chunks), text="".join(text))


def smoke(endpoint: str, *, prompt: str = "The capital of South Korea is", max_tokens: int = 32,
          model: str | None = None, api_key: str | None = None, timeout_s: float = 120.0) -> SmokeResult:
    if not endpoint.startswith(("http://", "https://")):
        raise UserError(f"--endpoint {endpoint!r} must be an http:// or https:// URL", 2)
    if max_tokens < 1:
        raise UserError("--max-tokens must be at least 1", 2)
    return asyncio.run(_smoke(endpoint, prompt, max_tokens, model, api_key, timeout_s))
