"""Replies name the model the consumer asked for: the JSON body's and every SSE event's `model` is the id in
the request (a model's or an adapter's), never the engine's own name for it (`engine`: trtllm-serve names
its model after its model directory, OpenAIServer `self.model = model_dir.name`,
tensorrt_llm/serve/openai_server.py)."""

from __future__ import annotations

import json

import pytest

from fleetcast.contract import telemetry as t
from runtime.gateway.reply import HOLD_LIMIT, ModelName
from runtime.gateway.routing import Adapter, Router

from .conftest import VOICE_VPCE, run, start_harness, stop_harness
from .fakes import FakeModelServer, one_request

SQL = Adapter("small-sql", "small", 1, "/var/lib/fleetcast/adapters/small/small-sql")


async def _harness():
    server = await FakeModelServer().start()
    router = Router({"small": [("127.0.0.1", server.port)]}, [SQL])
    return await start_harness(upstream=server, router=router)


@pytest.mark.parametrize("model", ["small", "small-sql"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("usage", [False, True], ids=["plain stream", "stream with usage"])
def test_every_sse_event_names_the_requested_id(model, path, usage):
    async def body():
        h = await _harness()
        try:
            request = {"model": model, "max_tokens": 3, "stream": True}
            request.update({"messages": [{"role": "user", "content": "a b"}]} if "chat" in path else {"prompt": "a b"})
            if usage:
                request["stream_options"] = {"include_usage": True}
            reply = await one_request(h.port, "POST", path, request, vpce_id=VOICE_VPCE)
            assert reply.status == 200
            events = [e for e in reply.events if isinstance(e, dict)]
            assert len(events) >= 3 + usage
            assert {e["model"] for e in events} == {model}
            assert reply.text.split() == ["t0", "t1", "t2"]  # the rest of each event as the server sent it
        finally:
            await stop_harness(h)
    run(body())


@pytest.mark.parametrize("model", ["small", "small-sql"])
def test_a_json_reply_names_the_requested_id_and_keeps_its_framing(model):
    async def body():
        h = await _harness()
        try:
            reply = await one_request(h.port, "POST", "/v1/completions",
                                      {"model": model, "prompt": "a b", "max_tokens": 4}, vpce_id=VOICE_VPCE)
            assert reply.status == 200
            data = reply.json()  # parses: the length the client read is the body's
            assert data["model"] == model and data["choices"][0]["text"] == " t0 t1 t2 t3"
            assert data["usage"]["completion_tokens"] == 4
            (rec,) = h.records_with(t.REQUESTS)
            assert rec[t.OUTPUT_TOKENS] == 4  # metering read the same body
        finally:
            await stop_harness(h)
    run(body())


# ---------------------------------------------------------------- the rewriting alone

def test_json_rewriting_holds_back_only_until_the_model_member_has_passed_however_the_bytes_arrive():
    body = json.dumps({"id": "cmpl-1", "object": "text_completion", "model": "engine",
                       "choices": [{"text": 'say "model": "x" \\ ok'}]}, separators=(",", ":")).encode()
    for size in (1, 2, 7, len(body)):
        name = ModelName("Qwen/Qwen2.5-0.5B-Instruct", events=False)
        out = b"".join(name.feed(body[i:i + size]) for i in range(0, len(body), size)) + name.flush()
        data = json.loads(out)
        assert data["model"] == "Qwen/Qwen2.5-0.5B-Instruct"
        assert data["choices"][0]["text"] == 'say "model": "x" \\ ok'  # a quoted "model" in text is text


def test_a_body_without_a_model_member_passes_unchanged():
    name = ModelName("m", events=False)
    assert name.feed(b'{"object":"list",') == b""  # held: the member may still come
    assert name.feed(b'"data":[]}') == b""
    assert name.flush() == b'{"object":"list","data":[]}'
    big = ModelName("m", events=False)
    start = b'{"a":"' + b"x" * HOLD_LIMIT
    assert big.feed(start) == start  # past the hold limit: let through as it is


def test_sse_events_are_rewritten_each_with_spacing_and_escapes_kept():
    name = ModelName("ft:gpt-3.5-turbo:acme::8abc1234", events=True)
    events = (b'data: {"id":"1","model":"engine","choices":[{"text":"\\"model\\":\\"engine\\""}]}\n\n'
              b'data: {"id": "1", "model" : "artifact", "choices": []}\n\ndata: [DONE]\n\n')
    out = name.feed(events)
    first, second, done = out.split(b"\n\n")[:3]
    assert json.loads(first[6:])["model"] == "ft:gpt-3.5-turbo:acme::8abc1234"
    assert json.loads(first[6:])["choices"][0]["text"] == '"model":"engine"'
    assert json.loads(second[6:])["model"] == "ft:gpt-3.5-turbo:acme::8abc1234"
    assert done == b"data: [DONE]"
