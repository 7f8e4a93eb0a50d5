"""Whether a request spills to another region (issue 36, section 2), and the state that decision keeps.

A request spills only when every one of these holds, checked in this order (the cheap ones first):
  1. the consumer allows the region (`consumers[].spill_regions`; none, the default, is strict residency) and
     the region serves the request's model (or adapter);
  2. the request is no forwarded one (at most one hop);
  3. local admission would break the consumer's SLO: the predicted local TTFT (the wait fair admission
     predicts, plus the engine's measured TTFT) is over the model's P99 TTFT target; with hysteresis: once
     spilling, a model keeps spilling until the prediction falls below LEAVE_RATIO of the target, so the
     spill share does not flap around the threshold;
  4. the region's circuit breaker lets a request through (closed, or half-open with its one probe free);
  5. the region advertises headroom for the model in its headroom answer (cached HEADROOM_TTL_S, refreshed in
     the background, ignored once older than HEADROOM_MAX_AGE_S) and its predicted TTFT plus the measured
     round trip beats the local prediction.
Every refusal is a reason string, so the decision can be explained and tested condition by condition.

The breaker counts failures of spilled attempts (no connection, no response head in time, a 5xx head): after
BREAKER_FAILURES in a row it opens and traffic stays home for a cool-down that doubles on each failed probe
(up to BREAKER_MAX_COOL_S); then it is half-open: one request is let through as the probe; its success closes
the breaker, its failure opens it again.

Nothing here does I/O but HeadroomCache's background fetch; the clock is injected, so tests and the overflow
benchmark (scripts/bench_overflow.py) drive the same code with simulated time.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetcast.contract.spill import may_serve_in

HEADROOM_PATH = "/_fleetcast/headroom"  # answered only on connections from the provider's endpoint or a peer
HEADROOM_TTL_S = 1.0
PEER_HEADROOM_TTL_S = 0.25  # a peer of the same region is a sub-millisecond read away: its answer ages faster
HEADROOM_MAX_AGE_S = 3.0
HEADROOM_TIMEOUT_S = 1.0
ENTER_RATIO = 1.0  # start spilling a model when its predicted local TTFT exceeds this share of the target
LEAVE_RATIO = 0.6  # stop when it falls below this share (hysteresis)
BREAKER_FAILURES = 3
BREAKER_COOL_S = 5.0
BREAKER_MAX_COOL_S = 60.0
EWMA = 0.2
# The share of a region's capacity its headroom answer never offers: kept for its own consumers, whose arrivals
# between two headroom reads would otherwise find the room spilled into. scripts/bench_overflow.py (--reserve)
# measured, of 120 one-minute windows within the SLO (home, remote): no spill 17, 50; reserve 0 (and no
# per-answer budget) 43, 0; 1/4 37, 21; 3/8 35, 40; 1/2 31, 44.
RESERVE = 3 / 8


@dataclass(frozen=True)
class ModelHeadroom:
    free: int  # requests the answering gateway offers to take for another region now (advertised_free)
    capacity: int  # requests it holds at once (its engine processes' admission caps)
    predicted_ttft_ms: float  # the wait it predicts for a new request plus its engine's measured TTFT
    room: int | None = None  # its whole free room, no reserve: what it offers a peer of its own region
                             # (whose consumers are its own); None: as `free`

    @property
    def peer_free(self) -> int:
        return self.free if self.room is None else self.room

    @property
    def share(self) -> float:
        """Free capacity normalized by capacity: comparable across instances of different sizes."""
        return self.free / self.capacity if self.capacity > 0 else 0.0


@dataclass(frozen=True)
class Headroom:
    region: str
    models: Mapping[str, ModelHeadroom]
    draining: bool = False

    @classmethod
    def from_json(cls, data: Any) -> Headroom:
        models = {str(k): ModelHeadroom(int(v["free"]), int(v["capacity"]), float(v["predicted_ttft_ms"]),
                                         None if v.get("room") is None else int(v["room"]))
                  for k, v in dict(data["models"]).items()}
        return cls(str(data["region"]), models, bool(data.get("draining", False)))

    def to_json(self, links: Mapping[str, RegionLink] | None = None) -> bytes:
        """`links`: the answering gateway's own spill links, their breaker states (for operators and tests)."""
        extra = {"links": {name: {"breaker": link.breaker.state, "rtt_ms": link.rtt_ms}
                           for name, link in links.items()}} if links else {}
        return json.dumps({"region": self.region, "draining": self.draining, **extra, "models": {
            k: {"free": v.free, "capacity": v.capacity, "predicted_ttft_ms": round(v.predicted_ttft_ms, 1),
                **({"room": v.room} if v.room is not None else {})}
            for k, v in self.models.items()}}, separators=(",", ":")).encode()


