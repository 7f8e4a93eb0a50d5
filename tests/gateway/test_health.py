"""/health: the gateway's answer mirrors the model server's, over one kept-alive upstream connection.

NLB health checks arrive from every load balancer node all day; a new upstream connection per
check left thousands of loopback sockets in TIME_WAIT. The counting server answers like
uvicorn (keep-alive unless asked to close).
"""

from __future__ import annotations

import asyncio

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
