"""Token metering: per-consumer EMF records whose totals equal the tokens actually streamed."""

from __future__ import annotations

import asyncio
import json

from fleetcast.contract import telemetry as t
from runtime.gateway.meter import SseMeter, prepare_body

from .conftest import ANALYTICS_VPCE, VOICE_VPCE, run, start_harness, stop_harness
from .fakes import Client, one_request, token_text


def completion(n: int, stream: bool = True, prompt: str = "one two three", **extra):
    return {"model": "gpt2-xl", "prompt": prompt, "max_tokens": n, "stream": stream, **extra}


def test_stream_without_include_usage_is_metered_and_the_client_sees_no_usage_event():
    async def body():
        h = await start_harness()
        try:
            reply = await one_request(h.port, "POST", "/v1/completions", completion(5), vpce_id=VOICE_VPCE)
            assert reply.status == 200
            assert reply.text == "".join(token_text(i) for i in range(5))
            assert reply.events[-1] == "[DONE]"
            assert not any(isinstance(e, dict) and e.get("usage") for e in reply.events)
            # The gateway asked the server for usage on the client's behalf.
            assert h.upstream.requests[0]["stream_options"] == {"include_usage": True}
            (rec,) = h.records_with(t.REQUESTS)
            assert (rec[t.INPUT_TOKENS], rec[t.OUTPUT_TOKENS]) == (3, 5)
            assert rec["Consumer"] == "voice-app" and rec[t.ERRORS] == 0
            assert rec[t.TTFT_MS] > 0 and rec[t.E2E_MS] >= rec[t.TTFT_MS] and t.ITL_MS in rec
            dims = rec["_aws"]["CloudWatchMetrics"][0]["Dimensions"]
            # Per consumer, and per (consumer, model) for the model the request was routed to.
            assert dims == [["Fleet", "Pool"], ["Fleet", "Pool", "Consumer"], ["Fleet", "Pool", "Consumer", "Model"],
                            ["Fleet", "Pool", "Model"]]
            assert rec["Model"] == "gpt2-xl"
            assert rec["_aws"]["CloudWatchMetrics"][0]["Namespace"] == t.NAMESPACE
        finally:
            await stop_harness(h)
    run(body())


