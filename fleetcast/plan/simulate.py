"""Discrete-event simulation of a pool: requests arrive per the traffic profile, the NLB
spreads them at random over the routable instances, and each instance batches
continuously following the candidate's measured curve (queueing.ServiceModel).

Per instance, every step advances each decoding request by one token and takes the
curve's mean ITL at the current batch (requests prefilling count in the batch); a
request's TTFT is drawn at the batch it joins, its ITL multiplier too. Batch sizes
change at every arrival, first token and completion, so an instance keeps a token
clock (steps done per decoding slot) and each decoding request finishes when that
clock reaches its own end: O(log n) per event however many requests are in flight.
An instance holds at most the highest measured concurrency; arrivals beyond it
wait in its queue (counted as out of the measured range).

Bounded and deterministic: a seed, a fixed horizon, no wall clock. The same
simulator runs `fleetcast plan simulate` (checking the planner's sizing) and
`make bench-scaling` (an Auto Scaling group driving it, scripts/bench_scaling.py).
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .queueing import MAX_OUT_OF_RANGE, Limits, Prediction, ServiceModel

if TYPE_CHECKING:
    from .solver import PlanContext, PlannedPool

# One stream of arrivals a pool serves: (hourly rps, hourly burstiness, output tokens: a mean or {tokens: share}).
Member = tuple[list[float], list[float], Any]
_Tables = tuple[list[float], list[tuple[float, float, float, float]]]

# Event kinds.
_DONE, _FIRST, _READY, _TICK = 0, 1, 2, 3
_TWOPI = math.tau  # Random.gauss's TWOPI (random.py: from math import tau as TWOPI)


# A finished request as the event loop writes it: (arrival_s, ttft_ms, itl_ms, done_s, stream, queued, ok), a tuple
# made in C (a Record per request cost the loop a Python call each); FleetSim.records gives them as Records.
Row = tuple[float, float, float | None, float, int, bool, bool]


@dataclass(slots=True)
class Record:
    arrival_s: float
    ttft_ms: float
    itl_ms: float | None
    done_s: float
    stream: int
    queued: bool
    ok: bool = True


class _Instance:
    __slots__ = ("idx", "routable", "draining", "active", "queue", "phi", "t_u", "decoding", "version", "born_s",
                 "gone_s", "anchor_t", "anchor_seq", "deferred")

    def __init__(self, idx: int, born_s: float) -> None:
        self.idx = idx
        self.routable = False
        self.draining = False
        self.active = 0
        self.queue: deque[list[Any]] = deque()
        self.phi = 0.0  # steps done per decoding slot (the token clock)
        self.t_u = 0.0  # ms, when phi was last brought up to date
        self.decoding: list[tuple[float, int, list[Any]]] = []  # heap of (end phi, seq, request)
        self.version = 0
        self.born_s = born_s
        self.gone_s: float | None = None
        # Completion events (FleetSim._reschedule): the earliest of this instance's in the event heap that is known
        # (its time and seq; seq 0: none known), and the current one while it waits behind that one to be pushed.
        self.anchor_t = math.inf
        self.anchor_seq = 0
        self.deferred: tuple[Any, ...] | None = None


@dataclass(slots=True)
class Arrival:
    t_s: float
    stream: int
    output_tokens: int


@dataclass
class FleetSim:
    """One pool of identical instances fed by a list of arrivals."""

    model: ServiceModel
    seed: int = 0
    cap: int | None = None

    def __post_init__(self) -> None:
        self.rows: list[Row] = []  # every finished request, in the order they finished
        self._records: list[Record] = []
        self.rng = random.Random(self.seed)
        self.cap = int(self.cap or self.model.top)
        self.instances: list[_Instance] = []
        self._events: list[tuple[Any, ...]] = []
        self._seq = 0
        self.now_ms = 0.0
        self._area = 0.0  # integral of requests in flight on routable instances, request-ms
        self._area_t = 0.0
        self._in_flight = 0
        self.unrouted = 0
        self._tab: _Tables | None = None  # per-batch service tables, built by the first run()

    @property
    def records(self) -> list[Record]:
        """The rows as Records (made as they are first read, each once)."""
        done = self._records
        if len(done) < len(self.rows):
            done.extend(Record(*row) for row in self.rows[len(done):])
        return done

    # -- fleet changes (the Auto Scaling side calls these) --

    def launch(self, ready_in_s: float) -> _Instance:
        inst = _Instance(len(self.instances), self.now_ms / 1000.0)
        self.instances.append(inst)
        self._push(self.now_ms + ready_in_s * 1000.0, _READY, inst, None)
        return inst

    def start(self, n: int) -> None:
        """n instances routable at once (the fleet as the plan sized it)."""
        for _ in range(n):
            inst = _Instance(len(self.instances), self.now_ms / 1000.0)
            inst.routable = True
            inst.t_u = self.now_ms
            self.instances.append(inst)

    def drain_one(self) -> bool:
        """Stop routing to the least-loaded routable instance; it leaves when its requests finish."""
        live = [i for i in self.instances if i.routable]
        if len(live) <= 1:
            return False
        inst = min(live, key=lambda i: (i.active + len(i.queue), -i.idx))
        inst.routable = False
        inst.draining = True
        if inst.active == 0:
            inst.gone_s = self.now_ms / 1000.0
        return True

    def cancel_pending(self) -> bool:
        """Give back a launched instance that is not yet routable (newest first)."""
        for inst in reversed(self.instances):
            if not inst.routable and not inst.draining and inst.gone_s is None:
                inst.gone_s = self.now_ms / 1000.0
                return True
        return False

    @property
    def routable(self) -> list[_Instance]:
        return [i for i in self.instances if i.routable]

    @property
    def pending(self) -> int:
        return sum(1 for i in self.instances if not i.routable and not i.draining and i.gone_s is None)

    def billed_instances(self) -> int:
        return sum(1 for i in self.instances if i.gone_s is None)

    def instance_seconds(self, until_s: float) -> float:
        return sum((i.gone_s if i.gone_s is not None else until_s) - i.born_s for i in self.instances)

    def take_load_area(self) -> float:
        """Request-ms in flight since the last call (for the per-instance load metric)."""
        self._account(self.now_ms)
        area, self._area = self._area, 0.0
        return area

    # -- the event loop --
    #
    # The loop below is the simulator's hot path (a few microseconds per request): the per-batch service figures
    # are read from tables built once per simulation (the same ServiceModel values, indexed by the integer batch),
    # and the handlers (arrive, admit, first token, complete, finish, reschedule) are inlined with their state in
    # locals; so are Random.choice and Random.gauss (the same calls into the generator, the same arithmetic), and the
    # sim's own counters, written back before a tick or a rare handler (_admit from a queue, _finish of a one-token
    # request) reads them. Every random draw and every floating-point operation happens in the same order as in the
    # plain version of this loop, so the results are identical to the bit (pinned in
    # tests/plan/test_sizing_from_arrivals.py).
    #
    # Completions: every change of an instance's batch moves its next completion, so each one schedules a new
    # completion event (its own time and seq) and the previous one goes stale. An event that is scheduled behind
    # one of the same instance already in the heap (`anchor`) is held on the instance (`deferred`) and pushed only
    # when the anchor pops, before its own time; most are superseded before then and never enter the heap. The
    # heap's live events and their (time, seq) keys are the same as if every one were pushed at once, so they pop
    # in the same order.

    def _tables(self) -> _Tables:
        """Per integer batch 0..cap: the step (ms), and the TTFT and ITL-factor lognormals as (mu, sigma, mu,
        sigma)."""
        if self._tab is None:
            m = self.model
            levels = range(int(self.cap or 0) + 1)
            self._tab = ([m.step_ms(b) for b in levels],
                         [(m.ttft(b).mu, m.ttft(b).sigma, m.itl_factor(b).mu, m.itl_factor(b).sigma) for b in levels])
        return self._tab

    def run(self, arrivals: list[Arrival], until_s: float, tick_s: float | None = None,
            on_tick: Callable[[FleetSim, float], None] | None = None) -> None:
        """Serve `arrivals` (sorted by time) until `until_s`; call on_tick(sim, t_s) every tick_s."""
        if tick_s:
            self._push(tick_s * 1000.0, _TICK, None, None)
        steps, draws = self._tables()
        events = self._events
        heappush, heappop = heapq.heappush, heapq.heappop
        exp, log, sqrt, cos, sin = math.exp, math.log, math.sqrt, math.cos, math.sin
        rng = self.rng
        rand, getrandbits = rng.random, rng.getrandbits
        rows = self.rows
        inf = math.inf
        cap = int(self.cap or 0)
        k, n = 0, len(arrivals)
        until_ms = until_s * 1000.0
        next_arrival = arrivals[0].t_s * 1000.0 if n else inf
        # The simulation's running state, in locals; written back (_sync) before anything else reads it.
        area, area_t, in_flight, seq, gauss_next = self._got()
        live: list[_Instance] | None = None
        n_live = bits = 0
        t = self.now_ms
        while True:
            if events and events[0][0] <= next_arrival:
                t = events[0][0]
                if t > until_ms:
                    break
                _, ev_seq, kind, inst, req, version = heappop(events)
                if kind == _DONE:
                    if ev_seq == inst.anchor_seq:
                        inst.anchor_seq = 0
                        d = inst.deferred
                        if d is not None:  # the completion waiting behind this one: due after it
                            inst.deferred = None
                            heappush(events, d)
                            inst.anchor_t, inst.anchor_seq = d[0], d[1]
                    if version != inst.version:
                        continue
                    # complete: advance the token clock, finish the request at the head of the decoding heap.
                    if t > inst.t_u:  # decoding is non-empty: this request is in it
                        inst.phi += (t - inst.t_u) / steps[inst.active]
                    inst.t_u = t
                    req = heappop(inst.decoding)[2]
                    # finish
                    area += in_flight * (t - area_t)
                    area_t = t
                    a = req[0]
                    inst.active -= 1
                    in_flight -= 1
                    rows.append((a.t_s, req[1] - a.t_s * 1000.0, (t - req[1]) / (a.output_tokens - 1), t / 1000.0,
                                 a.stream, req[3], True))  # decoding: output_tokens > 1
                    if inst.queue:
                        self._put(area, area_t, in_flight, seq, gauss_next)
                        self._admit(inst, inst.queue.popleft(), t)
                        area, area_t, in_flight, seq, gauss_next = self._got()
                    elif inst.draining and inst.active == 0:
                        inst.gone_s = t / 1000.0
                elif kind == _FIRST:
                    if inst.decoding and t > inst.t_u:
                        inst.phi += (t - inst.t_u) / steps[inst.active]
                    inst.t_u = t
                    req[1] = t
                    out = req[0].output_tokens
                    if out <= 1:
                        self._put(area, area_t, in_flight, seq, gauss_next)
                        self._finish(inst, t, req)
                        area, area_t, in_flight, seq, gauss_next = self._got()
                    else:
                        seq += 1
                        heappush(inst.decoding, (inst.phi + (out - 1) * req[2], seq, req))
                elif kind == _READY:
                    if inst.gone_s is None and not inst.draining:
                        area += in_flight * (t - area_t)
                        area_t = t
                        live = None
                        inst.routable = True
                        inst.t_u = t
                    continue
                else:  # _TICK: the callback sees (and may change) the fleet as it is now
                    assert on_tick is not None and tick_s is not None  # a tick is pushed only with both
                    self.now_ms = t
                    self._put(area, area_t, in_flight, seq, gauss_next)
                    on_tick(self, t / 1000.0)
                    self._push(t + tick_s * 1000.0, _TICK, None, None)
                    area, area_t, in_flight, seq, gauss_next = self._got()
                    live = None
                    continue
            else:
                t = next_arrival
                if t > until_ms or t == inf:
                    break
                a = arrivals[k]
                k += 1
                next_arrival = arrivals[k].t_s * 1000.0 if k < n else inf
                # arrive: the NLB picks a routable instance at random
                if live is None:
                    live = [i for i in self.instances if i.routable]
                    n_live = len(live)
                    bits = n_live.bit_length()
                if not n_live:
                    self.unrouted += 1
                    rows.append((a.t_s, inf, None, a.t_s, a.stream, False, False))
                    continue
                # rng.choice(live), inlined: Random._randbelow's draw (getrandbits(k) until below len(live))
                r = getrandbits(bits)
                while r >= n_live:
                    r = getrandbits(bits)
                inst = live[r]
                req = [a, 0.0, 0.0, False]  # arrival, first-token ms, ITL factor, queued
                if inst.active >= cap:
                    req[3] = True
                    inst.queue.append(req)
                    continue
                # admit (as _admit; its reschedule follows below)
                area += in_flight * (t - area_t)
                area_t = t
                if inst.decoding and t > inst.t_u:
                    inst.phi += (t - inst.t_u) / steps[inst.active]
                inst.t_u = t
                inst.active = b = inst.active + 1
                in_flight += 1
                # The TTFT and the ITL factor at the batch it joins: LogNormal.sample's exp(mu + sigma * rng.gauss(0.0,
                # 1.0)) for each. Both lognormals spread and no Box-Muller value kept from a previous draw: the two
                # draws are the two values of one pair, as Random.gauss makes them (random.py), inlined.
                mu, sigma, mu2, sigma2 = draws[b]
                if sigma and sigma2 and gauss_next is None:
                    x2pi = rand() * _TWOPI
                    g2rad = sqrt(-2.0 * log(1.0 - rand()))
                    ttft = exp(mu + sigma * (cos(x2pi) * g2rad))
                    req[2] = exp(mu2 + sigma2 * (sin(x2pi) * g2rad))
                else:  # a degenerate lognormal (no draw) or an odd number of draws before: the generator's own calls
                    self._put(area, area_t, in_flight, seq, gauss_next)
                    ttft = self.model.ttft(b).sample(rng)
                    req[2] = self.model.itl_factor(b).sample(rng)
                    area, area_t, in_flight, seq, gauss_next = self._got()
                seq += 1
                heappush(events, (t + ttft, seq, _FIRST, inst, req, 0))
            # reschedule (as _reschedule): the next completion at the current batch (every path here changed it)
            inst.version += 1
            if inst.decoding:
                left = inst.decoding[0][0] - inst.phi
                when = t + (0.0 if left < 0.0 else left) * steps[inst.active]  # max(left, 0.0), inlined
                seq += 1
                if inst.anchor_seq and inst.anchor_t <= when:
                    inst.deferred = (when, seq, _DONE, inst, None, inst.version)
                else:
                    heappush(events, (when, seq, _DONE, inst, None, inst.version))
                    inst.anchor_t, inst.anchor_seq, inst.deferred = when, seq, None
            else:
                inst.deferred = None
        self._put(area, area_t, in_flight, seq, gauss_next)
        self.now_ms = until_ms

    def _got(self) -> tuple[float, float, int, int, float | None]:
        """The loop's running state: the load integral and its time, requests in flight, the event seq, and the
        second value of the generator's last Box-Muller pair (random.Random keeps it in gauss_next)."""
        return self._area, self._area_t, self._in_flight, self._seq, cast(Any, self.rng).gauss_next

    def _put(self, area: float, area_t: float, in_flight: int, seq: int, gauss_next: float | None) -> None:
        self._area, self._area_t, self._in_flight, self._seq = area, area_t, in_flight, seq
        cast(Any, self.rng).gauss_next = gauss_next

    def _push(self, t: float, kind: int, inst: _Instance | None, payload: Any, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, inst, payload, version))

    def _account(self, t: float) -> None:
        self._area += self._in_flight * (t - self._area_t)
        self._area_t = t

    def _reschedule(self, inst: _Instance, t: float) -> None:
        """Schedule inst's next completion at its current batch (the previous one goes stale): pushed now, or held
        on the instance while an earlier completion event of it is in the heap (see the loop's comment)."""
        inst.version += 1
        if inst.decoding:
            when = t + max(inst.decoding[0][0] - inst.phi, 0.0) * self._tables()[0][inst.active]
            self._seq += 1
            if inst.anchor_seq and inst.anchor_t <= when:
                inst.deferred = (when, self._seq, _DONE, inst, None, inst.version)
            else:
                heapq.heappush(self._events, (when, self._seq, _DONE, inst, None, inst.version))
                inst.anchor_t, inst.anchor_seq, inst.deferred = when, self._seq, None
        else:
            inst.deferred = None

    def _admit(self, inst: _Instance, req: list[Any], t: float) -> None:
        """A request joins inst's batch: its TTFT and ITL factor drawn at the batch it joins."""
        self._account(t)
        if inst.decoding and t > inst.t_u:
            inst.phi += (t - inst.t_u) / self._tables()[0][inst.active]
        inst.t_u = t
        inst.active += 1
        self._in_flight += 1
        b = inst.active
        ttft = self.model.ttft(b).sample(self.rng)
        req[2] = self.model.itl_factor(b).sample(self.rng)
        self._push(t + ttft, _FIRST, inst, req)
        self._reschedule(inst, t)

    def _finish(self, inst: _Instance, t: float, req: list[Any]) -> None:
        """A request leaves inst: its record; the next queued request takes its place."""
        self._account(t)
        a: Arrival = req[0]
        inst.active -= 1
        self._in_flight -= 1
        itl = (t - req[1]) / (a.output_tokens - 1) if a.output_tokens > 1 else None
        self.rows.append((a.t_s, req[1] - a.t_s * 1000.0, itl, t / 1000.0, a.stream, req[3], True))
        if inst.queue:
            self._admit(inst, inst.queue.popleft(), t)
        elif inst.draining and inst.active == 0:
            inst.gone_s = t / 1000.0


