"""The planner's Spot tier (fleetcast/plan/spot.py): the seed scenario with a Spot price table recommends an
On-Demand base plus Spot, with its assumptions; a small fleet and a long cold start decline it, saying why."""

from __future__ import annotations

import functools
import json
import shutil

import pytest
from ruamel.yaml import YAML

from fleetcast.config import load_config
from fleetcast.contract.errors import UserError
from fleetcast.plan import spot
from fleetcast.plan.packing import scaling_target
from fleetcast.plan.packing_report import render_terminal, to_json
from fleetcast.plan.run import PlanOptions, build_packing

from .conftest import ROOT, SEED, write_plan

SEED_COUNTS = [11] * 9 + [17] * 4 + [2] * 9 + [8] * 2  # the on-demand plan's instances per UTC hour (g6e int8_wo)
OD, SPOT = 2.288, 0.80  # g6e.xlarge in ap-northeast-2: shipped on-demand table, seed spot table


@functools.cache
def run(traffic="traffic-seoul.yaml", **kw):
    """(plan, context, config) of the seed with the seed's Spot prices, planned once per set of inputs (the tests
    read it, none changes it)."""
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / traffic), config=str(ROOT / "config/fleet.yaml"),
                       spot_prices=str(SEED / "spot-prices.yaml"), **kw)
    return build_packing(opts)


def test_the_seed_recommends_an_on_demand_base_and_a_spot_tier_by_hand():
    result, _, _ = run()
    (pool,) = result.pools
    assert pool.instances_by_hour == SEED_COUNTS
    (advice,) = result.spot
    assert advice.recommended and advice.on_demand_base == 2  # config capacity.min: the base holds the quiet hours
    assert advice.spot_peak == 15 and advice.fallback_max == 17
    assert advice.instance_types == ["g6e.xlarge", "g6e.2xlarge"]  # both L40S, both cheaper on Spot than On-Demand
    # By hand: Spot instance-hours = 9*9 + 4*15 + 2*6 = 153; interruptions = 153 * 0.15 / 730 per day.
    interruptions = 153 * 0.15 / 730
    assert advice.interruptions_per_day == pytest.approx(interruptions)
    day = pool.loads[0].histogram  # the seed's traffic is a concurrency histogram: sized by the histogram method
    fixed = pool.cost_per_hour - sum(SEED_COUNTS) / 24 * OD
    extra = interruptions * (600 / 3600 * SPOT)  # re-launch billed without serving; nothing cut (0.6 s requests)
    expected = (sum(SEED_COUNTS) * OD - 153 * OD + 153 * SPOT + extra) / 24 + fixed
    assert advice.cost_per_hour == pytest.approx(expected)
    assert advice.requests_cut_per_day == 0.0  # every request is far shorter than the 90 s drain budget
    at_risk = interruptions * scaling_target(pool) / (day.weighted_e2e / 1000) * 600
    assert advice.requests_at_risk_per_day == pytest.approx(at_risk)
    assert advice.slo_attainment == pytest.approx(1 - at_risk / (2140 * 3600))
    assert advice.usd_per_m_output < advice.on_demand_usd_per_m_output


def test_the_report_shows_the_recommendation_with_its_assumptions():
    result, _, _ = run()
    text = render_terminal(result)
    assert "Spot tier (docs/plan.md#spot; a packing's processes are drained together):" in text
    assert "On-Demand base 2 + Spot up to 15 (g6e.xlarge, g6e.2xlarge)" in text and "expected SLO attainment" in text
    assert f"Spot prices as of 2026-01-15 ({SEED / 'spot-prices.yaml'})" in text
    assert "interruption rates ASSUMED as of" in text and "re-launch 600 s assumed" in text
    drain = YAML(typ="safe").load((ROOT / "fleetcast" / "config" / "data" / "spot_drain.yaml").read_text())
    assert f"drain budget {float(drain['safe_request_s']):g} s per request (measured {drain['as_of']}" in text
    assert "make bench-spot-drain" in text
    (entry,) = to_json(result)["spot"]
    assert entry["spot"]["on_demand_base"] == 2 and entry["assumptions"]


