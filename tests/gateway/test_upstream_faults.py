"""When the model server dies mid-stream, or a drain cuts requests it never started, clients are told.

A cut stream ends with an OpenAI-style error event (`data: {"error": {...}}`), which the OpenAI
client raises as APIError (openai-python src/openai/_streaming.py, `_raise_streaming_error`: a
data event whose JSON has "error" raises, its "message" the error's message), and it is
counted. A request still waiting for the server when the drain timeout closes the gateway
gets a 503, a retryable answer, instead of a connection reset.
"""

from __future__ import annotations

import asyncio
import json

from fleetcast.contract import telemetry as t

from .conftest import VOICE_VPCE, run, start_harness, stop_harness
from .fakes import Client, parse_sse


class DyingServer:
    """A raw upstream: answers a stream head and `events` SSE events, then drops the connection
    (a crashed server); with `answer=False` it reads the request and never replies (queued)."""

    def __init__(self, events: int = 2, answer: bool = True, then_hang: bool = False):
        self.events, self.answer, self.then_hang = events, answer, then_hang
        self.gate = None
        self.port = 0
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> DyingServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        if not self.answer:
            await asyncio.sleep(3600)
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(self.events):
            event = b"data: " + json.dumps({"id": "cmpl-1", "choices": [{"index": 0, "text": f" t{i}"}]}).encode() \
                + b"\n\n"
            writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
        await writer.drain()
        if self.then_hang:  # frozen: the connection stays open, nothing more comes
            await asyncio.sleep(3600)
        writer.transport.abort()  # died: no last chunk, no [DONE]

    async def stop(self) -> None:
        if self._server:
            self._server.close()


def stream_body():
    return {"model": "gpt2-xl", "prompt": "a b", "max_tokens": 8, "stream": True}


def test_a_stream_cut_by_the_server_ends_with_an_error_event_and_is_counted():
    async def body():
        h = await start_harness(upstream=await DyingServer(events=2).start())
        try:
            client = await Client(h.port, VOICE_VPCE).connect()
            reply = await asyncio.wait_for(client.request("POST", "/v1/completions", stream_body()), 10)
            assert reply.status == 200
            events = parse_sse(reply.body)
            assert [e["choices"][0]["text"] for e in events[:2]] == [" t0", " t1"]
            last = events[-1]
            assert isinstance(last, dict) and last["error"]["code"] == "upstream_stream_cut"
            assert last["error"]["message"] and last["error"]["type"] == "server_error"
            assert "[DONE]" not in events
            await asyncio.sleep(0.05)
            assert h.metric_sum(t.STREAMS_CUT) == 1 and h.metric_sum(t.ERRORS) == 1
            await client.close()
        finally:
            await stop_harness(h)
    run(body())


def test_a_request_the_drain_timeout_cuts_before_it_started_gets_a_503():
    async def body():
        h = await start_harness(upstream=await DyingServer(answer=False).start(), drain_timeout_s=0.3)
        try:
            client = await Client(h.port, VOICE_VPCE).connect()
            await client.send("POST", "/v1/completions", stream_body())
            await asyncio.sleep(0.2)  # forwarded, waiting for the server
            assert await h.gateway.drain() is False
            await h.gateway.close()
            status, headers = await asyncio.wait_for(client.read_head(), 10)
            assert status == 503 and headers["connection"] == "close"
            reply = json.loads(await client.read_body(headers))
            assert reply["error"]["code"] == "draining"
            await client.close()
        finally:
            await stop_harness(h)
    run(body())


def test_a_silent_upstream_is_cut_after_the_configured_idle_timeout_not_ten_minutes():
    """A frozen server keeps the stream open and sends nothing: the gateway's upstream inactivity
    timeout (FLEETCAST_UPSTREAM_IDLE_S -> --upstream-idle-s -> upstream_idle_timeout_s) ends it,
    and the client gets the error event."""
    async def body():
        h = await start_harness(upstream=await DyingServer(events=1, then_hang=True).start(),
                                upstream_idle_timeout_s=0.5)
        try:
            client = await Client(h.port, VOICE_VPCE).connect()
            reply = await asyncio.wait_for(client.request("POST", "/v1/completions", stream_body()), 20)
            events = parse_sse(reply.body)
            assert events[0]["choices"][0]["text"] == " t0"
            assert events[-1]["error"]["code"] == "upstream_stream_cut"
            await client.close()
        finally:
            await stop_harness(h)
    run(body())


