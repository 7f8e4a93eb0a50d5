"""Admission: which models a consumer may call, and the limits a request counts against.

Two limits per request: the consumer's own (`consumers[].limits`) and, where the
config sets one, the consumer's limit for that model or adapter. Both are taken
or neither: a request refused by one gives back what the other took (its slot
and its rate token), so a refusal never spends another limit's budget.

The limiters live for the whole process and survive a config refresh: a kept
consumer keeps its in-flight counts and stored rate tokens (`set_consumers`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from fleetcast.config.model import Consumer, ConsumerLimits
from fleetcast.contract import telemetry as t

from .identity import Refusal
from .limits import ConsumerLimiter, Throttle
from .metrics import MetricsSink


def model_not_found(model: object) -> Refusal:
    """The one answer for a model that does not exist and for one the consumer may not use.

    OpenAI's own answer, word for word in shape: 404 with
    `{"error": {"message": "The model `X` does not exist or you do not have access to it.",
    "type": "invalid_request_error", "param": null, "code": "model_not_found"}}` (as OpenAI returns it,
    quoted in e.g. shobrook/wut#14); openai-python raises NotFoundError for any 404
    (src/openai/_client.py `_make_status_error`). Nothing in it depends on whether the model exists.
    """
    shown = model if isinstance(model, str) else str(model)
    return Refusal(404, "model_not_found", f"The model `{shown[:256]}` does not exist or you do not have access to it.",
                   "invalid_request_error")


def model_limits_of(consumer: Consumer) -> Mapping[str, ConsumerLimits]:
    """The consumer's per-model limits, {model or adapter id: limits}; none configured: {}.

    Read from `consumers[].limits.models` when the config model has that field.
    """
    return getattr(consumer.limits, "models", None) or {}


@dataclass(frozen=True)
class Ticket:
    """An admitted request's slots; `release()` it exactly once when the request ends. Shared by the requests
    of the same limiters (`Admission.admit`)."""

    limiters: tuple[ConsumerLimiter, ...]

    def release(self) -> None:
        for limiter in self.limiters:
            limiter.release()


def limiter_key(consumer: str, model: str | None = None) -> str:
    """The name a limiter is shared under across worker processes (runtime/gateway/shared.py)."""
    return consumer if model is None else f"{consumer}\x00{model}"


def local_limiter(key: str, limits: ConsumerLimits) -> ConsumerLimiter:
    return ConsumerLimiter(limits)


class Admission:
    def __init__(self, limiters: dict[str, ConsumerLimiter], metrics: MetricsSink,
                 entitled: Mapping[str, Iterable[str]] | None = None,
                 model_limiters: dict[tuple[str, str], ConsumerLimiter] | None = None,
                 new_limiter: Callable[[str, ConsumerLimits], ConsumerLimiter] = local_limiter):
        """`entitled`: consumer -> the model and adapter ids it may call (absent consumer: none).
        `new_limiter(key, limits)`: makes the limiter of a consumer (or consumer and model) a refresh adds."""
        self.new_limiter = new_limiter
        self.limiters = limiters
        self.metrics = metrics
        self.entitled: dict[str, tuple[str, ...]] = {c: tuple(ids) for c, ids in (entitled or {}).items()}
        self.model_limiters = model_limiters or {}
        # One ticket per limiter (or consumer and model pair), shared by their requests: a ticket holds no state of
        # its request, and one each would be two more objects a waiting request keeps alive (runtime/heap.py).
        self._tickets: dict[ConsumerLimiter | tuple[ConsumerLimiter, ConsumerLimiter], Ticket] = {}

    def set_consumers(self, consumers: Iterable[Consumer], entitled: Mapping[str, Iterable[str]]) -> None:
        """Swap in a refreshed consumer list; a kept consumer keeps its limiters (in-flight count, tokens)."""
        limiters, model_limiters = {}, {}
        for consumer in consumers:
            limiters[consumer.name] = self._kept(self.limiters.get(consumer.name), consumer.limits,
                                                 limiter_key(consumer.name))
            for model, limits in model_limits_of(consumer).items():
                key = (consumer.name, model)
                model_limiters[key] = self._kept(self.model_limiters.get(key), limits, limiter_key(*key))
        self.entitled = {c.name: tuple(entitled.get(c.name, ())) for c in consumers}
        self.model_limiters = model_limiters
        self.limiters = limiters
        self._tickets = {}  # a dropped consumer's limiters go with their tickets

    def _kept(self, limiter: ConsumerLimiter | None, limits: ConsumerLimits, key: str) -> ConsumerLimiter:
        if limiter is None:
            return self.new_limiter(key, limits)
        limiter.update(limits)
        return limiter

    def may_use(self, consumer: str, model: str) -> bool:
        return model in self.entitled.get(consumer, ())

    def admit(self, consumer: str, model: str | None, path: str, arrived_ms: int) -> Ticket | Refusal:
        """Slots for one request of `consumer` on `model`, or the 429 to answer (its throttle record emitted)."""
        limiter = self.limiters[consumer]
        throttle = limiter.admit()
        if throttle is not None:
            return self._throttled(consumer, model, path, arrived_ms, limiter, throttle, "consumer")
        per_model = self.model_limiters.get((consumer, model)) if model is not None else None
        if per_model is None:
            ticket = self._tickets.get(limiter)
            if ticket is None:
                ticket = self._tickets[limiter] = Ticket((limiter,))
            return ticket
        throttle = per_model.admit()
        if throttle is not None:
            limiter.cancel()
            return self._throttled(consumer, model, path, arrived_ms, per_model, throttle, "model")
        pair = (limiter, per_model)
        ticket = self._tickets.get(pair)
        if ticket is None:
            ticket = self._tickets[pair] = Ticket(pair)
        return ticket

    def _throttled(self, consumer: str, model: str | None, path: str, arrived_ms: int, limiter: ConsumerLimiter,
                   throttle: Throttle, scope: str) -> Refusal:
        self.metrics.emit(consumer, {t.REQUESTS: 1, t.THROTTLED: 1, t.ERRORS: 0},
                          {"throttle_reason": throttle.reason, "throttle_scope": scope, "path": path,
                           "max_concurrency": limiter.max_concurrency,
                           "requests_per_minute": limiter.requests_per_minute}, arrived_ms, model=model)
        code = "rate_limit_exceeded" if throttle.reason == "rate" else "concurrency_limit_exceeded"
        message = throttle.message if scope == "consumer" else f"{throttle.message} and model {model}"
        return Refusal(429, code, message, "requests",
                       (("Retry-After", str(throttle.retry_after_s)),
                        ("x-ratelimit-limit-requests", str(limiter.requests_per_minute))))
