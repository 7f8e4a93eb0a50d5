"""Routing by `model`: each model to its own processes, copies by least in flight, adapters on their base
model's processes with TensorRT-LLM's `lora_request`, entitlement per consumer with one 404 for unknown and
not-entitled alike (no upstream contact, so no answer or timing says which models exist), metering per model."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fleetcast.config.model import ConsumerLimits
from fleetcast.contract import telemetry as t
from runtime.gateway.limits import ConsumerLimiter
from runtime.gateway.routing import Adapter, Router

from .conftest import ANALYTICS_VPCE, REGION, VOICE_VPCE, fleet_config, run, start_harness, stop_harness
from .fakes import Client, CountingHealthServer, FakeModelServer, one_request

VPCE = {"voice-app": VOICE_VPCE, "analytics": ANALYTICS_VPCE}
SQL = Adapter("small-sql", "small", 1, "/var/lib/fleetcast/adapters/small/small-sql")


def completion(model, n=3, stream=True):
    return {"model": model, "prompt": "a b c", "max_tokens": n, "stream": stream}


# ---------------------------------------------------------------- the router alone

def test_copies_take_turns_when_idle_and_a_busy_copy_is_passed_over():
    router = Router({"m": [("127.0.0.1", 1), ("127.0.0.1", 2), ("127.0.0.1", 3)]})
    target = router.resolve("m")
    assert {router.pick(target).address[1] for _ in range(3)} == {1, 2, 3}  # idle: in turn
    busy = target.pools[0]
    busy.in_flight = 5
    assert all(router.pick(target) is not busy for _ in range(6))
    target.pools[1].in_flight = target.pools[2].in_flight = 9
    assert router.pick(target) is busy  # now the least loaded


def test_an_instance_routes_to_what_its_own_regions_pool_serves_where_another_region_has_a_pool_of_that_name():
    """Pool names repeat across regions, each pool with its own serves: a us-east-1 `l40s` serving one copy of one
    model routes that model to one process, not to the four of ap-northeast-2's `l40s` (the lookup by name alone
    took the first region's)."""
    import copy
    from pathlib import Path

    from ruamel.yaml import YAML

    from fleetcast.config import parse_config
    from runtime.gateway.routing import router_for

    data = YAML(typ="safe").load(Path(__file__).resolve().parents[2] / "examples" / "multi-model" / "fleet.yaml")
    east = copy.deepcopy(data["regions"][0])
    east.update(region="us-east-1", vpc={"cidr": "10.43.0.0/16"},
                availability_zones=[{"name": "us-east-1a", "id": "use1-az1"}, {"name": "us-east-1b", "id": "use1-az2"}])
    east["pools"] = [{**east["pools"][0], "serves": [{"model": "qwen2.5-0.5b", "copies": 1, "kv_cache_gb": 4}]}]
    data["regions"].append(east)
    cfg = parse_config(data, "<test>")
    seoul, virginia = (r.pool("l40s") for r in cfg.regions)
    assert router_for(cfg, virginia, ("127.0.0.1", 9001), "/d").ids == ("qwen2.5-0.5b",)
    assert len(router_for(cfg, seoul, ("127.0.0.1", 9001), "/d").pools) == 4


def test_an_adapter_resolves_to_its_base_models_processes_and_unknown_values_to_nothing():
    router = Router({"small": [("127.0.0.1", 1)], "large": [("127.0.0.1", 2)]}, [SQL])
    assert router.ids == ("small", "large", "small-sql")
    sql = router.resolve("small-sql")
    assert sql.base == "small" and sql.pools == router.resolve("small").pools and sql.adapter is SQL
    # tensorrt_llm/serve/openai_protocol.py: CompletionRequest.lora_request is a LoRARequest
    # (tensorrt_llm/executor/request.py: lora_name, lora_int_id, lora_path).
    assert SQL.lora_request == {"lora_name": "small-sql", "lora_int_id": 1,
                                "lora_path": "/var/lib/fleetcast/adapters/small/small-sql"}
    assert [router.resolve(v) for v in ("nope", None, 3, ["small"], {"small": 1})] == [None] * 5