def test_a_small_fleet_declines_spot_because_the_baseline_is_the_whole_fleet():
    result, _, _ = run("traffic-small.yaml")
    (pool,) = result.pools
    assert max(pool.instances_by_hour) == 2
    (advice,) = result.spot
    assert not advice.recommended and advice.spot_block() is None
    assert "the On-Demand baseline is the whole fleet" in advice.reason
    assert "Spot does not pay: the On-Demand baseline is the whole fleet" in render_terminal(result)


def test_a_long_cold_start_with_frequent_interruptions_moves_capacity_to_on_demand_or_declines_spot(tmp_path):
    rates = tmp_path / "rates.yaml"
    rates.write_text("as_of: '2026-11-30'\nmonthly_interruption_rate: {g6e.xlarge: 1.0}\n")
    calm, _, _ = run()
    rough, _, _ = run(spot_interruptions=str(rates), spot_relaunch_s=3600)
    # Each interruption now leaves an instance's load on the others for an hour: a larger base keeps the
    # Spot-caused loss inside half the error budget (0.5 % of requests for slo.error_rate 0.01).
    assert rough.spot[0].recommended and rough.spot[0].on_demand_base > calm.spot[0].on_demand_base
    assert 1 - rough.spot[0].slo_attainment <= 0.5 * 0.01
    # With a tight error budget no base above the minimum keeps it: Spot is declined, and the report says why.
    strict, _, _ = run(spot_interruptions=str(rates), spot_relaunch_s=3600, error_rate=0.0001)
    (advice,) = strict.spot
    assert not advice.recommended
    assert "of the error budget slo.error_rate = 0.0001" in advice.reason and "long cold starts" in advice.reason


def test_long_requests_are_cut_by_a_drain_they_cannot_finish():
    # Length-biased in-flight mix: durations 10 s (share 0.5) and 200 s (0.5) against a 90 s budget:
    # cut share = 0.5 * (200 - 90) / (0.5 * 10 + 0.5 * 200).
    class Traffic:
        output_tokens = {"100": 0.5, "2000": 0.5}
        output_mean = 1050.0

        def hourly_rps(self):
            return [1.0] * 24

    assert spot._cut_share([Traffic()], 105.0, 90.0) == pytest.approx(0.5 * 110 / 105)


def test_write_config_writes_a_valid_spot_block(tmp_path):
    result, ctx, _ = run()
    target = tmp_path / "fleet.yaml"
    shutil.copy(ROOT / "config" / "fleet.yaml", target)
    changes = write_plan(target, result, ctx, write_spot=True)
    assert any(c.startswith("regions[ap-northeast-2].pools[l40s].spot = On-Demand base 2") for c in changes)
    cfg = load_config(target)  # re-validated with the spot rules
    pool = cfg.region("ap-northeast-2").pools[0]
    assert pool.on_demand_base == 2 and pool.spot_instance_types == ("g6e.xlarge", "g6e.2xlarge")
    assert pool.on_demand_fallback_max == pool.capacity.max == 17
    written = YAML(typ="safe").load(target.read_text())["regions"][0]["pools"][0]["spot"]
    assert written["allocation_strategy"] == "price-capacity-optimized" and written["capacity_rebalance"] is True
    # Planned again for a small fleet: the block goes, with the reason.
    small, small_ctx, _ = run("traffic-small.yaml")
    changes = write_plan(target, small, small_ctx)
    assert any(c.startswith("regions[ap-northeast-2].pools[l40s].spot removed: the On-Demand baseline") for c in changes)
    assert load_config(target).region("ap-northeast-2").pools[0].spot is None


