"""/health: the gateway's answer mirrors the model server's, over one kept-alive upstream connection.

NLB health checks arrive from every load balancer node all day; a new upstream connection per
check left thousands of loopback sockets in TIME_WAIT. The counting server answers like
uvicorn (keep-alive unless asked to close).
"""

from __future__ import annotations

import asyncio
import json

from runtime.gateway import ppv2

from .conftest import run, start_harness, stop_harness
from .fakes import Client, CountingHealthServer, FakeModelServer, one_request

CHECKS = 40


async def _harness(upstream: CountingHealthServer):
    fake = await FakeModelServer().start()  # only for the harness; the gateway talks to `upstream`
    h = await start_harness(upstream=fake, health_upstream=("127.0.0.1", upstream.port))
    return h


def test_n_health_checks_use_one_upstream_connection():
    async def body():
        upstream = await CountingHealthServer().start()
        h = await _harness(upstream)
        try:
            # A new client connection per check, as NLB health checks do.
            for _ in range(CHECKS):
                reply = await one_request(h.port, "GET", "/health", header=ppv2.LOCAL_HEADER)
                assert reply.status == 200 and reply.json() == {"status": "ok"}
            assert upstream.checks == CHECKS and upstream.connections == 1
        finally:
            await stop_harness(h)
            await upstream.stop()
    run(body())


def test_concurrent_health_checks_share_one_probe_and_connection():
    async def body():
        upstream = await CountingHealthServer().start()
        h = await _harness(upstream)
        try:
            replies = await asyncio.gather(*(one_request(h.port, "GET", "/health", header=ppv2.LOCAL_HEADER)
                                             for _ in range(CHECKS)))
            assert all(r.status == 200 for r in replies)
            assert upstream.connections == 1 and 1 <= upstream.checks <= CHECKS
        finally:
            await stop_harness(h)
            await upstream.stop()
    run(body())


def test_a_server_that_closes_idle_connections_never_fails_a_check():
    """trtllm-serve's uvicorn closes idle keep-alive connections (TIMEOUT_KEEP_ALIVE, 5 s): a check that
    finds its connection closed, announced or silently, opens another rather than answering 503."""
    async def body():
        for announce in (True, False):
            upstream = await CountingHealthServer(close_after_answer=True, announce_close=announce).start()
            h = await _harness(upstream)
            try:
                c = await Client(h.port, None, ppv2.LOCAL_HEADER).connect()
                for _ in range(10):
                    reply = await c.request("GET", "/health")
                    assert reply.status == 200, (announce, reply.body)
                assert upstream.connections == 10
                await c.close()
            finally:
                await stop_harness(h)
                await upstream.stop()
    run(body())


def test_health_turns_503_when_the_server_is_gone_and_200_when_it_is_back():
    async def body():
        upstream = await CountingHealthServer().start()
        h = await _harness(upstream)
        try:
            assert (await one_request(h.port, "GET", "/health", header=ppv2.LOCAL_HEADER)).status == 200
            await upstream.stop()  # the kept-alive connection closes with it
            down = await one_request(h.port, "GET", "/health", header=ppv2.LOCAL_HEADER)
            assert down.status == 503 and down.json()["status"] == "unhealthy"
            await upstream.start(upstream.port)
            assert (await one_request(h.port, "GET", "/health", header=ppv2.LOCAL_HEADER)).status == 200
            assert upstream.connections == 2
        finally:
            await stop_harness(h)
            await upstream.stop()
    run(body())


def test_with_several_models_health_names_the_ready_ones_and_stays_up_while_any_is(tmp_path):
    """The runtime's per-model readiness (runtime/serve.py) decides: one model's process restarting must
    not take the instance out of the NLB, which would stop the other models too."""
    from runtime.gateway.health import HealthProbe

    state = tmp_path / "models-ready.json"

    def write(**ready):
        state.write_text(json.dumps({"models": {m: {"ready": r, "copies": 1, "ready_copies": int(r), "ports": [1]}
                                                for m, r in ready.items()}}))

    async def body():
        upstream = await CountingHealthServer().start()
        probe = HealthProbe(("127.0.0.1", upstream.port), 2.0, models_state=str(state))
        try:
            # Not written yet (the first process still starting): the model server's own answer.
            assert await probe.verdict() == (200, {"status": "ok"}) and upstream.checks == 1
            write(**{"gpt2-xl": True, "qwen": False})
            assert await probe.verdict() == (200, {"status": "ok", "models": {"gpt2-xl": True, "qwen": False}})
            write(**{"gpt2-xl": False, "qwen": False})
            status, answer = await probe.verdict()
            assert status == 503 and answer["models"] == {"gpt2-xl": False, "qwen": False}
            assert upstream.checks == 1  # the file decides; no probe of one model's process stands for all
            state.write_text("{not json")  # a torn file is never read (written atomically), but never trusted
            assert (await probe.verdict())[0] == 200 and upstream.checks == 2
        finally:
            probe.close()
            await upstream.stop()
    run(body())


def test_draining_wins_over_ready_models(tmp_path):
    from runtime.gateway.health import HealthProbe

    state = tmp_path / "models-ready.json"
    state.write_text(json.dumps({"models": {"gpt2-xl": {"ready": True}}}))
    probe = HealthProbe(("127.0.0.1", 9), 2.0, draining=lambda: True, models_state=str(state))
    raw = run(probe.response(head_only=False, keep=False))
    assert raw.split(b" ", 2)[1] == b"503" and raw.endswith(b'{"status": "draining"}')
