"""Limits shared by the gateway's worker processes: one count and one bucket per consumer, whichever process admits."""

from __future__ import annotations

import multiprocessing

import pytest

from fleetcast.config.model import ConsumerLimits
from runtime.gateway.shared import SharedState

TIGHT = ConsumerLimits(max_concurrency=2, requests_per_minute=6000)


def _admit_in_child(state: SharedState, key: str, limits: ConsumerLimits, results) -> None:
    limiter = state.limiter(key, limits)  # the child finds the parent's slot, not a fresh one
    results.put([limiter.admit() is None for _ in range(3)])


def test_a_slot_taken_in_one_process_counts_in_another():
    state = SharedState(workers=2)
    parent = state.limiter("voice-app", TIGHT)
    assert parent.admit() is None and parent.active == 1
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=_admit_in_child, args=(state, "voice-app", TIGHT, results))
    child.start()
    got = results.get(timeout=30)
    child.join(30)
    assert got == [True, False, False]  # one slot was left of two: the parent's request counted there
    assert parent.active == 2
    assert parent.admit() is not None  # ...and the child's counts here
    parent.release()
    parent.release()
    assert parent.active == 0


def test_the_rate_bucket_is_one_across_processes():
    state = SharedState(workers=2)
    rate = ConsumerLimits(max_concurrency=100, requests_per_minute=6)  # a bucket of one token (10 s of 6/min)
    first = state.limiter("analytics", rate)
    assert first.admit() is None
    first.release()
    again = state.limiter("analytics", rate)  # another process's view of the same key (a fresh cache here)
    state._offsets.clear()
    assert state.limiter("analytics", rate).admit().reason == "rate"
    assert again.admit().reason == "rate"


def test_keys_get_their_own_slots_and_a_refused_model_limit_gives_the_consumer_token_back():
    state = SharedState()
    consumer = state.limiter("voice-app", ConsumerLimits(max_concurrency=5, requests_per_minute=60))
    model = state.limiter("voice-app\x00small", ConsumerLimits(max_concurrency=1, requests_per_minute=60))
    assert consumer.admit() is None and model.admit() is None
    assert (consumer.active, model.active) == (1, 1)
    before = consumer.bucket._tokens
    assert consumer.admit() is None
    consumer.cancel()
    assert consumer.active == 1 and consumer.bucket._tokens == pytest.approx(before, abs=0.01)


def test_the_instance_in_flight_count_is_shared_and_worker_counts_are_bounded():
    state = SharedState(workers=3)
    assert [state.enter(), state.enter()] == [1, 2]
    state.leave()
    assert state.enter() == 2
    state.set_outcome(2, 4, 1, 30.0)
    assert state.outcomes(3)[2] == (4, 1, 30.0)
    with pytest.raises(ValueError, match="--workers 0"):
        SharedState(workers=0)


def test_an_instance_runs_one_gateway_process_per_two_cpus_from_one_to_four():
    from runtime.gateway.shared import default_workers

    assert [default_workers(n) for n in (1, 2, 4, 8, 16, 192)] == [1, 1, 2, 4, 4, 4]  # g6e.xlarge: 4 vCPUs -> 2
