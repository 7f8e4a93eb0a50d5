"""Request bodies: read within a deadline before a slot is taken; bad ones refused with a 400 up front.

Every inference body is checked before anything reaches the model server: nesting is bounded
before parsing, integers longer than CPython's conversion limit and non-finite numbers are
refused, and the answer is an OpenAI error object. Its shape is the one OpenAI's SDKs decode
(openai/openai-python src/openai/types/shared/error_object.py, generated from the OpenAPI
spec; https://www.rubydoc.info/gems/openai/OpenAI/Models/ErrorObject): `message` (string),
`type` (string), `param` and `code` (string or null), all four present.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import tracemalloc

import pytest

from fleetcast.contract import telemetry as t
from runtime.gateway.http import (
    MAX_INT_DIGITS,
    MAX_JSON_DEPTH,
    BadBody,
    HttpError,
    body_length,
    json_depth_over,
    parse_json_body,
)

from .conftest import VOICE_VPCE, fleet_config, run, start_harness, stop_harness
from .fakes import Client

VALID = {"model": "gpt2-xl", "prompt": "a b", "max_tokens": 2}


def assert_openai_error(reply, status: int, code: str | None = None) -> dict:
    assert reply.status == status, reply.body[:200]
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)
    assert error["param"] is None or isinstance(error["param"], str)
    assert error["code"] is None or isinstance(error["code"], str)
    if code is not None:
        assert error["code"] == code, error
    return error


def raw_post(body: bytes, path: str = "/v1/completions", extra: bytes = b"") -> bytes:
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


async def read_reply(client: Client):
    from .fakes import Reply

    status, headers = await client.read_head()
    return Reply(status, headers, await client.read_body(headers))


# ---------------------------------------------------------------- item 5: the body read


def test_a_client_stalling_mid_body_holds_no_concurrency_slot():
    """max_concurrency 1: a client that promised a body and stalls must not make the next request a 429."""
    cfg = fleet_config(voice_limits={"max_concurrency": 1, "requests_per_minute": 6000})

    async def body():
        h = await start_harness(cfg)
        try:
            staller = await Client(h.port, VOICE_VPCE).connect()
            # Expect: 100-continue makes the gateway say when it has taken the head in.
            staller.writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: g\r\nExpect: 100-continue\r\n"
                                 b"Content-Length: 100\r\n\r\n")
            assert (await staller.reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
            staller.writer.write(b'{"model": "gpt2-xl", ')  # ...and the rest never comes
            await staller.writer.drain()

            ok = await Client(h.port, VOICE_VPCE).connect()
            reply = await ok.request("POST", "/v1/completions", VALID)
            assert reply.status == 200, reply.body
            assert h.gateway.limiters["voice-app"].active == 0
            await ok.close()
            await staller.close()
        finally:
            await stop_harness(h)
    run(body())


def test_a_stalled_body_gets_408_within_the_body_timeout_and_the_connection_closes():
    async def body():
        h = await start_harness(body_timeout_s=0.3)
        try:
            c = await Client(h.port, VOICE_VPCE).connect()
            c.writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: g\r\nContent-Length: 100\r\n\r\n{\"model\"")
            reply = await asyncio.wait_for(read_reply(c), 10)
            error = assert_openai_error(reply, 408)
            assert "0.3 s" in error["message"] and reply.headers["connection"] == "close"
            assert await asyncio.wait_for(c.reader.read(), 10) == b""  # closed
            assert h.upstream.arrivals == 0
            (record,) = h.records_with(t.REQUESTS)
            assert record["status"] == 408 and record[t.ERRORS] == 0
        finally:
            await stop_harness(h)
    run(body())


def test_a_drain_does_not_wait_for_a_client_stalling_mid_body():
    async def body():
        h = await start_harness(drain_timeout_s=20)
        try:
            staller = await Client(h.port, VOICE_VPCE).connect()
            staller.writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: g\r\nExpect: 100-continue\r\n"
                                 b"Content-Length: 100\r\n\r\n")
            assert (await staller.reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
            # Nothing in flight: the drain ends at once instead of after its 20 s timeout.
            assert await asyncio.wait_for(h.gateway.drain(), 10) is True
            await staller.close()
        finally:
            await stop_harness(h)
    run(body())


def test_body_timeout_is_a_gateway_flag_with_a_default():
    from runtime.gateway.__main__ import build_parser
    from runtime.gateway.http import BODY_TIMEOUT_S

    base = ["--listen", "127.0.0.1:1", "--upstream", "127.0.0.1:2", "--region", "r", "--pool", "p"]
    assert build_parser().parse_args(base).body_timeout_s == BODY_TIMEOUT_S
    assert build_parser().parse_args(base + ["--body-timeout-s", "7.5"]).body_timeout_s == 7.5
    with pytest.raises(SystemExit):
        build_parser().parse_args(base + ["--body-timeout-s", "0"])


# ---------------------------------------------------------------- item 6: bad bodies


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


BAD_BODIES = {
    "nested 100k deep": (b'{"model": "gpt2-xl", "prompt": ' + nested(100_000) + b"}", "json_too_deep"),
    "nested 600 deep": (b'{"model": "gpt2-xl", "prompt": "a", "x": ' + nested(600) + b"}", "json_too_deep"),
    "5000-digit integer": (b'{"model": "gpt2-xl", "prompt": "a", "max_tokens": ' + b"9" * 5000 + b"}",
                           "integer_too_long"),
    "5000-digit integer, streaming": (b'{"model": "gpt2-xl", "prompt": "a", "stream": true, "seed": -'
                                      + b"1" * 5000 + b"}", "integer_too_long"),
    "NaN": (b'{"model": "gpt2-xl", "prompt": "a", "temperature": NaN}', "invalid_json"),
    "overflowing float": (b'{"model": "gpt2-xl", "prompt": "a", "temperature": 1e999}', "number_out_of_range"),
    "not JSON": (b'{"model": "gpt2-xl", "prompt": ', "invalid_json"),
    "not UTF-8": (b'{"model": "gpt2-xl", "prompt": "\xff\xfe"}', "invalid_json"),
    "not an object": (b'["gpt2-xl"]', "invalid_body"),
    "empty": (b"", "invalid_body"),
}


@pytest.mark.parametrize("name", list(BAD_BODIES))
def test_bad_inference_bodies_get_an_openai_400_before_the_model_server_sees_them(name):
    raw, code = BAD_BODIES[name]

    async def body():
        h = await start_harness()
        try:
            c = await Client(h.port, VOICE_VPCE).connect()
            c.writer.write(raw_post(raw, "/v1/chat/completions" if "streaming" in name else "/v1/completions"))
            reply = await asyncio.wait_for(read_reply(c), 20)
            error = assert_openai_error(reply, 400, code)
            assert error["type"] == "invalid_request_error"
            assert h.upstream.arrivals == 0
            # The body was read whole, so the connection stays in step and serves the next request.
            assert (await c.request("POST", "/v1/completions", VALID)).status == 200
            records = h.records_with(t.REQUESTS)
            assert [r["status"] for r in records] == [400, 200] and records[0][t.ERRORS] == 0
            await c.close()
        finally:
            await stop_harness(h)
    run(body(), timeout=60)


@pytest.mark.parametrize("value,status", [(b"\xb2", 400), ("²".encode(), 400), (b"1_0", 400), (b"+10", 400),
                                          (b"9" * 5000, 413), (b"0" * 30 + b"2", None)])
def test_content_length_must_be_ascii_digits_and_is_answered_not_dropped(value, status):
    async def body():
        h = await start_harness()
        try:
            c = await Client(h.port, VOICE_VPCE).connect()
            c.writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: g\r\nContent-Length: " + value + b"\r\n\r\n{}")
            reply = await asyncio.wait_for(read_reply(c), 10)
            if status is None:  # understood: the body `{}` was read, and it names no model
                assert assert_openai_error(reply, 400)["message"] == "you must provide a model parameter"
            else:
                assert_openai_error(reply, status)
        finally:
            await stop_harness(h)
    run(body())


def test_body_length_parsing():
    assert body_length({"content-length": "0012"}) == 12
    for bad in ("²", "١٢", " 1", "1 ", "-1", "0x10", ""):
        with pytest.raises(HttpError) as err:
            body_length({"content-length": bad})
        assert err.value.status == 400
    with pytest.raises(HttpError) as err:
        body_length({"content-length": "9" * 5000})
    assert err.value.status == 413


def test_the_integer_limit_is_cpythons_default_conversion_limit():
    """https://docs.python.org/3/library/stdtypes.html#int-max-str-digits: int('1' * 4301) raises
    ValueError by default; the model server's Python parser would refuse what the gateway let through."""
    assert MAX_INT_DIGITS == sys.int_info.default_max_str_digits == 4300
    assert parse_json_body(b'{"n": ' + b"7" * MAX_INT_DIGITS + b"}")["n"] % 10 == 7
    with pytest.raises(BadBody):
        parse_json_body(b'{"n": ' + b"7" * (MAX_INT_DIGITS + 1) + b"}")
    # Digits in a string are text, not an integer.
    assert len(parse_json_body(b'{"prompt": "' + b"7" * 10_000 + b'"}')["prompt"]) == 10_000


