"""KV-cache isolation at the gateway: every inference request reaches the engine with the salt of the account
the PROXY v2 header identified, never with one the caller chose.

TensorRT-LLM 1.2.x takes `cache_salt` on /v1/chat/completions and has no such field on /v1/completions, whose
request model forbids unknown fields (tests/runtime/trtllm_1_2_cache_salt.py cites
tensorrt_llm/serve/openai_protocol.py); the reference backend salts both.
"""

from __future__ import annotations

import pytest

from fleetcast.config import parse_config
from fleetcast.contract.isolation import SALT_FIELD, cache_salt, salt_group
from runtime.gateway.salting import Salting, pinned_groups

from .conftest import ANALYTICS_VPCE, MODEL_ID, VOICE_VPCE, fleet_config, run, start_harness, stop_harness
from .fakes import one_request

# Gateways and fake engines as forks of this worker's fork server for them (tests/conftest.py, forked_gateways).
pytestmark = pytest.mark.usefixtures("forked_gateways")

KEY = b"k" * 32
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat(**extra):
    return {"model": MODEL_ID, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2, **extra}


def completion(**extra):
    return {"model": MODEL_ID, "prompt": "hello there", "max_tokens": 2, **extra}


def grouped_config(group: str | None):
    """Both test consumers, in one cache group when `group` is given."""
    data = fleet_config().model_dump(mode="json")
    for consumer in data["consumers"]:
        consumer["cache_group"] = group
    return parse_config(data, "<test config>")


def salt_of(name: str, group: str | None = None) -> str:
    return cache_salt(KEY, salt_group(name, group))


def test_a_chat_request_carries_its_accounts_salt_over_the_callers_own():
    async def body():
        h = await start_harness(salting=Salting(KEY, "tensorrt-llm"))
        try:
            plain = await one_request(h.port, "POST", CHAT, chat(), vpce_id=VOICE_VPCE)
            forged = await one_request(h.port, "POST", CHAT, chat(cache_salt=salt_of("analytics")),
                                       vpce_id=VOICE_VPCE)
            streamed = await one_request(h.port, "POST", CHAT, chat(stream=True, cache_salt="mine",
                                                                   stream_options={"include_usage": False}),
                                         vpce_id=VOICE_VPCE)
            other = await one_request(h.port, "POST", CHAT, chat(), vpce_id=ANALYTICS_VPCE)
            assert [r.status for r in (plain, forged, streamed, other)] == [200] * 4
            salts = [b.get(SALT_FIELD) for b in h.upstream.requests]
            # The caller's value (here: another account's salt, then its own choice) never reaches the engine.
            assert salts == [salt_of("voice-app")] * 3 + [salt_of("analytics")]
            assert salt_of("voice-app") != salt_of("analytics")
        finally:
            await stop_harness(h)

    run(body())


def test_accounts_in_one_cache_group_share_a_salt_and_others_do_not():
    async def body():
        h = await start_harness(grouped_config("trusted"), salting=Salting(KEY, "tensorrt-llm"))
        try:
            for vpce in (VOICE_VPCE, ANALYTICS_VPCE):
                assert (await one_request(h.port, "POST", CHAT, chat(), vpce_id=vpce)).status == 200
            salts = {b[SALT_FIELD] for b in h.upstream.requests}
            assert salts == {cache_salt(KEY, salt_group("voice-app", "trusted"))}
            # A refresh that takes them out of the group separates them at once.
            h.gateway.set_consumers(fleet_config().consumers_of("ap-northeast-2"))
            for vpce in (VOICE_VPCE, ANALYTICS_VPCE):
                assert (await one_request(h.port, "POST", CHAT, chat(), vpce_id=vpce)).status == 200
            assert [b[SALT_FIELD] for b in h.upstream.requests[2:]] == [salt_of("voice-app"), salt_of("analytics")]
        finally:
            await stop_harness(h)

    run(body())


