"""A shared reserve for regions whose peaks do not coincide (issue 36 §2, last bullet; docs/plan.md, "A shared
reserve across regions"): worked out by hand on small days, residency (consumers[].spill_regions) never broken,
the SLO with the round trip checked, and on examples/plan/shared-reserve through the CLI."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings, strategies as st
from ruamel.yaml import YAML

from fleetcast.config import load_config
from fleetcast.plan.reserve import RegionDemand, _search, host_capacity, size_shared_reserve, spill_targets

from .conftest import ROOT

EXAMPLE = ROOT / "examples" / "plan" / "shared-reserve"
SEED = ROOT / "examples" / "plan" / "seed"


def _day(busy: range, peak: int, quiet: int) -> tuple[int, ...]:
    return tuple(peak if h in busy else quiet for h in range(24))


def _demand(region, hours, spill_to=(), price=1.0, floor=1, worst=200.0, reserved=0) -> RegionDemand:
    return RegionDemand(region, hours, price, floor, frozenset(spill_to), worst, 300.0, reserved=reserved)


def _rtt(a: str, b: str) -> float:
    return 1.0 if a == b else 60.0


def test_two_regions_busy_at_different_hours_share_one_reserve():
    """East: 10 instances 13-21 UTC, 2 otherwise; west: 8 instances 01-07, 2 otherwise. Each for its own peak holds
    18. West hosting east's overflow: east keeps 2 and west needs max(8 + 0, 2 + 8) = 10 -> 12 held, 6 fewer."""
    east = _demand("us-east-1", _day(range(13, 21), 10, 2), ["us-west-2"])
    west = _demand("us-west-2", _day(range(1, 7), 8, 2), ["us-east-1"])
    plan = size_shared_reserve([east, west], _rtt)
    assert plan.separate_instances == 18
    assert plan.shared_instances == 12 and plan.method == "exact"
    # Both hosts give 12 at equal prices (east hosting: west keeps 2, east holds max(10, 2 + 6) = 10): the first wins.
    assert (plan.host, plan.bases, plan.host_capacity) == ("us-east-1", {"us-west-2": 2}, 10)
    text = "\n".join(plan.lines())
    assert "18 instances held" in text and "12 instances held, 6 fewer (33%)" in text
    assert "us-west-2 spills to us-east-1 above 2 instance(s): UTC hours 01-07, up to 6 instance(s)' load" in text


def test_the_cheaper_region_hosts_when_prices_differ():
    """East at twice west's price keeps only its floor (1) and west holds max(8, 2 + 9) = 11: 2 x 1 + 11 = 13
    against 2 x 10 + 8 = 28 (a base of 2 would cost 2 x 2 + 10 = 14)."""
    east = _demand("us-east-1", _day(range(13, 21), 10, 2), ["us-west-2"], price=2.0)
    west = _demand("us-west-2", _day(range(1, 7), 8, 2), ["us-east-1"], price=1.0)
    plan = size_shared_reserve([east, west], _rtt)
    assert plan.host == "us-west-2" and plan.bases == {"us-east-1": 1} and plan.host_capacity == 11
    assert plan.shared_cost_per_hour == pytest.approx(2 * 1 + 11 * 1) and plan.separate_cost_per_hour == 28


def test_strict_residency_keeps_a_region_at_its_own_peak():
    """A region whose consumers allow no spill region (the default) never sends requests to the reserve; it may
    still host the others' overflow, which their own spill_regions allow."""
    east = _demand("us-east-1", _day(range(13, 21), 10, 2), [])
    west = _demand("us-west-2", _day(range(1, 7), 8, 2), ["us-east-1"])
    plan = size_shared_reserve([east, west], _rtt)
    assert plan.host == "us-east-1" and "us-east-1" not in plan.bases and plan.bases == {"us-west-2": 2}
    alone = size_shared_reserve([_demand("a", _day(range(1, 7), 8, 2)), _demand("b", _day(range(13, 21), 8, 2))],
                                _rtt)
    assert alone.host is None and alone.shared_instances == alone.separate_instances == 16
    assert "strict residency" in " ".join(alone.lines())