def test_bad_spot_tables_are_user_errors_naming_the_entry(tmp_path):
    bad = tmp_path / "prices.yaml"
    bad.write_text("as_of: x\nprices: {g6e.xlarge: {ap-northeast-2: -1}}\n")
    with pytest.raises(UserError, match=r"--spot-prices: prices.g6e.xlarge.ap-northeast-2 = -1"):
        spot.load_spot_inputs(prices=bad)
    bad.write_text("as_of: x\nmonthly_interruption_rate: {g6e.xlarge: 3}\n")
    with pytest.raises(UserError, match=r"--spot-interruptions: monthly_interruption_rate.g6e.xlarge = 3"):
        spot.load_spot_inputs(interruptions=bad)


def test_the_drain_budget_is_the_benchmarked_figure_with_its_command():
    data = YAML(typ="safe").load((ROOT / "fleetcast" / "config" / "data" / "spot_drain.yaml").read_text())
    inputs = spot.load_spot_inputs()
    assert inputs.drain_safe_s == data["safe_request_s"] and data["command"].startswith("make bench-spot-drain")
    # Never more than the runtime's own deadline leaves (runtime/spot.py safe_request_seconds).
    from runtime import spot as runtime_spot

    assert data["safe_request_s"] <= runtime_spot.safe_request_seconds(data["notice_s"])
    assert "\nbench-spot-drain:" in (ROOT / "Makefile").read_text()


def test_the_cli_takes_the_spot_flags(tmp_path, capsys):
    from scripts.cli import main

    code = main(["plan", "--results", str(SEED / "results"), "--traffic", str(SEED / "traffic-seoul.yaml"),
                 "--config", str(ROOT / "config/fleet.yaml"), "--spot-prices", str(SEED / "spot-prices.yaml"),
                 "--spot-relaunch-s", "300", "--json"])
    assert code == 0
    (entry,) = json.loads(capsys.readouterr().out)["spot"]
    assert entry["recommended"] and "re-launch 300 s assumed" in entry["assumptions"][1]


def test_write_config_adds_a_spot_tier_only_when_asked_and_config_diff_names_it(tmp_path):
    """Before, --write-config added a spot: block wherever the shipped Spot table said it paid, and `config diff`
    listed it as one changed field among others. Now a pool gets one only with --write-spot (or when it has one
    already), and `config diff` names the new Spot group."""
    from fleetcast.config.impact import diff_configs, render_impact

    result, ctx, _ = run()
    target = tmp_path / "fleet.yaml"
    shutil.copy(ROOT / "config" / "fleet.yaml", target)
    changes = write_plan(target, result, ctx)
    assert load_config(target).region("ap-northeast-2").pools[0].spot is None
    assert any("spot not written: Spot would pay" in c and "--write-spot" in c for c in changes)
    asked = tmp_path / "asked.yaml"
    shutil.copy(target, asked)
    write_plan(asked, result, ctx, write_spot=True)
    text = render_impact(diff_configs(load_config(target), load_config(asked)))
    assert "NEW SPOT GROUP ap-northeast-2/l40s: On-Demand base 2, Spot on g6e.xlarge, g6e.2xlarge" in text
    # Spot already in the config: kept up to date without the flag, and no longer "new".
    assert not any("not written" in c for c in write_plan(asked, result, ctx))
    assert "NEW SPOT GROUP" not in render_impact(diff_configs(load_config(asked), load_config(asked)))


def test_the_spot_line_prints_the_interruption_rate_it_used():
    """Before: '0.00 interruptions/day' beside '92 at risk' (seed arrivals). The line now gives the assumed rate per
    Spot instance and day (0.15 a month / 730 h x 24 for g6e.xlarge) and the day's count in significant figures."""
    result, _, _ = run("traffic-seoul-arrivals.yaml")
    (advice,) = result.spot
    assert advice.interruption_rate_per_day == pytest.approx(0.15 / 730 * 24)
    line = advice.line()
    assert "0.0049 interruptions per Spot instance a day assumed" in line
    assert "0.00 interruptions/day" not in line and f"{advice.interruptions_per_day:.2g} interruptions/day" in line


