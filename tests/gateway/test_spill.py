"""The spill decision, the breaker and the peer claim, as code (runtime/gateway/spill.py, peer.py); the same code
across real processes is tests/gateway/test_spill_processes.py."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings, strategies as st

from fleetcast.contract.spill import may_serve_in
from runtime.gateway.peer import FRESH_S, PeerRefused, Verifier, sign
from runtime.gateway.spill import (
    LEAVE_RATIO,
    RESERVE,
    Breaker,
    Headroom,
    ModelHeadroom,
    RegionLink,
    SpillPolicy,
    advertised_free,
    choose_peer,
    predicted_wait_s,
)

REGIONS = ("us-east-1", "us-west-2", "eu-west-1", "ap-northeast-2")
KEY = b"s" * 32


@dataclass(frozen=True)
class Consumer:
    name: str
    service_region: str
    spill_regions: tuple[str, ...]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def policy(clock: Clock, rooms: dict[str, int], rtt_ms: float = 10.0) -> SpillPolicy:
    links = {}
    for region, free in rooms.items():
        link = RegionLink(region, ("127.0.0.1", 1), Breaker(clock))
        link.headroom = Headroom(region, {"m": ModelHeadroom(free, 8, 40.0)})
        link.fetched_at, link.rtt_ms = clock(), rtt_ms
        links[region] = link
    return SpillPolicy(links, {r: frozenset({"m"}) for r in rooms}, clock)


@settings(max_examples=300, deadline=None)
@given(home=st.sampled_from(REGIONS), allowed=st.lists(st.sampled_from(REGIONS), max_size=4, unique=True),
       rooms=st.dictionaries(st.sampled_from(REGIONS), st.integers(0, 4)),
       loads=st.lists(st.floats(0, 5000), min_size=1, max_size=20))
def test_residency_a_request_never_goes_to_a_region_its_consumer_does_not_allow(home, allowed, rooms, loads):
    consumer = Consumer("c", home, tuple(allowed))
    clock = Clock()
    p = policy(clock, rooms)
    for local_ms in loads:
        decision = p.decide(consumer, "m", "m", 0, local_ms, 300.0)
        if decision.region is not None:
            assert decision.region in allowed and decision.region != home
            assert may_serve_in(consumer, decision.region)
        if not allowed:
            assert decision.region is None and decision.reason.startswith("residency")
        clock.now += 0.1


def test_it_spills_only_past_the_slo_to_a_region_with_headroom_that_beats_waiting_and_never_a_second_hop():
    clock = Clock()
    consumer = Consumer("c", "us-east-1", ("us-west-2",))
    p = policy(clock, {"us-west-2": 2})
    assert p.decide(consumer, "m", "m", 0, 200.0, 300.0).region is None  # within the SLO
    assert p.decide(consumer, "m", "m", 0, 900.0, 300.0).region == "us-west-2"
    assert p.decide(consumer, "m", "m", 1, 900.0, 300.0).reason.startswith("hop")
    assert p.decide(consumer, "other", "other", 0, 900.0, 300.0).reason.startswith("not_served")
    slow = policy(clock, {"us-west-2": 2}, rtt_ms=2000.0)  # the round trip costs more than waiting here
    assert slow.decide(consumer, "m", "m", 0, 900.0, 300.0).reason.startswith("slower")
    full = policy(clock, {"us-west-2": 0})
    assert full.decide(consumer, "m", "m", 0, 900.0, 300.0).reason.startswith("no_headroom")
    clock.now += 10  # the headroom answer aged out: no spill on old news
    assert p.decide(consumer, "m", "m", 0, 900.0, 300.0).region is None


def test_hysteresis_keeps_spilling_until_the_prediction_falls_well_below_the_slo():
    clock = Clock()
    consumer = Consumer("c", "us-east-1", ("us-west-2",))
    p = policy(clock, {"us-west-2": 4})
    assert p.decide(consumer, "m", "m", 0, 301.0, 300.0).region == "us-west-2"
    # Just under the target, it keeps spilling (no flapping at the threshold) ...
    assert p.decide(consumer, "m", "m", 0, 290.0, 300.0).region == "us-west-2"
    assert p.decide(consumer, "m", "m", 0, 300.0 * LEAVE_RATIO + 1, 300.0).region == "us-west-2"
    # ... and stops only below LEAVE_RATIO of it, not starting again until above the target.
    assert p.decide(consumer, "m", "m", 0, 300.0 * LEAVE_RATIO - 1, 300.0).region is None
    assert p.decide(consumer, "m", "m", 0, 290.0, 300.0).region is None


def test_the_breaker_opens_after_failures_in_a_row_lets_one_probe_through_and_backs_off_when_it_fails():
    clock = Clock()
    breaker = Breaker(clock, failures=3, cool_s=5.0, max_cool_s=20.0)
    for _ in range(2):
        breaker.failure()
    assert breaker.state == "closed"
    breaker.failure()
    assert breaker.state == "open" and not breaker.allow()
    clock.now += 5.0
    assert breaker.state == "half_open"
    assert breaker.allow() and not breaker.allow()  # one probe at a time
    breaker.failure()  # the probe failed: open again, for twice as long
    clock.now += 5.0
    assert breaker.state == "open"
    clock.now += 5.0
    assert breaker.allow()
    breaker.success()
    assert breaker.state == "closed" and breaker.cool_s == 5.0


def test_a_full_engine_predicts_a_wait_of_the_queue_ahead_over_its_service_rate():
    assert predicted_wait_s(3, 0, 4, 2.0) == 0.0
    assert predicted_wait_s(4, 0, 4, 2.0) == pytest.approx(0.5)
    assert predicted_wait_s(4, 3, 4, 2.0) == pytest.approx(2.0)


def test_a_claim_is_accepted_once_for_its_destination_its_body_and_while_fresh():
    clock = Clock()
    verifier = Verifier(KEY, "us-west-2", clock)
    header = sign(KEY, consumer="c", model="m", origin="us-east-1", destination="us-west-2", body=b"{}", now=clock)
    claim = verifier.verify(header, b"{}")
    assert (claim.consumer, claim.model, claim.origin, claim.hop) == ("c", "m", "us-east-1", 1)
    with pytest.raises(PeerRefused, match="replay"):
        verifier.verify(header, b"{}")
    stale = sign(KEY, consumer="c", model="m", origin="us-east-1", destination="us-west-2", body=b"{}",
                 now=lambda: clock.now - FRESH_S - 1)
    with pytest.raises(PeerRefused, match="stale"):
        verifier.verify(stale, b"{}")
    payload = header.split(".")
    with pytest.raises(PeerRefused, match="signature"):
        verifier.verify(".".join([payload[0], payload[1][:-2] + "AA", payload[2]]), b"{}")
    with pytest.raises(ValueError, match="at least 32"):
        Verifier(b"short", "us-west-2")


def test_a_region_offers_its_free_room_less_a_reserve_for_its_own_consumers():
    assert advertised_free(0, 0, 8) == 8 - int(8 * RESERVE)
    assert advertised_free(4, 1, 8) == max(0, 3 - int(8 * RESERVE))
    assert advertised_free(0, 0, 1) == 1  # a one-slot engine offers its slot while idle
    assert advertised_free(8, 2, 8) == 0


def test_one_headroom_answer_is_spent_at_most_once_per_request_it_offered():
    clock = Clock()
    consumer = Consumer("c", "us-east-1", ("us-west-2",))
    p = policy(clock, {"us-west-2": 2})
    assert [p.decide(consumer, "m", "m", 0, 900.0, 300.0).region for _ in range(3)] == ["us-west-2"] * 2 + [None]


def test_the_local_prediction_asks_fair_admission_per_consumer_and_falls_back_to_its_counts():
    """Gateway._predicted_local_ttft_ms: fair admission's own per-consumer query where it has one (its order by
    weight and class), else (none, or no rate measured yet) the counts' estimate; plus the measured TTFT."""
    from types import SimpleNamespace

    from runtime.gateway.server import Gateway
    from runtime.gateway.spill import LoadGauge

    asked = []

    def query(consumer, model):
        asked.append((consumer, model))
        return 1.5

    gauge = LoadGauge(ttft_ms=50.0, service_s=2.0)
    fake = SimpleNamespace(fair=SimpleNamespace(predicted_wait_s=query), gauge=gauge, _load=lambda m: (1, 0, 1))
    assert Gateway._predicted_local_ttft_ms(fake, "c", "m") == pytest.approx(1550.0)
    assert asked == [("c", "m")]
    fake.fair = SimpleNamespace(predicted_wait_s=lambda c, m: None)  # no rate measured yet: the counts decide
    assert Gateway._predicted_local_ttft_ms(fake, "c", "m") == pytest.approx(2050.0)
    fake.fair = None  # fair admission off
    assert Gateway._predicted_local_ttft_ms(fake, "c", "m") == pytest.approx(2050.0)