def test_a_router_refuses_an_adapter_without_a_served_base_or_shadowing_a_model():
    with pytest.raises(ValueError, match="base model small"):
        Router({"large": [("127.0.0.1", 2)]}, [SQL])
    with pytest.raises(ValueError, match="also a model id"):
        Router({"small": [("127.0.0.1", 1)], "small-sql": [("127.0.0.1", 2)]}, [SQL])


# ---------------------------------------------------------------- through the gateway

async def _two_models(entitled=None, **kw):
    """small: two copies (two fake servers) + the small-sql adapter; large: one copy."""
    servers = [await FakeModelServer().start() for _ in range(3)]
    router = Router({"small": [("127.0.0.1", servers[0].port), ("127.0.0.1", servers[1].port)],
                     "large": [("127.0.0.1", servers[2].port)]}, [SQL])
    h = await start_harness(upstream=servers[0], router=router, entitled=entitled, **kw)
    return h, servers


async def _stop(h, servers):
    await stop_harness(h)
    for s in servers[1:]:
        await s.stop()


def test_each_model_reaches_only_its_own_processes_and_copies_share_the_load():
    async def body():
        h, (small0, small1, large) = await _two_models()
        try:
            for model in ("small", "small", "large", "small", "small"):
                reply = await one_request(h.port, "POST", "/v1/completions", completion(model), vpce_id=VOICE_VPCE)
                assert reply.status == 200 and reply.text
            assert (len(small0.requests), len(small1.requests), len(large.requests)) == (2, 2, 1)
            assert all(r["model"] == "small" for r in small0.requests + small1.requests)
            assert all("lora_request" not in r for r in small0.requests + small1.requests + large.requests)
            by_model = {}
            for rec in h.records_with(t.REQUESTS):
                by_model[rec[t.DIM_MODEL]] = by_model.get(rec[t.DIM_MODEL], 0) + rec[t.OUTPUT_TOKENS]
                assert ["Fleet", "Pool", "Consumer", "Model"] in rec["_aws"]["CloudWatchMetrics"][0]["Dimensions"]
            assert by_model == {"small": 12, "large": 3}
        finally:
            await _stop(h, [small0, small1, large])
    run(body())


def test_an_adapter_goes_to_its_base_model_with_the_lora_request_and_is_metered_as_itself():
    async def body():
        h, servers = await _two_models()
        try:
            reply = await one_request(h.port, "POST", "/v1/chat/completions",
                                      {"model": "small-sql", "messages": [{"role": "user", "content": "x y"}],
                                       "max_tokens": 2}, vpce_id=VOICE_VPCE)
            assert reply.status == 200
            [sent] = servers[0].requests + servers[1].requests
            assert sent["lora_request"] == SQL.lora_request and sent["model"] == "small-sql"
            assert not servers[2].requests
            (rec,) = h.records_with(t.REQUESTS)
            assert rec[t.DIM_MODEL] == "small-sql" and rec[t.OUTPUT_TOKENS] == 2
            # A caller may not name a path for the server to load: the gateway owns lora_request.
            reply = await one_request(h.port, "POST", "/v1/completions",
                                      dict(completion("small"), lora_request={"lora_name": "x", "lora_int_id": 9,
                                                                              "lora_path": "/etc"}),
                                      vpce_id=VOICE_VPCE)
            assert reply.status == 400 and reply.json()["error"]["code"] == "unsupported_parameter"
            assert len(servers[0].requests + servers[1].requests) == 1
        finally:
            await _stop(h, servers)
    run(body())


