"""The bench's test server (fleetcast/bench/testserver.py) as the client tests rely on it."""

from __future__ import annotations

import asyncio
import json

from fleetcast.bench import testserver


class _Sink:
    """A stream transport that keeps what is written."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def get_extra_info(self, name, default=None):
        return default

    def write(self, data: bytes) -> None:
        self.written.append(data)


def test_a_streamed_request_whose_client_left_before_the_response_began_ends_quietly():
    """The connection is lost between the request's arrival and its handler's first write: the handler
    returns as it does when the client leaves mid-stream, instead of failing on the missing transport."""
    async def scenario() -> tuple[list[bytes], int]:
        state = testserver.TestServerState(testserver.Timings(ttft_ms=0.0, itl_ms=0.0))
        conn = testserver._Http(state)
        sink = _Sink()
        conn.connection_made(sink)
        body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 2, "stream": True}).encode()
        conn.data_received(b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        conn.connection_lost(None)
        [handler] = asyncio.all_tasks() - {asyncio.current_task()}
        await handler  # re-raises whatever the handler raised
        return sink.written, state.active

    written, active = asyncio.run(scenario())
    assert written == [] and active == 0