def test_a_spill_whose_round_trip_breaks_the_ttft_slo_is_not_planned():
    east = _demand("us-east-1", _day(range(13, 21), 10, 2), ["eu-west-1"], worst=260.0)
    eu = _demand("eu-west-1", _day(range(1, 7), 8, 2), [], worst=200.0)
    plan = size_shared_reserve([east, eu], lambda a, b: 75.0)
    assert plan.host is None and plan.shared_instances == 18
    assert "planned 260 ms + 75 ms round trip > 300 ms" in plan.excluded["us-east-1"]


def test_a_floor_is_kept_at_home():
    east = _demand("us-east-1", _day(range(13, 21), 10, 4), ["us-west-2"], floor=3)
    west = _demand("us-west-2", _day(range(1, 7), 8, 2), ["us-east-1"], floor=1)
    plan = size_shared_reserve([east, west], _rtt)
    assert all(b >= {"us-east-1": 3, "us-west-2": 1}[r] for r, b in plan.bases.items())


days = st.lists(st.integers(0, 6), min_size=24, max_size=24).map(tuple)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(days, st.sets(st.sampled_from(["a", "b", "c"])), st.integers(1, 3)), min_size=2,
                max_size=3))
def test_residency_holds_and_every_hour_is_served(regions):
    """Property: whatever the days and allow-lists, only a region whose consumers allow the host sends it anything,
    and every hour the capacity held covers what runs: each spilling region's base at home, the host its own load
    plus every excess. The shared reserve never holds more than every region at its own peak."""
    names = ["a", "b", "c"]
    demands = [_demand(names[i], tuple(max(1, n) for n in day), allow - {names[i]}, floor=1, price=float(p))
               for i, (day, allow, p) in enumerate(regions)]
    plan = size_shared_reserve(demands, _rtt)
    assert plan.shared_cost_per_hour <= plan.separate_cost_per_hour + 1e-9
    if plan.host is None:
        return
    by = {d.region: d for d in demands}
    for region in plan.bases:
        assert plan.host in by[region].spill_to  # residency
    for h in range(24):
        excess = sum(max(0, by[r].instances_by_hour[h] - b) for r, b in plan.bases.items())
        assert by[plan.host].instances_by_hour[h] + excess <= plan.host_capacity


def test_the_move_search_finds_what_trying_every_base_finds_on_small_days():
    host = _demand("h", _day(range(1, 7), 6, 1), [])
    others = [_demand("x", _day(range(13, 17), 5, 1), ["h"]), _demand("y", _day(range(17, 21), 5, 2), ["h"])]
    exact, how = _search(host, others)
    assert how == "exact"
    brute = min(itertools.product(range(1, 6), range(1, 6)),
                key=lambda b: (sum(b) + host_capacity(host, others, b), -sum(b)))
    assert sum(exact) + host_capacity(host, others, exact) == sum(brute) + host_capacity(host, others, brute)


def test_spill_targets_are_what_every_consumer_of_a_region_allows(tmp_path):
    cfg = load_config(EXAMPLE / "fleet.yaml")
    assert spill_targets(cfg, "us-east-1") == {"us-west-2"} and spill_targets(cfg, "us-west-2") == {"us-east-1"}
    assert spill_targets(cfg, "eu-west-1") == frozenset()  # no consumer: strict


