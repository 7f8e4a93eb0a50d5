"""Per-consumer limits: concurrency and request rate, refused with an OpenAI-style 429 + Retry-After."""

from __future__ import annotations

import asyncio

from fleetcast.config.model import ConsumerLimits
from fleetcast.contract import telemetry as t
from runtime.gateway.limits import ConsumerLimiter, TokenBucket

from .conftest import ANALYTICS_VPCE, VOICE_VPCE, fleet_config, run, start_harness, stop_harness
from .fakes import Client


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_token_bucket_allows_a_burst_then_the_configured_rate():
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, capacity=3.0, clock=clock)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == 0.5  # next token in half a second at 2/s
    clock.now += 0.5
    assert bucket.take() == 0.0
    clock.now += 100
    assert [bucket.take() == 0.0 for _ in range(4)] == [True, True, True, False]  # never more than capacity


def test_limiter_checks_concurrency_before_spending_rate():
    clock = FakeClock()
    limiter = ConsumerLimiter(ConsumerLimits(max_concurrency=1, requests_per_minute=60), clock)
    assert limiter.admit() is None
    refused = limiter.admit()
    assert refused.reason == "concurrency" and refused.retry_after_s == 1
    limiter.release()
    tokens_left = limiter.bucket._tokens
    assert tokens_left == 9.0  # 10 s of 1/s burst, one spent; the refused request spent none


def test_rate_limit_refusal_says_when_to_retry():
    clock = FakeClock()
    limiter = ConsumerLimiter(ConsumerLimits(max_concurrency=100, requests_per_minute=6), clock)  # 0.1/s, burst 1
    assert limiter.admit() is None
    limiter.release()
    refused = limiter.admit()
    assert refused.reason == "rate" and refused.retry_after_s == 10


def streaming(n=3):
    return {"model": "gpt2-xl", "prompt": "a b", "max_tokens": n, "stream": True}


def test_concurrency_limit_under_load_refuses_only_the_noisy_consumer():
    cfg = fleet_config(voice_limits={"max_concurrency": 4, "requests_per_minute": 6000})
    async def body():
        h = await start_harness(cfg)
        h.upstream.gate = asyncio.Event()  # every stream stops after its first token until released
        try:
            async def open_stream(vpce):
                client = await Client(h.port, vpce).connect()
                await client.send("POST", "/v1/completions", streaming())
                status, headers = await client.read_head()
                return client, status, headers

            noisy = await asyncio.gather(*(open_stream(VOICE_VPCE) for _ in range(12)))
            statuses = sorted(s for _, s, _ in noisy)
            assert statuses == [200] * 4 + [429] * 8
            for client, status, headers in noisy:
                if status == 429:
                    assert headers["retry-after"] == "1"
                    body = await client.read_body(headers)
                    assert b'"concurrency_limit_exceeded"' in body and b'"type": "requests"' in body
            # The other consumer is not affected by the noisy one's limit.
            quiet = await asyncio.gather(*(open_stream(ANALYTICS_VPCE) for _ in range(3)))
            assert [s for _, s, _ in quiet] == [200, 200, 200]
            assert h.gateway.limiters["voice-app"].active == 4
            h.upstream.gate.set()
            for client, status, headers in noisy + quiet:
                if status == 200:
                    await client.read_body(headers)
                await client.close()
            assert h.gateway.limiters["voice-app"].active == 0
            # Slots come back: a new request is admitted once the streams ended.
            again, status, headers = await open_stream(VOICE_VPCE)
            assert status == 200
            await again.read_body(headers)
            await again.close()
            assert h.metric_sum(t.THROTTLED, "voice-app") == 8
            assert h.metric_sum(t.THROTTLED, "analytics") == 0
            throttled = [r for r in h.records if r.get(t.THROTTLED)]
            assert {r["throttle_reason"] for r in throttled} == {"concurrency"}
        finally:
            await stop_harness(h)
    run(body())


def test_rate_limit_on_loopback_keeps_the_connection_usable():
    cfg = fleet_config(analytics_limits={"max_concurrency": 50, "requests_per_minute": 30})  # burst: 5
    async def body():
        h = await start_harness(cfg)
        try:
            client = await Client(h.port, ANALYTICS_VPCE).connect()
            statuses, retry = [], []
            for _ in range(8):
                reply = await client.request("POST", "/v1/completions", streaming(1))
                statuses.append(reply.status)
                if reply.status == 429:
                    retry.append(int(reply.headers["retry-after"]))
                    assert reply.json()["error"]["code"] == "rate_limit_exceeded"
                    assert reply.headers["x-ratelimit-limit-requests"] == "30"
            await client.close()
            assert statuses == [200] * 5 + [429] * 3  # one keep-alive connection throughout
            assert all(1 <= r <= 2 for r in retry)
            assert h.metric_sum(t.THROTTLED, "analytics") == 3
            assert h.metric_sum(t.REQUESTS, "analytics") == 8
        finally:
            await stop_harness(h)
    run(body())