def _depth(obj) -> int:
    if isinstance(obj, dict):
        return 1 + max((_depth(v) for v in obj.values()), default=0)
    if isinstance(obj, list):
        return 1 + max((_depth(v) for v in obj), default=0)
    return 0


def _random_json(rng: random.Random, depth: int):
    if depth == 0 or rng.random() < 0.15:
        return rng.choice(["[{\"]}", "x\\", 1, None, "}}]]", 2.5, "plain"])
    if rng.random() < 0.5:
        return [_random_json(rng, depth - 1) for _ in range(rng.randint(0, 4))]
    return {f"k{i}[": _random_json(rng, depth - 1) for i in range(rng.randint(0, 4))}


def test_nesting_check_agrees_with_the_real_depth_whatever_the_strings_hold():
    rng = random.Random(1414)
    for _ in range(300):
        obj = _random_json(rng, rng.randint(1, 12))
        raw = json.dumps(obj).encode()
        depth = _depth(obj)
        for limit in (1, 3, 4, 5, 8, 12):
            assert json_depth_over(raw, limit) == (depth > limit), (raw[:200], depth, limit)
    deep = {"a": [[{"b": [[[]]]}]]}
    assert _depth(deep) == 7 and json_depth_over(json.dumps(deep).encode(), 6)
    assert not json_depth_over(nested(MAX_JSON_DEPTH)) and json_depth_over(nested(MAX_JSON_DEPTH + 1))