# ---------------------------------------------------------------- arrivals

BURST_MINUTES = 3  # the busiest minutes of an hour: consecutive, at `burstiness` x the hour's mean


def length_sampler(spec: float | dict[str, float], rng: random.Random) -> Callable[[], int]:
    """Output tokens per request: a fixed mean, or drawn from {tokens: share}."""
    if not isinstance(spec, dict):
        n = max(1, round(float(spec)))
        return lambda: n
    tokens = [int(k) for k in spec]
    cum, acc = [], 0.0
    for k in spec:
        acc += spec[k]
        cum.append(acc)

    def draw() -> int:
        u = rng.random() * acc
        for tok, c in zip(tokens, cum):
            if u <= c:
                return tok
        return tokens[-1]
    return draw


def poisson_arrivals(rates_per_minute: list[float], stream: int, start_s: float, draw_tokens: Callable[[], int],
                     rng: random.Random) -> list[Arrival]:
    """A Poisson process whose rate is constant within each minute."""
    out: list[Arrival] = []
    for m, rate in enumerate(rates_per_minute):
        if rate <= 0:
            continue
        t, end = start_s + m * 60.0, start_s + (m + 1) * 60.0
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                break
            out.append(Arrival(t, stream, draw_tokens()))
    return out


def p99(values: list[float]) -> float:
    """Nearest-rank P99 (the bench's and CloudWatch's reading of a percentile over raw values)."""
    if not values:
        return math.nan
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, math.ceil(0.99 * len(xs)) - 1))]


