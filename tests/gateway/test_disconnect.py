"""A client that leaves stops its generation, streaming or not.

The fake model server aborts a held non-streaming request when its connection closes, as
trtllm-serve does (OpenAIServer.await_disconnected in tensorrt_llm/serve/openai_server.py polls
Request.is_disconnected() once a second and calls promise.abort()): the gateway must close
that connection when its own client goes.
"""

from __future__ import annotations

import asyncio
import socket
import struct

from fleetcast.contract import telemetry as t

from .conftest import VOICE_VPCE, fleet_config, run, start_harness, stop_harness, until
from .fakes import Client

PLAIN = {"model": "gpt2-xl", "prompt": "a b c", "max_tokens": 8}


def _reset(client: Client) -> None:
    """Close with RST (SO_LINGER 0), as a killed client process does."""
    sock = client.writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.writer.transport.abort()


def _run_abandoned(leave, stream: bool = False) -> None:
    cfg = fleet_config(voice_limits={"max_concurrency": 1, "requests_per_minute": 6000})

    async def body():
        # The gateway looks for a departed client every disconnect_poll_s (0.5 s by default): checked more often,
        # the cut comes sooner and is the same cut.
        h = await start_harness(cfg, disconnect_poll_s=0.05)
        h.upstream.hold = asyncio.Event()  # the generation takes until released
        try:
            c = await Client(h.port, VOICE_VPCE).connect()
            await c.send("POST", "/v1/completions", {**PLAIN, "stream": stream})
            await asyncio.wait_for(h.upstream.held.wait(), 15)
            leave(c)
            await until(lambda: h.upstream.cancelled == 1)  # the server saw its connection close
            await until(lambda: h.records_with(t.REQUESTS))
            (record,) = h.records_with(t.REQUESTS)
            assert record["client_disconnected"] is True and record["upstream_cancelled"] is True
            assert record[t.ERRORS] == 0 and record[t.OUTPUT_TOKENS] == 0
            assert h.upstream.completed_output_tokens == 0
            # The slot came back: the consumer's next request is served, not refused with 429.
            assert h.gateway.limiters["voice-app"].active == 0 and h.gateway.active == 0
            h.upstream.hold.set()
            again = await Client(h.port, VOICE_VPCE).connect()
            assert (await again.request("POST", "/v1/completions", PLAIN)).status == 200
            await again.close()
        finally:
            await stop_harness(h)
    run(body())


def test_a_non_streaming_client_that_closes_stops_its_generation():
    _run_abandoned(lambda c: c.writer.close())


def test_a_non_streaming_client_that_resets_stops_its_generation():
    _run_abandoned(_reset)


def test_a_streaming_client_that_leaves_before_its_first_token_stops_its_generation():
    _run_abandoned(lambda c: c.writer.close(), stream=True)


def test_a_client_that_stays_gets_its_answer_however_long_the_generation():
    async def body():
        h = await start_harness(disconnect_poll_s=0.01)  # checked often: still never cut while it waits
        h.upstream.hold = asyncio.Event()
        try:
            c = await Client(h.port, VOICE_VPCE).connect()
            await c.send("POST", "/v1/completions", PLAIN)
            await asyncio.wait_for(h.upstream.held.wait(), 15)
            await asyncio.sleep(0.1)
            h.upstream.hold.set()
            status, headers = await c.read_head()
            reply = await c.read_body(headers)
            assert status == 200 and h.upstream.cancelled == 0
            assert b" t7" in reply
            (record,) = h.records_with(t.REQUESTS)
            assert record[t.OUTPUT_TOKENS] == 8 and "client_disconnected" not in record
            await c.close()
        finally:
            await stop_harness(h)
    run(body())


def test_a_client_that_leaves_before_the_response_head_is_not_retained():
    # Each abandoned request used to leave its client's StreamWriter (transport, socket, buffers)
    # in the gateway's set of unanswered requests for the life of the process: the slow RSS
    # growth of the soak (docs/gateway.md).
    async def body():
        h = await start_harness(disconnect_poll_s=0.01)
        h.upstream.hold = asyncio.Event()
        try:
            for left in range(1, 4):
                h.upstream.held.clear()
                c = await Client(h.port, VOICE_VPCE).connect()
                await c.send("POST", "/v1/completions", PLAIN)
                await asyncio.wait_for(h.upstream.held.wait(), 15)
                c.writer.close()
                await until(lambda: h.upstream.cancelled == left)  # noqa: B023 - called only within this iteration
                await until(lambda: not h.gateway._connections)  # its handler has returned
                assert h.gateway.drain_state.unstarted == 0
            assert h.gateway.active == 0 and h.gateway.limiters["voice-app"].active == 0
        finally:
            await stop_harness(h)
    run(body())
