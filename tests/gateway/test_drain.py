"""Drain on SIGTERM: health 503 at once, new requests refused, in-flight streams finish, exit 0."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

from runtime.descriptors import descriptor_room, descriptor_slots
from runtime.devtools.harness import free_port
from runtime.gateway import ppv2

from .conftest import VOICE_VPCE, fleet_config, gateway_process, run, start_harness, stop_harness
from .fakes import Client, FakeModelServer, one_request


def stream(n=4):
    return {"model": "gpt2-xl", "prompt": "a", "max_tokens": n, "stream": True}


def test_drain_lets_in_flight_streams_finish_and_refuses_new_work():
    async def body():
        h = await start_harness()
        h.upstream.gate = asyncio.Event()
        try:
            inflight = await Client(h.port, VOICE_VPCE).connect()
            await inflight.send("POST", "/v1/completions", stream(6))
            status, headers = await inflight.read_head()
            assert status == 200
            idle = await Client(h.port, VOICE_VPCE).connect()
            assert (await idle.request("GET", "/v1/models")).status == 200

            drained = asyncio.ensure_future(h.gateway.drain())
            await asyncio.sleep(0)
            health = await one_request(h.port, "GET", "/health", header=ppv2.LOCAL_HEADER)
            assert health.status == 503 and health.json()["status"] == "draining"
            refused = await idle.request("POST", "/v1/completions", stream())
            assert refused.status == 503 and refused.headers["connection"] == "close"
            assert refused.json()["error"]["code"] == "draining"
            assert not drained.done()  # still waiting for the stream

            h.upstream.gate.set()
            rest = await inflight.read_body(headers)
            assert rest.count(b'"text"') == 6 and rest.endswith(b"data: [DONE]\n\n")
            assert await asyncio.wait_for(drained, 5) is True
            await inflight.close()
            await idle.close()
        finally:
            await stop_harness(h)
    run(body())


def test_drain_gives_up_after_the_timeout():
    async def body():
        h = await start_harness(drain_timeout_s=0.3)
        h.upstream.gate = asyncio.Event()
        try:
            stuck = await Client(h.port, VOICE_VPCE).connect()
            await stuck.send("POST", "/v1/completions", stream())
            await stuck.read_head()
            started = time.monotonic()
            assert await h.gateway.drain() is False
            assert time.monotonic() - started < 30  # gave up after 0.3 s, not never (loose: a loaded machine)
            await stuck.close()
        finally:
            await stop_harness(h)
    run(body())


def test_process_exits_zero_on_sigterm_after_its_stream(tmp_path):
    """`python -m runtime.gateway` as the supervisor starts it, identity from a loopback EC2 fake."""
    config = tmp_path / "fleet.json"
    config.write_text(json.dumps(fleet_config().model_dump(mode="json")))
    port = free_port()

    async def body():
        upstream = await FakeModelServer(token_delay_s=0.05).start()
        proc, ec2 = await gateway_process(config, port, upstream.port, [(VOICE_VPCE, "444455556666")])
        try:
            for _ in range(600):  # bounded: 30 s for the process to come up on a loaded machine
                try:
                    health = await one_request(port, "GET", "/health", header=ppv2.LOCAL_HEADER)
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            assert health.status == 200
            assert ec2.calls == 1  # the startup read of the endpoint connections

            inflight = await Client(port, VOICE_VPCE).connect()
            await inflight.send("POST", "/v1/completions", stream(10))  # ~0.5 s of tokens
            status, headers = await inflight.read_head()
            assert status == 200
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.1)
            draining = await one_request(port, "GET", "/health", header=ppv2.LOCAL_HEADER)
            assert draining.status == 503
            rest = await inflight.read_body(headers)
            assert rest.count(b'"text"') == 10
            await inflight.close()
            assert await asyncio.wait_for(proc.wait(), 15) == 0
            err = (await proc.stderr.read()).decode()
            assert '"event": "drain_finished"' in err and '"all_finished": true' in err
            records = [json.loads(line) for line in (await proc.stdout.read()).decode().splitlines()]
            (record,) = [r for r in records if "Requests" in r]
            assert record["Consumer"] == "voice-app" and record["OutputTokens"] == 10
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await upstream.stop()
    run(body(), timeout=60)


def test_two_worker_processes_share_the_port_the_limits_and_the_drain(tmp_path):
    """--workers 2: one port (SO_REUSEPORT), a consumer's concurrency limit counted once across both
    processes, SIGTERM drains both and the parent exits 0 with one metric line per request."""
    config = tmp_path / "fleet.json"
    config.write_text(json.dumps(fleet_config(voice_limits={"max_concurrency": 1,
                                                            "requests_per_minute": 6000}).model_dump(mode="json")))
    port = free_port()

    async def body():
        upstream = await FakeModelServer(token_delay_s=0.05).start()
        upstream.gate = asyncio.Event()
        proc, ec2 = await gateway_process(config, port, upstream.port, [(VOICE_VPCE, "444455556666")],
                                          "--workers", "2")
        early = b""
        try:
            for _ in range(200):  # bounded: both workers say they listen (at most 200 log lines)
                line = await asyncio.wait_for(proc.stderr.readline(), 30)
                early += line
                if early.count(b'"event": "gateway_started"') == 2 or not line:
                    break
            assert early.count(b'"event": "gateway_started"') == 2 and ec2.calls == 2
            # Each worker grew its descriptor table before its first thread (runtime/descriptors.py).
            workers = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
            assert len(workers) == 2
            assert all(descriptor_slots(w) >= descriptor_room() for w in workers)

            held = await Client(port, VOICE_VPCE).connect()
            await held.send("POST", "/v1/completions", stream(4))
            status, headers = await held.read_head()
            assert status == 200
            # New connections spread over both workers; every one must see the one slot taken.
            refused = [await one_request(port, "POST", "/v1/completions", stream(2), vpce_id=VOICE_VPCE)
                       for _ in range(8)]
            assert [r.status for r in refused] == [429] * 8

            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.2)
            upstream.gate.set()
            rest = await held.read_body(headers)
            assert rest.count(b'"text"') == 4
            await held.close()
            rc = await asyncio.wait_for(proc.wait(), 30)
            err = (early + await proc.stderr.read()).decode()
            assert rc == 0, err[-3000:]
            assert err.count('"event": "gateway_started"') == 2 and err.count('"event": "drain_finished"') == 2
            records = [json.loads(line) for line in (await proc.stdout.read()).decode().splitlines()]
            assert sum(1 for r in records if r.get("Throttled") == 1) == 8
            (served,) = [r for r in records if r.get("Requests") == 1 and r.get("Throttled") == 0]
            assert served["OutputTokens"] == 4
        finally:
            upstream.gate.set()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await upstream.stop()
    run(body(), timeout=90)