# --reserved: AWS bills a Capacity Reservation whether it is used or not ("Capacity Reservations are charged at the
# equivalent On-Demand rate whether you run instances in reserved capacity or not": Amazon EC2 User Guide, "Capacity
# Reservation pricing and billing", docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-pricing-billing.html),
# and by default an open reservation is used by any running or new instance with matching attributes (instance type,
# platform, Availability Zone, tenancy: "Work with Capacity Reservations",
# docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-using.html), so the group's On-Demand base runs in
# it. Reserved instances are sunk: the planner leaves them out of a pool's cost, and Spot can only replace the
# On-Demand instances paid above them.
TWO_REGIONS = ROOT / "examples" / "plan" / "two-regions" / "traffic.yaml"
MULTI = ROOT / "examples" / "plan" / "multi-model"


def _reserved_plan(traffic, reserved):
    return _planned_with_reserved(traffic, tuple(reserved.items()))


@functools.cache
def _planned_with_reserved(traffic, reserved):
    """(the pool, its Spot advice), planned once per traffic and reservation."""
    reserved = dict(reserved)
    if traffic == "multi-model":
        opts = PlanOptions(results=[str(MULTI / "results")], traffic=str(MULTI / "traffic.yaml"),
                           config=str(MULTI / "fleet.yaml"), reserved=reserved)
    else:
        opts = PlanOptions(results=[str(SEED / "results")], traffic=str(traffic), config=str(ROOT / "config/fleet.yaml"),
                           reserved=reserved)
    result, ctx, _ = build_packing(opts)
    (pool,) = result.planned_pools(ctx)
    (advice,) = result.spot
    return pool, advice


def _replaced_on_demand(counts, base, reserved, price):
    """$/h of On-Demand that Spot above `base` takes over: only instance-hours paid above the reservation."""
    return sum(max(0, n - reserved) - max(0, min(n, base) - reserved) for n in counts) / 24 * price


def _assert_never_saves_more_than_the_on_demand_it_replaces(pool, advice, reserved):
    fixed = pool.cost_per_hour - sum(max(0, n - reserved) for n in pool.instances_by_hour) / 24 * pool.price_per_hour
    assert fixed >= 0 and advice.on_demand_cost_per_hour == pytest.approx(pool.cost_per_hour)
    if not advice.recommended:
        return
    assert advice.on_demand_base >= reserved  # a base below it would idle reserved instances, still billed
    assert advice.cost_per_hour >= fixed > 0 and advice.usd_per_m_output > 0
    saving = advice.on_demand_cost_per_hour - advice.cost_per_hour
    assert 0 < saving <= _replaced_on_demand(pool.instances_by_hour, advice.on_demand_base, reserved,
                                             pool.price_per_hour) + 1e-9


@pytest.mark.parametrize(("traffic", "itype_region", "reserved"), [
    (TWO_REGIONS, ("g6e.xlarge", "us-east-1"), 3),  # before: base 1 + Spot up to 4 at $-0.69/h vs $2.10/h
    (SEED / "traffic-seoul-arrivals.yaml", ("g6e.xlarge", "ap-northeast-2"), 3),  # before: $-0.17/h vs $0.85/h
    ("multi-model", ("g6e.xlarge", "ap-northeast-2"), 1),  # a packing of several models, its base the reservation
], ids=["two-regions", "seed-arrivals", "multi-model"])
def test_a_reservation_is_sunk_and_spot_replaces_only_the_on_demand_above_it(traffic, itype_region, reserved):
    pool, advice = _reserved_plan(traffic, {itype_region: reserved})
    assert (pool.instance_type, pool.region) == itype_region and max(pool.instances_by_hour) > reserved
    _assert_never_saves_more_than_the_on_demand_it_replaces(pool, advice, reserved)
    assert advice.recommended and advice.on_demand_base == reserved and advice.reserved == reserved
    assert f"On-Demand base {reserved} ({reserved} reserved, billed whether used or not)" in advice.line()
    assert "all On-Demand above the reservation" in advice.line()