def test_nesting_check_runs_without_recursion_in_memory_linear_in_the_body():
    # 500 KB, 250,000 levels: 250 times what json.loads recurses through before RecursionError. The peak is the
    # same 2.0 bytes per body byte at 4 MB (measured), at a tenth of the CPU under tracemalloc (1.2 s, not 10.5 s).
    hostile = b'{"a": ' + nested(250_000) + b"}"
    tracemalloc.start()
    try:
        with pytest.raises(BadBody):
            parse_json_body(hostile)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * len(hostile)


def test_number_hooks_prescan_finds_exactly_what_the_regular_expressions_find():
    """The one-translate scan that decides whether the number hooks run must find a long integer and a
    three-digit exponent wherever the plain regular expressions do, and nowhere else."""
    import re

    from runtime.gateway.http import _BIG_EXPONENTS, _LONG_INT, _NUMBER_SHAPE

    long_int = re.compile(rb"[0-9]{%d}" % (MAX_INT_DIGITS + 1))
    big_exponent = re.compile(rb"[0-9][eE][+-]?[0-9]{3}")
    rng = random.Random(2222)
    alphabet = b"0123456789eE+-. x\"\\\xc3\xa9\xd9\xa1"
    for _ in range(3000):
        raw = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        shape = raw.translate(_NUMBER_SHAPE)
        assert (_BIG_EXPONENTS[0] in shape or _BIG_EXPONENTS[1] in shape) == bool(big_exponent.search(raw)), raw
    for n in (MAX_INT_DIGITS, MAX_INT_DIGITS + 1):
        for raw in (b"7" * n, b"x" + b"7" * n + b"e", b"7" * (n // 2) + b"\xd9\xa1" + b"7" * (n // 2)):
            assert (_LONG_INT in raw.translate(_NUMBER_SHAPE)) == bool(long_int.search(raw)), (n, raw[:8])


def test_a_long_prompt_is_checked_without_running_the_number_hooks():
    """The common body (text, a few small numbers) parses at the C parser's speed: no hook is called."""
    import runtime.gateway.http as http

    calls = []
    real_int, real_float = http._bounded_int, http._finite_float
    http._bounded_int = lambda text: calls.append(text) or real_int(text)  # type: ignore[assignment]
    http._finite_float = lambda text: calls.append(text) or real_float(text)  # type: ignore[assignment]
    try:
        prompt = "the year 1999 had 365 days and e-mail; " * 800
        data = parse_json_body(json.dumps({"model": "m", "prompt": prompt, "max_tokens": 16,
                                           "temperature": 0.7e-2}).encode())
        assert data["prompt"] == prompt and calls == []
        assert parse_json_body(b'{"t": 1.5E+300}')["t"] == 1.5e300 and calls == ["1.5E+300"]
    finally:
        http._bounded_int, http._finite_float = real_int, real_float