def test_the_example_through_the_cli(capsys, tmp_path, unrasterized):
    from scripts.cli import main

    args = ["plan", "--results", str(SEED / "results"), "--traffic", str(EXAMPLE / "traffic.yaml"),
            "--config", str(EXAMPLE / "fleet.yaml"), "--shared-reserve", "--report", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    section = out[out.index("Shared reserve across regions"):]
    assert "each region for its own peak: 8 instances held" in section
    assert "shared reserve in us-east-1" in section and "5 instances held, 3 fewer (38%)" in section
    doc = json.loads((tmp_path / "reserve.json").read_text())
    assert doc["separate"]["instances"] == 8 and doc["shared"]["instances"] == 5 and doc["host"] == "us-east-1"


def test_a_strict_consumer_keeps_its_region_home_in_the_example(capsys, tmp_path):
    """The same example with support's spill_regions removed: us-west-2 may no longer spill to us-east-1; us-east-1
    (which peaks 13-21) may still spill to us-west-2."""
    from scripts.cli import main

    yaml = YAML()
    doc = yaml.load(EXAMPLE / "fleet.yaml")
    del next(c for c in doc["consumers"] if c["name"] == "support")["spill_regions"]
    path = tmp_path / "fleet.yaml"
    yaml.dump(doc, path)
    assert main(["plan", "--results", str(SEED / "results"), "--traffic", str(EXAMPLE / "traffic.yaml"),
                 "--config", str(path), "--shared-reserve", "--json"]) == 0
    err = capsys.readouterr().err
    assert "us-west-2 spills" not in err and "us-east-1 spills to us-west-2" in err


def test_a_packing_plan_of_one_region_has_nothing_to_share(capsys):
    """The packing plan's regions feed the same reserve (demands_of): the H200 example serves one region."""
    from scripts.cli import main

    data, scenario = ROOT / "bench" / "data", ROOT / "examples" / "plan" / "h200-colocate"
    files = [str(data / f"h200-colocate-{m}-{k}.json") for m in ("gpt2-medium", "gpt2-xl") for k in ("alone", "together")]
    assert main(["plan", "--results", *files, "--traffic", str(scenario / "traffic.yaml"), "--config",
                 str(scenario / "fleet.yaml"), "--lab", "H200=lab.h200", "--prices", str(scenario / "prices.yaml"),
                 "--shared-reserve"]) == 0
    out = capsys.readouterr().out
    assert "each region for its own peak: 1 instances held (ap-northeast-2 1)" in out and "one region: nothing to share" in out


@pytest.mark.parametrize("extra", [["simulate"], ["--check"]])
def test_the_reserve_goes_with_a_plan_only(extra, capsys):
    from scripts.cli import main

    args = ["--results", str(SEED / "results"), "--traffic", str(EXAMPLE / "traffic.yaml"), "--config",
            str(EXAMPLE / "fleet.yaml"), "--shared-reserve"]
    code = main(["plan", *extra, *args]) if extra == ["simulate"] else main(["plan", *args, *extra])
    assert code == 2 and "--shared-reserve goes with a plan" in capsys.readouterr().err


# --reserved: a Capacity Reservation is billed whether it is used or not ("Capacity Reservations are charged at the
# equivalent On-Demand rate whether you run instances in reserved capacity or not": Amazon EC2 User Guide, "Capacity
# Reservation pricing and billing", docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-pricing-billing.html).
# Reserved instances are sunk: holding fewer than them saves nothing, and only capacity held beyond them costs.


def test_reservations_that_hold_every_peak_leave_nothing_to_save():
    """Before, the reserve priced every instance held as if it could be given back: with east's 10 and west's 8
    reserved it still planned 'us-west-2 keeps 2, 12 instances held, 6 fewer, $6.00/h less'. Nothing is paid
    beyond the reservations, so sharing saves nothing and the plan says why."""
    east = _demand("us-east-1", _day(range(13, 21), 10, 2), ["us-west-2"], reserved=10)
    west = _demand("us-west-2", _day(range(1, 7), 8, 2), ["us-east-1"], reserved=8)
    plan = size_shared_reserve([east, west], _rtt)
    assert plan.separate_cost_per_hour == 0 and plan.host is None and plan.shared_cost_per_hour == 0
    text = "\n".join(plan.lines())
    assert "$0.00/h if held all day beyond the 18 reserved (--reserved, billed whether used or not)" in text
    assert "sharing a reserve saves nothing beyond the reservations" in plan.excluded["us-east-1"]


def test_a_hosts_idle_reservation_takes_the_others_overflow_for_free():
    """East has its peak of 10 reserved and runs 2 outside 13-21 UTC, so 8 reserved instances idle while west peaks
    (01-07). West keeps 2 and spills 6 to east, which holds max(10, 2 + 6) = 10, all reserved: $2/h beyond the
    reservation against $8/h (west's own peak)."""
    east = _demand("us-east-1", _day(range(13, 21), 10, 2), ["us-west-2"], reserved=10)
    west = _demand("us-west-2", _day(range(1, 7), 8, 2), ["us-east-1"])
    plan = size_shared_reserve([east, west], _rtt)
    assert (plan.host, plan.bases, plan.host_capacity) == ("us-east-1", {"us-west-2": 2}, 10)
    assert plan.separate_cost_per_hour == 8 and plan.shared_cost_per_hour == 2
    assert "$6.00/h less if held all day beyond the 10 reserved" in "\n".join(plan.lines())
    assert plan.to_json()["regions"][0]["reserved"] == 10


def test_a_region_never_gives_back_what_it_has_reserved():
    """West has its peak of 8 reserved. Before, the reserve still had west keep 2 and east host (12 held, '6 fewer,
    $6.00/h less'): west's 8 are billed whatever it keeps, so that plan saved nothing. Now east's overflow goes
    into west's idle reservation instead: west hosts, holding its own 8, and east keeps 4 of its 10: $4/h beyond
    the reservation against $10/h, a saving of $6/h that is real."""
    east = _demand("us-east-1", _day(range(13, 21), 10, 2), ["us-west-2"])
    west = _demand("us-west-2", _day(range(1, 7), 8, 2), ["us-east-1"], reserved=8)
    plan = size_shared_reserve([east, west], _rtt)
    assert (plan.host, plan.bases, plan.host_capacity) == ("us-west-2", {"us-east-1": 4}, 8)
    assert plan.separate_cost_per_hour == 10 and plan.shared_cost_per_hour == 4


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(days, st.sets(st.sampled_from(["a", "b", "c"])), st.integers(1, 3), st.integers(0, 7)),
                min_size=2, max_size=3))
