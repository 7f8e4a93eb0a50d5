"""Default-deny routes: a consumer reaches the inference routes (entitled by `model`, metered) and the gateway's
own answers; every other route of the engine is refused before any upstream contact.

trtllm-serve's routes, from `OpenAIServer.register_routes` (and `mount_metrics`) in
tensorrt_llm/serve/openai_server.py, read in the stored versions of NVIDIA/TensorRT-LLM (the v1.2.1 tag
cannot be fetched here: the repository is over the fetch limit): index id 456200087 (the 1.1 line,
`self.llm`, no /v1/responses/{id}) and 36409600292 (later, `self.generator`, with the RL-only routes);
1.2.x lies between them, so its routes are within their union, which is listed here. The later
/v1/kv_cache_hints and /energy_metrics (index id 51781230266) and the visual-generation routes are listed
too, and the reference backend's /memory (runtime/reference/server.py): default-deny refuses what it was
never told about.
"""

from __future__ import annotations

import pytest

from fleetcast.contract import telemetry as t
from runtime.gateway.routing import invalid_model

from .conftest import ANALYTICS_VPCE, VOICE_VPCE, run, start_harness, stop_harness
from .fakes import one_request

METERED, GATEWAY, REFUSED = "entitled and metered", "answered by the gateway", "refused"
# (method, path) -> what the gateway does with it, and why.
TRTLLM_SERVE_ROUTES = {
    ("POST", "/v1/completions"): METERED,
    ("POST", "/v1/chat/completions"): METERED,
    ("GET", "/v1/models"): GATEWAY,  # the calling consumer's models only
    ("GET", "/health"): GATEWAY,  # the NLB's health check
    # Generates, but neither entitled here nor metered (Responses usage has another shape).
    ("POST", "/v1/responses"): REFUSED,
    ("GET", "/v1/responses/resp_0123"): REFUSED,  # a stored response of whoever made it
    ("DELETE", "/v1/responses/resp_0123"): REFUSED,
    ("GET", "/health_generate"): REFUSED,  # generates (one token), unmetered
    # Tell of every account's traffic (and /metrics, /perf_metrics are dequeued on read).
    ("GET", "/metrics"): REFUSED,
    ("GET", "/perf_metrics"): REFUSED,
    ("GET", "/prometheus/metrics"): REFUSED,
    ("POST", "/kv_cache_events"): REFUSED,
    # Disaggregation and operator controls.
    ("GET", "/steady_clock_offset"): REFUSED,
    ("POST", "/steady_clock_offset"): REFUSED,
    ("POST", "/release_memory"): REFUSED,
    ("POST", "/resume_memory"): REFUSED,
    ("POST", "/update_weights"): REFUSED,
    ("GET", "/server_info"): REFUSED,
    ("GET", "/version"): REFUSED,
    # Later releases and the reference backend.
    ("POST", "/v1/kv_cache_hints"): REFUSED,
    ("GET", "/energy_metrics"): REFUSED,
    ("POST", "/v1/images/generations"): REFUSED,
    ("POST", "/v1/videos"): REFUSED,
    ("GET", "/memory"): REFUSED,
    # The inference routes under another method or spelling are other routes.
    ("GET", "/v1/completions"): REFUSED,
    ("PUT", "/v1/chat/completions"): REFUSED,
    ("POST", "/v1/completions/"): REFUSED,
    ("POST", "/v1//completions"): REFUSED,
    ("POST", "/V1/completions"): REFUSED,
    ("POST", "/v1/models"): REFUSED,
}
COMPLETION = {"model": "gpt2-xl", "prompt": "a b c", "max_tokens": 2}
CHAT = {"model": "gpt2-xl", "messages": [{"role": "user", "content": "a b"}], "max_tokens": 2}


def _body(method: str, path: str):
    if path == "/v1/chat/completions" and method == "POST":
        return CHAT
    return COMPLETION if method in ("POST", "PUT") else None


