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