# ---------------------------------------------------------------- the planner's sizing, checked

AGREEMENT = 0.10  # the planner and the simulation agree within 10% (instance counts: or one instance)
WARMUP_S = 30.0  # steady state is reached within a few request lifetimes (about a second)


@dataclass
class WindowStats:
    requests: int
    ttft_p99_ms: float  # in-region (network not included)
    itl_p99_ms: float
    queued_share: float
    error_share: float
    worst_minute_ttft_ms: float


MIN_REQUESTS = 20_000  # a P99 over fewer is too noisy to check to 10% (about 200 values above it here)
MAX_MINUTES = 30


def busiest_minutes(model: ServiceModel, streams: list[tuple[float, float | dict[str, float]]], n: int,
                    seed: int, minutes: int = BURST_MINUTES) -> WindowStats:
    """Serve `minutes` of arrivals at the given rates (requests/s, output-token spec per stream) on n instances,
    after a warm-up at the same rates; statistics over the arrivals after the warm-up. A quiet hour's busiest
    minute is held longer (up to MAX_MINUTES) until MIN_REQUESTS arrive: the planner predicts the steady state
    at that rate, and a P99 over a few thousand requests could not tell 10% apart."""
    return _serve_window(model, _window_arrivals(streams, seed, minutes), n, seed)