class LoadGauge:
    """Per model: the engine's measured TTFT and service time (EWMA of what the gateway saw finish)."""

    def __init__(self, ttft_ms: float = 50.0, service_s: float = 1.0):
        self._ttft: dict[str, float] = {}
        self._service: dict[str, float] = {}
        self.default_ttft_ms, self.default_service_s = ttft_ms, service_s

    def observe(self, model: str, ttft_ms: float | None, service_s: float | None) -> None:
        if ttft_ms is not None and ttft_ms >= 0:
            old = self._ttft.get(model)
            self._ttft[model] = ttft_ms if old is None else old + EWMA * (ttft_ms - old)
        if service_s is not None and service_s > 0:
            old_s = self._service.get(model)
            self._service[model] = service_s if old_s is None else old_s + EWMA * (service_s - old_s)

    def ttft_ms(self, model: str) -> float:
        return self._ttft.get(model, self.default_ttft_ms)

    def service_s(self, model: str) -> float:
        return self._service.get(model, self.default_service_s)


def advertised_free(held: int, waiting: int, capacity: int) -> int:
    """The requests a region offers to take for others now: its free room less the RESERVE of its capacity (rounded
    down: an engine of one slot still offers it when idle)."""
    return max(0, capacity - math.floor(capacity * RESERVE) - held - waiting)


def predicted_wait_s(held: int, waiting: int, capacity: int, service_s: float) -> float:
    """The wait of a request arriving now, from fair admission's counts: none while there is room; else its
    place in the queue (those waiting, then it) over the rate slots free at (capacity per service time).

    The one place the local prediction is made (fair_load feeds it): when fair admission offers its own
    per-consumer prediction, this is what changes."""
    if capacity <= 0:
        return float("inf")
    if held + waiting < capacity:
        return 0.0
    return (waiting + 1) * service_s / capacity


