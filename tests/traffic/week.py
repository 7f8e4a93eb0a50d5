"""Simulated days of production traffic, sent through the real gateway on loopback in compressed time.

Two consumers of the test fleet (tests/gateway/conftest.py), two length mixes:
- voice-app: diurnal (a daily sine, busiest mid-day UTC), streaming, short prompts and short answers;
- analytics: a low background plus bursts (a batch job landing within a few minutes), non-streaming,
  long prompts and long answers.
Every arrival has a (virtual) minute of the week. The gateway's clock is injected: before each
minute's requests are sent the clock is set to that minute, so every record is stamped where its
request "arrived", while the requests themselves run as fast as loopback allows (a week in seconds).
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from tests.gateway.conftest import ANALYTICS_VPCE, VOICE_VPCE
from tests.gateway.fakes import Client

# Two days: every claim of tests/traffic/test_export.py is per hour (arrivals, per-minute burstiness, lengths) or
# per UTC hour of the day over the days (the busiest day's rate), and two days already make that a maximum over
# days: for seed 16, whichever of the 24 hours the window starts at, each day is the busier one in some hours of
# the day (taking the first day, the last or the mean fails) and some hours carry an analytics burst. A week sent
# 3.4x the requests and asked moto 3.4x the hours, each over 3.4x the stored data, to prove the same.
DAYS = 2
HOURS = DAYS * 24
# The limiters run on real time, the week on virtual time: limits wide enough that compressing a week
# into seconds throttles nothing (throttling is tested in tests/gateway/test_limits.py).
WIDE_LIMITS = {"max_concurrency": 1000, "requests_per_minute": 10_000_000}


@dataclass(frozen=True)
class Arrival:
    minute: int  # minute of the week, from the window's start
    consumer: str
    prompt_words: int
    max_tokens: int
    stream: bool


@dataclass
class Week:
    start: datetime  # an hour boundary, UTC
    arrivals: list[Arrival]
    sent: list[Arrival] = field(default_factory=list)

    def per_hour(self, consumer: str | None = None) -> list[int]:
        out = [0] * HOURS
        for a in self.arrivals:
            if consumer is None or a.consumer == consumer:
                out[a.minute // 60] += 1
        return out

    def minutes(self, hour: int) -> list[int]:
        out = [0] * 60
        for a in self.arrivals:
            if a.minute // 60 == hour:
                out[a.minute % 60] += 1
        return out


def simulate(start: datetime, seed: int = 16, scale: float = 1.0, analytics_tokens: tuple[int, int] = (200, 900)) -> Week:
    """Arrivals for DAYS days from `start`: `scale` multiplies every rate (2.0 = the traffic doubled)."""
    rng = random.Random(seed)
    arrivals: list[Arrival] = []
    for hour in range(HOURS):
        utc_hour = (start + timedelta(hours=hour)).hour
        # voice-app: diurnal, 4..30 requests an hour, arrivals spread over the hour.
        rate = 4 + 26 * max(0.0, math.sin(math.pi * (utc_hour - 4) / 16)) if 4 <= utc_hour < 20 else 4
        for _ in range(_poisson(rng, rate * scale)):
            arrivals.append(Arrival(hour * 60 + rng.randrange(60), "voice-app", rng.randint(20, 200),
                                    rng.randint(4, 48), True))
        # analytics: ~2 an hour, and a burst of 15..35 within 3 minutes in one hour out of six.
        n = _poisson(rng, 2 * scale)
        minutes = [rng.randrange(60) for _ in range(n)]
        if rng.random() < 1 / 6:
            first = rng.randrange(57)
            minutes += [first + rng.randrange(3) for _ in range(int(rng.randint(15, 35) * scale))]
        lo, hi = analytics_tokens
        for m in minutes:
            arrivals.append(Arrival(hour * 60 + m, "analytics", rng.randint(600, 3000), rng.randint(lo, hi), False))
    arrivals.sort(key=lambda a: a.minute)
    return Week(start, arrivals)


def _poisson(rng: random.Random, lam: float) -> int:
    # Knuth's method; lam stays small here.
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


async def send_week(week: Week, gateway, port: int, per_consumer: int = 8) -> None:
    """Send every arrival through the gateway, minute by minute, with the gateway's clock at that minute."""
    vpce = {"voice-app": VOICE_VPCE, "analytics": ANALYTICS_VPCE}
    pools = {name: asyncio.Queue() for name in vpce}
    clients = []
    for name, endpoint in vpce.items():
        for _ in range(per_consumer):  # kept-alive connections, as SDK clients keep them
            c = await Client(port, endpoint).connect()
            clients.append(c)
            pools[name].put_nowait(c)
    virtual = [week.start.timestamp()]
    gateway.clock = lambda: virtual[0]

    async def one(a: Arrival) -> None:
        client = await pools[a.consumer].get()
        try:
            body = {"model": "gpt2-xl", "prompt": " ".join(["w"] * a.prompt_words), "max_tokens": a.max_tokens,
                    "stream": a.stream}
            reply = await client.request("POST", "/v1/completions", body)
            assert reply.status == 200, (reply.status, reply.body[:200])
            week.sent.append(a)
        finally:
            pools[a.consumer].put_nowait(client)

    try:
        i = 0
        while i < len(week.arrivals):
            minute = week.arrivals[i].minute
            j = i
            while j < len(week.arrivals) and week.arrivals[j].minute == minute:
                j += 1
            # A second into the minute: a record's minute is where its request arrived.
            virtual[0] = week.start.timestamp() + minute * 60 + 1
            await asyncio.gather(*(one(a) for a in week.arrivals[i:j]))
            i = j
    finally:
        for c in clients:
            await c.close()
