"""Relaying a response body from the model server's transport callbacks (proxy.py `_Body`, `_Arrivals`):
every byte in order, the client's pace respected, the ending right however the server ends."""

from __future__ import annotations

import asyncio
import json

import pytest

import runtime.gateway.proxy as proxy
from fleetcast.contract import telemetry as t

from .conftest import VOICE_VPCE, run, start_harness, stop_harness
from .fakes import Client, parse_sse

EVENT_TEXT = "x" * 16_000  # 16 KB events: a few hundred fill every buffer between the server and the client


class FloodServer:
    """A raw upstream that writes `events` large SSE events as fast as the socket takes them, then ends the
    body (`finish`), or drops the connection without the last chunk (`finish=False`: a crashed server)."""

    def __init__(self, events: int, finish: bool = True, hold: bool = False):
        self.events, self.finish, self.hold = events, finish, hold
        self.release = asyncio.Event()  # with `hold`: the body stays open (a long generation) until set
        self.port = 0
        self.gate = None
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> FloodServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(self.events):
            event = b"data: " + json.dumps({"choices": [{"index": 0, "text": f"{i}:{EVENT_TEXT}"}]}).encode() + b"\n\n"
            writer.write(b"%x\r\n%b\r\n" % (len(event), event))
            await writer.drain()  # as fast as the gateway reads
        if self.hold:
            try:
                await asyncio.wait_for(self.release.wait(), 20)
            except TimeoutError:
                pass
        if self.finish:
            done = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(done), done))
            await writer.drain()
        writer.transport.abort() if not self.finish else writer.close()

    async def stop(self) -> None:
        if self._server:
            self._server.close()


def held_back(monkeypatch) -> list[bool]:
    """A list that gets an entry each time the gateway stops reading the server for a client that lags."""
    paused: list[bool] = []

    class Spy(proxy._Arrivals):
        def __call__(self, data):
            super().__call__(data)
            if self.wake.done() and not self.wake.cancelled() and self.wake.exception() is None \
                    and self.wake.result() == proxy._FULL:
                paused.append(True)

    monkeypatch.setattr(proxy, "_Arrivals", Spy)
    return paused


async def held_back_stream(h, paused: list[bool]) -> Client:
    """A client whose streamed request the gateway is holding the server back for (its buffers are full)."""
    client = await Client(h.port, VOICE_VPCE).connect()
    await client.send("POST", "/v1/completions", {"model": "gpt2-xl", "prompt": "a", "stream": True})
    for _ in range(500):  # bounded: until the gateway holds the server back
        if paused:
            break
        await asyncio.sleep(0.01)
    assert paused
    return client


@pytest.mark.parametrize("finish", [True, False])
def test_a_client_slower_than_the_server_gets_every_byte_in_order_and_the_right_ending(monkeypatch, finish):
    """The client reads nothing until the gateway has paused reading the server (its buffer for the client
    is full), then reads all: every event arrives once, in order, and the body ends as the server ended it —
    [DONE] and the last chunk, or the stream-cut error event when the server dropped the connection."""
    paused = held_back(monkeypatch)
    events = 600  # ~10 MB

    async def body():
        h = await start_harness(upstream=await FloodServer(events, finish).start())
        try:
            client = await Client(h.port, VOICE_VPCE).connect()
            await client.send("POST", "/v1/completions", {"model": "gpt2-xl", "prompt": "a", "stream": True,
                                                          "stream_options": {"include_usage": True}})
            for _ in range(500):  # bounded: until the gateway stops reading the server for this client
                if paused:
                    break
                await asyncio.sleep(0.01)
            assert paused, "the gateway never held the server back for a client that did not read"
            status, headers = await client.read_head()
            assert status == 200
            got = parse_sse(await asyncio.wait_for(client.read_body(headers), 30))
            texts = [e["choices"][0]["text"] for e in got if isinstance(e, dict) and "choices" in e]
            assert [int(text.split(":")[0]) for text in texts] == list(range(events))
            assert all(text.endswith(EVENT_TEXT) for text in texts)
            if finish:
                assert got[-1] == "[DONE]"
            else:
                assert got[-1]["error"]["code"] == "upstream_stream_cut"
                await asyncio.sleep(0.05)
                assert h.metric_sum(t.STREAMS_CUT) == 1
            await client.close()
        finally:
            await stop_harness(h)
    run(body(), timeout=90)


