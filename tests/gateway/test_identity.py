"""Who is calling: PROXY v2 on every connection, VPC endpoint -> account -> consumer, refusals counted."""

from __future__ import annotations

from fleetcast.contract import telemetry as t
from runtime.gateway import ppv2

from .conftest import (
    ANALYTICS_VPCE,
    DEFAULT_CONNECTIONS,
    STRANGER_VPCE,
    VOICE_VPCE,
    connections,
    run,
    start_harness,
    stop_harness,
)
from .fakes import Client, one_request

COMPLETION = {"model": "gpt2-xl", "prompt": "hello there", "max_tokens": 3}


def test_each_endpoint_is_metered_as_its_consumer():
    async def body():
        h = await start_harness()
        try:
            voice = await one_request(h.port, "POST", "/v1/completions", COMPLETION, vpce_id=VOICE_VPCE)
            analytics = await one_request(h.port, "POST", "/v1/completions", COMPLETION, vpce_id=ANALYTICS_VPCE)
            assert voice.status == analytics.status == 200
            assert voice.json()["usage"]["completion_tokens"] == 3
            consumers = [r["Consumer"] for r in h.records_with(t.REQUESTS)]
            assert consumers == ["voice-app", "analytics"]
        finally:
            await stop_harness(h)
    run(body())


def test_unknown_endpoint_gets_openai_shaped_403_and_is_counted():
    async def body():
        h = await start_harness()
        try:
            never_seen = await one_request(h.port, "POST", "/v1/completions", COMPLETION,
                                           vpce_id="vpce-0ddddddddddddddd4")
            stranger = await one_request(h.port, "POST", "/v1/completions", COMPLETION, vpce_id=STRANGER_VPCE)
            for reply in (never_seen, stranger):
                assert reply.status == 403
                error = reply.json()["error"]
                assert error["code"] == "unknown_endpoint" and error["type"] == "permission_error"
                assert set(error) == {"message", "type", "param", "code"}
            assert "vpce-0ddddddddddddddd4" in never_seen.json()["error"]["message"]
            assert "999988887777" in stranger.json()["error"]["message"]
            unknown = h.records_with(t.UNKNOWN_ENDPOINT)
            assert len(unknown) == 2 and all("Consumer" not in r for r in unknown)
            assert h.upstream.requests == []  # refused before reaching the model server
        finally:
            await stop_harness(h)
    run(body())


def test_connection_without_endpoint_id_is_refused_for_inference():
    async def body():
        h = await start_harness()
        try:
            reply = await one_request(h.port, "POST", "/v1/completions", COMPLETION,
                                      header=ppv2.build(("10.40.1.9", 5000)))  # PROXY, but no AWS TLV
            assert reply.status == 403 and reply.json()["error"]["code"] == "unknown_endpoint"
        finally:
            await stop_harness(h)
    run(body())


def test_endpoint_accepted_after_start_is_found_by_a_refresh_on_miss():
    late = "vpce-0eeeeeeeeeeeeeee5"
    async def body():
        h = await start_harness(ec2_responses=(connections(*DEFAULT_CONNECTIONS),
                                               connections(*DEFAULT_CONNECTIONS, (late, "444455556666", "available"))),
                                miss_refresh_s=0.0)
        try:
            reply = await one_request(h.port, "POST", "/v1/completions", COMPLETION, vpce_id=late)
            assert reply.status == 200
            assert h.records_with(t.REQUESTS)[0]["Consumer"] == "voice-app"
        finally:
            await stop_harness(h)
    run(body())


def test_health_check_with_local_header_mirrors_the_model_server():
    async def body():
        h = await start_harness()
        try:
            ok = await one_request(h.port, "GET", "/health", header=ppv2.LOCAL_HEADER)
            assert ok.status == 200
            h.upstream.healthy = False
            sick = await one_request(h.port, "GET", "/health", header=ppv2.LOCAL_HEADER)
            assert sick.status == 503 and "503" in sick.json()["reason"]
            await h.upstream.stop()
            gone = await one_request(h.port, "GET", "/health", header=ppv2.LOCAL_HEADER)
            assert gone.status == 503 and "unreachable" in gone.json()["reason"]
        finally:
            await stop_harness(h)
    run(body())


def test_health_check_with_proxy_header_from_the_nlb_address_works_too():
    async def body():
        h = await start_harness()
        try:
            reply = await one_request(h.port, "GET", "/health", header=ppv2.build(("10.40.2.17", 31000)))
            assert reply.status == 200
        finally:
            await stop_harness(h)
    run(body())


def test_missing_or_malformed_proxy_header_is_refused_and_the_gateway_keeps_serving():
    bad_headers = [
        b"",  # a plain HTTP client: the request line is not a PROXY signature
        b"PROXY TCP4 10.0.0.1 10.0.0.2 1111 2222\r\n",  # v1 text
        ppv2.SIGNATURE + bytes([0x21, 0x11]) + b"\x00\x20" + b"\x00" * 12,  # length overruns the TLVs
        ppv2.SIGNATURE + bytes([0x2F, 0x11]) + b"\x00\x0c" + b"\x00" * 12,  # command 0xF
    ]
    async def body():
        h = await start_harness()
        try:
            for header in bad_headers:
                client = Client(h.port, header=header)
                await client.connect()
                await client.send("GET", "/v1/models")
                status, _ = await client.read_head()
                assert status == 400
                await client.close()
            assert len(h.records_with(t.PROXY_PROTOCOL_ERRORS)) == len(bad_headers)
            good = await one_request(h.port, "POST", "/v1/completions", COMPLETION, vpce_id=VOICE_VPCE)
            assert good.status == 200
        finally:
            await stop_harness(h)
    run(body())


def test_server_statistics_endpoints_are_not_exposed_to_consumers():
    async def body():
        h = await start_harness()
        try:
            reply = await one_request(h.port, "GET", "/metrics", vpce_id=VOICE_VPCE)
            assert reply.status == 404
            models = await one_request(h.port, "GET", "/v1/models", vpce_id=VOICE_VPCE)
            assert models.status == 200 and models.json()["data"][0]["id"] == "gpt2-xl"
        finally:
            await stop_harness(h)
    run(body())


def test_proxy_protocol_off_serves_health_without_a_header():
    async def body():
        h = await start_harness(proxy_protocol=False)
        try:
            reply = await one_request(h.port, "GET", "/health", header=b"")
            assert reply.status == 200
        finally:
            await stop_harness(h)
    run(body())


def test_random_bytes_in_place_of_the_header_never_take_the_gateway_down():
    import asyncio
    import random

    rng = random.Random(20261129)  # fixed seed: the same 60 blobs every run
    blobs = []
    for _ in range(60):
        tail = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 48)))
        head = ppv2.SIGNATURE + bytes([rng.choice([0x20, 0x21, 0x22, 0x11]), rng.randrange(256)])
        blobs.append(rng.choice([tail, head + tail, head + len(tail).to_bytes(2, "big") + tail]))

    async def body():
        h = await start_harness(header_timeout_s=0.2)
        try:
            async def poke(blob):
                reader, writer = await asyncio.open_connection("127.0.0.1", h.port)
                writer.write(blob)
                writer.write_eof()
                await reader.read()  # the gateway answers (400) or closes; either way it ends
                writer.close()
            await asyncio.gather(*(poke(b) for b in blobs))
            reply = await one_request(h.port, "POST", "/v1/completions", COMPLETION, vpce_id=VOICE_VPCE)
            assert reply.status == 200
            assert h.gateway.active == 0
        finally:
            await stop_harness(h)
    run(body())
