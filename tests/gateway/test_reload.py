"""Consumer changes reach a running gateway through its config refresh, with no restart.

Consumers are not part of the launch template (FleetConfig.instance_digest), so this
refresh is the only way a new consumer, a changed limit or a removed consumer gets to
instances that are already serving.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from fleetcast.config import parse_config
from runtime.devtools.harness import free_port
from runtime.gateway import ppv2
from runtime.gateway.reload import ConfigRefresher

from .conftest import (
    ANALYTICS_VPCE,
    REGION,
    VOICE_VPCE,
    fleet_config,
    gateway_process,
    run,
    start_harness,
    stop_harness,
)
from .fakes import Client, one_request

# Gateways and fake engines as forks of this worker's fork server for them (tests/conftest.py, forked_gateways).
pytestmark = pytest.mark.usefixtures("forked_gateways")


def streaming(n=3):
    return {"model": "gpt2-xl", "prompt": "a b", "max_tokens": n, "stream": True}


def without_analytics(cfg):
    data = cfg.model_dump(mode="json")
    data["consumers"] = [c for c in data["consumers"] if c["name"] != "analytics"]
    return parse_config(data, "<test config>")


def as_text(cfg) -> str:
    return cfg.model_dump_json()


class Source:
    """What the SSM parameter holds right now; `fail` makes the next reads raise."""

    def __init__(self, text: str):
        self.text = text
        self.fail: Exception | None = None
        self.reads = 0

    def __call__(self) -> str:
        self.reads += 1
        if self.fail:
            raise self.fail
        return self.text


def refresher_for(h, boot, source: Source) -> ConfigRefresher:
    async def apply(_cfg, consumers):
        h.gateway.set_consumers(consumers)
    return ConfigRefresher(source, "test:source", boot, REGION, "l40s", apply, refresh_s=3600)


async def status_of(port: int, vpce: str) -> int:
    return (await one_request(port, "POST", "/v1/completions", streaming(1), vpce_id=vpce)).status


def test_a_consumer_added_to_the_config_is_served_after_one_refresh():
    full = fleet_config()
    boot = without_analytics(full)

    async def body():
        h = await start_harness(boot)
        try:
            source = Source(as_text(boot))
            refresher = refresher_for(h, boot, source)
            assert await status_of(h.port, ANALYTICS_VPCE) == 403
            assert await refresher.refresh() is False  # same consumers: nothing to apply
            source.text = as_text(full)
            assert await refresher.refresh() is True
            assert await status_of(h.port, ANALYTICS_VPCE) == 200
            assert await status_of(h.port, VOICE_VPCE) == 200
            assert set(h.gateway.limiters) == {"voice-app", "analytics"}
        finally:
            await stop_harness(h)
    run(body())


def test_a_removed_consumer_is_refused_but_its_stream_in_flight_finishes():
    full = fleet_config()

    async def body():
        h = await start_harness(full)
        h.upstream.gate = asyncio.Event()
        try:
            source = Source(as_text(full))
            refresher = refresher_for(h, full, source)
            inflight = await Client(h.port, ANALYTICS_VPCE).connect()
            await inflight.send("POST", "/v1/completions", streaming(4))
            status, headers = await inflight.read_head()
            assert status == 200
            source.text = as_text(without_analytics(full))
            assert await refresher.refresh() is True
            assert await status_of(h.port, ANALYTICS_VPCE) == 403
            h.upstream.gate.set()
            assert (await inflight.read_body(headers)).count(b'"text"') == 4
            await inflight.close()
        finally:
            await stop_harness(h)
    run(body())


def test_a_raised_limit_applies_at_once_and_requests_in_flight_stay_counted():
    tight = fleet_config(voice_limits={"max_concurrency": 1, "requests_per_minute": 6000})
    loose = fleet_config(voice_limits={"max_concurrency": 2, "requests_per_minute": 6000})

    async def body():
        h = await start_harness(tight)
        h.upstream.gate = asyncio.Event()
        clients = []
        try:
            source = Source(as_text(tight))
            refresher = refresher_for(h, tight, source)

            async def open_stream():
                client = await Client(h.port, VOICE_VPCE).connect()
                clients.append(client)
                await client.send("POST", "/v1/completions", streaming())
                return (await client.read_head())[0]

            assert await open_stream() == 200
            assert await open_stream() == 429
            limiter = h.gateway.limiters["voice-app"]
            source.text = as_text(loose)
            assert await refresher.refresh() is True
            assert h.gateway.limiters["voice-app"] is limiter and limiter.active == 1  # the held stream still counts
            assert await open_stream() == 200
            assert await open_stream() == 429  # 2 in flight: the new limit, not a fresh count
        finally:
            h.upstream.gate.set()
            for client in clients:
                await client.close()
            await stop_harness(h)
    run(body())


def test_an_invalid_or_unreadable_config_keeps_the_consumers_and_says_why(capsys):
    full = fleet_config()

    async def body():
        h = await start_harness(full)
        try:
            source = Source(as_text(full))
            refresher = refresher_for(h, full, source)
            broken = full.model_dump(mode="json")
            broken["consumers"][0]["limits"]["max_concurrency"] = 0
            source.text = json.dumps(broken)
            assert await refresher.refresh() is False
            source.text = "{not json"
            assert await refresher.refresh() is False
            source.fail = ConnectionError("ssm unreachable")
            assert await refresher.refresh() is False
            assert await status_of(h.port, VOICE_VPCE) == 200
            assert await status_of(h.port, ANALYTICS_VPCE) == 200
        finally:
            await stop_harness(h)
    run(body())
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    rejected = [e for e in events if e["event"] == "config_refresh_rejected"]
    assert len(rejected) == 2 and "max_concurrency" in rejected[0]["error"] and "not the JSON" in rejected[1]["error"]
    assert rejected[0]["kept"] == ["voice-app", "analytics"]
    assert [e["error"] for e in events if e["event"] == "config_refresh_failed"] == [
        "ConnectionError: ssm unreachable"]


def test_an_engine_change_is_left_to_the_rollout_but_consumers_still_apply(capsys):
    full = fleet_config()
    boot = without_analytics(full)
    changed = full.model_dump(mode="json")
    changed["engine"]["max_batch_size"] = 32

    async def body():
        h = await start_harness(boot)
        try:
            source = Source(json.dumps(changed))
            assert await refresher_for(h, boot, source).refresh() is True
            assert await status_of(h.port, ANALYTICS_VPCE) == 200
        finally:
            await stop_harness(h)
    run(body())
    err = capsys.readouterr().err
    assert '"event": "config_instance_fields_changed"' in err and '"added": ["analytics"]' in err


def test_the_gateway_process_rereads_its_config_file(tmp_path):
    """`python -m runtime.gateway` as the supervisor starts it: a consumer written into the
    config file later is served within a refresh period, without a restart."""
    from .fakes import FakeModelServer

    full = fleet_config()
    config = tmp_path / "fleet.json"
    config.write_text(as_text(without_analytics(full)))
    port = free_port()

    async def body():
        upstream = await FakeModelServer().start()
        proc, _ = await gateway_process(config, port, upstream.port,
                                        [(VOICE_VPCE, "444455556666"), (ANALYTICS_VPCE, "777788889999")],
                                        "--refresh-s", "0.2", stdout=asyncio.subprocess.DEVNULL)
        try:
            for _ in range(600):  # bounded: 30 s for the process to come up on a loaded machine
                try:
                    await one_request(port, "GET", "/health", header=ppv2.LOCAL_HEADER)
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            assert await status_of(port, ANALYTICS_VPCE) == 403
            config.write_text(as_text(full))
            statuses = []
            for _ in range(100):  # bounded: 10 s against a 0.2 s refresh period
                statuses.append(await status_of(port, ANALYTICS_VPCE))
                if statuses[-1] == 200:
                    break
                await asyncio.sleep(0.1)
            assert statuses[-1] == 200, statuses
        finally:
            if proc.returncode is None:
                proc.terminate()
            await asyncio.wait_for(proc.wait(), 30)
            await upstream.stop()
        err = (await proc.stderr.read()).decode()
        assert '"event": "consumers_reloaded"' in err and '"added": ["analytics"]' in err, err[-2000:]
    run(body(), timeout=60)


def test_on_an_instance_the_refresh_reads_the_stacks_config_parameter(aws_env, monkeypatch, tmp_path):
    """With FLEETCAST_CONFIG_PARAM set (as on every instance) the refresh reads the parameter the
    stack updates on deploy, not the boot snapshot file, which never changes."""
    import boto3

    from runtime.gateway.__main__ import build_parser, config_source

    name = f"/fleetcast-reload-{os.getpid()}/config"
    boto3.client("ssm", region_name=REGION).put_parameter(Name=name, Value=as_text(fleet_config()), Type="String")
    snapshot = tmp_path / "config.json"
    snapshot.write_text(as_text(without_analytics(fleet_config())))
    monkeypatch.setenv("FLEETCAST_CONFIG_PARAM", name)
    args = build_parser().parse_args(["--listen", "127.0.0.1:1", "--upstream", "127.0.0.1:2", "--region", REGION,
                                      "--pool", "l40s", "--config-json", str(snapshot)])
    source, read = config_source(args)
    assert source == f"ssm:{name}"
    assert read() == as_text(fleet_config())
    monkeypatch.delenv("FLEETCAST_CONFIG_PARAM")
    assert config_source(args)[0] == f"file:{snapshot}"


def test_a_failed_apply_keeps_the_consumers_and_is_retried(capsys):
    full = fleet_config()
    boot = without_analytics(full)

    async def body():
        h = await start_harness(boot)
        try:
            source = Source(as_text(full))
            calls = []

            async def apply(_cfg, consumers):
                calls.append(len(consumers))
                if len(calls) == 1:
                    raise ConnectionError("secrets manager unreachable")
                h.gateway.set_consumers(consumers)

            refresher = ConfigRefresher(source, "test:source", boot, REGION, "l40s", apply, refresh_s=3600)
            assert await refresher.refresh() is False
            assert await status_of(h.port, ANALYTICS_VPCE) == 403
            assert await refresher.refresh() is True  # same text, tried again
            assert await status_of(h.port, ANALYTICS_VPCE) == 200 and calls == [2, 2]
        finally:
            await stop_harness(h)
    run(body())
    assert '"event": "config_apply_failed"' in capsys.readouterr().err


def entitled_only(cfg, consumer: str):
    """`cfg` with its one model callable by `consumer` alone (models[].consumers)."""
    data = cfg.model_dump(mode="json")
    data["model"]["consumers"] = [consumer]
    return parse_config(data, "<test config>")


def test_an_entitlement_change_reaches_the_running_gateway_and_rolls_no_pool():
    """Who may call a model is re-read with the consumers: it is out of the instance digest, so a deploy
    that changes it replaces no instance, and the gateway applies it within one refresh."""
    from runtime.gateway.routing import entitlements

    everyone = fleet_config()
    voice_only = entitled_only(everyone, "voice-app")
    assert voice_only.instance_digest(REGION, "l40s") == everyone.instance_digest(REGION, "l40s")

    async def body():
        consumers = voice_only.consumers_of(REGION)
        h = await start_harness(voice_only)
        h.gateway.set_consumers(consumers, entitlements(voice_only, consumers, h.gateway.router))
        try:
            source = Source(as_text(voice_only))

            async def apply(cfg, new_consumers):
                h.gateway.set_consumers(new_consumers, entitlements(cfg, new_consumers, h.gateway.router))

            refresher = ConfigRefresher(source, "test:source", voice_only, REGION, "l40s", apply, refresh_s=3600)
            assert await status_of(h.port, ANALYTICS_VPCE) == 404  # model_not_found: not entitled
            assert await status_of(h.port, VOICE_VPCE) == 200
            source.text = as_text(everyone)
            assert await refresher.refresh() is True  # the consumers are the same; the entitlement is not
            assert await status_of(h.port, ANALYTICS_VPCE) == 200
            source.text = as_text(voice_only)
            assert await refresher.refresh() is True
            assert await status_of(h.port, ANALYTICS_VPCE) == 404
        finally:
            await stop_harness(h)
    run(body())
