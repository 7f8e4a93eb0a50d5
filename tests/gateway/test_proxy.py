"""What the model server receives: hop-by-hop headers, Host and the consumer's API key replaced."""

from __future__ import annotations

from runtime.gateway.http import parse_head
from runtime.gateway.proxy import upstream_head

from .conftest import MODEL_ID, VOICE_VPCE, run, start_harness, stop_harness
from .fakes import Client


def test_the_upstream_head_drops_hop_by_hop_headers_and_the_api_key_and_sets_host_and_length():
    request = parse_head(b"POST /v1/completions HTTP/1.1\r\nHost: fleet.example\r\nAuthorization: Bearer sk-1\r\n"
                         b"Connection: keep-alive\r\nTransfer-Encoding: chunked\r\nX-Request-Id: r1\r\n\r\n")
    head = upstream_head(request, "127.0.0.1:8001", b'{"a":1}').decode()
    lines = head.split("\r\n")
    assert lines[0] == "POST /v1/completions HTTP/1.1" and lines[1] == "Host: 127.0.0.1:8001"
    assert "X-Request-Id: r1" in lines and "Content-Length: 7" in lines
    assert not any(line.lower().startswith(("authorization", "connection", "transfer-encoding", "host: fleet"))
                   for line in lines)
    assert head.endswith("\r\n\r\n")


def test_a_bodyless_get_carries_no_content_length():
    head = upstream_head(parse_head(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"), "127.0.0.1:8001", b"")
    assert b"Content-Length" not in head


def test_both_hops_send_each_write_at_once_nagle_off():
    """Every SSE event is its own small write: with Nagle's algorithm on, a write waits for the ACK of the one
    before, and the receiver may hold that ACK back (delayed ACK: up to 40 ms on Linux, tcp(7)). The event
    loop turns TCP_NODELAY on for each TCP transport (CPython Lib/asyncio/selector_events.py,
    _SelectorSocketTransport.__init__ calls base_events._set_nodelay; uvloop uvloop/handles/tcp.pyx,
    TCPTransport.new calls _set_nodelay): checked here on the gateway's own sockets, both sides."""
    import socket

    async def body():
        h = await start_harness()
        try:
            c = await Client(h.port, VOICE_VPCE).connect()
            assert (await c.request("POST", "/v1/completions", {"model": MODEL_ID, "prompt": "a",
                                                                 "max_tokens": 2, "stream": True})).status == 200
            client_side = [w.get_extra_info("socket") for w in h.gateway._connections]
            model_side = [conn.writer.get_extra_info("socket") for conn in h.gateway.router.default._idle]
            assert client_side and model_side
            for sock in client_side + model_side:
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            await c.close()
        finally:
            await stop_harness(h)
    run(body())
