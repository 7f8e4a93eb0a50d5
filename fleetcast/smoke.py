"""`fleetcast smoke`: one streamed completion through an endpoint, with its TTFT and token count.

The last step of the deployment guide: proof that a consumer reaches the
fleet and gets tokens back. TTFT is measured as `fleetcast bench` defines it
(request sent -> first non-empty content chunk), on the same
`/v1/completions` API that GPT-2 serves (it has no chat template).

Several models: without `--model`, every model the endpoint lists for this caller gets its own
completion (a consumer's GET /v1/models lists the models and adapters it may call). With the config
and the consumer (`--config`, `--consumer`), the list must be exactly the ones the config lets that
consumer call, and each model of the config it may not call, and an id no config holds, must be
refused with the gateway's 404 `model_not_found` (runtime/gateway/admission.py): an entitlement that
leaks, or a model missing behind the endpoint, fails the smoke test by name.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from fleetcast.contract.errors import UserError

if TYPE_CHECKING:
    import aiohttp


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


# An id no config can hold (model ids start with a letter or digit): the gateway's answer for it is the one
# for a model the caller may not use, so it proves the refusal without knowing the config.
UNKNOWN_MODEL = "-fleetcast-smoke-no-such-model"


@dataclass
class SmokeReport:
    """Every model's completion and every refusal checked, with what failed (empty: the smoke test passed)."""

    endpoint: str
    results: list[SmokeResult]
    refused: dict[str, str]  # model id -> what the endpoint answered ("404 model_not_found" when right)
    failures: list[str]

    def lines(self) -> list[str]:
        out = [f"endpoint: {self.endpoint}  models: {', '.join(r.model for r in self.results) or 'none answered'}"]
        for r in self.results:
            out.append(f"  {r.model}: TTFT {r.ttft_ms:.1f} ms, end-to-end {r.e2e_ms:.1f} ms, tokens prompt "
                       f"{r.prompt_tokens if r.prompt_tokens is not None else '?'} completion {r.completion_tokens}, "
                       f"text {r.text!r}")
        if self.refused:
            out.append("  refused: " + ", ".join(f"{m} ({said})" for m, said in self.refused.items()))
        out += [f"  FAILED: {f}" for f in self.failures]
        return out

    def to_json(self) -> str:
        return json.dumps({"endpoint": self.endpoint, "models": [asdict(r) for r in self.results],
                           "refused": self.refused, "failures": self.failures})


def _base(endpoint: str) -> str:
    base = endpoint.rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


async def _listed(session: aiohttp.ClientSession, base: str) -> list[str]:
    async with session.get(f"{base}/v1/models") as resp:
        if resp.status != 200:
            raise UserError(f"GET {base}/v1/models answered {resp.status}: {(await resp.text())[:200]}")
        models = (await resp.json()).get("data") or []
    if not models:
        raise UserError(f"{base}/v1/models lists no model")
    return [m["id"] for m in models]


def _session(api_key: str | None, timeout_s: float) -> aiohttp.ClientSession:
    import aiohttp

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s), headers=headers)


async def _smoke(endpoint: str, prompt: str, max_tokens: int, model: str | None, api_key: str | None,
                 timeout_s: float, session: aiohttp.ClientSession | None = None) -> SmokeResult:
    import aiohttp

    base = _base(endpoint)
    try:
        if session is None:
            async with _session(api_key, timeout_s) as own:
                return await _smoke(endpoint, prompt, max_tokens, model, api_key, timeout_s, own)
        if model is None:
            model = (await _listed(session, base))[0]
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                "temperature": 0, "stream_options": {"include_usage": True}}
        sent = time.perf_counter()
        first = None
        text: list[str] = []
        chunks = 0
        usage: dict[str, Any] = {}
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


async def _refusal(session: aiohttp.ClientSession, base: str, model: str) -> str:
    """What the endpoint answers a completion for `model`, as '404 model_not_found' or 'STATUS CODE'."""
    body = {"model": model, "prompt": "smoke", "max_tokens": 1, "stream": False}
    async with session.post(f"{base}/v1/completions", json=body) as resp:
        try:
            code = ((await resp.json(content_type=None)).get("error") or {}).get("code")
        except (ValueError, AttributeError):
            code = None
        return f"{resp.status} {code or 'no error code'}"


REFUSED = "404 model_not_found"


async def _smoke_models(endpoint: str, prompt: str, max_tokens: int, api_key: str | None, timeout_s: float,
                        expected: tuple[str, ...] | None, not_entitled: tuple[str, ...], who: str) -> SmokeReport:
    import aiohttp

    base = _base(endpoint)
    results, refused, failures = [], {}, []
    try:
        async with _session(api_key, timeout_s) as session:
            listed = await _listed(session, base)
            if expected is not None:
                failures += [f"GET /v1/models does not list {m}, which {who} may call" for m in expected
                             if m not in listed]
                failures += [f"GET /v1/models lists {m}, which {who} may not call" for m in listed
                             if m not in expected]
            for model in listed if expected is None else [m for m in expected if m in listed]:
                try:
                    results.append(await _smoke(endpoint, prompt, max_tokens, model, api_key, timeout_s, session))
                except UserError as exc:
                    failures.append(f"{model}: {exc}")
            for model in (*not_entitled, UNKNOWN_MODEL) if expected is not None else ():
                refused[model] = said = await _refusal(session, base, model)
                if said != REFUSED:
                    failures.append(f"{model} answered {said}; {who} may not call it, so the gateway must answer "
                                    f"{REFUSED}")
    except aiohttp.ClientError as exc:
        raise UserError(f"cannot reach {endpoint}: {exc}") from None
    except TimeoutError:
        raise UserError(f"no complete answer from {endpoint} within {timeout_s:.0f} s") from None
    return SmokeReport(endpoint, results, refused, failures)


def _check_args(endpoint: str, max_tokens: int) -> None:
    if not endpoint.startswith(("http://", "https://")):
        raise UserError(f"--endpoint {endpoint!r} must be an http:// or https:// URL", 2)
    if max_tokens < 1:
        raise UserError("--max-tokens must be at least 1", 2)


def smoke(endpoint: str, *, prompt: str = "The capital of South Korea is", max_tokens: int = 32,
          model: str | None = None, api_key: str | None = None, timeout_s: float = 120.0) -> SmokeResult:
    """One model: `model`, or the first the endpoint lists."""
    _check_args(endpoint, max_tokens)
    return asyncio.run(_smoke(endpoint, prompt, max_tokens, model, api_key, timeout_s))


def smoke_models(endpoint: str, *, prompt: str = "The capital of South Korea is", max_tokens: int = 32,
                 api_key: str | None = None, timeout_s: float = 120.0, expected: tuple[str, ...] | None = None,
                 not_entitled: tuple[str, ...] = (), who: str = "this caller") -> SmokeReport:
    """Every model the endpoint lists (or, with `expected`, the config's view of the caller: the list must match it,
    and each of `not_entitled` and an unknown id must be refused with 404 model_not_found)."""
    _check_args(endpoint, max_tokens)
    return asyncio.run(_smoke_models(endpoint, prompt, max_tokens, api_key, timeout_s, expected, not_entitled, who))