def _window_arrivals(streams: list[tuple[float, float | dict[str, float]]], seed: int,
                     minutes: int = BURST_MINUTES) -> tuple[list[Arrival], float]:
    """busiest_minutes' arrivals and horizon: drawn from `seed` alone, so the same for every instance count, and for
    every candidate checked on the same traffic (`plan simulate` checks the plan's pools, then any --candidate, on
    the same members' hours): the last few windows drawn are kept. The simulation reads them, never changes them."""
    key = tuple((rate, tuple(out.items()) if isinstance(out, dict) else out) for rate, out in streams)
    return _drawn_window(key, seed, minutes)


@functools.lru_cache(maxsize=4)
def _drawn_window(key: tuple[tuple[float, Any], ...], seed: int, minutes: int) -> tuple[list[Arrival], float]:
    streams = [(rate, dict(out) if isinstance(out, tuple) else out) for rate, out in key]
    total = sum(rate for rate, _ in streams)
    if total > 0:
        minutes = max(minutes, min(MAX_MINUTES, math.ceil(MIN_REQUESTS / (total * 60.0))))
    rng = random.Random(seed)
    arrivals: list[Arrival] = []
    horizon = WARMUP_S + minutes * 60.0
    for idx, (rate, out_spec) in enumerate(streams):
        draw = length_sampler(out_spec, rng)
        t = 0.0
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= horizon:
                break
            arrivals.append(Arrival(t, idx, draw()))
    arrivals.sort(key=lambda a: a.t_s)
    return arrivals, horizon