def test_the_gateway_takes_its_upstream_idle_timeout_from_the_command_line():
    from runtime.gateway.__main__ import build_parser

    args = build_parser().parse_args(["--listen", "127.0.0.1:1", "--upstream", "127.0.0.1:2", "--region", "r",
                                      "--pool", "p", "--upstream-idle-s", "45"])
    assert args.upstream_idle_s == 45.0
    assert build_parser().parse_args(["--listen", "127.0.0.1:1", "--upstream", "127.0.0.1:2", "--region", "r",
                                      "--pool", "p"]).upstream_idle_s < 600


def test_an_upstream_that_takes_the_request_and_never_sends_a_head_is_cut_after_the_idle_timeout():
    """The inactivity timeout covers the wait for the response head too (a server that accepted the request and
    froze): the client gets an error it can act on, not a wait without end, and the request is not resent."""
    async def body():
        server = await DyingServer(answer=False).start()
        h = await start_harness(upstream=server, upstream_idle_timeout_s=0.5)
        try:
            client = await Client(h.port, VOICE_VPCE).connect()
            reply = await asyncio.wait_for(client.request("POST", "/v1/completions", stream_body()), 30)
            assert reply.status == 502
            assert "no response head" in json.loads(reply.body)["error"]["message"]
            await client.close()
        finally:
            await stop_harness(h)
    run(body())


def test_an_upstream_that_dies_with_the_request_before_any_head_is_a_retryable_503():
    """A process killed with the request in it (its GPU's processes restarted after an MPS fault, or a crash):
    nothing of the response went out, so the client gets a 503 with Retry-After, not a hang or a 502."""
    from runtime.gateway.upstream import RESTART_RETRY_AFTER_S

    class ClosesAtOnce(DyingServer):
        async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.transport.abort()

    async def body():
        server = await ClosesAtOnce().start()
        h = await start_harness(upstream=server)
        try:
            client = await Client(h.port, VOICE_VPCE).connect()
            reply = await asyncio.wait_for(client.request("POST", "/v1/completions", stream_body()), 30)
            assert reply.status == 503
            assert reply.headers["retry-after"] == str(RESTART_RETRY_AFTER_S)
            assert json.loads(reply.body)["error"]["code"] == "upstream_unavailable"
            await client.close()
        finally:
            await stop_harness(h)
    run(body())


def test_at_the_drain_deadline_a_stream_cut_mid_body_ends_with_the_drains_error_event():
    async def body():
        h = await start_harness(upstream=await DyingServer(events=1, then_hang=True).start(), drain_timeout_s=0.3)
        try:
            client = await Client(h.port, VOICE_VPCE).connect()
            await client.send("POST", "/v1/completions", stream_body())
            status, headers = await asyncio.wait_for(client.read_head(), 10)  # the first event is on its way
            assert status == 200
            assert await h.gateway.drain() is False
            await h.gateway.close()
            events = parse_sse(await asyncio.wait_for(client.read_body(headers), 10))
            assert events[0]["choices"][0]["text"] == " t0"
            assert events[-1]["error"]["code"] == "draining" and events[-1]["error"]["type"] == "server_error"
            assert "[DONE]" not in events
            await client.close()
        finally:
            await stop_harness(h)
    run(body())


def test_at_the_drain_deadline_a_stream_still_queued_in_the_engine_gets_a_retryable_503():
    """The server sent its stream head and no token yet (queued): the gateway holds a head back until the first
    bytes, so the client can still get a clean 503 instead of a closed connection without any answer."""
    async def body():
        h = await start_harness(upstream=await DyingServer(events=0, then_hang=True).start(), drain_timeout_s=0.3)
        try:
            client = await Client(h.port, VOICE_VPCE).connect()
            await client.send("POST", "/v1/completions", stream_body())
            await asyncio.sleep(0.2)  # forwarded; the upstream head arrived, no event
            assert await h.gateway.drain() is False
            await h.gateway.close()
            status, headers = await asyncio.wait_for(client.read_head(), 10)
            assert status == 503 and headers["connection"] == "close"
            assert json.loads(await client.read_body(headers))["error"]["code"] == "draining"
            await client.close()
        finally:
            await stop_harness(h)
    run(body())