def peer(name: str, price: float, free: int, capacity: int, clock: Clock, ttft_ms: float = 40.0) -> RegionLink:
    link = RegionLink(name, ("127.0.0.1", 1), Breaker(clock), pool=name, price=price, direct=True)
    link.headroom = Headroom("r", {"m": ModelHeadroom(free, capacity, ttft_ms)})
    link.fetched_at, link.rtt_ms = clock(), 1.0
    return link


def test_balancing_prefers_the_cheapest_pool_per_slot_then_the_most_room_for_its_size():
    clock = Clock()
    spot_large = peer("spot-g6e", price=0.9, free=1, capacity=8, clock=clock)  # 0.11 per slot
    large = peer("g6e", price=1.9, free=6, capacity=8, clock=clock)  # 0.24 per slot
    small = peer("g5", price=1.0, free=1, capacity=1, clock=clock)  # 1.0 per slot
    assert choose_peer([small, large, spot_large], "m", 500.0, clock) is spot_large
    # Its one offered slot spent, the next goes to the next cheapest per slot, not the emptiest small one.
    assert choose_peer([small, large, spot_large], "m", 500.0, clock) is large
    twin = peer("g6e-b", price=1.9, free=2, capacity=8, clock=clock)
    assert choose_peer([twin, large], "m", 500.0, clock) is large  # same price: more room per capacity
    assert choose_peer([small], "m", 30.0, clock) is None  # waiting here is quicker than the hop
    clock.now += 10
    assert choose_peer([small, large], "m", 500.0, clock) is None  # old headroom: no forwarding on old news


