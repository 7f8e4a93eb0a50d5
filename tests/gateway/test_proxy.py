"""What the model server receives: hop-by-hop headers, Host and the consumer's API key replaced."""

from __future__ import annotations

from runtime.gateway.http import parse_head
from runtime.gateway.proxy import upstream_head


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