def _serve_window(model: ServiceModel, window: tuple[list[Arrival], float], n: int, seed: int,
                  give_up: bool = False) -> WindowStats:
    """busiest_minutes on arrivals already drawn (the simulation reads them, never changes them). `give_up`: for a
    caller that reads only whether the window meets the limits (check_sizing's search for the fewest instances): the
    simulation stops once more requests have waited than MAX_OUT_OF_RANGE of the window's, which then fails whatever
    follows; the figures are of the requests finished by then, the queued share a lower bound above the limit."""
    arrivals, horizon = window
    sim = FleetSim(model, seed=seed + 1)
    sim.start(n)
    queued_past_limit = None
    if give_up:
        queued_past_limit = _run_until_queued_past_limit(sim, arrivals, horizon + 600.0)
    else:
        sim.run(arrivals, until_s=horizon + 600.0)
    # The rows (Row: arrival_s, ttft_ms, itl_ms, done_s, stream, queued, ok), read by index: 80,000 and more.
    kept = [r for r in sim.rows if r[0] >= WARMUP_S]
    ok = [r for r in kept if r[6]]
    per_minute: dict[int, list[float]] = {}
    for r in ok:
        per_minute.setdefault(int((r[0] - WARMUP_S) // 60), []).append(r[1])
    return WindowStats(
        requests=len(kept),
        ttft_p99_ms=p99([r[1] for r in ok]),
        itl_p99_ms=p99([r[2] for r in ok if r[2] is not None]),
        queued_share=queued_past_limit if queued_past_limit is not None else
        sum(1 for r in kept if r[5]) / max(len(kept), 1),
        error_share=1 - len(ok) / max(len(kept), 1),
        worst_minute_ttft_ms=max((p99(v) for v in per_minute.values()), default=math.nan),
    )


def _run_until_queued_past_limit(sim: FleetSim, arrivals: list[Arrival], until_s: float) -> float | None:
    """sim.run(arrivals, until_s=until_s), a minute of arrivals at a time after the warm-up, stopping once the requests
    that arrived after it and waited for a batch slot are more than MAX_OUT_OF_RANGE of all that arrive after it: the
    window's queued share (of those that finish, fewer) is then above the limit, whatever follows. Returns that share
    of all arrivals then (None: it ran to the end, the same run as in one piece). Each piece ends at a minute's end,
    the next starts with the first arrival after it: run() takes events before arrivals at the same time, and each
    piece hands the next its state (events, instances, the generator), so the pieces make the one run's rows."""
    after = len(arrivals) - bisect.bisect_left(arrivals, WARMUP_S, key=lambda a: a.t_s)
    limit = MAX_OUT_OF_RANGE * after
    queued = seen = start = 0
    end_s = WARMUP_S
    while end_s < until_s:
        end_s = min(end_s + 60.0, until_s)
        stop = bisect.bisect_right(arrivals, end_s * 1000.0, lo=start, key=lambda a: a.t_s * 1000.0)
        sim.run(arrivals[start:stop], until_s=end_s)
        start = stop
        rows = sim.rows
        queued += sum(1 for r in rows[seen:] if r[5] and r[0] >= WARMUP_S)
        seen = len(rows)
        if queued > limit:
            return queued / after
    return None


def meets(stats: WindowStats, limits: Limits) -> bool:
    """The planner's rule (queueing.Limits), read off the simulation."""
    return (stats.ttft_p99_ms <= limits.ttft_ms and stats.itl_p99_ms <= limits.itl_ms
            and stats.error_share <= limits.error_rate and stats.queued_share <= MAX_OUT_OF_RANGE)


@dataclass
class HourCheck:
    hours: list[int]
    rate_rps: float  # at the busiest minute, all members together
    planned_n: int  # what the SLOs need, by the planner
    fleet_n: int  # what the plan runs (capacity floor included): the P99s are at this count
    sim_n: int | None
    planned_ttft_ms: float  # network of the farthest member included
    sim_ttft_ms: float
    planned_itl_ms: float
    sim_itl_ms: float
    requests: int
    sim_queued: float
    network_ms: float
    slo_met: bool = True  # the simulated P99 TTFT (network included) and ITL at the planned count within the SLOs

    @staticmethod
    def _close(a: float, b: float) -> bool:
        return abs(a - b) <= AGREEMENT * max(abs(b), 1e-9)

    @property
    def count_agrees(self) -> bool:
        return self.sim_n is not None and abs(self.planned_n - self.sim_n) <= max(1, AGREEMENT * self.sim_n)

    @property
    def agrees(self) -> bool:
        return self.count_agrees and self._close(self.planned_ttft_ms, self.sim_ttft_ms) and \
            self._close(self.planned_itl_ms, self.sim_itl_ms)


def check_sizing(model: ServiceModel, members: list[Member], limits: Limits, planned: list[int], needed: list[int],
                 predictions: list[Prediction | None],
                 network_ms: float, seed: int, max_groups: int | None = None) -> list[HourCheck]:
    """members: [(hourly rps, hourly burstiness, output-token spec)] sharing one pool. One check per distinct hour
    (rates and burstiness of every member), at that hour's busiest minutes: the P99s at the planned count (the
    floor included), and the fewest instances meeting the SLOs in the simulation against the planner's (before
    any floor)."""
    groups: dict[tuple[tuple[float, float], ...], list[int]] = {}
    for h in range(24):
        key = tuple((round(m[0][h], 6), round(m[1][h], 6)) for m in members)
        if any(r > 0 for r, _ in key) and predictions[h] is not None:
            groups.setdefault(key, []).append(h)
    ordered = sorted(groups.items(), key=lambda kv: -sum(r * b for r, b in kv[0]))
    if max_groups is not None:
        ordered = ordered[:max_groups]
    out = []
    for g, (key, hours) in enumerate(ordered):
        streams = [(r * b, m[2]) for (r, b), m in zip(key, members)]
        h = hours[0]
        sub_seed = seed * 1000 + g
        window = _window_arrivals(streams, sub_seed)  # busiest_minutes(model, streams, k, sub_seed) for each k
        at_plan = _serve_window(model, window, planned[h], sub_seed)
        cache = {planned[h]: at_plan}
        n = max(needed[h], 1)

        def passes(k: int) -> bool:
            if k not in cache:  # noqa: B023 - called only within this iteration
                cache[k] = _serve_window(model, window, k, sub_seed, give_up=True)  # noqa: B023 - called only within this iteration
            return meets(cache[k], limits)  # noqa: B023 - called only within this iteration
        bound = max(3, n // 2)
        sim_n = None
        if passes(n):
            k = n
            while k > 1 and k > n - bound and passes(k - 1):
                k -= 1
            sim_n = k
        else:
            k = n
            while k < n + bound:
                k += 1
                if passes(k):
                    sim_n = k
                    break
        pred = predictions[h]
        assert pred is not None  # a checked hour has traffic
        out.append(HourCheck(hours, sum(r for r, _ in streams), n, planned[h], sim_n, pred.ttft_p99_ms + network_ms,
                             at_plan.ttft_p99_ms + network_ms, pred.itl_p99_ms, at_plan.itl_p99_ms, at_plan.requests,
                             at_plan.queued_share, network_ms, meets(at_plan, limits)))
    return out


def slo_misses(checks: list[HourCheck]) -> list[int]:
    """The UTC hours whose simulated P99s at the planned count miss an SLO (whatever the planner predicted)."""
    return sorted(h for c in checks if not c.slo_met for h in c.hours)


def verdict(ok: bool, misses: list[tuple[str, list[int]]], what: str) -> list[str]:
    """The closing lines: 'agree' only when the figures agree AND every simulated hour meets its SLOs; each miss
    names the model (or pool) and its UTC hours."""
    lines = [f"  SLO MISSED in simulation: {who} at UTC hours {_hours_text(hours)} (P99 above its SLO at the planned "
             "count)" for who, hours in misses if hours]
    if ok and lines:
        return lines + [f"planner and simulation DISAGREE: the figures agree within {AGREEMENT:.0%} ({what}), but "
                        "the planned fleet misses an SLO in simulation (above)"]
    return lines + [f"planner and simulation {'agree' if ok and not lines else 'DISAGREE'} within {AGREEMENT:.0%} "
                    f"({what})"]


def synthetic_line(synthetic: bool) -> list[str]:
    return ["inputs: SYNTHETIC curves (authored data, not measurements): the simulation checks the method on them, "
            "not a fleet"] if synthetic else []


def _hours_text(hours: list[int]) -> str:
    runs, start = [], hours[0]
    for a, b in zip(hours, hours[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start:02d}" if start == a else f"{start:02d}-{a + 1:02d}")
            if b is not None:
                start = b
    return ",".join(runs)


def render_checks(title: str, checks: list[HourCheck]) -> list[str]:
    lines = [title, f"  {'UTC hours':<14}{'busiest rps':>12}{'N plan':>8}{'N sim':>7}{'fleet':>7}{'TTFT plan':>11}"
             f"{'TTFT sim':>10}{'ITL plan':>10}{'ITL sim':>9}{'requests':>10}  agree"]
    for c in checks:
        lines.append(f"  {_hours_text(c.hours):<14}{c.rate_rps:>12.1f}{c.planned_n:>8}{c.sim_n if c.sim_n else '-':>7}"
                     f"{c.fleet_n:>7}"
                     f"{c.planned_ttft_ms:>9.0f}ms{c.sim_ttft_ms:>8.0f}ms{c.planned_itl_ms:>8.1f}ms{c.sim_itl_ms:>7.1f}ms"
                     f"{c.requests:>10}  {'yes' if c.agrees else 'NO'}")
    return lines


@dataclass
class SimTarget:
    """One set of processes to simulate: a one-model pool's instances, or one model's processes in a packing (the
    pool's instances x its copies; one model is a packing of one). `group`: the region whose instance counts the
    packing's models share (None: the target's own counts are instances)."""

    title: str
    who: str  # what an SLO miss names (the pool, or the model and region)
    model: ServiceModel
    members: list[Member]
    limits: Limits
    planned: list[int]
    needed: list[int]
    predictions: list[Prediction | None]
    network_ms: float
    synthetic: bool
    copies: int = 1
    group: tuple[str, list[int], int] | None = None  # (region, instances per hour, floor)
    unit: str = "instances"
    picture: str = ""


def simulate(targets: list[SimTarget], header: str, what: str, seed: int = 7, max_groups: int | None = None,
             report: Path | None = None, lines: list[str] | None = None) -> tuple[list[str], bool]:
    """Check each target's sizing by simulation; 'agree' only when every figure agrees within AGREEMENT and every
    simulated hour meets the target's SLOs (a miss names the target and its hours). With `report` (a directory),
    each target's 24-hour picture (write_day_plot) is drawn there as simulate-PICTURE.png."""
    out = [f"Simulated busiest minutes: {BURST_MINUTES} min per distinct hour (longer for quiet hours, up to "
           f"{MAX_MINUTES} min, until {MIN_REQUESTS:,} requests) after {WARMUP_S:g} s warm-up, {header}; seed {seed}"]
    out += lines or []
    ok = True
    misses = []
    drawn = []
    fleets: dict[str, tuple[list[int], int, dict[int, int]]] = {}
    for t in targets:
        checks = check_sizing(t.model, t.members, t.limits, t.planned, t.needed, t.predictions, t.network_ms, seed,
                              max_groups)
        out += render_checks(t.title, checks)
        ok = ok and all(c.agrees for c in checks)
        misses.append((t.who, slo_misses(checks)))
        if t.group is not None:
            region, instances, floor = t.group
            sim = fleets.setdefault(region, (instances, floor, {}))[2]
            for c in checks:
                for h in c.hours:
                    if c.sim_n is not None:
                        sim[h] = max(sim.get(h, 0), -(-c.sim_n // t.copies))
        if report is not None and checks:
            drawn.append((t, checks))
    for region, (instances, floor, sim) in fleets.items():
        if sim:
            hours = sorted(sim)[:6]
            out.append(f"{region}: instances planned / simulated (floor included), first checked hours: "
                       + ", ".join(f"{h:02d}h {instances[h]}/{max(sim[h], floor)}" for h in hours))
    if drawn and report is not None:
        report.mkdir(parents=True, exist_ok=True)
        paths = [write_day_plot(f"{t.title.split(' (counts')[0]}: simulated day (seed {seed})", t.planned, t.needed,
                                checks, t.limits, report / f"simulate-{t.picture}.png", unit=t.unit)
                 for t, checks in drawn]
        out.append(f"pictures: {', '.join(str(p) for p in paths)}")
    out += verdict(ok, misses, what)
    return synthetic_line(any(t.synthetic for t in targets)) + out, ok and not any(h for _, h in misses)


def simulate_pools(pools: list[PlannedPool], ctx: PlanContext, seed: int = 7, max_groups: int | None = None,
                   report: Path | None = None, notes: list[str] | None = None,
                   named: bool = False) -> tuple[list[str], bool]:
    """Planned pools (solver.PlannedPool, one model or a packing) by simulation: per pool and model, that model's
    planned processes (the pool's instances x its copies) each batch continuously on the curve the planner used for
    it (in a packing the co-located one where measured, else the solo curve stretched by the interference rule),
    its consumers' arrivals spread at random over them (the NLB over instances, the gateway over copies). Per
    model and distinct hour: its P99s at the planned processes and the fewest processes meeting its SLOs, against
    the planner's; a packed pool's instance count is the largest over its models of processes / copies. `named`:
    the pools are candidates named by --candidate (one sized from a histogram is then refused, not skipped)."""
    from fleetcast.contract.errors import UserError

    targets: list[SimTarget] = []
    notes = list(notes or [])
    for pool in pools:
        for s in pool.serves:
            z = s.sizing
            assert z is not None  # every planner sizes what it serves
            members = [(t.hourly_rps(), t.hourly_burstiness(), t.output_tokens) for t in z.members]
            if not z.arrival_driven:
                if named:
                    raise UserError(f"--candidate {pool.label}: {', '.join(pool.consumer_regions)}'s profile has no "
                                    "arrivals to simulate (a concurrency histogram only); add burstiness to it")
                notes.append(f"{pool.label} @ {pool.region}: sized from a concurrency histogram, not from arrivals; "
                             "nothing to check (add burstiness to the profile)")
                continue
            if not pool.packed:
                title = f"{pool.label} @ {pool.region} serving {', '.join(pool.consumer_regions)}"
                targets.append(SimTarget(title, title, z.service, members, z.limits, list(z.processes), list(z.needed),
                                         list(z.predictions), z.network_ms, z.synthetic, picture=_slug(title)))
                continue
            title = f"{pool.instance_type} @ {pool.region}: {s.model} {s.precision} x{s.copies} [{z.source}]"
            targets.append(SimTarget(
                f"{title} (counts are its processes: instances x {s.copies})", f"{s.model} ({pool.region})", z.service,
                members, z.limits, list(z.processes), list(z.needed), list(z.predictions), z.network_ms, z.synthetic,
                s.copies, (pool.region, list(pool.instances_by_hour), ctx.n_min(pool.region)), f"{s.model} processes",
                _slug(f"{pool.instance_type} @ {pool.region} {s.model}")))
    # One header whatever the number of models: a one-model pool's processes are its instances.
    return simulate(targets, "random routing over each model's processes (a one-model pool's: its instances), "
                    "continuous batching per that model's curve", "per model: P99 TTFT incl. network, P99 ITL at the "
                    "planned processes; process count within 10% or one process", seed, max_groups, report, notes)


def _slug(text: str) -> str:
    """'g6e.xlarge fp8 @ ap-northeast-2 serving ...' -> 'g6e.xlarge-fp8-ap-northeast-2' (a file name)."""
    words = text.split(" serving ")[0].replace("@", " ").split()
    return "-".join("".join(c if c.isalnum() or c in "._-" else "-" for c in w) for w in words)


def write_day_plot(title: str, planned: list[int], needed: list[int], checks: list[HourCheck], limits: Limits,
                   path: Path, unit: str = "instances") -> Path:
    """The 24-hour picture of one simulated pool: instances the plan runs per UTC hour against the fewest the
    simulation needed, and each checked hour's P99 TTFT and ITL (planned line, simulated marker) against the SLO,
    hours whose simulated P99 at the planned count misses the SLO shaded red: the SLO windows at a glance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = list(range(25))
    fig, (inst, ttft, itl) = plt.subplots(3, 1, figsize=(9, 8.5), sharex=True,
                                          gridspec_kw={"height_ratios": [1.3, 1, 1]})
    inst.step(hours, planned + planned[-1:], where="post", color="k", linewidth=2, label=f"{unit} the plan runs",
              zorder=2)
    if needed and needed != planned:  # a floor (capacity.min) holds more than the SLOs need
        inst.step(hours, needed + needed[-1:], where="post", color="0.5", linestyle="--", linewidth=1.5, zorder=2,
                  label=f"{unit} the SLOs need, by the planner (before capacity.min)")
    by_hour = {h: c for c in checks for h in c.hours}
    sim = [(h + 0.5, c.sim_n) for h, c in sorted(by_hour.items()) if c.sim_n is not None]
    if sim:
        inst.plot(*zip(*sim), "o", color="C1", zorder=3,
                  label="fewest meeting the SLOs in the simulation (busiest minutes)")
    inst.set_ylim(0, max(planned + [n for _, n in sim]) * 1.2 + 0.5)
    inst.set_ylabel(unit)
    inst.set_title(title, fontsize=10)
    # Limits.ttft_ms is in-region; the checks' TTFTs include the farthest member's network, so the line does too.
    for ax, what, slo_ms in ((ttft, "ttft", limits.ttft_ms + checks[0].network_ms), (itl, "itl", limits.itl_ms)):
        plan_y = [getattr(by_hour[h], f"planned_{what}_ms") if h in by_hour else float("nan") for h in range(24)]
        ax.step(hours, plan_y + plan_y[-1:], where="post", color="0.4", label="planner's P99 (busiest minute)")
        pts = [(h + 0.5, getattr(c, f"sim_{what}_ms")) for h, c in sorted(by_hour.items())]
        ax.plot(*zip(*pts), "o", color="C0", markersize=4, label="simulated P99 at the planned count")
        ax.axhline(slo_ms, color="C3", linestyle="--", linewidth=1.2, label=f"SLO: {slo_ms:g} ms")
        for h, c in by_hour.items():
            if getattr(c, f"sim_{what}_ms") > slo_ms:
                ax.axvspan(h, h + 1, color="C3", alpha=0.15, linewidth=0)
        ax.set_ylim(0, max([slo_ms] + [y for _, y in pts if y == y]) * 1.2)
        ax.set_ylabel(f"P99 {what.upper()} (ms)" + (" incl. network" if what == "ttft" else ""))
    for ax in (inst, ttft, itl):
        ax.grid(alpha=0.3)
    itl.set_xlim(0, 24)
    itl.set_xticks(range(0, 25, 3))
    itl.set_xlabel("hour of day (UTC); hours without a marker were not simulated (no traffic, or --max-hours)"
                   if len(by_hour) < 24 else "hour of day (UTC)")
    fig.tight_layout()
    handles, labels = [], []
    for ax in (inst, ttft):
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels and not lab.startswith("SLO"):
                handles.append(h)
                labels.append(lab)
    from matplotlib.patches import Patch

    handles += [ttft.get_lines()[-1], Patch(color="C3", alpha=0.15)]
    labels += ["the P99 SLO (dashed)", "an hour whose simulated P99 misses the SLO"]
    fig.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, frameon=False)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
