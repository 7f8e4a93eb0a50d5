"""Admission: a ticket per admitted request, a 429 refusal (with its throttle record) when over a limit."""

from __future__ import annotations

from fleetcast import telemetry as t
from fleetcast.config.model import ConsumerLimits
from runtime.gateway.admission import Admission, Ticket
from runtime.gateway.identity import Refusal
from runtime.gateway.limits import ConsumerLimiter

from .conftest import fleet_config, REGION


class Sink:
    def __init__(self):
        self.records = []

    def emit(self, consumer, values, props=None, timestamp_ms=None, shape=None):
        self.records.append((consumer, values, props, timestamp_ms))


def test_a_ticket_holds_a_slot_until_released_and_the_next_request_is_refused_meanwhile():
    sink = Sink()
    admission = Admission({"voice-app": ConsumerLimiter(ConsumerLimits(max_concurrency=1,
                                                                       requests_per_minute=6000))}, sink)
    ticket = admission.admit("voice-app", "/v1/completions", 1_000)
    assert isinstance(ticket, Ticket) and admission.limiters["voice-app"].active == 1
    refused = admission.admit("voice-app", "/v1/completions", 2_000)
    assert isinstance(refused, Refusal)
    assert (refused.status, refused.code, refused.error_type) == (429, "concurrency_limit_exceeded", "requests")
    assert dict(refused.headers) == {"Retry-After": "1", "x-ratelimit-limit-requests": "6000"}
    ticket.release()
    assert isinstance(admission.admit("voice-app", "/v1/completions", 3_000), Ticket)
    # Only the refusal is recorded here (an admitted request's record comes when it ends), at its arrival time.
    [(consumer, values, props, at)] = sink.records
    assert consumer == "voice-app" and values[t.THROTTLED] == 1 and at == 2_000
    assert props["throttle_reason"] == "concurrency" and props["max_concurrency"] == 1


def test_an_exhausted_rate_is_refused_as_rate_limit_exceeded_with_the_wait_in_retry_after():
    admission = Admission({"voice-app": ConsumerLimiter(ConsumerLimits(max_concurrency=100,
                                                                       requests_per_minute=6))}, Sink())
    for _ in range(1):  # the bucket holds 10 s of 6/min: one token
        admission.admit("voice-app", "/v1/completions", 0).release()
    refused = admission.admit("voice-app", "/v1/completions", 0)
    assert refused.code == "rate_limit_exceeded" and 1 <= int(dict(refused.headers)["Retry-After"]) <= 10


def test_a_refresh_keeps_a_kept_consumers_limiter_and_drops_a_removed_one():
    consumers = fleet_config().consumers_of(REGION)
    admission = Admission({c.name: ConsumerLimiter(c.limits) for c in consumers}, Sink())
    held = admission.admit("voice-app", "/v1/completions", 0)
    limiter = admission.limiters["voice-app"]
    admission.set_consumers(tuple(c for c in consumers if c.name == "voice-app"))
    assert set(admission.limiters) == {"voice-app"} and admission.limiters["voice-app"] is limiter
    assert limiter.active == 1  # the request in flight still counts
    held.release()
    assert limiter.active == 0
