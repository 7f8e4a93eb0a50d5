"""Fair admission: how many requests each engine process holds, and whose request goes next when it is full.

Each engine process gets an admission cap: its engine's `max_batch_size`, the most requests it runs in one
batch (the plan has no per-process target: its scaling target is a per-instance average, and queueing at
an average would throttle a lone consumer below what the engine can batch). A request the engine would
only queue is held here instead, where the caller's identity is known, in a queue per consumer, and
admitted by start-time fair queuing (Goyal, Vin and Cheng, SIGCOMM 1996): each request gets the start tag
max(V, F) where F is the finish tag of its consumer's previous request and V the start tag of the last
request admitted; its finish tag is the start tag plus 1/weight; the smallest start tag goes next. A
consumer that has been idle starts at V, with no credit saved up; two busy consumers of weights 2 and 1
get two admissions to one. Among the requests that may take a slot, interactive ones go before any batch one
(strict priority between the classes, fair queuing within one); an account's reserved part (below) is its own
whatever its class, so a batch account that should yield gets a small weight.

What the cap promises a quiet account, and what it cannot: its request joins the engine's next iteration
beside the neighbours' requests, so its TTFT carries one step at up to the cap's batch and the prefills
started with it. Within 1.1x of its TTFT alone only where the engine's TTFT at the cap is within 1.1x of its
TTFT at the quiet account's own concurrency (a GPU's memory-bound decode); the cap is `max_batch_size`, which
the plan chooses per packing (docs/gateway.md, "What bounds the quiet account's P99").

A part of the cap for each active account: an account is active while it holds or waits for requests and for
IDLE_AFTER_S after its last one ended, and each active account is reserved its weighted share of the cap (of
every engine process of the model together), rounded down (`reserved`). An account holding less than its part
takes a free slot at once, even past others' waiting requests; beyond its part it may take only room the other
active accounts have not reserved, and while requests wait, only in fair order. So a neighbour flooding the
engine holds at most the cap less the other active accounts' parts (`held_beside`), and a quiet account's burst
up to its part starts in the engine's next iteration; alone, an account may use the whole cap. A request never
passes its own account's waiting requests. An account whose waiting requests alone would fill the whole cap is
flooding, and beyond FLOOD_KEEPS slots nothing is kept for it: room it left unfilled goes in fair order, so a quiet
account whose burst of long streams passed what it is reserved takes the flood's next freed slot when its start tag
comes first (it is behind the flood in service), instead of waiting for one of its own streams to end.

A reservation sized by the account's bursts, beside a flood. A weighted part is not what a quiet account's bursts
need: at 0.15 of an H100's capacity with 64-token streams a Poisson account's requests come 8 to 20 within 150 ms,
past half the cap, and each past its part waited for one of the flood's streams to end (23-76 ms;
bench/FAIRNESS_DEVICE.md, call 4: 59 of 62 queued quiet requests held their whole part). So an active account that
is not flooding and whose recent service is light is reserved its recent peak in flight and a quarter more
(BURST_HEADROOM) where that is more than its part, and its next burst of the size it recently had, or a little more,
starts in the engine's next iteration:
- "recent": the epoch of BURST_WINDOW_S under way and the one before (between one and two of them); "service":
  slot-seconds, the engine slots its requests held over that time (what the cap divides, so an account of few long
  streams is not counted as light); "light": its slot-seconds over all active accounts' less than SHARE_SLACK times
  its weight over theirs (a quarter past its weighted share: the room kept for its bursts holds the flood lower,
  and its own share climbs towards the weighted one); "peak in flight": the most requests it held and waited for
  at once. All in the shared mapping (`_roll`), so every worker decides alike.
- The room comes out of the flooding accounts' parts only, each keeping FLOOD_KEEPS slots of it (none where its part
  is 0) and giving up the rest by weight; where the bursts ask more than that room, each gets the same fraction of
  what it asks beyond its part. With nobody flooding, or nobody light and bursty, every reservation is the weighted
  part, as before: two floods split the cap by weight exactly as without this rule, and an account at or above
  SHARE_SLACK times its weighted share of the service (a heavy user) is reserved only its part.
- What a flood is guaranteed: FLOOD_KEEPS slots at every moment (a burst may never take its last one), and over the
  window what each account that took room from it leaves: that account used less than SHARE_SLACK times its
  weighted share (with two equal weights, under five eighths of the service, so the flood has three eighths or
  more); the moment the bursty account's service reaches that it is reserved its part again. Bounded work: one
  pass over the active list, and a few over what it read where a flood has room to give.
- What it costs the flood: the reserved room is kept free while the bursty account does not fill it (not work
  conserving), so the engine runs a smaller batch. In `python -m scripts.bench_fairness simulate 16 --seconds=20
  --prefill-ms=2.5` (docs/gateway.md) the neighbour was served 1091 requests against 1923 with the parts alone
  (-43 %), while the quiet requests that waited for a slot went from 47 to 6 of 703 (P99 wait 39 ms to 0); with the
  parts alone, the quiet account's weight 3 (its part 12) left 5 waiting and the neighbour 1248 (-35 %). A burst
  past its recent peak and headroom is not foreseen: its requests past them wait, as before.

Every count lives in the workers' shared mapping (runtime/gateway/shared.py), changed under its one
lock, so the cap of an engine process holds across gateway workers exactly as the consumer limits do.
Each worker keeps its own waiters and publishes the tag of its best one; a worker that frees a slot
owed to another worker's waiter writes a byte to that worker's pipe. While any request waits, one sweep
every poll period notices clients that left, waits that ran out, and (a safety net) a slot nobody handed over.

For a caller deciding where a request should go (cross-region spill), `predicted_wait_s(consumer, model)` says,
without queueing anything, how long a request arriving now would wait here: 0 with room for it, else the
requests fair order puts before it over the engine's service rate measured while requests waited
(`service_rate`). The rest of the public API is `acquire` (or `ask`, the wait left to the caller, and `abandon`),
`release`, `flush`, `waiting`, `queued` (every worker's waiting requests), `set_consumers`, `start`/`stop`, and the
module's `admission_caps`, `reserved`, `held_beside`, `fair_admission` and the queue-state file the runtime's QueuedRequests gauge reads
(`write_queue_state`, `read_queue_state`, `publish_queue_state`).

TensorRT-LLM 1.2.x's OpenAI server takes no per-request priority (tests/gateway/test_fair.py names the
source), so the classes are the gateway's own and nothing is added to the request the engine gets.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .identity import Refusal

if TYPE_CHECKING:
    from fleetcast.config import Consumer, FleetConfig, Pool

    from .routing import Router
    from .shared import SharedState
    from .upstream import UpstreamPool

# How long an account keeps its reserved share after its last request ended: a quiet account's requests come
# and go, and between two of them it holds nothing; were its share freed at once, a flooding neighbour would fill
# it and the quiet account's next request would wait for one of the neighbour's to end, up to a whole request's
# time (requests started in one engine iteration end together, so slots free in bunches, not one every cap-th of a
# request's time). An account idle longer than this gets no reservation: its next request takes the next free slot.
IDLE_AFTER_S = 1.0
# Active accounts a model's reservations track (a shared list, so that a decision reads the active accounts, not
# every consumer: 0.35 µs an account on the development VM). An account arriving while the list is full still gets
# its own part, but no one else reserves room for it.
MAX_ACTIVE = 64
# The window an account's recent service and peak are read over (`_Group.standing`): time is cut into epochs of
# BURST_WINDOW_S, and "recent" is the epoch under way and the one before, so between one and two of them. Long enough
# to hold a bursty account's last few bursts (0.15 R at the H100's R of 250-350 requests a second is 150-200 requests
# an epoch; in `simulate 16 --prefill-ms=2.5`, 20 s, epochs of 2 s left 22 quiet requests waiting, of 4 s 13, of 8 s
# 12, the neighbour served 1548, 1427 and 1135 requests; without BURST_HEADROOM), short enough that a burst is forgotten seconds after it.
BURST_WINDOW_S = 4.0
# The slots a flooding account keeps whatever bursts its neighbours reserve room for (none where its weighted part
# is 0). One, not more: what bounds its loss is that only a light account (under SHARE_SLACK times its weighted share
# of the recent service) reserves beyond its part, so over the window a flood is served at least what each account
# that took room from it leaves. The slot keeps it from standing still in between.
FLOOD_KEEPS = 1
# How far past its weighted share of the recent service an account still counts as light, reserved its bursts. The
# room kept for them holds the flood lower, so a light account's own slot-seconds climb towards its share (its
# requests take as long as the flood's, and every batched prefill stretches them all); at the share itself it fell
# back to its part, its next burst waited, and the flood refilled. In `python -m scripts.bench_fairness simulate 16
# --seconds=20 --seeds 6` (two workers), a quarter: at --prefill-ms=4 the quiet requests that waited fell from 90 to
# 29 (the neighbour served 7 % less), at 5 from 286 to 39 (12 % less), at 3 from 24 to 14, and at 2.5 and 0 they
# stayed as they were (33 to 32; 13), the neighbour within 2 %; a tenth left 41 at 4 ms. Past it an account is a
# heavy user, reserved its part alone.
SHARE_SLACK = 1.25
# How much more than its recent peak in flight a bursty account is reserved (rounded up): a peak read over seconds
# understates the next one (a Poisson account's largest burst grows with the time watched). On the H100
# (bench/FAIRNESS_DEVICE.md, "Calls 6 to 10", call 7) the peak alone left the quiet requests past it waiting. A
# quarter: in the simulation (docs/gateway.md, after the bursts table) it left fewer waiting than the peak alone at
# every prefill cost tried; a half left more, since held that far below its share the flood makes the quiet
# account's slot-seconds reach its share, and it is back to its part.
BURST_HEADROOM = 0.25
RANK = {"interactive": 0, "batch": 1}
T = TypeVar("T")
# The weight of the newest interval in the service rate's moving average: about the last 20 releases count.
RATE_SMOOTHING = 0.1


def admission_caps(cfg: FleetConfig, pool: Pool) -> dict[str, int]:
    """model id -> the requests one of its engine processes may hold at once on `pool` (this instance's, of its own
    region: pool names repeat across regions, each pool with its own serves and engines): the batch limit."""
    return {s.model.id: s.engine.max_batch_size for s in cfg.served_by(pool)}


def reserved(cap: int, weight: float, weights: float) -> int:
    """The slots of `cap` an active account of `weight` is entitled to while the active accounts' weights sum to
    `weights`: its weighted part, rounded down (the reservations of all active accounts never exceed the cap)."""
    return int(cap * weight / weights + 1e-9)


def held_beside(cap: int, weights: Sequence[float]) -> int:
    """The most requests the first account of `weights` holds beside the others, active and holding none: the cap
    less their reserved parts, or its own part where that is more."""
    total = sum(weights)
    return max(reserved(cap, weights[0], total), cap - sum(reserved(cap, w, total) for w in weights[1:]))


@dataclass(frozen=True)
class Share:
    weight: float = 1.0
    rank: int = 0
    max_queued: int = 64
    max_wait_s: float = 30.0


def share_of(consumer: Consumer) -> Share:
    a = consumer.admission
    return Share(a.weight, RANK[a.priority.value], a.max_queued, a.max_queue_wait_s)


class Waiter:
    """A request waiting in its account's queue (`FairAdmission.ask`): `future` gets the engine process or the
    refusal. `gone(client)` says whether its client left: a function shared by every waiter and the one object it
    reads, rather than a closure or partial of its own, which a flood's thousands of waiting requests would each
    keep alive for the collector to walk at every young collection (runtime/heap.py)."""

    __slots__ = ("consumer", "rank", "tag", "future", "deadline", "gone", "client", "held_i", "note")

    def __init__(self, consumer: str, rank: int, tag: float, future: asyncio.Future[UpstreamPool | Refusal],
                 deadline: float, gone: Callable[[Any], bool], client: Any, held_i: int = 0,
                 note: dict[str, Any] | None = None):
        self.consumer, self.rank, self.tag, self.future, self.deadline = consumer, rank, tag, future, deadline
        self.gone, self.client = gone, client
        self.held_i = held_i  # its account's held-count cell (names it to other workers)
        self.note = note  # the TTFT trace's record of its admission (`ask`), or None


def _called(gone: Callable[[], bool]) -> bool:
    """`acquire`'s `gone` as a waiter's check: the callable is the waiter's client."""
    return gone()


