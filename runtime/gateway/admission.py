"""Admission: which consumer limiter a request counts against, and the 429 it gets when over.

The limiters live for the whole process and survive a config refresh: a kept
consumer keeps its in-flight count and stored rate tokens (`set_consumers`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetcast import telemetry as t

from .identity import Refusal
from .limits import ConsumerLimiter
from .metrics import MetricsSink


@dataclass(frozen=True)
class Ticket:
    """An admitted request's slot; `release()` it exactly once when the request ends."""

    limiter: ConsumerLimiter

    def release(self) -> None:
        self.limiter.release()


class Admission:
    def __init__(self, limiters: dict[str, ConsumerLimiter], metrics: MetricsSink):
        self.limiters = limiters
        self.metrics = metrics

    def set_consumers(self, consumers: tuple) -> None:
        """Swap in a refreshed consumer list; a kept consumer keeps its limiter (in-flight count, tokens)."""
        limiters = {}
        for consumer in consumers:
            limiter = self.limiters.get(consumer.name)
            if limiter is None:
                limiter = ConsumerLimiter(consumer.limits)
            else:
                limiter.update(consumer.limits)
            limiters[consumer.name] = limiter
        self.limiters = limiters

    def admit(self, consumer: str, path: str, arrived_ms: int) -> Ticket | Refusal:
        """A slot for one request of `consumer`, or the 429 to answer (its throttle record emitted)."""
        limiter = self.limiters[consumer]
        throttle = limiter.admit()
        if throttle is None:
            return Ticket(limiter)
        self.metrics.emit(consumer, {t.REQUESTS: 1, t.THROTTLED: 1, t.ERRORS: 0},
                          {"throttle_reason": throttle.reason, "path": path,
                           "max_concurrency": limiter.max_concurrency,
                           "requests_per_minute": limiter.requests_per_minute}, arrived_ms)
        code = "rate_limit_exceeded" if throttle.reason == "rate" else "concurrency_limit_exceeded"
        return Refusal(429, code, throttle.message, "requests",
                       (("Retry-After", str(throttle.retry_after_s)),
                        ("x-ratelimit-limit-requests", str(limiter.requests_per_minute))))
