"""Per-consumer limits at the gateway: concurrent requests and request rate.

Both are per instance (the config's `limits` say so): with N instances behind
the NLB a consumer gets about N times each figure. A request over either limit
is refused at once with an OpenAI-style 429 and a Retry-After, rather than
queued: a queue in front of the server would only move the wait into TTFT.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from fleetcast.config.model import ConsumerLimits

BURST_SECONDS = 10.0  # the bucket holds this many seconds of the configured rate


def bucket_shape(limits: ConsumerLimits) -> tuple[float, float]:
    """(tokens per second, capacity) of a consumer's rate limit."""
    rate = limits.requests_per_minute / 60.0
    return rate, max(1.0, rate * BURST_SECONDS)


class TokenBucket:
    """Classic token bucket: `rate` tokens per second, at most `capacity` stored."""

    def __init__(self, rate: float, capacity: float, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.capacity = capacity
        self._clock = clock
        self._tokens = capacity
        self._at = clock()

    def retune(self, rate: float, capacity: float) -> None:
        """Tokens earned so far at the old rate are kept (up to the new capacity)."""
        now = self._clock()
        self._tokens = min(capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now
        self.rate, self.capacity = rate, capacity

    def take(self) -> float:
        """Take one token; returns 0.0 on success, else seconds until one is available."""
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.rate

    def refund(self) -> None:
        """Give back a token taken for a request that another limit then refused."""
        self._tokens = min(self.capacity, self._tokens + 1.0)


@dataclass(frozen=True)
class Throttle:
    reason: str  # "concurrency" or "rate"
    retry_after_s: int
    message: str


class ConsumerLimiter:
    """One consumer's limits. `admit()` either reserves a slot (release it with `release()`) or says why not."""

    def __init__(self, limits: ConsumerLimits, clock: Callable[[], float] = time.monotonic):
        self.max_concurrency = limits.max_concurrency
        self.requests_per_minute = limits.requests_per_minute
        self.bucket = TokenBucket(*bucket_shape(limits), clock)
        self.active = 0

    def update(self, limits: ConsumerLimits) -> None:
        """New limits in place (config refresh): requests in flight stay counted, stored tokens carry over."""
        self.max_concurrency = limits.max_concurrency
        self.requests_per_minute = limits.requests_per_minute
        self.bucket.retune(*bucket_shape(limits))

    def admit(self) -> Throttle | None:
        # Concurrency first: a request refused for concurrency must not also spend a rate token.
        if self.active >= self.max_concurrency:
            return Throttle("concurrency", 1, f"too many concurrent requests: the limit is {self.max_concurrency} "
                            "per instance for this consumer")
        wait = self.bucket.take()
        if wait > 0:
            return Throttle("rate", max(1, math.ceil(wait)), f"rate limit reached: {self.requests_per_minute} "
                            "requests per minute per instance for this consumer")
        self.active += 1
        return None

    def release(self) -> None:
        self.active -= 1

    def cancel(self) -> None:
        """Undo an `admit()` whose request was refused by another limit: the slot and the rate token."""
        self.active -= 1
        self.bucket.refund()
