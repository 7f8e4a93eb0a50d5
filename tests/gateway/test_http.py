"""The HTTP/1.1 pieces the gateway relies on: chunked decoding at any split, bad requests answered."""

from __future__ import annotations

import gc

import pytest

from runtime.gateway.http import ChunkedDecoder, ChunkedError, HttpError, chunk, parse_head

from .conftest import VOICE_VPCE, run, start_harness, stop_harness
from .fakes import Client

BODY = [b"data: one\n\n", b"x" * 300, b"data: [DONE]\n\n"]
WIRE = b"".join(chunk(p) for p in BODY) + b"0\r\n\r\n"


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, len(WIRE)])
def test_chunked_decoder_returns_the_payload_however_the_bytes_are_split(step):
    decoder = ChunkedDecoder()
    out = b"".join(decoder.feed(WIRE[i:i + step]) for i in range(0, len(WIRE), step))
    assert out == b"".join(BODY) and decoder.done


def test_chunked_decoder_accepts_extensions_and_trailers():
    decoder = ChunkedDecoder()
    assert decoder.feed(b"3;name=v\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n") == b"abc" and decoder.done


@pytest.mark.parametrize("wire", [b"zz\r\nabc\r\n", b"3\r\nabcXY", b"-1\r\n", b"1" * 2000])
def test_chunked_decoder_rejects_malformed_framing(wire):
    with pytest.raises(ChunkedError):
        ChunkedDecoder().feed(wire)


def test_request_head_parsing():
    req = parse_head(b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nX-A: 1\r\nx-a: 2\r\n\r\n")
    assert req.path == "/v1/completions" and req.lower["x-a"] == "1, 2" and req.keep_alive
    assert req.headers == ("Host", "a", "X-A", "1", "x-a", "2")  # as sent, for the upstream head
    gc.collect()
    # Strings only: the first collection stops tracking it (Modules/gcmodule.c untrack_tuples), and the young
    # collections of a flood no longer walk it for each waiting request (runtime/heap.py).
    assert not gc.is_tracked(req.headers)
    assert not parse_head(b"GET / HTTP/1.0\r\n\r\n").keep_alive
    for bad in (b"GET /\r\n\r\n", b"GET / HTTP/2\r\n\r\n", b"GET / HTTP/1.1\r\nno colon\r\n\r\n"):
        with pytest.raises(HttpError):
            parse_head(bad)


def test_unreadable_requests_get_a_400_and_the_gateway_carries_on():
    async def body():
        h = await start_harness()
        try:
            c = await Client(h.port, VOICE_VPCE).connect()
            c.writer.write(b"POST /v1/completions HTTP/1.1\r\nContent-Length: ten\r\n\r\n")
            status, _ = await c.read_head()
            assert status == 400
            await c.close()
            c = await Client(h.port, VOICE_VPCE).connect()
            c.writer.write(b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nnothex\r\n")
            status, _ = await c.read_head()
            assert status == 400
            await c.close()
            c = await Client(h.port, VOICE_VPCE).connect()
            reply = await c.request("POST", "/v1/completions", {"model": "gpt2-xl", "prompt": "a b", "max_tokens": 2})
            assert reply.status == 200
            await c.close()
        finally:
            await stop_harness(h)
    run(body())


def test_chunked_decoding_gives_the_same_payload_however_the_reads_split_the_stream():
    """Whole chunks take a fast path, split ones the general one: the payload must not depend on which."""
    import random

    rng = random.Random(7)
    for _ in range(2000):
        payloads = [bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))) for _ in range(rng.randint(0, 6))]
        wire = b"".join(chunk(p) for p in payloads) + b"0\r\n\r\n"
        cuts = sorted(rng.sample(range(len(wire) + 1), min(len(wire) + 1, rng.randint(0, 5))))
        decoder, out, at = ChunkedDecoder(), b"", 0
        for cut in [*cuts, len(wire)]:
            out += decoder.feed(wire[at:cut])
            at = cut
        assert out == b"".join(payloads) and decoder.done, (payloads, cuts)


@pytest.mark.parametrize("wire", [b"-5\r\nhello\r\n", b"5\r\nhelloXY", b"zz\r\n", b"5" * 2000])
def test_a_malformed_chunk_is_refused_even_after_whole_chunks(wire):
    with pytest.raises(ChunkedError):
        ChunkedDecoder().feed(chunk(b"data: ok\n\n") + wire)
