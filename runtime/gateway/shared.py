"""State the gateway's worker processes share, so per-consumer limits stay exact across them.

Several gateway processes listen on one port (SO_REUSEPORT: the kernel spreads new
connections over them), each with its own event loop on its own core. A consumer's
concurrency count and rate bucket must be one, not one per process: they live in an
anonymous shared mapping made before the workers are forked, one slot per limiter key
(consumer, or consumer and model), changed only under one process-shared lock. The
critical section is a few arithmetic operations on a dozen bytes; the lock is a POSIX
semaphore (multiprocessing.Lock), uncontended in well under a microsecond, in whose hold
no garbage collection starts (QuietLock), and nothing done under it grows with the
requests waiting (runtime/gateway/fair.py).

CLOCK_MONOTONIC is one clock for every process on the host, so a bucket's timestamps
mean the same in each worker.
"""

from __future__ import annotations

import gc
import hashlib
import mmap
import multiprocessing
import os
import struct
import time
from contextlib import AbstractContextManager
from typing import Any

from fleetcast.config.model import ConsumerLimits

from .limits import ConsumerLimiter, Throttle, TokenBucket, bucket_shape

SLOTS = 4096  # limiter keys: consumers x (1 + their limited models); far above any config
_SLOT = struct.Struct("<16sqdd")  # key digest, active, tokens, tokens' timestamp (monotonic s)
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
_EMPTY = bytes(16)
_OUTCOME = struct.Struct("<qqd")  # one per worker: in flight when its drain began, cut, its drain budget (s)
MAX_WORKERS = 64
# Peer claims' nonces seen by any worker (runtime/gateway/peer.py): an open-addressed table, each entry a nonce
# digest and the wall-clock second it may be forgotten (a claim is refused as stale FRESH_S after its time, so
# an entry is dead after 2 x FRESH_S). 65,536 entries of 24 bytes: 1.5 MiB, room for about 1,000 forwarded
# requests a second with the table under half full; a nonce probes at most NONCE_PROBES entries.
NONCE_SLOTS = 65536
NONCE_PROBES = 32
_NONCE = struct.Struct("<16sd")


