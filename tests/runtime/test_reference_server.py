"""runtime.reference.server as a real process on loopback: the trtllm-serve surface and drain."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.request

import aiohttp
import pytest

from runtime.reference.build import build_artifact, load_weights
from runtime.reference.client import stream_completion
from runtime.reference.configs import shape_for
from runtime.reference.tokenizer import VOCAB_SIZE, ByteTokenizer
from tests.optional import needs_torch

from .reference_helpers import ONE_FORK_SERVER, ServerProcess, http_status

pytestmark = [needs_torch, ONE_FORK_SERVER]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "artifact"
    build_artifact(out, size="tiny", seed=5)
    return out


@pytest.fixture(scope="module")
def server(artifact, tmp_path_factory):
    srv = ServerProcess(artifact, "--max-batch-size", "4", "--served-model-name", "gpt2-test",
                        log_path=tmp_path_factory.mktemp("log") / "server.log")
    try:
        srv.wait_healthy()
        yield srv
    finally:
        srv.stop()


def post(base: str, path: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get_json(base: str, path: str):
    with urllib.request.urlopen(base + path, timeout=10) as resp:
        return json.loads(resp.read())


def streams(base: str, requests: list[tuple], **kw):
    async def go():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            return await asyncio.gather(*[stream_completion(session, base, p, n, **kw) for p, n in requests])
    return asyncio.run(go())


def test_info_endpoints(server):
    assert http_status(server.base + "/health") == 200
    assert get_json(server.base, "/v1/models")["data"][0]["id"] == "gpt2-test"
    assert get_json(server.base, "/version")["backend"] == "reference"


def test_greedy_completion_is_the_models_greedy_continuation(server, artifact):
    from runtime.reference.model import naive_logits  # PyTorch: imported where the test runs, not at collection

    status, body = post(server.base, "/v1/completions", {"prompt": "Hello", "max_tokens": 6, "temperature": 0,
                                                        "ignore_eos": True})
    assert status == 200
    ids = ByteTokenizer().encode("Hello")
    weights, shape = load_weights(artifact), shape_for("tiny")
    want = []
    for _ in range(6):
        want.append(int(naive_logits(shape, weights, ids + want)[-1, :VOCAB_SIZE].argmax()))
    assert body["choices"][0]["text"] == ByteTokenizer().decode(want)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
    assert body["model"] == "gpt2-test" and body["object"] == "text_completion"


def test_prompt_as_token_ids_gives_the_same_completion_as_text(server):
    as_text = post(server.base, "/v1/completions", {"prompt": "abc", "max_tokens": 5, "temperature": 0})[1]
    as_ids = post(server.base, "/v1/completions", {"prompt": [97, 98, 99], "max_tokens": 5, "temperature": 0})[1]
    assert as_ids["choices"][0]["text"] == as_text["choices"][0]["text"]
    assert as_ids["usage"]["prompt_tokens"] == 3


def test_stream_sends_one_chunk_per_token_then_usage_then_done(server):
    """One SSE event per token, as trtllm-serve sends them by default: TorchLlmArgs.stream_interval, "The iteration
    interval to create responses under the streaming mode. Set this to a larger value when the batch size is large,
    which helps reduce the streaming overhead.", default 1 (tensorrt_llm/llmapi/llm_args.py of NVIDIA/TensorRT-LLM,
    the 1.1/1.2 line, index id 1520735490; an earlier stored version, index id 292162234, has it with default 1
    too). A handler that fell behind writes several events at once, still one per token."""
    (r,) = streams(server.base, [("Hi there", 9)], temperature=0, ignore_eos=True)
    assert r.status == 200 and r.done and r.error is None
    assert r.chunks == 9 and r.finish_reason == "length"
    assert r.usage == {"prompt_tokens": 8, "completion_tokens": 9, "total_tokens": 17}
    assert r.ttft_s is not None and r.ttft_s <= r.e2e_s


def test_stream_without_include_usage_has_no_usage_chunk(server):
    # Greedy and EOS-blind, so exactly 3 chunks: at the default temperature of 1.0 a sampled EOS ends the
    # stream early (CI saw 2 chunks once).
    body = {"prompt": "x", "max_tokens": 3, "stream": True, "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(server.base + "/v1/completions", headers={"Content-Type": "application/json"},
                                 data=json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = [e for e in resp.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert len(chunks) == 3 and all("usage" not in c for c in chunks)


def test_min_tokens_and_ignore_eos_give_the_exact_count(server):
    (a, b) = streams(server.base, [("q", 40), ("r", 40)], temperature=1.0, seed=3, ignore_eos=True)
    assert a.usage["completion_tokens"] == 40 and b.usage["completion_tokens"] == 40
    status, body = post(server.base, "/v1/completions", {"prompt": "q", "max_tokens": 30, "min_tokens": 30,
                                                        "temperature": 1.0})
    assert status == 200 and body["usage"]["completion_tokens"] == 30


def test_concurrent_streams_beyond_the_batch_size_all_complete_with_their_counts(server):
    wanted = [5, 17, 33, 2, 64, 9, 21, 40, 12, 7]
    results = streams(server.base, [(f"request {i}", n) for i, n in enumerate(wanted)], temperature=0, ignore_eos=True)
    assert [r.usage["completion_tokens"] for r in results] == wanted
    assert [r.chunks for r in results] == wanted
    assert all(r.done and r.finish_reason == "length" for r in results)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "", "max_tokens": 3}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "x", "temperature": -1}, "temperature"),
        ({"prompt": "x", "n": 2}, "n"),
        ({"prompt": "x", "stream": "yes"}, "stream"),
        ({"prompt": "x", "max_tokens": 300}, "max_tokens"),
        ({"prompt": [1, 99999]}, "prompt"),
        ({"prompt": "x", "min_tokens": 20, "max_tokens": 5}, "min_tokens"),
    ],
)
def test_bad_requests_get_400_naming_the_field(server, body, param):
    status, err = post(server.base, "/v1/completions", body)
    assert status == 400
    assert err["object"] == "error" and err["param"] == param and err["message"].startswith(param)


def test_invalid_json_and_chat_are_400(server):
    assert post(server.base, "/v1/completions", b"{not json")[0] == 400
    status, err = post(server.base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and "chat template" in err["message"]


def test_metrics_returns_iteration_stats_once(server):
    get_json(server.base, "/metrics")  # drop what earlier tests left
    post(server.base, "/v1/completions", {"prompt": "m", "max_tokens": 4, "temperature": 0, "ignore_eos": True})
    stats = get_json(server.base, "/metrics")
    for _ in range(50):  # the last iteration's record can land just after the response is sent
        if sum(st["numCompletedRequests"] for st in stats) == 1:
            break
        time.sleep(0.02)
        stats += get_json(server.base, "/metrics")
    assert len(stats) == 3  # prefill (token 1) + decode (token 2) in one iteration, then two decode iterations
    assert stats[0]["inflightBatchingStats"]["numContextRequests"] == 1
    assert stats[-1]["numCompletedRequests"] == 1
    assert {"iter", "iterLatencyMS", "kvCacheStats", "numActiveRequests", "numQueuedRequests"} <= stats[0].keys()
    assert get_json(server.base, "/metrics") == []


def test_sigterm_drains_health_first_refuses_new_work_and_finishes_every_accepted_stream(artifact, tmp_path):
    srv = ServerProcess(artifact, "--max-batch-size", "2", "--drain-timeout", "60", log_path=tmp_path / "s.log")
    try:
        srv.wait_healthy()

        async def scenario():
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
                first = [asyncio.Event() for _ in range(6)]
                # 6 requests on 2 slots: most wait in the queue, so the drain takes many iterations.
                tasks = [asyncio.ensure_future(stream_completion(session, srv.base, "x", 250, first_chunk=ev,
                                                                 temperature=0, ignore_eos=True)) for ev in first]
                await first[0].wait()
                await asyncio.sleep(0.05)
                srv.proc.send_signal(signal.SIGTERM)
                health = None
                for _ in range(100):
                    async with session.get(srv.base + "/health") as resp:
                        health = resp.status
                    if health == 503:
                        break
                    await asyncio.sleep(0.01)
                refused = await stream_completion(session, srv.base, "late", 5)
                return health, refused, await asyncio.gather(*tasks)

        health, refused, results = asyncio.run(scenario())
        assert health == 503
        assert refused.status == 503
        assert [r.usage["completion_tokens"] for r in results] == [250] * 6
        assert all(r.done for r in results)
        assert srv.proc.wait(timeout=30) == 0
    finally:
        srv.stop()


def test_drain_is_bounded_by_the_drain_timeout(artifact, tmp_path):
    srv = ServerProcess(artifact, "--max-batch-size", "1", "--drain-timeout", "0.5", log_path=tmp_path / "s.log")
    try:
        srv.wait_healthy()

        async def scenario():
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                first = asyncio.Event()
                tasks = [asyncio.ensure_future(stream_completion(session, srv.base, "x", 250, first_chunk=first,
                                                                 ignore_eos=True)) for _ in range(40)]
                await first.wait()
                srv.proc.send_signal(signal.SIGTERM)
                t = time.monotonic()
                results = await asyncio.gather(*tasks, return_exceptions=True)
                await asyncio.to_thread(srv.proc.wait, 30)
                return time.monotonic() - t, results

        elapsed, results = asyncio.run(scenario())
        assert srv.proc.returncode == 0
        cut = [r for r in results if not isinstance(r, BaseException) and r.finish_reason == "cancelled"]
        assert cut and all(r.done and r.usage["completion_tokens"] < 250 for r in cut)
        assert elapsed < 15  # 0.5 s bound plus shutdown; 40 x 250 tokens on one slot would take far longer
        assert "still running after 0.5s" in srv.log()
    finally:
        srv.stop()


def test_missing_artifact_is_a_one_line_error(tmp_path, capsys):
    # `python -m runtime.reference.server` is `sys.exit(main())`; main runs here (ServerProcess runs the module).
    from runtime.reference import server

    assert server.main(["--artifact", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.strip().startswith("error: --artifact:") and "Traceback" not in err


def test_a_lora_request_is_served_when_its_adapter_could_load_and_refused_with_400_otherwise(artifact, tmp_path):
    """As trtllm-serve with lora_config: lora_request {lora_name, lora_int_id, lora_path}
    (tensorrt_llm/serve/openai_protocol.py CompletionRequest.lora_request) reaches the engine, and a request it
    cannot serve is a 400 BadRequestError (tensorrt_llm/serve/openai_server.py create_error_response)."""
    from fleetcast.contract.adapters import lora_config
    from runtime.devtools.harness import write_peft_adapter

    adapter = write_peft_adapter(tmp_path / "sql", rank=8, modules=("q_proj", "v_proj"))
    lora = lora_config([(8, ("attn_q", "attn_v"))])
    log = tmp_path / "requests.jsonl"
    srv = ServerProcess(artifact, "--max-batch-size", "2", "--lora-config", json.dumps(lora), "--request-log", str(log),
                        log_path=tmp_path / "server.log")
    try:
        srv.wait_healthy()
        request = {"lora_name": "sql", "lora_int_id": 1, "lora_path": str(adapter)}
        status, reply = post(srv.base, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "lora_request": request,
                                                           "ignore_eos": True})
        assert status == 200 and reply["usage"]["completion_tokens"] == 2
        assert json.loads(log.read_text().splitlines()[-1])["lora_name"] == "sql"
        missing = {**request, "lora_path": str(tmp_path / "not-staged")}
        status, err = post(srv.base, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "lora_request": missing})
        assert status == 400 and err["type"] == "BadRequestError" and err["param"] == "lora_request"
        assert "does not exist" in err["message"]
    finally:
        srv.stop()


def test_without_lora_config_any_lora_request_is_400(server, tmp_path):
    body = {"prompt": "hi", "max_tokens": 2, "lora_request": {"lora_name": "x", "lora_int_id": 1, "lora_path": "/"}}
    status, err = post(server.base, "/v1/completions", body)
    assert status == 400 and "started without lora_config" in err["message"]


def test_a_cache_salt_is_taken_as_trtllm_serve_takes_it():
    """A non-empty string or absent (tensorrt_llm/serve/openai_protocol.py, check_cache_salt_support)."""
    from runtime.reference.server import RequestError, parse_args, parse_completion_request

    _, opts = parse_completion_request({"prompt": [1, 2], "cache_salt": "tenant"}, ByteTokenizer())
    assert opts["cache_salt"] == "tenant"
    assert parse_completion_request({"prompt": [1, 2]}, ByteTokenizer())[1]["cache_salt"] is None
    for bad in ("", "  ", 5):
        with pytest.raises(RequestError) as err:
            parse_completion_request({"prompt": [1, 2], "cache_salt": bad}, ByteTokenizer())
        assert err.value.param == "cache_salt"
    with pytest.raises(SystemExit):
        parse_args(["--artifact", "x", "--prefix-cache-blocks", "0"])
    assert parse_args(["--artifact", "x", "--no-block-reuse"]).no_block_reuse


def test_the_request_log_says_how_much_of_each_prompt_came_from_the_prefix_cache(artifact, tmp_path):
    log = tmp_path / "requests.jsonl"
    srv = ServerProcess(artifact, "--request-log", str(log))
    try:
        srv.wait_healthy()
        prompt = list(range(1, 140))  # two full blocks of 64 and a rest
        for salt in ("a", "a", "b", None):
            body = {"prompt": prompt, "max_tokens": 1, **({"cache_salt": salt} if salt else {})}
            assert post(srv.base, "/v1/completions", body)[0] == 200
        assert get_json(srv.base, "/memory")["prefix_cache_bytes"] > 0
    finally:
        srv.stop()
    assert [json.loads(line)["cached_tokens"] for line in log.read_text().splitlines()] == [0, 128, 0, 0]


def test_a_streams_text_chunks_are_the_bytes_json_dumps_gives_for_each_chunk():
    """The chunk's fixed part is encoded once a second, the text and finish reason per token: the bytes must be
    those of json.dumps over the whole chunk, for any text (escapes, non-ASCII, control characters)."""
    import json

    from runtime.reference.server import TextChunks

    for include_usage in (False, True):
        chunks = TextChunks("cmpl-1f", "fleetcast-reference/tiny", include_usage)
        for text, finish in [("a", None), ("", "stop"), ('é"\\\n\x00\u2028', "length"), ("\x00text", "cancelled")]:
            got = chunks(text, finish)
            created = json.loads(got[len(b"data: "):])["created"]
            assert got == b"data: " + json.dumps(chunks.chunk(created, text, finish)).encode() + b"\n\n"
            assert json.loads(got[len(b"data: "):])["choices"][0]["text"] == text


def test_a_request_answered_in_one_body_is_woken_once_at_its_finish_not_per_token():
    import asyncio

    from runtime.reference.server import Collected

    async def run() -> tuple[list[bool], list]:
        collected = Collected()
        woken = []
        for event in [(5, None, 1.0), (6, None, 2.0), (7, "length", 3.0)]:
            collected.put_nowait(event)
            woken.append(collected.finished.done())
        await collected.finished
        return woken, collected.events

    woken, events = asyncio.run(run())
    assert woken == [False, False, True]
    assert events == [(5, None, 1.0), (6, None, 2.0), (7, "length", 3.0)]


def test_metrics_are_encoded_in_slices_that_each_give_the_event_loop_a_turn():
    """A read of /metrics carries every iteration since the last: encoded at once, 600 of them held the HTTP
    process's loop (every stream's tokens) for 27 ms on the dev VM. In slices, a ticker on the same loop runs
    between every two, and the body is exactly json.dumps of the list."""
    import asyncio
    import json

    from runtime.reference.server import METRICS_SLICE, json_in_slices

    stats = [{"iter": i, "iterLatencyMS": 1.5, "kvCacheStats": {"usedNumBlocks": i}} for i in range(600)]

    async def body() -> tuple[bytes, int]:
        turns = 0

        async def ticker() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        task = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        before = turns
        out = await json_in_slices(stats)
        task.cancel()
        return out, turns - before

    out, turns = asyncio.run(body())
    assert json.loads(out) == stats and out == json.dumps(stats).encode()
    assert turns >= len(stats) // METRICS_SLICE - 1
    assert asyncio.run(json_in_slices([])) == b"[]"


def test_a_client_that_leaves_mid_stream_cancels_its_sequence_quietly(artifact, tmp_path):
    """A stream whose client went away ends with status 499 in the request log and frees its slot, with no handler
    error: aiohttp logs a raise from a handler as 'Error handling request' with its traceback, which the H100
    fairness bench's server wrote 660 times a run (one per stream its flooding client dropped at a phase's end)."""
    import socket

    log, requests = tmp_path / "server.log", tmp_path / "requests.jsonl"
    srv = ServerProcess(artifact, "--max-batch-size", "2", "--request-log", str(requests), log_path=log)
    try:
        srv.wait_healthy()
        body = json.dumps({"prompt": "a", "max_tokens": 200, "min_tokens": 200, "ignore_eos": True,
                           "stream": True}).encode()
        for _ in range(3):  # more than the batch: the slots of the streams that left must come back
            with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                got = b""
                for _ in range(100):  # the headers may come alone; read on (bounded) to the first token's event
                    got += s.recv(65536)
                    if b"data: " in got:
                        break
                assert b"data: " in got  # the stream started; then the client leaves
        assert post(srv.base, "/v1/completions", {"prompt": "a", "max_tokens": 2})[0] == 200
        deadline = time.monotonic() + 30
        while requests.read_text().count("\n") < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        srv.stop()
    statuses = [json.loads(line)["status"] for line in requests.read_text().splitlines()]
    assert sorted(statuses) == [200, 499, 499, 499]
    assert "Error handling request" not in srv.log() and "Traceback" not in srv.log()
