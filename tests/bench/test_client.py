"""The streaming client: HTTP framing, SSE decoding after the run, timing attribution."""

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fleetcast.bench.client import (
    ConnectionPool,
    Endpoint,
    RawResponse,
    _Connection,
    build_http_request,
    parse_stream,
    send_request,
    tcp_rtt_ms,
)
from fleetcast.contract.errors import UserError

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def sse(obj, crlf=False):
    text = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode())
    return text + (b"\r\n\r\n" if crlf else b"\n\n")


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def completion_events(n, crlf=False, usage=True):
    events = [sse({"choices": [{"index": 0, "text": f" t{i}"}]}, crlf) for i in range(n)]
    if usage:
        events.append(sse({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n}}, crlf))
    events.append(sse(b"[DONE]", crlf))
    return events


def framed(events):
    return HEAD + b"".join(chunk(e) for e in events) + b"0\r\n\r\n"


def feed(reads, times=None):
    """Push reads through a real protocol instance, as the event loop would."""
    conn = _Connection()

    class T:
        def write(self, data):
            pass

        def get_extra_info(self, name):
            return None

        def close(self):
            pass

    conn.connection_made(T())
    raw = RawResponse(t_send=0.0)
    loop = asyncio.new_event_loop()
    try:
        done = loop.create_future()
        conn.start(b"", raw, done)
        raw.t_send = 0.0
        for read in reads:
            conn.data_received(read)
        complete = done.done()
    finally:
        loop.close()
    if times is not None:
        raw.times = list(times)
    return raw, complete


def test_each_content_event_gets_the_time_of_the_read_that_completed_it():
    events = completion_events(3)
    reads = [HEAD + chunk(events[0]), chunk(events[1]) + chunk(events[2]), b"".join(chunk(e) for e in events[3:]) + b"0\r\n\r\n"]
    raw, complete = feed(reads, times=[0.010, 0.020, 0.030])
    assert complete
    parsed = parse_stream(raw, "completions")
    assert parsed.error is None and parsed.status == 200
    assert parsed.content_times == [0.010, 0.020, 0.020]  # two events coalesced in one read share its time
    assert (parsed.prompt_tokens, parsed.completion_tokens) == (7, 3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # no timing verdicts
@given(st.data(), st.booleans())
def test_any_split_of_the_byte_stream_decodes_the_same(data, crlf):
    body = framed(completion_events(5, crlf=crlf))
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(body) - 1), max_size=12))))
    reads = [body[a:b] for a, b in zip([0] + cuts, cuts + [len(body)])]
    raw, complete = feed(reads, times=[float(i) for i in range(len(reads))])
    assert complete, "the response end must be detected whatever the split"
    parsed = parse_stream(raw, "completions")
    assert parsed.error is None and len(parsed.content_times) == 5 and parsed.completion_tokens == 5
    # Each event is stamped with the read holding its last byte.
    ends, acc = [], 0
    for r in reads:
        acc += len(r)
        ends.append(acc)
    pos = len(HEAD)
    for i, ev in enumerate(completion_events(5, crlf=crlf)[:5]):
        pos += len(chunk(ev))
        last_byte = pos - 2  # chunk data ends 2 bytes before the chunk's CRLF end
        expected = next(k for k, e in enumerate(ends) if e >= last_byte)
        assert parsed.content_times[i] == float(expected)


def test_chat_role_chunk_with_empty_content_is_not_the_first_token():
    events = [sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]}),
              sse({"choices": [{"delta": {"content": "Hi"}}]}), sse(b"[DONE]")]
    raw, _ = feed([HEAD + chunk(events[0]), chunk(events[1]) + chunk(events[2]) + b"0\r\n\r\n"], times=[0.001, 0.050])
    parsed = parse_stream(raw, "chat")
    assert parsed.content_times == [0.050]
    assert parsed.completion_tokens is None  # no usage: the record falls back to counting content events