def test_a_direct_connection_may_carry_a_claim_only_from_a_named_peer_and_an_endpoint_only_if_the_provider_owns_it():
    import asyncio
    from types import SimpleNamespace

    from runtime.gateway.identity import Endpoint
    from runtime.gateway.server import Gateway

    owners = {"vpce-spill": "111122223333", "vpce-consumer": "444455556666"}

    async def lookup(vpce):
        return Endpoint(vpce, owners[vpce], "available", None) if vpce in owners else None

    fake = SimpleNamespace(spill=SimpleNamespace(peers=frozenset({"10.0.1.5"}), provider_account="111122223333"),
                           identity=SimpleNamespace(endpoints=SimpleNamespace(lookup=lookup)))

    def asks(vpce, source):
        return asyncio.run(Gateway._from_peer(fake, vpce, source))

    assert asks(None, ("10.0.1.5", 40000)) and not asks(None, ("10.0.1.6", 40000))
    assert asks("vpce-spill", ("10.0.9.9", 1)) and not asks("vpce-consumer", ("10.0.1.5", 1))
    assert not asks("vpce-unknown", ("10.0.1.5", 1))  # a PROXY header naming an endpoint: its owner decides
    fake.spill = None
    assert not asks(None, ("10.0.1.5", 1))  # without spill set up, nobody is a peer