def test_a_completion_to_tensorrt_llm_carries_no_salt_at_all():
    """CompletionRequest has no cache_salt and forbids unknown fields: a salt there would be a 400."""
    async def body():
        h = await start_harness(salting=Salting(KEY, "tensorrt-llm"))
        try:
            for request in (completion(), completion(cache_salt=salt_of("analytics"))):
                assert (await one_request(h.port, "POST", COMPLETIONS, request, vpce_id=VOICE_VPCE)).status == 200
            assert [SALT_FIELD in b for b in h.upstream.requests] == [False, False]
            assert h.upstream.requests[1]["prompt"] == "hello there"  # the rest of the body as sent
        finally:
            await stop_harness(h)

    run(body())


def test_a_completion_to_the_reference_backend_is_salted():
    async def body():
        h = await start_harness(salting=Salting(KEY, "reference"))
        try:
            reply = await one_request(h.port, "POST", COMPLETIONS, completion(cache_salt="x"), vpce_id=ANALYTICS_VPCE)
            assert reply.status == 200 and h.upstream.requests[0][SALT_FIELD] == salt_of("analytics")
        finally:
            await stop_harness(h)

    run(body())


def test_an_unsalted_path_of_a_process_reusing_blocks_for_one_group_refuses_the_others():
    """A process started with block reuse for one group (its model's `consumers` all in it) keeps it until it
    restarts: a consumer a refresh let in is refused on /v1/completions there, and served on chat (salted)."""
    async def body():
        pinned = pinned_groups({MODEL_ID: frozenset({salt_group("voice-app", None)})}, "tensorrt-llm")
        h = await start_harness(salting=Salting(KEY, "tensorrt-llm", pinned))
        try:
            assert (await one_request(h.port, "POST", COMPLETIONS, completion(), vpce_id=VOICE_VPCE)).status == 200
            refused = await one_request(h.port, "POST", COMPLETIONS, completion(), vpce_id=ANALYTICS_VPCE)
            assert refused.status == 403 and refused.json()["error"]["code"] == "cache_isolation"
            assert (await one_request(h.port, "POST", CHAT, chat(), vpce_id=ANALYTICS_VPCE)).status == 200
            assert len(h.upstream.requests) == 2  # the refused one never reached the engine
        finally:
            await stop_harness(h)

    run(body())


def test_only_reuse_on_processes_with_an_unsalted_path_are_pinned():
    groups = {"open": None, "two": frozenset({"consumer:a", "consumer:b"}), "one": frozenset({"group:g"})}
    assert pinned_groups(groups, "tensorrt-llm") == {"one": frozenset({"group:g"})}
    assert pinned_groups(groups, "reference") == {}  # every path salted: nothing to pin


def test_every_worker_process_salts_an_account_alike(tmp_path):
    """--workers 2: the salt key is drawn once, before the workers fork; a key per worker would split an
    account's cached prefixes between them (and the engine would see two salts for one account)."""
    import asyncio
    import json
    import signal

    from runtime.devtools.harness import free_port

    from .conftest import gateway_process
    from .fakes import FakeModelServer

    config = tmp_path / "fleet.json"
    config.write_text(json.dumps(fleet_config().model_dump(mode="json")))
    port = free_port()

    async def body():
        upstream = await FakeModelServer().start()
        proc, _ = await gateway_process(config, port, upstream.port,
                                        [(VOICE_VPCE, "444455556666"), (ANALYTICS_VPCE, "777788889999")],
                                        "--workers", "2", stdout=asyncio.subprocess.DEVNULL)
        early = b""
        try:
            for _ in range(200):  # bounded: both workers say they listen
                line = await asyncio.wait_for(proc.stderr.readline(), 30)
                early += line
                if early.count(b'"event": "gateway_started"') == 2 or not line:
                    break
            assert early.count(b'"event": "gateway_started"') == 2, early.decode()[-2000:]
            # Each on a new connection: SO_REUSEPORT spreads them over both workers.
            for vpce in [VOICE_VPCE] * 8 + [ANALYTICS_VPCE] * 8:
                assert (await one_request(port, "POST", CHAT, chat(), vpce_id=vpce)).status == 200
            salts = [b[SALT_FIELD] for b in upstream.requests]
            assert len(set(salts[:8])) == 1 and len(set(salts[8:])) == 1 and salts[0] != salts[8]
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await upstream.stop()

    run(body(), timeout=90)