@pytest.mark.parametrize("reads, error", [
    ([b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n{}"], "http_503"),
    ([HEAD + chunk(sse({"error": {"message": "boom"}})) + b"0\r\n\r\n"], "stream_error"),
    ([HEAD + chunk(sse({"choices": [{"text": "a"}]})) + b"0\r\n\r\n"], "incomplete_stream"),
    ([HEAD + chunk(sse(b"[DONE]")) + b"0\r\n\r\n"], None),
    ([HEAD + chunk(b"data: {not json\n\n") + b"0\r\n\r\n"], "bad_sse_json"),
])
def test_failures_are_typed(reads, error):
    raw, _ = feed(reads, times=[0.0] * len(reads))
    parsed = parse_stream(raw, "completions")
    assert parsed.error == error
    if error is None:
        assert parsed.content_times == []  # a clean but empty stream: the record marks it not ok


def test_content_length_response_completes():
    body = b'{"error": "x"}'
    raw, complete = feed([b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n" % len(body), body])
    assert complete and parse_stream(raw, "completions").error == "http_400"


def test_endpoint_parsing():
    ep = Endpoint.parse("https://bench.example.internal/prefix/v1/")
    assert (ep.host, ep.port, ep.tls, ep.path("/v1/completions")) == ("bench.example.internal", 443, True, "/prefix/v1/completions")
    with pytest.raises(UserError, match="--endpoint"):
        Endpoint.parse("127.0.0.1:8000")


def _request(ep, n=4, api="completions"):
    body = {"model": "gpt2-xl", "max_tokens": n, "stream": True, "stream_options": {"include_usage": True}}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": "one two three"}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = "one two three"
        path = "/v1/completions"
    return build_http_request(ep, path, json.dumps(body).encode(), {})


def test_live_stream_keeps_the_connection_alive_across_requests(fast_server):
    async def go():
        ep = Endpoint.parse(fast_server.url)
        pool = ConnectionPool(ep)
        results = []
        for api in ("completions", "chat", "completions"):
            raw = await send_request(pool, _request(ep, 4, api), 10)
            results.append((raw, parse_stream(raw, api)))
        n_connections = len(pool._all)
        pool.close()
        return results, n_connections

    results, n_connections = asyncio.run(go())
    assert n_connections == 1
    for raw, parsed in results:
        assert raw.error is None and parsed.error is None
        assert parsed.completion_tokens == 4 and len(parsed.content_times) == 4 and parsed.prompt_tokens == 3
        ttft_ms = (parsed.content_times[0] - raw.t_send) * 1000
        assert ttft_ms >= 10  # the server waits 10 ms before the first token


def test_timeout_and_refused_connections_are_errors_not_crashes(fast_server):
    async def go():
        ep = Endpoint.parse(fast_server.url)
        slow = await send_request(ConnectionPool(ep), _request(ep, 200), timeout_s=0.05)
        dead = Endpoint.parse("http://127.0.0.1:9")  # discard port: nothing listens
        refused = await send_request(ConnectionPool(dead), _request(dead), timeout_s=1)
        rtt = await tcp_rtt_ms(ep, samples=3)
        return slow, refused, rtt

    slow, refused, rtt = asyncio.run(go())
    assert slow.error == "timeout"
    assert refused.error == "connect_error"
    assert rtt is not None and 0 < rtt < 50


@pytest.mark.parametrize("lateness_s, merged", [(0.0002, False), (0.004, True)])
def test_first_token_merged_with_later_tokens_in_a_late_read_is_marked(lateness_s, merged):
    events = completion_events(3)
    reads = [HEAD, chunk(events[0]) + chunk(events[1]), b"".join(chunk(e) for e in events[2:]) + b"0\r\n\r\n"]
    raw = RawResponse(t_send=0.0, reads=reads, times=[0.001, 0.030, 0.040], lateness=[0.0, lateness_s, 0.0])
    parsed = parse_stream(raw, "completions")
    assert parsed.content_times[:2] == [0.030, 0.030]
    assert parsed.first_token_merged is merged
