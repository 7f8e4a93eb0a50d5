"""Optional per-consumer API keys from Secrets Manager (moto on loopback), rotated without a restart."""

from __future__ import annotations

import json

import boto3
import pytest

from fleetcast.contract import telemetry as t
from runtime.gateway.identity import ApiKeyStore, parse_secret

from .conftest import ANALYTICS_VPCE, REGION, VOICE_VPCE, fleet_config, run, start_harness, stop_harness
from .fakes import Client


@pytest.fixture
def secrets(moto_endpoint, request):
    client = boto3.client("secretsmanager", region_name=REGION, endpoint_url=moto_endpoint,
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    name = f"fleetcast/consumers/analytics/api-keys-{request.node.name[:40]}"
    client.create_secret(Name=name, SecretString=json.dumps({"keys": ["key-one", "key-one-b"]}))
    return client, name


def completion(stream=True):
    return {"model": "gpt2-xl", "prompt": "x", "max_tokens": 2, "stream": stream}


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


def test_consumer_with_keys_needs_a_valid_one_and_others_do_not(secrets):
    client, name = secrets
    cfg = fleet_config(analytics_api_keys=True)
    assert cfg.api_key_secret_of(cfg.consumers[1]) == "fleetcast/consumers/analytics/api-keys"
    async def body():
        store = ApiKeyStore(client, {"analytics": name}, refresh_s=3600)
        assert await store.refresh()
        h = await start_harness(cfg, keys=store)
        try:
            c = await Client(h.port, ANALYTICS_VPCE).connect()
            missing = await c.request("POST", "/v1/completions", completion())
            wrong = await c.request("POST", "/v1/completions", completion(), bearer("nope"))
            right = await c.request("POST", "/v1/completions", completion(), bearer("key-one-b"))
            await c.close()
            assert (missing.status, missing.json()["error"]["code"]) == (401, "missing_api_key")
            assert (wrong.status, wrong.json()["error"]["code"]) == (401, "invalid_api_key")
            assert right.status == 200
            assert "authorization" not in {k.lower() for k in h.upstream.requests[0]}  # body only, sanity
            voice = await Client(h.port, VOICE_VPCE).connect()
            assert (await voice.request("POST", "/v1/completions", completion())).status == 200
            await voice.close()
            assert h.metric_sum(t.REQUESTS, "analytics") == 1  # refused callers are not metered as the consumer
        finally:
            await stop_harness(h)
    run(body())


def test_a_key_of_another_consumer_is_not_accepted(secrets):
    client, name = secrets
    async def body():
        other = name + "-voice"
        client.create_secret(Name=other, SecretString=json.dumps({"keys": ["voice-key"]}))
        store = ApiKeyStore(client, {"analytics": name, "voice-app": other}, refresh_s=3600)
        await store.refresh()
        assert store.consumer_for("voice-key") == "voice-app"
        h = await start_harness(fleet_config(analytics_api_keys=True), keys=store)
        try:
            c = await Client(h.port, ANALYTICS_VPCE).connect()
            reply = await c.request("POST", "/v1/completions", completion(), bearer("voice-key"))
            await c.close()
            assert reply.status == 401 and reply.json()["error"]["code"] == "invalid_api_key"
        finally:
            await stop_harness(h)
    run(body())


def test_rotation_without_restart_keeps_connections_and_in_flight_streams(secrets):
    client, name = secrets
    async def body():
        import asyncio

        store = ApiKeyStore(client, {"analytics": name}, refresh_s=3600)
        await store.refresh()
        h = await start_harness(fleet_config(analytics_api_keys=True), keys=store)
        h.upstream.gate = asyncio.Event()
        try:
            streaming = await Client(h.port, ANALYTICS_VPCE).connect()
            await streaming.send("POST", "/v1/completions", {**completion(), "max_tokens": 5}, bearer("key-one"))
            status, headers = await streaming.read_head()
            assert status == 200
            idle = await Client(h.port, ANALYTICS_VPCE).connect()
            assert (await idle.request("POST", "/v1/completions", completion(False), bearer("key-one"))).status == 200

            # Rotation: a new version becomes AWSCURRENT, the old one AWSPREVIOUS.
            client.put_secret_value(SecretId=name, SecretString=json.dumps({"keys": ["key-two"]}))
            assert await store.refresh()
            h.upstream.gate.set()
            rest = await streaming.read_body(headers)  # the in-flight stream finishes untouched
            assert rest.count(b'"text"') == 5
            # Same keep-alive connections: the previous key still works, the new one too.
            assert (await idle.request("POST", "/v1/completions", completion(False), bearer("key-one"))).status == 200
            assert (await idle.request("POST", "/v1/completions", completion(False), bearer("key-two"))).status == 200
            assert (await streaming.request("POST", "/v1/completions", completion(), bearer("key-two"))).status == 200

            # A second rotation retires key-one (no longer current or previous).
            client.put_secret_value(SecretId=name, SecretString=json.dumps({"keys": ["key-three"]}))
            await store.refresh()
            old = await idle.request("POST", "/v1/completions", completion(False), bearer("key-one"))
            assert old.status == 401
            assert (await idle.request("POST", "/v1/completions", completion(False), bearer("key-two"))).status == 200
            assert (await idle.request("POST", "/v1/completions", completion(False), bearer("key-three"))).status == 200
            await idle.close()
            await streaming.close()
        finally:
            await stop_harness(h)
    run(body())


def test_failed_refresh_keeps_the_last_good_keys(secrets):
    client, name = secrets
    async def body():
        store = ApiKeyStore(client, {"analytics": name}, refresh_s=3600)
        await store.refresh()
        client.delete_secret(SecretId=name, ForceDeleteWithoutRecovery=True)
        assert not await store.refresh()
        assert store.consumer_for("key-one") == "analytics"
    run(body())


def test_secret_format_is_checked():
    assert parse_secret('{"keys": ["a", "b"]}') == ["a", "b"]
    assert parse_secret("  bare-key\n") == ["bare-key"]
    for bad in ('{"keys": "a"}', '{"keys": [""]}', "", '{"other": 1}'):
        with pytest.raises(ValueError):
            parse_secret(bad)