def test_models_lists_what_the_consumer_may_use_in_openais_shape():
    async def body():
        h, servers = await _two_models(entitled={"voice-app": ("small", "large", "small-sql"),
                                                 "analytics": ("large",)})
        try:
            reply = await one_request(h.port, "GET", "/v1/models", vpce_id=ANALYTICS_VPCE)
            # openai-python src/openai/types/model.py: Model = {id, created, object: "model", owned_by}.
            assert reply.status == 200 and reply.json()["object"] == "list"
            [card] = reply.json()["data"]
            assert card["id"] == "large" and card["object"] == "model" and isinstance(card["created"], int)
            assert isinstance(card["owned_by"], str)
            reply = await one_request(h.port, "GET", "/v1/models", vpce_id=VOICE_VPCE)
            assert [c["id"] for c in reply.json()["data"]] == ["small", "large", "small-sql"]
            assert (await one_request(h.port, "GET", "/v1/models/large", vpce_id=ANALYTICS_VPCE)).json()["id"] == "large"
            hidden = await one_request(h.port, "GET", "/v1/models/small", vpce_id=ANALYTICS_VPCE)
            assert hidden.status == 404 and hidden.json()["error"]["code"] == "model_not_found"
        finally:
            await _stop(h, servers)
    run(body())


def test_a_not_entitled_model_whose_process_is_down_reads_exactly_like_an_unknown_one():
    async def body():
        down = await CountingHealthServer().start()  # counts every connection the gateway would open
        live = await FakeModelServer().start()
        router = Router({"live": [("127.0.0.1", live.port)], "down": [("127.0.0.1", down.port)]})
        h = await start_harness(upstream=live, router=router,
                                entitled={"voice-app": ("live", "down"), "analytics": ("live",)})
        try:
            await down.stop()  # its process died: connecting now fails
            hidden = await one_request(h.port, "POST", "/v1/completions", completion("down"), vpce_id=ANALYTICS_VPCE)
            unknown = await one_request(h.port, "POST", "/v1/completions", completion("nowhere"),
                                        vpce_id=ANALYTICS_VPCE)
            assert hidden.status == unknown.status == 404
            assert hidden.body.replace(b"down", b"X") == unknown.body.replace(b"nowhere", b"X")
            same = lambda headers: {k: v for k, v in headers.items() if k != "content-length"}  # noqa: E731
            assert same(hidden.headers) == same(unknown.headers)  # the length differs by the name's alone
            assert down.connections == 0  # no upstream contact: nothing for the timing to depend on
            entitled = await one_request(h.port, "POST", "/v1/completions", completion("down"), vpce_id=VOICE_VPCE)
            assert entitled.status == 503  # only a consumer that may use it learns the process is down
        finally:
            await stop_harness(h)
    run(body())


def test_a_per_model_limit_holds_back_that_model_and_not_the_consumers_others():
    async def body():
        h, servers = await _two_models(
            model_limiters={("voice-app", "large"): ConsumerLimiter(ConsumerLimits(max_concurrency=1,
                                                                                   requests_per_minute=6000))})
        servers[2].gate = asyncio.Event()
        try:
            held = await Client(h.port, VOICE_VPCE).connect()
            await held.send("POST", "/v1/completions", completion("large", n=4))
            status, _ = await held.read_head()
            assert status == 200
            refused = await one_request(h.port, "POST", "/v1/completions", completion("large"), vpce_id=VOICE_VPCE)
            assert refused.status == 429 and refused.json()["error"]["code"] == "concurrency_limit_exceeded"
            other = await one_request(h.port, "POST", "/v1/completions", completion("small"), vpce_id=VOICE_VPCE)
            assert other.status == 200
            servers[2].gate.set()
            await held.read_body({"transfer-encoding": "chunked"})
            await held.close()
            throttled = [r for r in h.records if r.get(t.THROTTLED)]
            assert [(r[t.DIM_MODEL], r["throttle_scope"]) for r in throttled] == [("large", "model")]
        finally:
            servers[2].gate.set()
            await _stop(h, servers)
    run(body())


# ---------------------------------------------------------------- the property

MODELS = ("m-a", "m-b", "m-c", "m-c-lora")
PROBES = MODELS + ("unknown", "M-A", "m-a ", "")