def test_the_two_regions_reservation_by_hand():
    """Before: the Spot cost was priced as if the 3 reserved instances were paid On-Demand and could be moved to
    Spot: On-Demand base 1 + Spot up to 4, $-0.69/h against $2.10/h (133% less)."""
    pool, advice = _reserved_plan(TWO_REGIONS, {("g6e.xlarge", "us-east-1"): 3})
    counts, p, s = pool.instances_by_hour, pool.price_per_hour, advice.spot_price
    fixed = pool.cost_per_hour - sum(max(0, n - 3) for n in counts) / 24 * p
    spot_h = [max(0, n - advice.on_demand_base) for n in counts]
    assert advice.interruptions_per_day == pytest.approx(sum(spot_h) * advice.interruption_rate_per_day / 24)
    assert advice.requests_cut_per_day == 0.0  # sub-second requests, far inside the drain budget
    extra = advice.interruptions_per_day * 600 / 3600 * s  # each re-launch billed without serving
    paid = sum(max(0, n - sh - 3) for n, sh in zip(counts, spot_h))  # On-Demand above the reservation
    assert advice.cost_per_hour == pytest.approx((paid * p + sum(spot_h) * s + extra) / 24 + fixed)


def test_a_reservation_as_large_as_the_peak_leaves_spot_nothing_to_replace():
    """The multi-model packing runs 1-2 g6e.xlarge; with 2 reserved every instance it runs is already paid. Before,
    Spot was recommended at $0.10/h against $0.34/h: below the pool's fixed costs (NLB, endpoints) alone."""
    pool, advice = _reserved_plan("multi-model", {("g6e.xlarge", "ap-northeast-2"): 2})
    assert max(pool.instances_by_hour) == 2
    assert not advice.recommended and advice.spot_block() is None and advice.cost_per_hour is None
    assert "the reservation is the whole fleet" in advice.reason and "billed whether used or not" in advice.reason


def test_no_reservation_size_makes_spot_cost_less_than_the_fixed_costs_or_save_more_than_it_replaces():
    """The seed's 2-17 instance pool, priced as the planner prices it under every reservation from none to above its
    peak (its cost leaves the reserved instances out): the base never drops below the reservation, and the saving
    never exceeds the On-Demand spend Spot replaces, so the cost never falls below the fixed costs."""
    from dataclasses import replace

    result, ctx, _ = run()
    (planned,) = result.planned_pools(ctx)
    base = spot.spot_pool(planned)
    counts, p = base.instances_by_hour, base.price_per_hour
    fixed = base.cost_per_hour - sum(counts) / 24 * p
    inputs = spot.load_spot_inputs(SEED / "spot-prices.yaml")
    key = (base.instance_type, base.service_region)
    for reserved in range(0, max(counts) + 2):
        pool = replace(base, cost_per_hour=fixed + sum(max(0, n - reserved) for n in counts) / 24 * p)
        advice = spot.advise(pool, replace(ctx, reserved={key: reserved}), inputs)
        _assert_never_saves_more_than_the_on_demand_it_replaces(planned if not reserved else
                                                                replace(planned, cost_per_hour=pool.cost_per_hour),
                                                                advice, min(reserved, max(counts)))
        if reserved == 0:
            assert advice.cost_per_hour == pytest.approx(result.spot[0].cost_per_hour)
        if reserved >= max(counts):
            assert not advice.recommended and "the reservation is the whole fleet" in advice.reason
        elif advice.recommended:
            assert advice.on_demand_base >= reserved