class Breaker:
    """One region's circuit breaker (module docstring): closed, open until `open_until`, half-open."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, failures: int = BREAKER_FAILURES,
                 cool_s: float = BREAKER_COOL_S, max_cool_s: float = BREAKER_MAX_COOL_S):
        self.clock, self.threshold, self.base_cool_s, self.max_cool_s = clock, failures, cool_s, max_cool_s
        self.failures = 0
        self.cool_s = cool_s
        self.open_until: float | None = None
        self.probing = False  # the half-open probe is out
        self.opened = 0  # times it opened (the tests and the benchmark read it)

    @property
    def state(self) -> str:
        if self.open_until is None:
            return "closed"
        return "open" if self.clock() < self.open_until else "half_open"

    def allow(self) -> bool:
        """Whether a request may go now; in half-open, True once (the probe) until its outcome is known."""
        state = self.state
        if state == "closed":
            return True
        if state == "half_open" and not self.probing:
            self.probing = True
            return True
        return False

    def success(self) -> None:
        self.failures, self.cool_s, self.open_until, self.probing = 0, self.base_cool_s, None, False

    def failure(self) -> None:
        if self.open_until is not None:  # the probe failed: open again, longer
            self.cool_s = min(self.cool_s * 2, self.max_cool_s)
            self.open_until, self.probing = self.clock() + self.cool_s, False
            self.opened += 1
            return
        self.failures += 1
        if self.failures >= self.threshold:
            self.open_until = self.clock() + self.cool_s
            self.opened += 1

    def release_probe(self) -> None:
        """The probe went nowhere (decided against after all): let the next request probe."""
        self.probing = False


@dataclass
class RegionLink:
    """What the home gateway knows about one remote region."""

    region: str
    address: tuple[str, int]  # the spill endpoint's DNS name (or a loopback stand-in) and the serving port
    breaker: Breaker
    headroom: Headroom | None = None
    fetched_at: float = float("-inf")
    attempted_at: float = float("-inf")
    rtt_ms: float | None = None
    fetching: bool = False
    spent: int = 0  # spills sent on the current headroom answer: no more than it offered until the next one
    pool: str = ""  # a peer instance's pool (section 1 balancing); "" for a region
    price: float = 0.0  # that pool's instance price per hour (the shipped table): the cheapest pool is preferred
    direct: bool = False  # reached straight (a peer instance), not through an NLB: send the PROXY v2 LOCAL header


@dataclass(frozen=True)
class Decision:
    region: str | None  # None: serve at home
    reason: str
    local_ttft_ms: float = 0.0
    remote_ttft_ms: float = 0.0


@dataclass
class Counters:
    decisions: int = 0
    spilled: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


class SpillPolicy:
    """The home gateway's spill decision over its links to remote regions (module docstring)."""

    def __init__(self, links: Mapping[str, RegionLink], served: Mapping[str, frozenset[str]],
                 clock: Callable[[], float] = time.monotonic):
        """`served`: remote region -> the model and adapter ids it serves (from the config)."""
        self.links, self.served, self.clock = dict(links), dict(served), clock
        self._spilling: set[str] = set()  # models in the spilling state (hysteresis)
        self.counters = Counters()

    def spilling(self, model: str) -> bool:
        return model in self._spilling

    def _count(self, decision: Decision) -> Decision:
        self.counters.decisions += 1
        key = decision.reason.split(":")[0]
        self.counters.reasons[key] = self.counters.reasons.get(key, 0) + 1
        if decision.region is not None:
            self.counters.spilled += 1
        return decision

    def decide(self, consumer: Any, model: str, base_model: str, hop: int, local_ttft_ms: float,
               slo_ttft_ms: float) -> Decision:
        """Where a request goes: `consumer` the config consumer (its service_region and spill_regions), `model`
        the id it named (an adapter's base is `base_model`), `local_ttft_ms` the local prediction, `slo_ttft_ms`
        the model's P99 target."""
        allowed = [r for r in consumer.spill_regions if r != consumer.service_region]
        candidates = [r for r in allowed if r in self.links and may_serve_in(consumer, r)
                      and model in self.served.get(r, frozenset()) and base_model in self.served.get(r, frozenset())]
        if not allowed:
            return self._count(Decision(None, "residency: the consumer allows no other region"))
        if not candidates:
            return self._count(Decision(None, "not_served: no allowed region serves the model"))
        if hop > 0:
            return self._count(Decision(None, "hop: a forwarded request is not forwarded again"))
        ratio = local_ttft_ms / slo_ttft_ms
        if base_model in self._spilling:
            if ratio < LEAVE_RATIO:
                self._spilling.discard(base_model)
        elif ratio > ENTER_RATIO:
            self._spilling.add(base_model)
        if base_model not in self._spilling:
            return self._count(Decision(None, "within_slo: local admission keeps the SLO", local_ttft_ms))
        now = self.clock()
        best: tuple[float, RegionLink] | None = None
        why = "no_headroom: no allowed region advertises headroom"
        for region in candidates:
            link = self.links[region]
            if link.breaker.state == "open":
                why = "breaker_open: the allowed regions' breakers are open"
                continue
            fresh = link.headroom is not None and now - link.fetched_at <= HEADROOM_MAX_AGE_S
            room = link.headroom.models.get(base_model) if fresh and link.headroom is not None else None
            if room is None or room.free - link.spent <= 0 or (link.headroom is not None and link.headroom.draining):
                continue
            remote = room.predicted_ttft_ms + (link.rtt_ms or 0.0)
            if remote >= local_ttft_ms:
                why = "slower: the remote prediction plus the round trip does not beat waiting here"
                continue
            if best is None or remote < best[0]:
                best = (remote, link)
        if best is None:
            return self._count(Decision(None, why, local_ttft_ms))
        remote_ms, link = best
        if not link.breaker.allow():
            return self._count(Decision(None, "breaker_probe_out: the half-open probe is in flight", local_ttft_ms))
        link.spent += 1
        return self._count(Decision(link.region, "spill", local_ttft_ms, remote_ms))

    def stale(self) -> list[RegionLink]:
        """Links whose headroom is older than HEADROOM_TTL_S and not being fetched (the caller fetches them)."""
        now = self.clock()
        return [link for link in self.links.values() if not link.fetching and now - link.attempted_at > HEADROOM_TTL_S]