def test_events_after_the_buffer_is_emptied_are_relayed_from_the_transport_callback(monkeypatch):
    """The first read takes what came with the response head; the rest goes through the sink, not the buffer."""
    sunk = []

    class Spy(proxy._Arrivals):
        def __call__(self, data):
            sunk.append(data)
            super().__call__(data)

    monkeypatch.setattr(proxy, "_Arrivals", Spy)

    async def body():
        h = await start_harness(token_delay_s=0.01)
        try:
            client = await Client(h.port, VOICE_VPCE).connect()
            reply = await client.request("POST", "/v1/completions", {"model": "gpt2-xl", "prompt": "a b",
                                                                     "max_tokens": 6, "stream": True})
            assert reply.status == 200 and reply.events[-1] == "[DONE]"
            assert [e["choices"][0]["text"] for e in reply.events[:-1] if e["choices"]] == \
                [f" t{i}" for i in range(6)]
            assert len([d for d in sunk if d]) >= 3  # tokens 10 ms apart: most of them arrive one by one
            await client.close()
        finally:
            await stop_harness(h)
    run(body())


def test_a_drain_that_cuts_a_stream_held_back_for_a_slow_client_still_ends_it_with_the_drain_event(monkeypatch):
    """The server is cut (the drain's deadline) while the gateway waits for a slow client to take what is
    buffered for it: once the client reads, it gets every whole event relayed so far, then the draining
    error event and the end of the body, and the relay finishes instead of waiting for the server forever.
    An event the cut left half-sent is dropped, as an SSE client would drop it at the end of the stream
    (WHATWG HTML 9.2.6: "any pending data must be discarded"), so it cannot run into the error event."""
    paused = held_back(monkeypatch)

    async def body():
        server = await FloodServer(600, hold=True).start()
        h = await start_harness(upstream=server)
        try:
            client = await held_back_stream(h, paused)
            closing = asyncio.ensure_future(h.gateway.close())  # the drain's deadline: relayed streams are cut
            for _ in range(200):  # bounded: until the cut has reached the held-back relay
                if h.gateway.drain_state.cutting:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            status, headers = await client.read_head()
            got = parse_sse(await asyncio.wait_for(client.read_body(headers), 30))
            assert status == 200 and got[-1]["error"]["code"] == "draining"
            texts = [e["choices"][0]["text"] for e in got[:-1]]
            assert [int(text.split(":")[0]) for text in texts] == list(range(len(texts))) and texts
            await asyncio.wait_for(closing, 10)
            server.release.set()
            await client.close()
        finally:
            server.release.set()
            await stop_harness(h)
    run(body(), timeout=90)


def test_closing_after_a_drain_does_not_wait_for_a_client_that_never_reads(monkeypatch):
    """A client that stopped reading mid-stream (its buffers full) must not keep a drained gateway from
    exiting: what is still buffered for it can never be delivered, so after the cut's grace the gateway
    drops the connection with it instead of waiting on the flush forever. asyncio's close() ends a
    connection only once its write buffer is flushed (CPython Lib/asyncio/selector_events.py,
    `_SelectorTransport.close`: connection_lost is called at once only `if not self._buffer`), and from
    Python 3.12.1 Server.wait_closed() waits for every connection (Lib/asyncio/base_events.py)."""
    paused = held_back(monkeypatch)

    async def body():
        server = await FloodServer(600, hold=True).start()
        h = await start_harness(upstream=server)
        try:
            client = await held_back_stream(h, paused)
            (stuck,) = h.gateway._connections  # the gateway's side of the client's connection
            assert stuck.transport.get_write_buffer_size() > 0  # events the client has not taken
            # Its ending cannot be written and its flush never ends, so close() waits out both graces: shortened
            # from the product's 2 s each, what is asserted (the exit comes, the buffer is dropped) is the same.
            h.gateway.cut_endings_wait_s = 0.2
            await asyncio.wait_for(h.gateway.close(), 30)  # the client has not read a byte
            assert stuck.transport.get_write_buffer_size() == 0  # dropped with the connection, not left flushing
            for _ in range(10_000):  # bounded: the client can still read what reached its side, then the end
                try:
                    if not await client.reader.read(1 << 20):
                        break
                except ConnectionError:
                    break
            server.release.set()
        finally:
            server.release.set()
            await stop_harness(h)
    run(body(), timeout=90)