async def _check_entitlement(entitled: dict[str, tuple[str, ...]]) -> None:
    server = await FakeModelServer().start()
    address = ("127.0.0.1", server.port)
    router = Router({m: [address] for m in MODELS[:3]}, [Adapter("m-c-lora", "m-c", 1, "/x")])
    h = await start_harness(upstream=server, router=router, entitled=entitled)
    try:
        for consumer, vpce in VPCE.items():
            listed = await one_request(h.port, "GET", "/v1/models", vpce_id=vpce)
            assert [c["id"] for c in listed.json()["data"]] == [m for m in MODELS if m in entitled[consumer]]
            for probe in PROBES:
                before = len(server.requests)
                reply = await one_request(h.port, "POST", "/v1/completions", completion(probe, stream=False),
                                          vpce_id=vpce)
                if probe in entitled[consumer]:
                    assert reply.status == 200 and len(server.requests) == before + 1
                else:
                    assert reply.status == 404 and len(server.requests) == before
                    assert reply.json() == {"error": {
                        "message": f"The model `{probe}` does not exist or you do not have access to it.",
                        "type": "invalid_request_error", "param": None, "code": "model_not_found"}}
    finally:
        await stop_harness(h)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # no timing verdicts
@given(st.fixed_dictionaries({c: st.sets(st.sampled_from(MODELS)).map(lambda s: tuple(sorted(s)))
                              for c in VPCE}))
def test_property_models_lists_exactly_the_entitled_ids_and_every_other_call_is_the_same_404(entitled):
    run(_check_entitlement(entitled))


def test_a_consumer_refresh_changes_entitlement_without_a_restart():
    async def body():
        h, servers = await _two_models(entitled={"voice-app": ("small",), "analytics": ("small",)})
        try:
            assert (await one_request(h.port, "POST", "/v1/completions", completion("large"),
                                      vpce_id=VOICE_VPCE)).status == 404
            h.gateway.set_consumers(fleet_config().consumers_of(REGION), {"voice-app": ("large",), "analytics": ()})
            assert (await one_request(h.port, "POST", "/v1/completions", completion("large"),
                                      vpce_id=VOICE_VPCE)).status == 200
            assert (await one_request(h.port, "GET", "/v1/models", vpce_id=ANALYTICS_VPCE)).json()["data"] == []
        finally:
            await _stop(h, servers)
    run(body())


def test_ids_with_slashes_and_colons_route_and_are_listed_as_written():
    # Hub-style and fine-tune ids (fleetcast/contract/model_ids.py): routed by the id itself, retrievable at
    # /v1/models/{id} as written or percent-encoded (HTTP clients quote '/' and ':' in a path segment).
    hub, tuned = "Qwen/Qwen2.5-0.5B-Instruct", "ft:gpt-3.5-turbo:acme::8abc1234"

    async def body():
        servers = [await FakeModelServer().start() for _ in range(2)]
        router = Router({hub: [("127.0.0.1", servers[0].port)], tuned: [("127.0.0.1", servers[1].port)]})
        h = await start_harness(upstream=servers[0], router=router, entitled={"voice-app": (hub, tuned)})
        try:
            for model, server in ((hub, servers[0]), (tuned, servers[1])):
                reply = await one_request(h.port, "POST", "/v1/completions", completion(model), vpce_id=VOICE_VPCE)
                assert reply.status == 200 and server.requests[-1]["model"] == model
            for path in (f"/v1/models/{hub}", "/v1/models/Qwen%2FQwen2.5-0.5B-Instruct",
                         "/v1/models/ft%3Agpt-3.5-turbo%3Aacme%3A%3A8abc1234"):
                reply = await one_request(h.port, "GET", path, vpce_id=VOICE_VPCE)
                assert reply.status == 200 and reply.json()["id"] in (hub, tuned), path
        finally:
            await _stop(h, servers)
    run(body())