def test_stream_that_asked_for_usage_keeps_its_usage_event():
    async def body():
        h = await start_harness()
        try:
            reply = await one_request(h.port, "POST", "/v1/completions",
                                      completion(4, stream_options={"include_usage": True}), vpce_id=VOICE_VPCE)
            usage = [e["usage"] for e in reply.events if isinstance(e, dict) and e.get("usage")]
            assert usage == [{"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}]
            assert h.records_with(t.REQUESTS)[0][t.OUTPUT_TOKENS] == 4
        finally:
            await stop_harness(h)
    run(body())


def test_chat_stream_and_non_streaming_requests_are_metered():
    async def body():
        h = await start_harness()
        try:
            chat = {"model": "gpt2-xl", "messages": [{"role": "user", "content": "hi you"}], "max_tokens": 6,
                    "stream": True}
            reply = await one_request(h.port, "POST", "/v1/chat/completions", chat, vpce_id=ANALYTICS_VPCE)
            assert reply.text == "".join(token_text(i) for i in range(6))
            plain = await one_request(h.port, "POST", "/v1/completions", completion(7, stream=False),
                                      vpce_id=ANALYTICS_VPCE)
            assert plain.json()["usage"]["completion_tokens"] == 7
            recs = h.records_with(t.REQUESTS)
            assert [(r[t.INPUT_TOKENS], r[t.OUTPUT_TOKENS]) for r in recs] == [(2, 6), (3, 7)]
            assert t.TTFT_MS in recs[0] and t.TTFT_MS not in recs[1] and t.E2E_MS in recs[1]
        finally:
            await stop_harness(h)
    run(body())


def test_totals_per_consumer_equal_the_tokens_streamed_under_concurrency():
    async def body():
        h = await start_harness()
        try:
            plan = [(VOICE_VPCE if i % 3 else ANALYTICS_VPCE, 1 + (i * 7) % 13, i % 4 != 0) for i in range(30)]
            streamed = {"voice-app": 0, "analytics": 0}

            async def go(vpce, n, stream):
                client = await Client(h.port, vpce).connect()
                try:
                    reply = await client.request("POST", "/v1/completions", completion(n, stream=stream))
                finally:
                    await client.close()
                text = reply.text if stream else reply.json()["choices"][0]["text"]
                name = "voice-app" if vpce == VOICE_VPCE else "analytics"
                streamed[name] += text.count(" t")  # one " t<i>" per token

            await asyncio.gather(*(go(*p) for p in plan))
            for name, count in streamed.items():
                assert h.metric_sum(t.OUTPUT_TOKENS, name) == count
                assert h.metric_sum(t.REQUESTS, name) == sum(1 for v, _, _ in plan
                                                              if (v == VOICE_VPCE) == (name == "voice-app"))
            assert sum(streamed.values()) == h.upstream.completed_output_tokens
        finally:
            await stop_harness(h)
    run(body())


def test_client_leaving_mid_stream_stops_the_generation_and_counts_what_was_sent():
    async def body():
        h = await start_harness(token_delay_s=0.02)
        try:
            client = await Client(h.port, VOICE_VPCE).connect()
            await client.send("POST", "/v1/completions", completion(200))
            status, headers = await client.read_head()
            assert status == 200
            await client.reader.read(1)  # first bytes arrived: the stream is live
            await client.close()
            for _ in range(200):
                if h.records_with(t.REQUESTS):
                    break
                await asyncio.sleep(0.02)
            (rec,) = h.records_with(t.REQUESTS)
            assert rec["client_disconnected"] is True and rec[t.ERRORS] == 0
            assert 0 < rec[t.OUTPUT_TOKENS] < 200 and rec["usage_source"] == "content_events"
            for _ in range(100):
                if h.upstream.cancelled:
                    break
                await asyncio.sleep(0.02)
            assert h.upstream.cancelled == 1
        finally:
            await stop_harness(h)
    run(body())


def test_model_server_down_is_a_retryable_503_counted_as_error():
    """Down or restarting (a crash, a freeze, an MPS fault restarting its GPU's processes): 503 with Retry-After,
    which OpenAI's SDKs retry (openai-python retries 503 and honours Retry-After), not a 502."""
    from runtime.gateway.upstream import RESTART_RETRY_AFTER_S

    async def body():
        h = await start_harness()
        await h.upstream.stop()
        try:
            reply = await one_request(h.port, "POST", "/v1/completions", completion(3), vpce_id=VOICE_VPCE)
            assert reply.status == 503 and reply.json()["error"]["code"] == "upstream_unavailable"
            assert reply.headers["retry-after"] == str(RESTART_RETRY_AFTER_S)
            (rec,) = h.records_with(t.REQUESTS)
            assert rec[t.ERRORS] == 1 and rec["Consumer"] == "voice-app"
        finally:
            await stop_harness(h)
    run(body())


def test_meter_forwards_events_split_across_reads_only_when_complete():
    meter = SseMeter(strip_usage=True)
    usage_event = b'data: {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1}}\n\n'
    token_event = b'data: {"choices": [{"index": 0, "text": " a"}], "usage": null}\n\n'
    stream = token_event + usage_event + b"data: [DONE]\n\n"
    out = b"".join(meter.feed(stream[i:i + 7], float(i)) for i in range(0, len(stream), 7)) + meter.flush()
    assert out == token_event + b"data: [DONE]\n\n"
    assert meter.usage == {"prompt_tokens": 2, "completion_tokens": 1} and meter.done
    assert meter.content_events == 1


def test_meter_passes_crlf_framed_events():
    meter = SseMeter(strip_usage=False)
    out = meter.feed(b'data: {"choices": [{"text": "x"}]}\r\n\r\n', 1.0)
    assert out == b'data: {"choices": [{"text": "x"}]}\n\n' and meter.first_content_at == 1.0


def _prepared(obj):
    raw = json.dumps(obj).encode()
    return raw, prepare_body(raw, json.loads(raw))


def test_prepare_body_only_touches_streaming_requests():
    plain, prepared = _prepared({"prompt": "x", "max_tokens": 2})
    assert prepared.body == plain and not prepared.stream
    _, asked = _prepared({"stream": True, "stream_options": {"include_usage": True}})
    assert asked.stream and not asked.strip_usage
    _, injected = _prepared({"stream": True, "stream_options": {"continuous_usage_stats": False}})
    assert json.loads(injected.body)["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert injected.strip_usage


def test_tokens_reach_the_client_as_they_are_generated_not_at_the_end():
    async def body():
        h = await start_harness()
        h.upstream.gate = asyncio.Event()  # the server sends one token, then waits
        try:
            client = await Client(h.port, VOICE_VPCE).connect()
            await client.send("POST", "/v1/completions", completion(3))
            status, headers = await client.read_head()
            assert status == 200 and headers["content-type"].startswith("text/event-stream")
            first = await asyncio.wait_for(client.reader.readuntil(b"\n\n"), 5)
            assert b'"text": " t0"' in first  # delivered while the server is still generating
            assert h.upstream.active == 1
            h.upstream.gate.set()
            rest = await asyncio.wait_for(client.reader.readuntil(b"0\r\n\r\n"), 5)  # the last chunk
            assert rest.count(b'"text"') == 2 and b"[DONE]" in rest
            await client.close()
        finally:
            await stop_harness(h)
    run(body())


def test_usage_is_asked_for_by_writing_the_member_in_not_by_re_encoding():
    """A streaming body without stream_options keeps its own bytes (key order, spacing, escapes) after the
    added member, and parses to the caller's request plus include_usage."""
    raw = b'{ "model": "m",\n "prompt": "caf\\u00e9 \xc3\xa9", "stream": true }'
    prepared = prepare_body(raw, json.loads(raw))
    assert prepared.body == b'{"stream_options":{"include_usage":true}, "model": "m",\n "prompt": "caf\\u00e9 \xc3\xa9", "stream": true }'
    assert json.loads(prepared.body) == {**json.loads(raw), "stream_options": {"include_usage": True}}
    assert prepared.strip_usage and prepared.stream


def test_added_fields_land_in_a_valid_body_whatever_its_shape():
    extra = {"lora_request": {"lora_name": "a", "lora_int_id": 1, "lora_path": "/x"}}
    cases = [
        b'{"model":"m","stream":true}',
        b'{"model":"m","stream":true,"stream_options":null}',  # present but null: re-encoded, usage on
        b'{"model":"m","stream":false}',
        b'{"model":"m"}',
        b'{   }',
        json.dumps({"model": "m", "stream": True}).encode("utf-16"),  # json.loads reads UTF-16 too
        json.dumps({"model": "m", "stream": True}).encode("utf-16-le"),
        b"\xef\xbb\xbf" + b'{"model":"m","stream":true}',  # a UTF-8 byte order mark
    ]
    for raw in cases:
        data = json.loads(raw)
        for add in (None, extra):
            prepared = prepare_body(raw, data, add)
            expected = {**data, **(add or {})}
            if data.get("stream") is True:
                expected["stream_options"] = {"include_usage": True}
            assert json.loads(prepared.body) == expected, (raw, add)
            if add is None and data.get("stream") is not True:
                assert prepared.body == raw