async def fetch_headroom(link: RegionLink, get: Callable[[tuple[str, int]], Awaitable[bytes]],
                         clock: Callable[[], float] = time.monotonic) -> None:
    """Refresh one link's headroom with `get` (an HTTP GET of HEADROOM_PATH); its duration is the round trip.

    A failed fetch counts against the breaker only while closed (an open one waits for its probe) and leaves
    the old answer to age out."""
    link.fetching = True
    started = link.attempted_at = clock()
    try:
        raw = await asyncio.wait_for(get(link.address), HEADROOM_TIMEOUT_S)
        headroom = Headroom.from_json(json.loads(raw))
    except (TimeoutError, OSError, ValueError, KeyError, TypeError):
        if link.breaker.state == "closed":
            link.breaker.failure()
        return
    finally:
        link.fetching = False
    rtt = (clock() - started) * 1000
    link.rtt_ms = rtt if link.rtt_ms is None else link.rtt_ms + EWMA * (rtt - link.rtt_ms)
    link.headroom, link.fetched_at, link.spent = headroom, clock(), 0


def choose_peer(links: Sequence[RegionLink], model: str, local_ttft_ms: float,
                clock: Callable[[], float] = time.monotonic) -> RegionLink | None:
    """The peer instance of this region a request that would queue here goes to instead, or None (issue 36,
    section 1): among peers whose fresh headroom answer offers room for `model` (the answer's budget not yet
    spent), whose breaker lets it through and whose predicted TTFT plus round trip beats waiting here, the
    cheapest pool per request it holds at once (the instance price over its capacity: Spot and the larger
    instance first), then the most free room normalized by capacity (a small instance's one free slot is less
    room than a large one's), then the fastest."""
    now = clock()
    best: tuple[tuple[float, float, float], RegionLink] | None = None
    for link in links:
        if link.breaker.state == "open" or link.headroom is None or now - link.fetched_at > HEADROOM_MAX_AGE_S:
            continue
        room = link.headroom.models.get(model)
        if room is None or room.capacity <= 0 or link.headroom.draining or room.peer_free - link.spent <= 0:
            continue
        remote = room.predicted_ttft_ms + (link.rtt_ms or 0.0)
        if remote >= local_ttft_ms:
            continue
        key = (link.price / room.capacity, -(room.peer_free - link.spent) / room.capacity, remote)
        if best is None or key < best[0]:
            best = (key, link)
    if best is None or not best[1].breaker.allow():
        return None
    best[1].spent += 1
    return best[1]


async def http_get(address: tuple[str, int], path: str = HEADROOM_PATH, preamble: bytes = b"") -> bytes:
    """GET `path` from a peer gateway on a fresh connection (the headroom answer is small and once a second);
    the body of a 200, else ValueError. `preamble`: what the connection starts with (a PROXY v2 header)."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(preamble + f"GET {path} HTTP/1.1\r\nHost: {address[0]}\r\nConnection: close\r\n\r\n".encode())
        raw = await reader.read()
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
        raise ValueError(f"headroom answered {head[:40]!r}")
    return body


@dataclass(frozen=True)
class SpillSetup:
    """What a gateway needs to spill (home side) and to accept forwarded requests (receiving side)."""

    region: str  # this gateway's region
    key: bytes  # the fleet's peer key (peer.py)
    provider_account: str  # the owner of the spill endpoints: a connection from its endpoint may carry a claim
    consumers: Mapping[str, Any]  # every consumer of the fleet by name (config Consumer: spill_regions, ...)
    slo_ttft_ms: Mapping[str, float]  # model or adapter id -> its P99 TTFT target
    policy: SpillPolicy | None = None  # None: no consumer served here may spill
    peers: frozenset[str] = frozenset()  # addresses of peer instances whose direct connections may carry a claim
    peer_links: Mapping[str, RegionLink] = field(default_factory=dict)  # peer instances to balance onto
    head_timeout_s: float = 2.0  # a spilled request's response head must come within this, else it is served here