def test_the_saving_never_exceeds_what_is_paid_beyond_the_reservations(regions):
    """Property: whatever the days, allow-lists and reservations, the shared reserve's cost is what it holds beyond
    each region's reservation, never negative, never above every region at its own peak; so the saving is at most
    what the regions pay beyond their reservations, and no base drops below a reservation it could fill."""
    names = ["a", "b", "c"]
    demands = [_demand(names[i], tuple(max(1, n) for n in day), allow - {names[i]}, floor=1, price=float(p),
                       reserved=r) for i, (day, allow, p, r) in enumerate(regions)]
    plan = size_shared_reserve(demands, _rtt)
    by = {d.region: d for d in demands}
    paid = sum(d.price_per_hour * max(0, n - d.reserved) for d in demands for n in [plan.held()[d.region]])
    assert plan.shared_cost_per_hour == pytest.approx(paid) and paid >= 0
    assert plan.separate_cost_per_hour == pytest.approx(sum(d.price_per_hour * max(0, d.peak - d.reserved)
                                                            for d in demands))
    assert 0 <= plan.separate_cost_per_hour - plan.shared_cost_per_hour <= plan.separate_cost_per_hour + 1e-9
    if plan.host is not None and plan.method == "exact":
        assert all(b >= min(by[r].reserved, by[r].peak) for r, b in plan.bases.items())


def test_the_planned_reservation_enters_the_reserve_through_the_cli(capsys):
    """With 4 g6e.xlarge reserved in us-east-1 the example's fleet runs 1-5 instances there (both regions pooled):
    before, the reserve priced all 5 held at $9.30/h; 4 of them are billed whatever is held, so one costs. The 4 are
    counted once (packing.claim_reserved): us-east-1's own choice (peak 4) takes them all, so us-west-2 on its own is
    its own 4 in us-west-2, as without the reservation (before, its own choice rode the same 4 in us-east-1: 5 held)."""
    from scripts.cli import main

    assert main(["plan", "--results", str(SEED / "results"), "--traffic", str(EXAMPLE / "traffic.yaml"), "--config",
                 str(EXAMPLE / "fleet.yaml"), "--shared-reserve", "--reserved", "g6e.xlarge@us-east-1=4"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("Shared reserve across regions"):]
    assert "each region for its own peak: 8 instances held (us-east-1 4, us-west-2 4), $7.44/h if held all day " \
           "beyond the 4 reserved" in section
    # Shared, 5 held of which 4 reserved: the one beyond them, $1.86/h, is all it pays.
    assert "5 instances held, 3 fewer (38%), $5.58/h less if held all day beyond the 4 reserved" in section
