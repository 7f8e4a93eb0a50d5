"""Admission: entitlement per consumer, a ticket per admitted request, and a 429 (with its throttle record)
when the consumer's limit or its limit for that model is reached; a refusal by one never spends the other."""

from __future__ import annotations

from fleetcast.config.model import ConsumerLimits
from fleetcast.contract import telemetry as t
from runtime.gateway.admission import Admission, Ticket, model_not_found
from runtime.gateway.identity import Refusal
from runtime.gateway.limits import ConsumerLimiter

from .conftest import REGION, fleet_config

PATH = "/v1/completions"


class Sink:
    def __init__(self):
        self.records = []

    def emit(self, consumer, values, props=None, timestamp_ms=None, shape=None, model=None):
        self.records.append((consumer, values, props, timestamp_ms, model))


def limiter(concurrency: int, rpm: int = 6000) -> ConsumerLimiter:
    return ConsumerLimiter(ConsumerLimits(max_concurrency=concurrency, requests_per_minute=rpm))


def test_a_ticket_holds_a_slot_until_released_and_the_next_request_is_refused_meanwhile():
    sink = Sink()
    admission = Admission({"voice-app": limiter(1)}, sink)
    ticket = admission.admit("voice-app", "gpt2-xl", PATH, 1_000)
    assert isinstance(ticket, Ticket) and admission.limiters["voice-app"].active == 1
    refused = admission.admit("voice-app", "gpt2-xl", PATH, 2_000)
    assert isinstance(refused, Refusal)
    assert (refused.status, refused.code, refused.error_type) == (429, "concurrency_limit_exceeded", "requests")
    assert dict(refused.headers) == {"Retry-After": "1", "x-ratelimit-limit-requests": "6000"}
    ticket.release()
    assert isinstance(admission.admit("voice-app", "gpt2-xl", PATH, 3_000), Ticket)
    # Only the refusal is recorded here (an admitted request's record comes when it ends), at its arrival time.
    [(consumer, values, props, at, model)] = sink.records
    assert consumer == "voice-app" and values[t.THROTTLED] == 1 and at == 2_000 and model == "gpt2-xl"
    assert props["throttle_reason"] == "concurrency" and props["throttle_scope"] == "consumer"


def test_an_exhausted_rate_is_refused_as_rate_limit_exceeded_with_the_wait_in_retry_after():
    admission = Admission({"voice-app": limiter(100, rpm=6)}, Sink())
    admission.admit("voice-app", "gpt2-xl", PATH, 0).release()  # the bucket holds 10 s of 6/min: one token
    refused = admission.admit("voice-app", "gpt2-xl", PATH, 0)
    assert refused.code == "rate_limit_exceeded" and 1 <= int(dict(refused.headers)["Retry-After"]) <= 10


def test_a_per_model_limit_refuses_that_model_only_and_gives_back_the_consumer_slot_and_token():
    consumer = limiter(10, rpm=60)  # a bucket of 10 tokens
    admission = Admission({"voice-app": consumer}, Sink(), model_limiters={("voice-app", "small"): limiter(1)})
    held = admission.admit("voice-app", "small", PATH, 0)
    assert isinstance(held, Ticket) and consumer.active == 1
    tokens_before = consumer.bucket._tokens
    refused = admission.admit("voice-app", "small", PATH, 0)
    assert refused.status == 429 and "model small" in refused.message
    assert consumer.active == 1 and consumer.bucket._tokens >= tokens_before  # nothing of the consumer's spent
    other = admission.admit("voice-app", "large", PATH, 0)  # another model is not held back by it
    assert isinstance(other, Ticket) and consumer.active == 2
    held.release()
    other.release()
    assert consumer.active == 0 and admission.model_limiters[("voice-app", "small")].active == 0


def test_requests_of_the_same_limiters_share_one_ticket_and_each_release_frees_one_slot_of_each():
    """A ticket holds nothing of its request (one each would be two more objects a waiting request keeps alive):
    the requests admitted through the same limiters get the same one, and a replaced limiter gets its own."""
    consumer, per_model = limiter(10), limiter(5)
    admission = Admission({"voice-app": consumer}, Sink(), model_limiters={("voice-app", "small"): per_model})
    first, second = (admission.admit("voice-app", "small", PATH, 0) for _ in range(2))
    alone = admission.admit("voice-app", "large", PATH, 0)
    assert first is second and alone is not first and alone.limiters == (consumer,)
    assert (consumer.active, per_model.active) == (3, 2)
    first.release()
    assert (consumer.active, per_model.active) == (2, 1)
    second.release()
    alone.release()
    assert (consumer.active, per_model.active) == (0, 0)
    admission.limiters["voice-app"] = replaced = limiter(1)  # as a test or a refresh swaps one in
    assert admission.admit("voice-app", "large", PATH, 0).limiters == (replaced,) and replaced.active == 1


def test_entitlement_is_exactly_the_listed_ids_per_consumer():
    admission = Admission({"a": limiter(1), "b": limiter(1)}, Sink(), entitled={"a": ("m1", "m2"), "b": ("m2",)})
    assert [admission.may_use("a", m) for m in ("m1", "m2", "m3")] == [True, True, False]
    assert [admission.may_use("b", m) for m in ("m1", "m2")] == [False, True]
    assert not admission.may_use("stranger", "m2")


def test_not_found_and_not_entitled_read_the_same_as_openai_words_them():
    refusal = model_not_found("gpt-9")
    assert (refusal.status, refusal.code, refusal.error_type) == (404, "model_not_found", "invalid_request_error")
    assert refusal.message == "The model `gpt-9` does not exist or you do not have access to it."
    assert model_not_found(None).message == "The model `None` does not exist or you do not have access to it."


def test_a_refresh_keeps_a_kept_consumers_limiter_and_drops_a_removed_one():
    consumers = fleet_config().consumers_of(REGION)
    admission = Admission({c.name: ConsumerLimiter(c.limits) for c in consumers}, Sink())
    held = admission.admit("voice-app", "gpt2-xl", PATH, 0)
    kept = admission.limiters["voice-app"]
    admission.set_consumers(tuple(c for c in consumers if c.name == "voice-app"), {"voice-app": ("gpt2-xl",)})
    assert set(admission.limiters) == {"voice-app"} and admission.limiters["voice-app"] is kept
    assert kept.active == 1  # the request in flight still counts
    assert admission.may_use("voice-app", "gpt2-xl") and not admission.may_use("analytics", "gpt2-xl")
    held.release()
    assert kept.active == 0
