"""A capacity reservation (--reserved TYPE@REGION=N) is counted once in a plan (packing.claim_reserved, the one rule;
docs/plan.md, "Pooling across regions"): each consumer region's own choice sees only what the regions before it left,
the fleet's pools share it, and "each region on its own" never costs less than the fleet runs the same instances for.

AWS bills a Capacity Reservation at the On-Demand rate whether instances run in it or not ("Capacity Reservations are
charged at the equivalent On-Demand rate whether you run instances in reserved capacity or not": Amazon EC2 User Guide,
"Capacity Reservation pricing and billing",
docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-pricing-billing.html): N reserved instances are one
sunk set, so they make N instances free once, never once per region or pool that could run on them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleetcast.plan.packing import PackingEval, claim_reserved
from fleetcast.plan.run import PlanOptions, build_packing

from .conftest import ROOT

SEED = ROOT / "examples" / "plan" / "seed"
TWO_REGIONS = ROOT / "examples" / "plan" / "two-regions" / "traffic.yaml"
MULTI = ROOT / "examples" / "plan" / "multi-model"

CASES = {
    "two-regions": (dict(results=[str(SEED / "results")], traffic=str(TWO_REGIONS),
                         config=str(ROOT / "config/fleet.yaml")), ("g6e.xlarge", "us-east-1"), 3),
    "seed-arrivals": (dict(results=[str(SEED / "results")], traffic=str(SEED / "traffic-seoul-arrivals.yaml"),
                           config=str(ROOT / "config/fleet.yaml")), ("g6e.xlarge", "ap-northeast-2"), 3),
    "multi-model": (dict(results=[str(MULTI / "results")], traffic=str(MULTI / "traffic.yaml"),
                         config=str(MULTI / "fleet.yaml")), ("g6e.xlarge", "ap-northeast-2"), 1),
}


def _plan(name, reserved):
    args, _, _ = CASES[name]
    result, _, _ = build_packing(PlanOptions(**args, reserved=reserved))
    return result


def _true_cost(evs, reserved):
    """$/h of running `evs` side by side: each pays its instances beyond a reservation drawn once, in order."""
    left, total = dict(reserved), 0.0
    for e in evs:
        at = (e.instance_type, e.region)
        share = min(left.get(at, 0), max(e.instances_by_hour))
        left[at] = left.get(at, 0) - share
        total += sum(max(n - share, 0) * e.price_per_hour + f for n, f in zip(e.instances_by_hour, e.fixed_by_hour))
    return total / 24


def _credited(evs):
    out: dict[tuple[str, str], int] = {}
    for e in evs:
        out[(e.instance_type, e.region)] = out.get((e.instance_type, e.region), 0) + e.reserved_used
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_no_reservation_is_credited_to_two_regions_or_two_pools(name):
    """Before: two-regions with 3 x g6e.xlarge reserved in us-east-1 credited 3 to us-east-1's own choice and 3 more
    to us-east-2's (its pick $0.43/h @ us-east-1, 'decided by the reservation'): 6 of 3."""
    _, at, n = CASES[name]
    result = _plan(name, {at: n})
    winners = [w for w, _ in result.winners()]
    for evs in (winners, result.pools):
        assert all(used <= n if key == at else used == 0 for key, used in _credited(evs).items())
        # Each is priced as it is billed: its instances beyond its own share of the reservation, plus fixed costs.
        for e in evs:
            assert e.cost_per_hour == pytest.approx(_true_cost([e], {at: e.reserved_used}))


@pytest.mark.parametrize("name", list(CASES))
def test_each_region_on_its_own_never_costs_less_than_the_fleet(name):
    """Before: two-regions reserved read 'packed $2.10/h' against regions on their own at $0.37 + $0.43 = $0.80/h, the
    same 3 reserved instances free in both. Now us-east-2 on its own pays for its instances ($3.75/h) and joins the
    us-east-1 pool for +$1.73/h."""
    _, at, n = CASES[name]
    result = _plan(name, {at: n})
    winners = [w for w, _ in result.winners()]
    separate = sum(w.cost_per_hour for w in winners)
    assert separate == pytest.approx(_true_cost(winners, {at: n}))
    assert result.cost_per_hour == pytest.approx(_true_cost(result.pools, {at: n}))
    assert result.cost_per_hour <= separate + 1e-9


def test_two_regions_reserved_prices_us_east_2_without_us_east_1s_reservation():
    result = _plan("two-regions", {("g6e.xlarge", "us-east-1"): 3})
    east, ohio = result.regions
    assert east.winner is not None and ohio.winner is not None
    assert east.winner.reserved_used == 3 and ohio.winner.reserved_used == 0
    assert not ohio.decided_by  # nothing was left of the reservation to decide its pick
    plain = _plan("two-regions", {})
    assert ohio.winner.cost_per_hour == pytest.approx(plain.regions[1].winner.cost_per_hour)


@pytest.mark.parametrize("name", list(CASES))
def test_without_a_reservation_nothing_is_reserved(name):
    result = _plan(name, {})
    assert all(e.reserved_used == 0 for e in [w for w, _ in result.winners()] + result.pools)
    assert result.cost_per_hour == pytest.approx(_true_cost(result.pools, {}))


def _ev(n_by_hour, region="us-east-1", reserved_used=0):
    ev = PackingEval("g6e.xlarge", region, [], None, price_per_hour=2.0, instances_by_hour=list(n_by_hour),
                     fixed_by_hour=[0.5] * 24)
    ev.reserved_used = reserved_used
    return replace(ev, cost_by_hour=[max(n - reserved_used, 0) * 2.0 + 0.5 for n in n_by_hour],
                   cost_per_hour=sum(max(n - reserved_used, 0) * 2.0 + 0.5 for n in n_by_hour) / 24)


def test_two_pools_of_one_type_and_region_share_its_reservation():
    """Two pools on g6e.xlarge in us-east-1, each priced with all 3 reserved: the first keeps its 2 (its peak), the
    second gets the 1 left and pays for its other 2 instances every hour."""
    left = {("g6e.xlarge", "us-east-1"): 3}
    first = claim_reserved(left, _ev([2] * 24, reserved_used=2))
    second = claim_reserved(left, _ev([3] * 24, reserved_used=3))
    assert (first.reserved_used, second.reserved_used) == (2, 1)
    assert second.cost_per_hour == pytest.approx(2 * 2.0 + 0.5)
    assert left == {("g6e.xlarge", "us-east-1"): 0}
    other = claim_reserved(left, _ev([1] * 24, region="us-east-2"))
    assert other.reserved_used == 0 and other.cost_per_hour == pytest.approx(2.5)
