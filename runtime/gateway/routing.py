"""Routing: which local model server a request goes to.

Today every request goes to the one server on this instance. Routing by the
body's `model` (several models, several copies each) belongs here: `pick` is the
single place the gateway asks.
"""

from __future__ import annotations

from .upstream import UpstreamPool


class Router:
    def __init__(self, upstream: tuple[str, int], max_idle: int = 256):
        self.default = UpstreamPool(upstream, max_idle)

    @property
    def pools(self) -> tuple[UpstreamPool, ...]:
        return (self.default,)

    def pick(self) -> UpstreamPool:
        return self.default

    def close(self) -> None:
        for pool in self.pools:
            pool.close()
