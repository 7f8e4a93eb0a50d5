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


# ------------------------------------------------------------ peer claims' replay table (peer.py Verifier)

PEER_KEY = b"p" * 48


def _verify_in_child(state: SharedState, header: str, body: bytes, results) -> None:
    from runtime.gateway.peer import PeerRefused, Verifier

    try:
        Verifier(PEER_KEY, "us-west-2", first_use=state.first_use).verify(header, body)
        results.put("accepted")
    except PeerRefused as exc:
        results.put(str(exc))


def _in_child(target, *args):
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=target, args=(*args, results))
    child.start()
    got = results.get(timeout=30)
    child.join(30)
    return got


def test_a_claim_accepted_by_one_worker_is_refused_as_a_replay_by_another():
    from runtime.gateway.peer import PeerRefused, Verifier, sign

    state = SharedState(workers=2)
    body = b'{"model":"m"}'
    header = sign(PEER_KEY, consumer="checkout", model="m", origin="us-east-1", destination="us-west-2", body=body)
    assert _in_child(_verify_in_child, state, header, body) == "accepted"  # worker 1 serves it
    with pytest.raises(PeerRefused, match="replay"):  # the same header reaching worker 0 afterwards
        Verifier(PEER_KEY, "us-west-2", first_use=state.first_use).verify(header, body)
    # What the shared table fixes: a verifier remembering only its own process's nonces would serve it again.
    assert Verifier(PEER_KEY, "us-west-2").verify(header, body).consumer == "checkout"
    # ...and a fresh claim (a retry signs anew) still passes everywhere.
    again = sign(PEER_KEY, consumer="checkout", model="m", origin="us-east-1", destination="us-west-2", body=body)
    assert _in_child(_verify_in_child, state, again, body) == "accepted"


def test_the_replay_table_is_bounded_reuses_expired_entries_and_refuses_when_full(monkeypatch):
    import runtime.gateway.shared as shared

    monkeypatch.setattr(shared, "NONCE_SLOTS", 8)
    monkeypatch.setattr(shared, "NONCE_PROBES", 8)
    state = SharedState()
    assert len(state.mem) == state._nonces_at + 8 * shared._NONCE.size  # the table's size is fixed at start
    assert all(state.first_use(f"n{i}", until=100.0, now=0.0) for i in range(8))
    assert state.first_use("n3", until=100.0, now=50.0) is False  # live: a replay
    assert state.first_use("n8", until=100.0, now=50.0) is None  # every entry live: cannot tell, refused
    assert state.first_use("n8", until=200.0, now=100.0) is True  # the entries expired: reused
    assert state.first_use("n3", until=200.0, now=100.0) is True  # an expired nonce is forgotten
    assert state.first_use("n8", until=200.0, now=150.0) is False


def test_a_full_replay_table_refuses_the_claim_rather_than_letting_it_pass(monkeypatch):
    import runtime.gateway.shared as shared
    from runtime.gateway.peer import PeerRefused, Verifier, sign

    monkeypatch.setattr(shared, "NONCE_SLOTS", 2)
    monkeypatch.setattr(shared, "NONCE_PROBES", 2)
    state = SharedState()
    verifier = Verifier(PEER_KEY, "us-west-2", first_use=state.first_use)
    claims = [sign(PEER_KEY, consumer="c", model="m", origin="a", destination="us-west-2", body=b"") for _ in range(3)]
    verifier.verify(claims[0], b"")
    verifier.verify(claims[1], b"")
    with pytest.raises(PeerRefused, match="too many peer claims"):
        verifier.verify(claims[2], b"")


def test_no_garbage_collection_starts_while_a_worker_holds_the_shared_lock_and_the_one_due_runs_after():
    """Every worker waits for the shared lock, so a collection begun under it (any allocation may cross the
    threshold) would stall them all. Counted by the collector's own callbacks: allocations that cross the young
    threshold many times over start no collection under the lock, and the one that came due runs at the first
    allocation after the release; a process that had automatic collection off keeps it off."""
    import gc

    state = SharedState(workers=2)
    starts: list[bool] = []
    holding = [False]

    def watch(phase: str, _info: dict) -> None:
        if phase == "start":
            starts.append(holding[0])

    threshold = gc.get_threshold()
    gc.callbacks.append(watch)
    gc.set_threshold(100, *threshold[1:])
    kept = []
    try:
        assert gc.isenabled()
        with state.lock:
            holding[0] = True
            kept += [[i] for i in range(5000)]  # 50 times the young threshold in tracked objects
            holding[0] = False
        under = list(starts)
        kept += [[i] for i in range(200)]
        after = len(starts) - len(under)
        gc.disable()
        try:
            with state.lock:
                pass
            still_off = not gc.isenabled()
        finally:
            gc.enable()
    finally:
        gc.callbacks.remove(watch)
        gc.set_threshold(*threshold)
    assert True not in under and after >= 1 and still_off