def queue_full(consumer: str, max_queued: int) -> Refusal:
    return Refusal(429, "queue_full", f"the model's engine is at capacity and {max_queued} requests of this consumer "
                   "already wait for it on this instance; retry after the Retry-After interval", "requests",
                   (("Retry-After", "1"),))


# Not sent: the client left while its request waited (status 499 as nginx logs it; the connection is closed).
CLIENT_GONE = Refusal(499, "client_gone", "the client closed the connection while its request waited", "client_gone")
QUEUE_TIMEOUT = Refusal(503, "queue_timeout", "the model's engine stayed at capacity for as long as this request may "
                        "wait; retry after the Retry-After interval", "service_unavailable", (("Retry-After", "1"),))


class _Group:
    """One model's engine processes: their shared counts, and this worker's queues for them."""

    def __init__(self, state: SharedState, model: str, pools: Sequence[UpstreamPool], cap: int, worker: int,
                 clock: Callable[[], float]):
        self.state, self.model, self.pools, self.cap, self.clock = state, model, tuple(pools), cap, clock
        self.cap_total = cap * len(self.pools)  # shares are of every process's slots together
        self.worker = worker
        view = memoryview(state.mem)
        self._ints, self._floats = view.cast("q"), view.cast("d")
        with state.lock:
            self.used_at = [state.cell(f"fair\x00proc\x00{p.host_header}") for p in self.pools]
            self.group_at = state.cell(f"fair\x00group\x00{model}")  # (requests waiting in any worker, V)
            self.heads_at = [state.cell(f"fair\x00head\x00{model}\x00{w}") for w in range(state.workers)]
            # (the held-count cell of the account whose request heads that worker's queues, -)
            whos_at = [state.cell(f"fair\x00headwho\x00{model}\x00{w}") for w in range(state.workers)]
            # (monotonic ns of the last release seen while requests waited, 0 after one seen while none did;
            # the mean seconds between such releases, 0 until two were seen)
            self.rate_at = state.cell(f"fair\x00rate\x00{model}")
            # The active accounts: (how many, the sum of their weights), then one cell each: (its held cell's
            # index << 32 | its waiting cell's index, its weight). Idle accounts leave it when a decision finds them
            # idle past IDLE_AFTER_S, so the sum may still count some of those: never less than the active ones'.
            active_n_at = state.cell(f"fair\x00activen\x00{model}")
            active_at = [state.cell(f"fair\x00active\x00{model}\x00{k}") for k in range(MAX_ACTIVE)]
            # Beside each entry, where its account's recent service and peak are: (its burst cell's index << 32 | its
            # served cell's index, -) (`consumer_index`); it moves with its entry.
            recent_at = [state.cell(f"fair\x00activer\x00{model}\x00{k}") for k in range(MAX_ACTIVE)]
        # The same cells as indices of the int64 view (the float of cell i is element i + 1 of the float64 view):
        # the hot paths index the views inline, a method call per read cost more than the rest of a request.
        self.used_i = [at >> 3 for at in self.used_at]
        self.group_i, self.rate_i = self.group_at >> 3, self.rate_at >> 3
        self.heads_i = [at >> 3 for at in self.heads_at]
        self.active_n_i, self.active_i = active_n_at >> 3, [at >> 3 for at in active_at]
        self.recent_i = [at >> 3 for at in recent_at]
        self.head_i = self.heads_i[worker]
        self.whos_i = [at >> 3 for at in whos_at]
        self.who_i = self.whos_i[worker]
        self._names: dict[int, str] = {}  # held-count cell -> account, for the heads other workers publish
        self.queues: dict[str, deque[Waiter]] = {}
        self._consumer_i: dict[str, tuple[int, int]] = {}
        self._recent_of: dict[str, tuple[int, int]] = {}  # account -> (burst cell index, served cell index)
        self._waiting_of: dict[int, int] = {}  # held cell index -> waiting cell index, of the accounts seen here
        self._listed_at: dict[int, int] = {}  # held cell index -> its entry on the active list, as last seen here

    # Shared cells, read and written with the lock held. A cell's offset is a multiple of 8 (slots of 40 bytes), so
    # its two values are elements of the mapping seen as int64s and as float64s: an index instead of a struct call.
    # Native byte order: one machine writes and reads them. These accessors serve the cold paths and the tests.
    def _int(self, at: int) -> int:
        value: int = self._ints[at >> 3]
        return value

    def _set_int(self, at: int, value: int) -> None:
        self._ints[at >> 3] = value

    def _float(self, at: int) -> float:
        value: float = self._floats[(at >> 3) + 1]
        return value

    def _set_float(self, at: int, value: float) -> None:
        self._floats[(at >> 3) + 1] = value

    def consumer_index(self, consumer: str) -> tuple[int, int]:
        """The int64 indices of (held requests and finish tag, waiting requests and when it last became idle:
        monotonic seconds, 0.0 never)."""
        cells = self._consumer_i.get(consumer)
        if cells is None:
            cells = (self.state.cell(f"fair\x00held\x00{self.model}\x00{consumer}") >> 3,
                     self.state.cell(f"fair\x00waiting\x00{self.model}\x00{consumer}") >> 3)
            # Its recent use (`_roll`): (the epoch it is counted in << 32 | its peak in flight in that epoch << 16 |
            # its peak in the epoch before, its slot-seconds in that epoch less its held requests x now), and
            # (-, its slot-seconds in the epoch before).
            self._recent_of[consumer] = (self.state.cell(f"fair\x00burst\x00{self.model}\x00{consumer}") >> 3,
                                         self.state.cell(f"fair\x00served\x00{self.model}\x00{consumer}") >> 3)
            self._waiting_of[cells[0]] = cells[1]
            self._consumer_i[consumer] = cells
        return cells

    def named(self, held_i: int, consumers: Iterable[str]) -> str | None:
        """The account among `consumers` whose held-count cell is `held_i` (another worker's published head)."""
        name = self._names.get(held_i)
        if name is None:
            for consumer in consumers:
                self._names[self.consumer_index(consumer)[0]] = consumer
            name = self._names.get(held_i)
        return name

    def consumer_cells(self, consumer: str) -> tuple[int, int]:
        """`consumer_index` as byte offsets (for `_int` and `_float`)."""
        held, waiting = self.consumer_index(consumer)
        return held << 3, waiting << 3

    def enlist(self, held_i: int, waiting_i: int, weight: float, recent: tuple[int, int]) -> None:
        """Put an account that is becoming active on the active list, unless it is there (`recent`: its burst and
        served cells, `consumer_index`). Lock held."""
        ints, entries = self._ints, self.active_i
        packed = held_i << 32 | waiting_i
        n = ints[self.active_n_i]
        k = self._listed_at.get(held_i, n)  # where this worker last saw it: entries move only when one leaves
        if k < n and ints[entries[k]] == packed:
            return
        for k in range(n):
            if ints[entries[k]] == packed:
                self._listed_at[held_i] = k
                return
        if n < MAX_ACTIVE:
            floats = self._floats
            ints[entries[n]], floats[entries[n] + 1] = packed, weight
            ints[self.recent_i[n]] = recent[0] << 32 | recent[1]
            ints[self.active_n_i] = n + 1
            floats[self.active_n_i + 1] += weight
            self._listed_at[held_i] = n

    def reweigh(self, weights: Mapping[int, float]) -> None:
        """New weights (held cell index -> weight) for the listed accounts (a config refresh). Lock held."""
        ints, floats = self._ints, self._floats
        for at in self.active_i[:ints[self.active_n_i]]:
            weight = weights.get(ints[at] >> 32)
            if weight is not None:
                floats[self.active_n_i + 1] += weight - floats[at + 1]
                floats[at + 1] = weight

    def standing(self, own: int, weight: float) -> tuple[bool, bool]:
        """(whether one more request keeps the account whose held cell is `own` (`consumer_index`) within what is
        reserved for it, whether one more may go: within it, or into room not reserved for the other active
        accounts). Lock held; call with a slot free.

        Active: holding or waiting requests, or idle for less than IDLE_AFTER_S (the active list; an entry found
        idle for longer leaves it here); the account asking counts as active. What each is reserved, from its
        weighted part (`reserved`) and its recent service and peak in flight (the module docstring says why):
        - flooding (its waiting requests alone would fill the cap): for the others, FLOOD_KEEPS slots of its part
          (none above it); for itself, its part less its weighted share of the room the others' bursts took
          (`_bursts`), never less than those slots;
        - else light (below SHARE_SLACK times its weighted share of the recent service): its part, or its recent
          peak in flight and BURST_HEADROOM more where that is more, as far as the flooding accounts' parts beyond
          their kept slots go (with none flooding, its part): where the peaks ask more than that, each gets the same
          fraction of what it asks beyond its part;
        - else: its part.
        O(active accounts): one pass over the list, a few over what it read."""
        ints, floats = self._ints, self._floats
        cap = self.cap_total
        own_waiting = ints[self._waiting_of[own]]
        # Within its part even were every listed account active (the sum counts its own weight at most twice): no
        # need to read the list. Most requests below the cap end here. Not a flooding account: its part gives room
        # to the others' bursts.
        if own_waiting < cap and ints[own] + 1 <= cap * weight / (floats[self.active_n_i + 1] + weight) - 1e-9:
            return True, True
        recent = None
        total, listed = weight, 0.0  # listed: its own entry's weight, if it has one
        # Every active account's (weight, held, waiting, its entry's index on the list), flat; the one asking first
        # (-1: unlisted, the list was full, and it reserves nothing beyond its part).
        rows: list[float] = [weight, ints[own], own_waiting, -1]
        entries, n, k = self.active_i, ints[self.active_n_i], 0
        while k < n:
            at = entries[k]
            packed = ints[at]
            held_i = packed >> 32
            held, waiting = ints[held_i], ints[packed & 0xFFFFFFFF]
            if held_i != own:
                if not held and not waiting:
                    if recent is None:
                        recent = self.clock() - IDLE_AFTER_S
                    if floats[(packed & 0xFFFFFFFF) + 1] <= recent:
                        n -= 1  # idle past IDLE_AFTER_S: off the list, its last entry takes its place
                        ints[at], floats[at + 1] = ints[entries[n]], floats[entries[n] + 1]
                        ints[self.recent_i[k]] = ints[self.recent_i[n]]
                        ints[self.active_n_i] = n
                        continue
                total += floats[at + 1]
                rows += (floats[at + 1], held, waiting, k)
            else:
                listed += floats[at + 1]
                rows[3] = k
            k += 1
        floats[self.active_n_i + 1] = listed + total - weight  # the sum, exact again (no drift from + and -)
        if own_waiting < cap and ints[own] + 1 <= cap * weight / total + 1e-9:
            return True, True
        # What bursts may take (`room`: the flooding accounts' parts beyond their kept slots; with nobody flooding,
        # nothing: each account is reserved its part, and nothing more is read), the flooding accounts' weights.
        room, flood_weights = 0, 0.0
        for i in range(0, len(rows), 4):
            if rows[i + 2] >= cap:
                part = int(cap * rows[i] / total + 1e-9)
                room += part - min(FLOOD_KEEPS, part)
                flood_weights += rows[i]
        bursts: dict[int, int] = {}  # row -> the slots it is reserved beyond its part
        if room:
            self._bursts(rows, total, room, bursts)
        taken = 0  # the slots the bursts reserve beyond their accounts' parts
        kept = 0  # the room reserved for the others and not filled
        mine = 0  # what is reserved for the account asking
        for i in range(0, len(rows), 4):
            part = int(cap * rows[i] / total + 1e-9)
            if rows[i + 2] >= cap:
                reserve = min(FLOOD_KEEPS, part)  # for the others to keep; its own is known once `taken` is
            else:
                burst = bursts.get(i, 0)
                taken += burst
                reserve = part + burst
            if i:
                unmet = reserve - int(rows[i + 1])
                if unmet > 0:
                    kept += unmet
            else:
                mine = reserve
        if own_waiting >= cap:  # flooding: its kept slots and its weighted share of what the bursts left of `room`
            part = int(cap * weight / total + 1e-9)
            if not taken:
                mine = part  # no burst reserved beyond its part: as if none were bursty
            else:
                mine = min(part, mine + int((room - taken) * weight / flood_weights + 1e-9))
        if ints[own] + 1 <= mine:
            return True, True
        free = cap
        for at in self.used_i:
            free -= ints[at]
        return False, free - kept >= 1

    def _bursts(self, rows: list[float], total: float, room: int, bursts: dict[int, int]) -> None:
        """Into `bursts` (row -> slots), what each account of `rows` (`standing`'s) that is not flooding and is light
        (below SHARE_SLACK times its weighted share of the recent service) is reserved beyond its part for its recent
        peak in flight, out of `room`. Lock held; O(active accounts)."""
        ints, floats, cap = self._ints, self._floats, self.cap_total
        now = self.clock()
        epoch = int(now / BURST_WINDOW_S) + 1
        begun = (epoch - 2) * BURST_WINDOW_S  # the epoch before this one began: the window's start (`_roll`)
        served_all = asked = 0.0
        recents = self.recent_i
        use: list[float] = []  # per row: its slot-seconds since `begun`, its peak in flight since
        for i in range(0, len(rows), 4):
            held, waiting, k = int(rows[i + 1]), int(rows[i + 2]), int(rows[i + 3])
            if k < 0:
                use += (0.0, 0)
                continue
            cells = ints[recents[k]]
            burst_i = cells >> 32
            burst = ints[burst_i]
            if burst >> 32 == epoch:
                served = floats[burst_i + 1] + held * now + floats[(cells & 0xFFFFFFFF) + 1]
                peak = max(burst >> 16 & 0xFFFF, burst & 0xFFFF)
            elif burst >> 32 == epoch - 1:  # its last change was in the epoch before: nothing since
                served = floats[burst_i + 1] + held * now
                peak = max(burst >> 16 & 0xFFFF, held + waiting)
            else:  # none in either: it held what it holds all along
                served, peak = held * (now - begun), held + waiting
            served_all += served
            use += (served, peak)
        for i in range(0, len(rows), 4):
            part = int(cap * rows[i] / total + 1e-9)
            want = math.ceil(use[i // 2 + 1] * (1 + BURST_HEADROOM) - 1e-9)
            if rows[i + 2] < cap and want > part and use[i // 2] * total < SHARE_SLACK * rows[i] * served_all:
                bursts[i] = want - part
                asked += bursts[i]
        if asked > room:  # each the same fraction of what it asks
            for i, want in bursts.items():
                bursts[i] = int(want * room / asked + 1e-9)

    def may_take(self, own: int, weight: float) -> bool:
        """`standing(own, weight)[1]`, without reading the list where the free room is more than the others could have
        reserved: their parts (their weights' sum bounds them: the list's, which may count its own), since bursts take
        from flooding accounts' parts what those no longer keep; and, where it floods itself, what bursts may take
        from its own part beyond its kept slots. Lock held."""
        ints, cap = self._ints, self.cap_total
        listed = self._floats[self.active_n_i + 1]
        free = cap
        for at in self.used_i:
            free -= ints[at]
        others = int(cap * listed / (listed + weight) + 1e-9)
        if ints[self._waiting_of[own]] >= cap:
            others += max(0, cap - FLOOD_KEEPS)
        if free - 1 >= others:
            return True
        return self.standing(own, weight)[1]

    def _free_pool(self, limit: int) -> int | None:
        """The index of the process holding the fewest requests, if that is under `limit`."""
        ints = self._ints
        best, fewest = None, limit
        for i, at in enumerate(self.used_i):
            used = ints[at]
            if used < fewest:
                best, fewest = i, used
        return best

    def _activity(self, consumer: str, change: int, waiting: bool) -> None:
        """Count one more (or fewer) held or waiting request of `consumer`; when its last one ends, note when (it
        keeps its reservation IDLE_AFTER_S from then)."""
        held_i, waiting_i = self.consumer_index(consumer)
        ints = self._ints
        if waiting:
            at, other = waiting_i, held_i
            now = 0.0
        else:  # its service: a held request counts its slot-seconds from now (`_roll`)
            at, other = held_i, waiting_i
            now = self.clock()
            burst_i = self._recent_of[consumer][0]
            if ints[burst_i] >> 32 != int(now / BURST_WINDOW_S) + 1:
                self._roll(burst_i, self._recent_of[consumer][1], held_i, waiting_i, now)
            self._floats[burst_i + 1] -= change * now
        count = ints[at] + change
        ints[at] = count
        if count == 0 and change < 0 and not ints[other]:
            self._floats[waiting_i + 1] = now or self.clock()

    def _roll(self, burst_i: int, served_i: int, held_i: int, waiting_i: int, now: float) -> None:
        """Move an account's recent use into the epoch under way at `now` (BURST_WINDOW_S each): what it had in the
        last epoch it was counted in becomes the epoch before's if that is the one just before, else it held and
        waited for what it does now all through the epoch before. Lock held, before its counts change.

        Its service is slot-seconds: the burst cell's float is the sum of its ended requests' end times less the sum of
        its requests' start times, both counted from the epoch's start, so that plus held x now is its slot-seconds in
        the epoch so far, kept by one subtraction when a request takes a slot and one addition when it ends."""
        ints, floats = self._ints, self._floats
        epoch = int(now / BURST_WINDOW_S) + 1  # from 1: a new account's epoch 0 is no epoch at all
        begun = (epoch - 1) * BURST_WINDOW_S
        held, burst = ints[held_i], ints[burst_i]
        flight = min(held + ints[waiting_i], 0xFFFF)
        if burst >> 32 == epoch - 1:
            floats[served_i + 1] = floats[burst_i + 1] + held * begun
            before = burst >> 16 & 0xFFFF
        else:
            floats[served_i + 1] = held * BURST_WINDOW_S
            before = flight
        ints[burst_i] = epoch << 32 | flight << 16 | before
        floats[burst_i + 1] = -held * begun

    def _grant(self, index: int, consumer: str, tag: float) -> UpstreamPool:
        self._ints[self.used_i[index]] += 1
        floats, v = self._floats, self.group_i + 1
        if tag > floats[v]:
            floats[v] = tag  # V: the start tag last admitted
        self._activity(consumer, 1, waiting=False)
        return self.pools[index]

    def _grant_waiting(self, index: int, waiter: Waiter) -> UpstreamPool:
        """`_grant` to a request that waited here: one of its account's waiting requests becomes a held one (the
        account stays active, so the active weights' sum does not change); the caller counts it out of the group's
        waiting ones."""
        ints, floats = self._ints, self._floats
        held_i, waiting_i = self.consumer_index(waiter.consumer)
        now = self.clock()
        burst_i, served_i = self._recent_of[waiter.consumer]
        if ints[burst_i] >> 32 != int(now / BURST_WINDOW_S) + 1:
            self._roll(burst_i, served_i, held_i, waiting_i, now)
        floats[burst_i + 1] -= now  # its slot-seconds count from now
        ints[waiting_i] -= 1
        ints[held_i] += 1
        ints[self.used_i[index]] += 1
        if waiter.tag > floats[self.group_i + 1]:
            floats[self.group_i + 1] = waiter.tag  # V: the start tag last admitted
        return self.pools[index]

    def _publish_head(self) -> None:
        best = self._best()
        at = self.head_i
        if best is None:
            self._ints[at] = 0
        else:
            self._ints[at] = best.rank + 1
            self._floats[at + 1] = best.tag
            self._ints[self.who_i] = best.held_i

    def _best(self) -> Waiter | None:
        best = None
        for queue in self.queues.values():
            if queue:
                head = queue[0]
                if best is None or head.rank < best.rank or (head.rank == best.rank and head.tag < best.tag):
                    best = head
        return best

    def _owner_of_best(self) -> int | None:
        ints, floats = self._ints, self._floats
        owner, rank, tag = None, 0, 0.0
        for w, at in enumerate(self.heads_i):
            r = ints[at]
            if r and (owner is None or r < rank or (r == rank and floats[at + 1] < tag)):
                owner, rank, tag = w, r, floats[at + 1]
        return owner


class FairAdmission:
    """The admission caps and fair queues of one gateway worker (see the module docstring)."""

    def __init__(self, state: SharedState, pools: Mapping[str, Sequence[UpstreamPool]], caps: Mapping[str, int],
                 consumers: Iterable[Consumer] = (), worker: int = 0, poll_s: float = 0.05,
                 clock: Callable[[], float] = time.monotonic):
        """`pools`: model id -> its engine processes; `caps`: model id -> requests each may hold at once;
        `clock`: monotonic seconds, the same in every worker (for the service rate)."""
        self.state, self.worker, self.poll_s, self.clock = state, worker, poll_s, clock
        self.groups = {model: _Group(state, model, pools[model], cap, worker, clock) for model, cap in caps.items()
                       if model in pools}
        self.shares: dict[str, Share] = {}
        self.set_consumers(consumers)
        self._reader_fd = state.wake_fds[worker][0]
        self._watching = False
        self._sweep: asyncio.TimerHandle | None = None
        self._via = ""  # the path that last took the lock to hand slots over (the TTFT trace's `granted.via`)

    def set_consumers(self, consumers: Iterable[Consumer]) -> None:
        self.shares = {c.name: share_of(c) for c in consumers}
        with self.state.lock:  # the active accounts' weights, as the new config sets them
            for group in self.groups.values():
                group.reweigh({group.consumer_index(name)[0]: share.weight for name, share in self.shares.items()})

    def start(self) -> None:
        """Listen for another worker's hand-over (call inside the event loop)."""
        if self.state.workers > 1 and not self._watching:
            asyncio.get_running_loop().add_reader(self._reader_fd, self._woken)
            self._watching = True

    def stop(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        if self._watching:
            asyncio.get_running_loop().remove_reader(self._reader_fd)
            self._watching = False

    def _woken(self) -> None:
        try:
            while os.read(self._reader_fd, 512):
                pass
        except BlockingIOError:
            pass
        self._via = "poke"
        for group in self.groups.values():
            with self.state.lock:
                self._dispatch(group, relay=False)

    def _poke(self, worker: int) -> None:
        try:
            os.write(self.state.wake_fds[worker][1], b"\x01")
        except BlockingIOError:
            pass  # its pipe is full of pokes already: it will look

    async def acquire(self, consumer: str, model: str, gone: Callable[[], bool],
                      note: dict[str, Any] | None = None) -> UpstreamPool | Refusal:
        """The engine process `consumer`'s request for `model` goes to, once it has room; or the answer to give.

        `gone()`: the client has left (checked every poll period while the request waits). `note` (the TTFT trace
        only, runtime/ttft_trace.py): filled with what decided it (`_noted`). `ask` and the wait, as one coroutine."""
        got = self.ask(consumer, model, _called, gone, note)
        if not isinstance(got, Waiter):
            return got
        try:
            return await got.future
        except asyncio.CancelledError:
            self.abandon(model, got)
            raise

    def ask(self, consumer: str, model: str, gone: Callable[[T], bool], client: T,
            note: dict[str, Any] | None = None) -> UpstreamPool | Refusal | Waiter:
        """`acquire` without the wait: the engine process, the answer to give, or the request's place in its
        account's queue, whose `future` the caller awaits (calling `abandon` if that await is cancelled). For a
        caller that awaits in its own coroutine, so that a waiting request keeps no coroutine of this module alive.

        `gone(client)`: the client has left (checked every poll period while the request waits)."""
        group = self.groups[model]
        share = self.shares.get(consumer) or Share()
        if note is not None:
            asked = time.monotonic()
        with self.state.lock:
            if note is not None:
                self._noted(note, group, "asked", asked)
            held_i, waiting_i = group.consumer_index(consumer)
            ints, floats = group._ints, group._floats
            tag = floats[held_i + 1]
            vtime = floats[group.group_i + 1]
            if vtime > tag:
                tag = vtime
            floats[held_i + 1] = tag + 1.0 / share.weight
            # Within its reserved part it goes now if a slot is free; beyond it, only into room no other active
            # account has reserved, and only while nobody waits (else it queues behind them in tag order).
            index = group._free_pool(group.cap)
            room = index is not None
            # Never past its own account's waiting requests (in any worker): granted here, its start tag (its
            # finish tag, beyond all of theirs) would move V past every one of them.
            recent = group._recent_of[consumer]
            if not ints[held_i] and not ints[waiting_i]:  # it becomes active: its part is reserved from now
                group.enlist(held_i, waiting_i, share.weight, recent)
            # Its peak in flight: with this request (held or waiting, it is in flight from now).
            now = group.clock()
            burst_i = recent[0]
            if ints[burst_i] >> 32 != int(now / BURST_WINDOW_S) + 1:
                group._roll(burst_i, recent[1], held_i, waiting_i, now)
            flight = ints[held_i] + ints[waiting_i] + 1
            if flight > ints[burst_i] >> 16 & 0xFFFF and flight <= 0xFFFF:
                ints[burst_i] += (flight - (ints[burst_i] >> 16 & 0xFFFF)) << 16
            within = may = False
            if index is not None and not ints[waiting_i]:
                within, may = group.standing(held_i, share.weight)
                if within or (may and ints[group.group_i] == 0):
                    if note is not None:
                        note["fair"]["outcome"] = "within_part" if within else "free_room"
                    return group._grant(index, consumer, tag)
            if note is not None:
                note["fair"]["outcome"] = ("queue_full" if ints[waiting_i] >= share.max_queued else
                                           "queued:cap_full" if index is None else
                                           "queued:behind_own_waiting" if ints[waiting_i] else
                                           "queued:others_waiting" if may else "queued:room_reserved_for_others")
            if ints[waiting_i] >= share.max_queued:
                return queue_full(consumer, share.max_queued)
            loop = asyncio.get_running_loop()
            future: asyncio.Future[UpstreamPool | Refusal] = loop.create_future()
            waiter = Waiter(consumer, share.rank, tag, future, time.monotonic() + share.max_wait_s, gone, client,
                            held_i, note)
            queue = group.queues.get(consumer)
            if queue is None:
                queue = group.queues[consumer] = deque()
            queue.append(waiter)
            group._activity(consumer, 1, waiting=True)
            ints[group.group_i] += 1
            if len(queue) == 1:  # a new head here; behind its own account's head it changes nothing published
                group._publish_head()
            if room:  # with the cap full nobody can go (and releases dispatch); else another worker's may
                self._via = "acquire"
                self._dispatch(group)
        if self._sweep is None:
            self._sweep = loop.call_later(self.poll_s, self._sweep_waiters)
        return waiter

    def abandon(self, model: str, waiter: Waiter) -> None:
        """The wait for `waiter.future` was cancelled (the connection's task, the gateway closing): a slot granted
        in the same turn goes back, else the request leaves its queue."""
        future = waiter.future
        if future.done() and not future.cancelled():
            granted = future.result()
            if not isinstance(granted, Refusal):
                self.release(waiter.consumer, model, granted)
        else:
            self._withdraw(self.groups[model], waiter, CLIENT_GONE)

    def _noted(self, note: dict[str, Any], group: _Group, stamp: str, asked: float) -> None:
        """Into a traced request's `note["fair"]`, at `stamp` ("asked": its acquire; "granted": a slot handed to it
        after a wait), what the decision read: when the lock was asked for and got (monotonic s: the wait for the
        other workers), every account's held and waiting requests, the engine processes' held ones and the cap, the
        requests waiting in every worker, and this worker's own waiting ones (what a sweep walks). Lock held."""
        got = time.monotonic()
        fair = note.setdefault("fair", {"worker": self.worker})
        fair[stamp] = {"lock_asked": asked, "lock_got": got,
                       "accounts": {name: [group._int(a << 3) for a in group.consumer_index(name)]
                                    for name in self.shares},
                       "used": sum(group._ints[i] for i in group.used_i), "cap": group.cap_total,
                       "waiting_all": group._ints[group.group_i], "waiting_here": self.waiting()}

    def _sweep_waiters(self) -> None:
        """Every poll period while any request waits, one pass over them all (not a timer each): withdraw
        those whose client left or whose wait ran out, and hand over any slot a lost poke left free."""
        self._sweep = None
        self._via = "sweep"
        now = time.monotonic()

        def answer(waiter: Waiter) -> Refusal | None:
            if waiter.gone(waiter.client):
                return CLIENT_GONE
            return QUEUE_TIMEOUT if now >= waiter.deadline else None

        for group in self.groups.values():
            self._drop(group, answer)
        if self.waiting():
            self._sweep = asyncio.get_running_loop().call_later(self.poll_s, self._sweep_waiters)

    def _drop(self, group: _Group, answer: Callable[[Waiter], Refusal | None]) -> None:
        """Withdraw every waiter of `group` that `answer` gives a refusal, and answer it that; then hand over any
        slot free. Each queue is rebuilt in one pass: a flood's client dropping thousands of waiting requests at
        once (or a drain) costs the event loop one pass over them, not a deque search for each."""
        leaving: list[tuple[Waiter, Refusal]] = []
        rebuilt: dict[str, deque[Waiter]] = {}
        for consumer, queue in group.queues.items():  # this worker's own queues: no lock needed to read them
            kept: deque[Waiter] = deque()
            for waiter in queue:
                refusal = answer(waiter)
                if refusal is None:
                    kept.append(waiter)
                else:
                    leaving.append((waiter, refusal))
            if len(kept) != len(queue):
                rebuilt[consumer] = kept
        with self.state.lock:  # the shared counts, for the waiters that leave: one change an account
            for consumer, kept in rebuilt.items():
                gone = len(group.queues[consumer]) - len(kept)
                group._activity(consumer, -gone, waiting=True)
                group._set_int(group.group_at, group._int(group.group_at) - gone)
                group.queues[consumer] = kept
            group._publish_head()
            self._dispatch(group, relay=bool(leaving))  # another worker's waiter may be the best now
        for waiter, refusal in leaving:
            if not waiter.future.done():
                waiter.future.set_result(refusal)

    def _withdraw(self, group: _Group, waiter: Waiter, refusal: Refusal) -> None:
        """Take a waiter out of its queue and answer it `refusal` (if no slot was granted meanwhile).

        The queue is this worker's own (no other process reads it), so it is searched before the lock is taken: a
        flood's queue holds thousands, and a search under the lock would stall every worker's admissions for it."""
        queue = group.queues.get(waiter.consumer)
        if queue is None or waiter not in queue:
            if not waiter.future.done():
                waiter.future.set_result(refusal)
            return
        queue.remove(waiter)
        self._via = "withdraw"
        with self.state.lock:  # the shared counts only: O(1) whatever the queue's length
            group._activity(waiter.consumer, -1, waiting=True)
            group._set_int(group.group_at, group._int(group.group_at) - 1)
            group._publish_head()
            self._dispatch(group)  # another worker's waiter may be the best now
        if not waiter.future.done():
            waiter.future.set_result(refusal)

    def release(self, consumer: str, model: str, pool: UpstreamPool) -> None:
        """The request `acquire` placed on `pool` has ended: its slot goes to the next in fair order."""
        group = self.groups[model]
        self._via = "release"  # for the TTFT trace: which path handed a slot over
        with self.state.lock:
            group._ints[group.used_i[group.pools.index(pool)]] -= 1
            group._activity(consumer, -1, waiting=False)
            self._note_release(group)
            self._dispatch(group)

    def _note_release(self, group: _Group) -> None:
        """Time the release for the engine's service rate. Lock held.

        Only releases while requests wait count: then the engine, not the arrivals, sets their pace (an
        interval that spans a lull would read as a slow engine). A release while nobody waits breaks the chain."""
        ints, at = group._ints, group.rate_i
        if ints[group.group_i] == 0:
            ints[at] = 0
            return
        now = int(self.clock() * 1e9)
        last = ints[at]
        if last:
            floats = group._floats
            interval, mean = (now - last) / 1e9, floats[at + 1]
            floats[at + 1] = interval if mean == 0.0 else mean + RATE_SMOOTHING * (interval - mean)
        ints[at] = now

    def service_rate(self, model: str) -> float | None:
        """Requests per second `model`'s engine processes together finish while requests wait for them (a moving
        average over the last few dozen releases, shared by the workers); None until two were timed."""
        group = self.groups.get(model)
        if group is None:
            return None
        with self.state.lock:
            mean = group._float(group.rate_at)
        return 1.0 / mean if mean > 0.0 else None

    def predicted_wait_s(self, consumer: str, model: str) -> float | None:
        """Seconds a request of `consumer` for `model` arriving now would wait here for an engine slot.

        The query for a caller deciding where to send a request (cross-region spill: would waiting here break the
        consumer's latency objective?). It changes nothing. 0.0 when the request would go to an engine at once
        (room for it under the rules of `acquire`), or when the gateway holds no queue for `model` (fair admission
        off, or a model it does not cap). Otherwise the requests that would go before it, across every worker (its
        own account's waiting ones, all waiting ones of a higher class, and those of its class whose start tags
        are below the one it would get), plus itself, over `service_rate`: the engine frees one slot per 1/rate
        seconds on average while requests wait, or per the time since the last release where that is longer. None
        when it would wait but no release has been timed in this wait yet (the first releases after a lull, or a
        request that has held the engine since before anyone waited); a caller should then treat the wait as
        unknown, not as zero."""
        group = self.groups.get(model)
        if group is None:
            return 0.0
        share = self.shares.get(consumer) or Share()
        with self.state.lock:
            held_at, waiting_at = group.consumer_cells(consumer)
            tag = max(group._float(group.group_at), group._float(held_at))
            if group._free_pool(group.cap) is not None and not group._int(waiting_at):
                within, may = group.standing(held_at >> 3, share.weight)
                if within or (may and group._int(group.group_at) == 0):  # as `acquire` decides
                    return 0.0
            ahead = group._int(waiting_at)
            for other, other_share in self.shares.items():
                if other == consumer:
                    continue
                waiting = group._int(group.consumer_cells(other)[1])
                if not waiting or other_share.rank > share.rank:
                    continue
                if other_share.rank < share.rank:
                    ahead += waiting
                    continue
                # Its queued requests' start tags step by 1/weight up to its finish tag: those below `tag` go first.
                behind = math.floor((group._float(group.consumer_cells(other)[0]) - tag) * other_share.weight)
                ahead += waiting - min(max(behind, 0), waiting)
            mean, last_ns = group._float(group.rate_at), group._int(group.rate_at)
        # The mean is of the releases timed while requests waited. None timed in this wait yet (the last release came
        # while nobody waited) leaves only an earlier wait's rate, and what holds the engine now may be far slower:
        # unknown. And the interval under way has lasted at least since the last release: a request holding the
        # engine longer than the recent ones did stretches the wait, it does not keep their rate.
        if mean <= 0.0 or not last_ns:
            return None
        return (ahead + 1) * max(mean, self.clock() - last_ns / 1e9)

    def _dispatch(self, group: _Group, relay: bool = True) -> None:
        """Hand free slots to the best waiters, this worker's or (by a poke) another's. Lock held.

        The best waiter of all goes next if it may (`_Group.standing`); if not (its account is beyond its part and
        the free room is reserved for others), the best of this worker's waiters whose accounts are within their
        parts. `relay`: when the best is another worker's, or this worker has nobody who may go, poke the others.
        Not when a poke or a poll brought us here and we handed nothing over (two workers would poke each other for
        ever); once we handed a slot over we poke too, so every such poke follows a grant: a bunch of slots freed
        at once reaches every worker's waiters (the poked one grants its own, then passes the next slot on), not
        only the first owner's, the others' waiting beside a free slot for their worker's next event or poll."""
        ints, waiting_i = group._ints, group.group_i
        while ints[waiting_i] > 0:
            index = group._free_pool(group.cap)
            if index is None:
                return
            owner = group._owner_of_best()
            if owner is None:
                return
            if owner != self.worker:
                if self._may_go(group, owner):
                    if relay:
                        self._poke(owner)
                    return
                # Another worker's request is the best, but it may not use the room (reserved for accounts within
                # their parts): the room is for those, this worker's as much as the owner's (the owner looked at
                # its own already, or will when poked).
                best = self._best_within_share(group)
            else:
                best = group._best()
                if best is None:  # our published head is stale: republish and look again
                    group._publish_head()
                    continue
                if not group.may_take(best.held_i, (self.shares.get(best.consumer) or Share()).weight):
                    best = self._best_within_share(group)
            if best is None:
                if relay:
                    for worker, at in enumerate(group.heads_i):
                        if worker != self.worker and ints[at]:
                            self._poke(worker)
                return
            group.queues[best.consumer].popleft()  # `best` is the head of its account's queue
            ints[waiting_i] -= 1
            if best.future.done():  # done: cancelled, its task not yet told; it gets no slot
                group._activity(best.consumer, -1, waiting=True)
            else:
                if best.note is not None:
                    self._noted(best.note, group, "granted", time.monotonic())
                    best.note["fair"]["granted"]["via"] = self._via
                best.future.set_result(group._grant_waiting(index, best))
                relay = True  # progress: a poke from here on follows a grant
            group._publish_head()

    def _may_go(self, group: _Group, owner: int) -> bool:
        """Whether the request heading worker `owner`'s queues may take a free slot (an account this worker does not
        know counts as able to: the owner decides). Lock held, a slot free."""
        held_i = group._ints[group.whos_i[owner]]
        name = group.named(held_i, self.shares)
        if name is None:
            return True
        return group.may_take(held_i, self.shares[name].weight)

    def _best_within_share(self, group: _Group) -> Waiter | None:
        """This worker's best waiter whose account is within its reserved part. Lock held, a slot free."""
        best = None
        for consumer, queue in group.queues.items():
            if queue and (best is None or (queue[0].rank, queue[0].tag) < (best.rank, best.tag)) \
                    and group.standing(queue[0].held_i, (self.shares.get(consumer) or Share()).weight)[0]:
                best = queue[0]
        return best

    def flush(self, refusal: Refusal) -> None:
        """Answer every waiting request `refusal` (the drain: none of them has reached an engine)."""
        self._via = "flush"
        for group in self.groups.values():
            self._drop(group, lambda _waiter: refusal)

    def waiting(self) -> int:
        """Requests waiting in this worker's queues."""
        return sum(len(q) for g in self.groups.values() for q in g.queues.values())

    def load(self, model: str) -> tuple[int, int, int] | None:
        """(requests `model`'s engine processes hold, requests waiting for them in every worker, what they may hold
        at once), from the shared counts; None when no queue is kept for `model`."""
        group = self.groups.get(model)
        if group is None:
            return None
        with self.state.lock:
            held = sum(group._int(at) for at in group.used_at)
            return held, group._int(group.group_at), group.cap * len(group.pools)

    def queued(self) -> int:
        """Requests waiting for an engine slot in every worker's queues (the instance's, from the shared counts)."""
        with self.state.lock:
            return sum(g._int(g.group_at) for g in self.groups.values())


# The instance's gateway-queued count, for the runtime's QueuedRequests gauge: one small file, rewritten each
# QUEUE_STATE_S seconds by one worker; a reader takes one older than QUEUE_STATE_STALE_S for a gateway that stopped
# writing (it died, or drained) and counts nothing from it.
QUEUE_STATE_S = 1.0
QUEUE_STATE_STALE_S = 10.0


def write_queue_state(path: str | os.PathLike[str], queued: int, now: float | None = None) -> None:
    """Write `queued` to `path` whole (a temporary file renamed over it: a reader never sees half of it)."""
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w") as f:
        json.dump({"queued": queued, "written": time.time() if now is None else now}, f)
    os.replace(tmp, path)


def read_queue_state(path: str | os.PathLike[str], now: float | None = None) -> int | None:
    """The gateway-queued count in `path`; None when there is none, it is unreadable, or it is stale."""
    try:
        with open(path) as f:
            state = json.load(f)
        queued, written = int(state["queued"]), float(state["written"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return queued if (time.time() if now is None else now) - written <= QUEUE_STATE_STALE_S else None


async def publish_queue_state(admission: FairAdmission, path: str | os.PathLike[str]) -> None:
    """Rewrite the queue state every QUEUE_STATE_S until cancelled (one worker runs it: the counts are shared)."""
    while True:
        try:
            write_queue_state(path, admission.queued())
        except OSError:
            pass  # the gauge misses a sample; serving goes on
        await asyncio.sleep(QUEUE_STATE_S)


def fair_admission(router: Router, caps: Mapping[str, int], consumers: Iterable[Consumer],
                   shared: SharedState | None, worker: int, poll_s: float) -> FairAdmission:
    """The worker's FairAdmission over the router's engine processes; a single process gets its own SharedState
    (one code path: its lock is then never contended)."""
    from .shared import SharedState

    pools = {model: target.pools for model in caps if (target := router.resolve(model)) is not None}
    return FairAdmission(shared if shared is not None else SharedState(1), pools, caps, consumers, worker, poll_s)
