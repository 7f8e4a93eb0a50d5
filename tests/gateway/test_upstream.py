"""Upstream connections: pooled and reused, one resend only when a pooled one had gone stale, a hung stream aborted."""

from __future__ import annotations

import asyncio
import time

import pytest

from runtime.gateway.upstream import StreamWatchdog, UpstreamError, UpstreamPool

from .conftest import run
from .fakes import CountingHealthServer

GET = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


async def _read_body(conn, headers):
    length = int(dict((k.lower(), v) for k, v in headers)["content-length"])
    return await conn.reader.readexactly(length)


def test_a_released_connection_is_reused_by_the_next_request():
    async def body():
        server = await CountingHealthServer().start()
        pool = UpstreamPool(("127.0.0.1", server.port))
        try:
            for _ in range(3):
                conn, status, headers = await pool.send(GET, b"")
                assert status == 200
                await _read_body(conn, headers)
                pool.release(conn, reusable=True)
            assert server.connections == 1 and server.checks == 3
        finally:
            pool.close()
            await server.stop()
    run(body())


def test_a_pooled_connection_the_server_closed_is_replaced_without_an_error():
    async def body():
        server = await CountingHealthServer(close_after_answer=True, announce_close=False).start()
        pool = UpstreamPool(("127.0.0.1", server.port))
        try:
            conn, _, headers = await pool.send(GET, b"")
            await _read_body(conn, headers)
            pool.release(conn, reusable=True)  # looks reusable; the server closes it after answering
            await asyncio.sleep(0.05)
            conn, status, headers = await pool.send(GET, b"")
            assert status == 200 and server.connections == 2
            conn.writer.close()
        finally:
            pool.close()
            await server.stop()
    run(body())


def test_an_unreachable_server_is_an_upstream_error_naming_the_address():
    async def body():
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()
        with pytest.raises(UpstreamError, match=f"127.0.0.1:{port}"):
            await UpstreamPool(("127.0.0.1", port)).send(GET, b"")
    run(body())


def test_the_watchdog_aborts_a_stream_without_progress_and_leaves_a_progressing_one():
    async def body():
        server = await CountingHealthServer().start()
        pool = UpstreamPool(("127.0.0.1", server.port))
        watchdog = StreamWatchdog(idle_timeout_s=0.2)
        watchdog.start()
        try:
            stalled, _, _ = await pool.send(GET, b"")
            alive, _, _ = await pool.send(GET, b"")
            watchdog.watch(stalled)
            progress = watchdog.watch(alive)
            for _ in range(60):  # bounded: 60 x 20 ms of "progress" on one of them
                progress[0] = time.monotonic()
                await asyncio.sleep(0.02)
                if stalled.writer.is_closing():
                    break
            assert stalled.writer.is_closing() and not alive.writer.is_closing()
            watchdog.unwatch(alive)
            alive.writer.close()
        finally:
            watchdog.stop()
            pool.close()
            await server.stop()
    run(body())


async def _until(predicate, steps: int = 300) -> bool:
    """Wait for `predicate` in 10 ms steps, bounded (3 s by default; a verdict, not a timing)."""
    for _ in range(steps):
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return predicate()


def test_a_warm_pool_opens_its_connections_ahead_and_replaces_each_one_taken():
    async def body():
        server = await CountingHealthServer().start()
        pool = UpstreamPool(("127.0.0.1", server.port))
        try:
            pool.keep_warm(3)
            assert await _until(lambda: server.connections == 3 and len(pool._idle) == 3)
            conn, status, headers = await pool.send(GET, b"")  # takes a warm one: no connect on the request's path
            assert status == 200 and conn.reused
            assert await _until(lambda: server.connections == 4 and len(pool._idle) == 3)  # topped up behind it
            await _read_body(conn, headers)
            pool.release(conn, reusable=True)
            assert len(pool._idle) == 4 and server.connections == 4  # a released one is kept, not counted twice
        finally:
            pool.close()
            await server.stop()
    run(body())


def test_idle_connections_the_server_closed_are_replaced_and_a_down_server_gets_no_connect_storm():
    async def body():
        server = await CountingHealthServer().start()
        port = server.port
        pool = UpstreamPool(("127.0.0.1", port))
        try:
            pool.keep_warm(2)
            assert await _until(lambda: len(pool._idle) == 2)
            await server.stop()  # the server closes every connection (as uvicorn does after 5 s idle)...
            assert await _until(lambda: all(c.reader.at_eof() for c in pool._idle))
            pool.tidy()  # ...and is gone: the two replacements fail
            assert await _until(lambda: pool._opening == 0)
            assert pool._idle == [] and pool._retry_at > 0
            before = pool._retry_at
            for _ in range(50):
                pool.tidy()  # within the back-off: not a single new attempt
            assert pool._opening == 0 and pool._retry_at == before
            revived = await CountingHealthServer().start(port)
            pool._retry_at = 0.0  # the back-off has passed
            pool.tidy()
            assert await _until(lambda: revived.connections == 2 and len(pool._idle) == 2)
            await revived.stop()
        finally:
            pool.close()
    run(body())