def default_workers(cpus: int | None = None) -> int:
    """Gateway processes for an instance with `cpus` usable CPUs: one per two, from 1 to 4.

    The engine process shares the instance's CPUs (its own event loop and the executor's threads), so the
    gateway takes half: 2 on a g6e.xlarge's 4 vCPUs, where docs/gateway.md measures 2 processes on 2 cores.
    """
    if cpus is None:
        cpus = len(os.sched_getaffinity(0))
    return min(4, max(1, cpus // 2))


class QuietLock:
    """A process-shared lock in whose hold this process starts no garbage collection.

    Every worker waits for the lock, a quiet account's admission too; an automatic collection is triggered by
    whatever allocation crosses the threshold (gc.set_threshold), one made under the lock as likely as any (a
    waiter, its future, the hand-over's callback), and a young collection under a flood walks thousands of objects
    (1-8 ms on the H100 host, bench/FAIRNESS_DEVICE.md call 4): the other workers would wait those out. So automatic
    collection is off while it is held (if it was on) and the collection that came due runs at this process's next
    allocation after the release. Not reentrant, as multiprocessing.Lock."""

    __slots__ = ("_lock", "_collect")

    def __init__(self, lock: Any) -> None:
        self._lock, self._collect = lock, False

    def __enter__(self) -> QuietLock:
        self._lock.acquire()
        if gc.isenabled():
            gc.disable()
            self._collect = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._collect:
            self._collect = False
            gc.enable()
        self._lock.release()

    def acquire(self, *args: Any) -> bool:
        return bool(self._lock.acquire(*args))

    def release(self) -> None:
        self._lock.release()


class SharedState:
    """The shared mapping and its locks; create it before forking the workers."""

    def __init__(self, workers: int = 1):
        if not 1 <= workers <= MAX_WORKERS:
            raise ValueError(f"--workers {workers}: between 1 and {MAX_WORKERS}")
        ctx = multiprocessing.get_context("fork")
        # Limiter slots, the in-flight counter, fair admission's counts. A context manager: the TTFT trace wraps it.
        self.lock: AbstractContextManager[object] = QuietLock(ctx.Lock())
        self.emf_lock = ctx.Lock()  # whole batches of metric lines on the one stdout
        self._outcomes_at = SLOTS * _SLOT.size
        self._in_flight_at = self._outcomes_at + MAX_WORKERS * _OUTCOME.size
        self._nonces_at = self._in_flight_at + _I64.size
        # MAP_SHARED | MAP_ANONYMOUS: kept across fork
        self.mem = mmap.mmap(-1, self._nonces_at + NONCE_SLOTS * _NONCE.size)
        self._offsets: dict[str, int] = {}  # this process's cache of key -> slot offset
        self.workers = workers
        # One pipe per worker: another worker writes a byte to hand it an engine slot its queued request is owed
        # (runtime/gateway/fair.py); made before the fork so every worker holds every write end.
        self.wake_fds = [os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC) for _ in range(workers)]

    def slot(self, key: str, capacity: float) -> int:
        """The slot of `key`; a new one starts with a full bucket. Call with `lock` held."""
        offset = self._offsets.get(key)
        if offset is not None:
            return offset
        digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
        free = None
        for i in range(SLOTS):
            at = i * _SLOT.size
            found = self.mem[at:at + 16]
            if found == digest:
                self._offsets[key] = at
                return at
            if found == _EMPTY:
                free = at
                break  # slots fill in order and are never freed: the first empty one ends the search
        if free is None:
            raise RuntimeError(f"more than {SLOTS} limiter keys; raise runtime.gateway.shared.SLOTS")
        _SLOT.pack_into(self.mem, free, digest, 0, capacity, time.monotonic())
        self._offsets[key] = free
        return free

    def cell(self, key: str) -> int:
        """The offset of a shared (int64, float64) pair under `key`, for state other than limiters (fair
        admission's counts and virtual times); both start at 0. Call with `lock` held."""
        offset = self.slot(key, 0.0) + 16  # a slot's active count, then its tokens: reused as the pair
        return offset

    # The instance-wide count of admitted requests in flight (InFlightAtArrival: this instance, not this worker).
    def enter(self) -> int:
        with self.lock:
            value: int = _I64.unpack_from(self.mem, self._in_flight_at)[0] + 1
            _I64.pack_into(self.mem, self._in_flight_at, value)
        return value

    def leave(self) -> None:
        with self.lock:
            _I64.pack_into(self.mem, self._in_flight_at, _I64.unpack_from(self.mem, self._in_flight_at)[0] - 1)

    def set_outcome(self, worker: int, in_flight: int, cut: int, budget_s: float) -> None:
        _OUTCOME.pack_into(self.mem, self._outcomes_at + worker * _OUTCOME.size, in_flight, cut, budget_s)

    def outcomes(self, workers: int) -> list[tuple[int, int, float]]:
        return [_OUTCOME.unpack_from(self.mem, self._outcomes_at + i * _OUTCOME.size) for i in range(workers)]

    def limiter(self, key: str, limits: ConsumerLimits) -> SharedLimiter:
        return SharedLimiter(self, key, limits)

    def first_use(self, nonce: str, until: float, now: float) -> bool | None:
        """Record a peer claim's nonce for every worker until `until` (wall-clock seconds): True the first time,
        False when any worker recorded it and it has not expired (a replay), None when its NONCE_PROBES entries
        all hold live nonces (the table is full: the caller refuses, as it cannot tell a replay apart)."""
        digest = hashlib.blake2b(nonce.encode(), digest_size=16).digest()
        start = int.from_bytes(digest[:8], "little") % NONCE_SLOTS
        with self.lock:
            free = None
            for i in range(NONCE_PROBES):
                at = self._nonces_at + (start + i) % NONCE_SLOTS * _NONCE.size
                found, expires = _NONCE.unpack_from(self.mem, at)
                if found == digest and expires > now:
                    return False
                if free is None and (found == _EMPTY or expires <= now):
                    free = at  # a dead entry is reused; probing goes on, a live twin may sit further on
                if found == _EMPTY:
                    break  # entries are never emptied: an insert of this nonce would have stopped here or before
            if free is None:
                return None
            _NONCE.pack_into(self.mem, free, digest, until)
            return True


class _SharedBucket(TokenBucket):
    """TokenBucket whose stored tokens and timestamp live in a shared slot (the arithmetic is TokenBucket's)."""

    def __init__(self, mem: mmap.mmap, offset: int, rate: float, capacity: float):
        self.rate, self.capacity, self._clock = rate, capacity, time.monotonic
        self._mem, self._tokens_at, self._stamp_at = mem, offset + 24, offset + 32

    @property
    def _tokens(self) -> float:
        tokens: float = _F64.unpack_from(self._mem, self._tokens_at)[0]
        return tokens

    @_tokens.setter
    def _tokens(self, value: float) -> None:
        _F64.pack_into(self._mem, self._tokens_at, value)

    @property
    def _at(self) -> float:
        stamp: float = _F64.unpack_from(self._mem, self._stamp_at)[0]
        return stamp

    @_at.setter
    def _at(self, value: float) -> None:
        _F64.pack_into(self._mem, self._stamp_at, value)


class SharedLimiter(ConsumerLimiter):
    """A ConsumerLimiter whose count and bucket every worker shares; each operation under the shared lock."""

    def __init__(self, state: SharedState, key: str, limits: ConsumerLimits):
        self._state = state
        self.max_concurrency = limits.max_concurrency
        self.requests_per_minute = limits.requests_per_minute
        rate, capacity = bucket_shape(limits)
        with state.lock:
            offset = state.slot(key, capacity)
        self._active_at = offset + 16
        self.bucket = _SharedBucket(state.mem, offset, rate, capacity)

    @property
    def active(self) -> int:
        active: int = _I64.unpack_from(self._state.mem, self._active_at)[0]
        return active

    @active.setter
    def active(self, value: int) -> None:
        _I64.pack_into(self._state.mem, self._active_at, value)

    def admit(self) -> Throttle | None:
        with self._state.lock:
            return super().admit()

    def release(self) -> None:
        with self._state.lock:
            super().release()

    def cancel(self) -> None:
        with self._state.lock:
            super().cancel()

    def update(self, limits: ConsumerLimits) -> None:
        with self._state.lock:
            super().update(limits)