@pytest.mark.parametrize("entitled_to", [(), ("gpt2-xl",)], ids=["entitled to nothing", "entitled to the model"])
def test_no_route_reaches_an_engine_unentitled_or_unmetered(entitled_to):
    """The incident: a consumer entitled to no model got 200 from GET /memory, answered by an engine."""
    async def body():
        h = await start_harness(entitled={"voice-app": entitled_to, "analytics": ()})
        try:
            for (method, path), decision in TRTLLM_SERVE_ROUTES.items():
                h.upstream.seen.clear()
                before = len(h.records_with(t.REQUESTS))
                reply = await one_request(h.port, method, path, _body(method, path), vpce_id=VOICE_VPCE)
                reached = [p for _, p in h.upstream.seen if p != "/health"]
                records = h.records_with(t.REQUESTS)[before:]
                where = f"{method} {path} ({decision})"
                if decision == REFUSED:
                    assert reply.status == 404, where
                    assert reply.json()["error"]["code"] == "unknown_url", where
                    assert f"{method} {path}" in reply.json()["error"]["message"], where
                    assert reached == [], where
                elif decision == METERED:
                    if entitled_to:
                        assert reply.status == 200 and reached == [path], where
                        assert [r["status"] for r in records] == [200], where
                    else:
                        assert reply.status == 404 and reply.json()["error"]["code"] == "model_not_found", where
                        assert reached == [] and [r["status"] for r in records] == [404], where
                else:
                    assert reply.status == 200 and reached == [], where
        finally:
            await stop_harness(h)
    run(body(), timeout=60)


def test_a_refused_route_is_refused_before_identity_and_keeps_the_connection():
    async def body():
        h = await start_harness()
        try:
            from .fakes import Client

            c = await Client(h.port, ANALYTICS_VPCE).connect()
            refused = await c.request("POST", "/v1/responses", {"model": "gpt2-xl", "input": "hi"})
            assert refused.status == 404 and refused.json()["error"]["type"] == "invalid_request_error"
            served = await c.request("POST", "/v1/completions", COMPLETION)  # the same connection, in step
            assert served.status == 200
            await c.close()
            assert h.upstream.seen.count(("POST", "/v1/responses")) == 0
        finally:
            await stop_harness(h)
    run(body())


# ---------------------------------------------------------------- `model` that is not a string: 400

MISTYPED = [
    # OpenAI's answers: missing, as quoted in danielmiessler/Fabric#239 and lss233/kirara-ai#800;
    # a mistyped member, "Invalid type for 'x': expected a string, but got an integer instead.", code
    # "invalid_type" (portkey.ai/error-library/type-validation-error-10531 quotes the wording).
    ({"prompt": "a"}, None, None, "you must provide a model parameter"),
    ({"model": None, "prompt": "a"}, "model", "invalid_type",
     "Invalid type for 'model': expected a string, but got null instead."),
    ({"model": 7, "prompt": "a"}, "model", "invalid_type",
     "Invalid type for 'model': expected a string, but got an integer instead."),
    ({"model": 1.5, "prompt": "a"}, "model", "invalid_type",
     "Invalid type for 'model': expected a string, but got a decimal number instead."),
    ({"model": True, "prompt": "a"}, "model", "invalid_type",
     "Invalid type for 'model': expected a string, but got a boolean instead."),
    ({"model": ["gpt2-xl"], "prompt": "a"}, "model", "invalid_type",
     "Invalid type for 'model': expected a string, but got an array instead."),
    ({"model": {"id": "gpt2-xl"}, "prompt": "a"}, "model", "invalid_type",
     "Invalid type for 'model': expected a string, but got an object instead."),
]


@pytest.mark.parametrize("request_body,param,code,message", MISTYPED)
def test_a_model_that_is_not_a_string_is_openais_400_not_model_not_found(request_body, param, code, message):
    async def body():
        h = await start_harness()
        try:
            reply = await one_request(h.port, "POST", "/v1/completions", request_body, vpce_id=VOICE_VPCE)
            assert reply.status == 400
            assert reply.json() == {"error": {"message": message, "type": "invalid_request_error",
                                              "param": param, "code": code}}
            assert h.upstream.arrivals == 0
            (rec,) = h.records_with(t.REQUESTS)
            assert rec["status"] == 400 and rec[t.ERRORS] == 0
        finally:
            await stop_harness(h)
    run(body())


def test_a_string_model_is_left_to_routing():
    assert invalid_model({"model": "anything"}) is None
    assert invalid_model({"model": ""}) is None  # a string: unknown, so model_not_found
