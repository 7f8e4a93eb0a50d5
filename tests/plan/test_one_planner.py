"""One model is a packing of one (docs/plan.md, "Scaling target"; issue 34): one planner sizes, costs, targets and
pools a one-model fleet, and a packing's target is the same rule summed over its models.

Until issue 34 a one-model fleet could also be planned by a second, one-model planner (solver.evaluate, fleet_pools,
run.build_plan); these tests compared the two entry points figure by figure. With the twin deleted, the figures both
agreed on, computed on main before the deletion, are pinned here: _day("0-9: 3, ...") is instances (or processes)
per UTC hour, as a traffic profile writes its rates."""

from __future__ import annotations

import math
from datetime import date

import pytest

from fleetcast.plan.packing import PackingEval, scaling_target
from fleetcast.plan.queueing import Limits, Stream, max_safe_rate, model_for, predict
from fleetcast.plan.run import PlanOptions, build_packing
from fleetcast.plan.solver import TARGET_HEADROOM, TargetPart, floor_tenth, scaling_target as target_of

from .conftest import ROOT, SEED

TODAY = date(2026, 2, 1)


def _options(traffic: str) -> PlanOptions:
    return PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / traffic),
                       config=str(ROOT / "config" / "fleet.yaml"), today=TODAY)


def _day(spec: str) -> tuple[int, ...]:
    """Counts per UTC hour from "0-9: 3, 9-13: 4, 13-24: 2"."""
    out: list[int] = []
    for part in spec.split(", "):
        hours, n = part.split(": ")
        start, end = hours.split("-")
        out += [int(n)] * (int(end) - int(start))
    assert len(out) == 24
    return tuple(out)


def _ways(region):
    """(instance type, precision, service region, instances per hour, $/h to the micro-dollar, target) per ranked way
    to serve a region's one model, in rank order."""
    return [(e.instance_type, e.loads[0].precision, e.region, tuple(e.instances_by_hour), round(e.cost_per_hour, 6),
             scaling_target(e)) for e in region.ranked]


@pytest.fixture(scope="module")
def seoul():
    packed, _, _ = build_packing(_options("traffic-seoul-arrivals.yaml"))
    return packed.regions[0]


# The seed's Seoul arrivals: what the one-model planner and the packing search both gave, in the one rank order.
SEOUL_ARRIVALS = [
    ("g6e.xlarge", "fp8", "ap-northeast-2", _day("0-9: 3, 9-13: 4, 13-24: 2"), 6.662463, 31.1),
    ("g6e.xlarge", "int8_wo", "ap-northeast-2", _day("0-9: 4, 9-13: 6, 13-22: 2, 22-24: 3"), 8.473797, 26.0),
    ("g6e.xlarge", "fp16", "ap-northeast-2", _day("0-9: 7, 9-13: 10, 13-22: 2, 22-24: 5"), 12.954463, 18.9),
    ("g5.xlarge", "int8_wo", "ap-northeast-2", _day("0-9: 22, 9-13: 32, 13-22: 4, 22-24: 15"), 20.67013, 4.6),
    ("g5.xlarge", "fp16", "ap-northeast-2", _day("0-9: 30, 9-13: 45, 13-22: 5, 22-24: 20"), 28.040588, 4.2),
]


def test_a_one_model_fleet_is_sized_costed_targeted_and_ranked_as_both_planners_agreed(seoul):
    """Before, the packing planner read its target off the planned count at the busiest hour (6 g6e int8_wo
    instances at 225 req/s: 30.3 in flight / 1.25 = 24.2) while the one-model planner wrote 26.0 for the same
    curve: the target a pool scaled on depended on how many models were planned with it. The pin is the figures
    both entry points gave once they agreed, in the rank order both gave."""
    assert _ways(seoul) == SEOUL_ARRIVALS


def test_the_target_is_the_in_flight_count_at_the_safe_rate_over_the_burst_headroom(seoul):
    """docs/plan.md, Sizing from arrivals: kappa = L at x* / H, H the day's busiest-minute ratio (here 1.25)."""
    ev = next(e for e in seoul.ranked if e.label == "g6e.xlarge [gpt2-xl int8_wo x1]")
    (load,) = ev.loads
    model = model_for(load.curve)
    x, _, _ = max_safe_rate(model, 128, Limits(300 - load.network_ms, 40, 0.01))
    level = predict(model, [Stream(x / max(1.25, 1 / (1 - TARGET_HEADROOM)), 128)], 1.0).in_flight
    assert scaling_target(ev) == floor_tenth(level) == 26.0


def test_a_packings_target_holds_every_hour_at_the_count_its_most_demanding_model_needs():
    """Two models whose peaks fall in different hours: the target is the lowest over the hours of the in-flight
    count per instance at the count the binding model needs then, so tracking it never runs fewer instances."""
    curve_a = next(c for c in _seed_curves() if c.label == "g6e.xlarge int8_wo").curve
    curve_b = next(c for c in _seed_curves() if c.label == "g6e.xlarge fp16").curve
    a, b = model_for(curve_a), model_for(curve_b)
    limits = Limits(300, 40, 0.01)
    xa, xb = max_safe_rate(a, 128, limits)[0], max_safe_rate(b, 128, limits)[0]
    day_a = tuple([100.0] * 12 + [10.0] * 12)
    day_b = tuple([10.0] * 12 + [100.0] * 12)
    burst = tuple([1.25] * 24)
    parts = [TargetPart(a, 128, xa, 1, day_a, burst), TargetPart(b, 128, xb, 1, day_b, burst)]
    target = target_of(parts)
    for h in (0, 12):
        n = max(day_a[h] * 1.25 / xa, day_b[h] * 1.25 / xb)
        held = sum(predict(m, [Stream(r[h] / n, 128)], 1.0).in_flight for m, r in ((a, day_a), (b, day_b)))
        assert target <= held + 1e-9
    # One model alone gets its own one-model figure, whatever its peer's day.
    assert target_of(parts[:1]) == floor_tenth(predict(a, [Stream(xa / 1.25, 128)], 1.0).in_flight)


def _seed_curves():
    from fleetcast.plan.inputs import load_candidates

    return load_candidates(sorted(str(p) for p in (SEED / "results").glob("*.json")))


def test_a_pooled_pools_spot_verdict_reads_every_member_at_the_pools_batches_as_a_packings_does():
    """One Spot conversion (spot.spot_pool) for one model or a packing: a request holds its instance for the in-region
    time at the pool's planned batch, request-weighted over every member. Before, a one-model pool read its first
    member's own evaluation (its weighted E2E, network included, at the count that member alone needed): on the
    two-regions example the Virginia-Ohio pool counted 251 requests at risk a day instead of 257 (273 since the pool's
    target reads its summed busiest minutes, 25.8 instead of 24.3: the test below)."""
    from fleetcast.plan import spot

    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(ROOT / "examples/plan/two-regions/traffic.yaml"),
                       config=str(ROOT / "config" / "fleet.yaml"), today=TODAY,
                       spot_prices=str(SEED / "spot-prices.yaml"))
    packed, ctx, _ = build_packing(opts)
    (pool,) = [p for p in packed.planned_pools(ctx) if len(p.consumer_regions) == 2]
    ((served,),) = (pool.serves,)
    assert served.sizing is not None
    model = served.sizing.service
    held = rates = 0.0
    for member in served.sizing.members:
        for rate, p in zip(member.hourly_rps(), served.sizing.predictions):
            if p is not None:
                held, rates = held + rate * model.hold_ms(1.0 + p.in_flight, 128) / 1000.0, rates + rate
    read = spot.spot_pool(pool)
    assert read.mean_hold_s == pytest.approx(held / rates, rel=1e-12)
    assert {t.region for t in read.traffics} == {"us-east-1", "us-east-2"}
    (advice,) = [a for a in packed.spot if a.service_region == pool.region]
    inputs = spot.load_spot_inputs(str(SEED / "spot-prices.yaml"))
    per_interruption = pool.target / read.mean_hold_s * inputs.relaunch_s
    assert advice.requests_at_risk_per_day == pytest.approx(advice.interruptions_per_day * per_interruption)
    assert round(advice.requests_at_risk_per_day) == 273


def test_one_rank_key_on_a_cost_tie_fewer_instance_hours_win_before_a_lower_p99(seoul):
    """docs/plan.md, Objective: one order for one model and for packings. Before, a one-model plan broke a cost
    tie on the weighted P99 TTFT first and a packing on instance-hours first, so the same two ways to serve ranked
    one way or the other by how many models were planned. The exact count now comes before the noisy P99.
    (The rank order both planners gave on the seed is pinned above.)"""
    from dataclasses import replace

    ev = seoul.ranked[0]
    (load,) = ev.loads
    quicker = replace(load, predictions=[p and replace(p, ttft_p99_ms=p.ttft_p99_ms - 50) for p in load.predictions])
    faster = replace(ev, loads=[quicker], instances_by_hour=[n + 1 for n in ev.instances_by_hour])
    fewer = replace(ev, instances_by_hour=list(ev.instances_by_hour))
    assert round(faster.cost_per_hour, 2) == round(fewer.cost_per_hour, 2)
    assert faster.latency_rank() < fewer.latency_rank()
    assert sorted([faster, fewer], key=PackingEval.rank_key)[0] is fewer
    # Same instance-hours: the lower P99 (more SLO headroom) wins.
    same_hours = replace(faster, instances_by_hour=list(ev.instances_by_hour))
    assert sorted([fewer, same_hours], key=PackingEval.rank_key)[0] is same_hours


@pytest.mark.parametrize("kw, starts", [
    ({"min_instances": 40}, "the floor of 40 instances"),
    ({"reserved": {("g5.xlarge", "ap-northeast-2"): 32}}, "the capacity reservation (32 x g5.xlarge in ap-northeast-2"),
])
def test_a_floor_or_reservation_that_decides_the_pick_is_named_for_a_packing_as_for_one_model(kw, starts):
    """solver.deciding_constraints. Before, only a one-model plan said that a floor (every candidate pays for 40
    instances, so the cheaper g5 wins) or a reservation, not the traffic, decided."""
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / "traffic-seoul-arrivals.yaml"),
                       config=str(ROOT / "config" / "fleet.yaml"), today=TODAY, **kw)
    packed, _, _ = build_packing(opts)
    (region,) = packed.regions
    assert region.winner.instance_type == "g5.xlarge"
    (note,) = region.decided_by
    assert note.startswith(starts)
    assert "decided the pick: without it g6e.xlarge [" in note and "fp8 x1]" in note


def test_a_packing_plan_says_why_not_each_other_instance_type_as_a_one_model_plan_did(seoul):
    """packing.loss_reason, one explanation with one wording: for one model each other instance type x precision
    with the one-model detail clauses (the instance-seconds a request holds, the price, the region). Before, a
    packing plan named only each other instance type's best packing, by its cost."""
    why = dict(seoul.why_not())
    assert list(why) == ["g6e.xlarge [gpt2-xl int8_wo x1]", "g6e.xlarge [gpt2-xl fp16 x1]",
                         "g5.xlarge [gpt2-xl int8_wo x1]", "g5.xlarge [gpt2-xl fp16 x1]"]
    assert why["g5.xlarge [gpt2-xl int8_wo x1]"] == ("costs $20.67/h vs $6.66/h (+210%, $0.503 vs $0.162 per 1M output "
                                                     "tokens); each request holds an instance 183 ms vs 30 ms at the "
                                                     "traffic's load levels")
    for (itype, precision), text in [(("g6e.xlarge", "int8_wo"), "39 ms vs 30 ms"),
                                     (("g6e.xlarge", "fp16"), "61 ms vs 30 ms"), (("g5.xlarge", "fp16"), "250 ms vs 30 ms")]:
        assert f"each request holds an instance {text}" in why[f"{itype} [gpt2-xl {precision} x1]"]


# The histogram method on the seed's in-flight histograms: per ranked way to serve, (_ways, $ per 1M output tokens,
# traffic-weighted (P99 TTFT incl. network, P99 ITL)), then the chosen pool as --write-config, Spot and `plan --check`
# read it (_pool_fields). Both planners gave these figures.
HISTOGRAM_WAYS = {
    "traffic-seoul.yaml": [
        (("g6e.xlarge", "int8_wo", "ap-northeast-2", _day("0-9: 11, 9-13: 17, 13-22: 2, 22-24: 8"), 19.627797, 48.0),
         0.477701438, (117.2, 5.512)),
        (("g6e.xlarge", "fp8", "ap-northeast-2", _day("0-9: 12, 9-13: 17, 13-22: 2, 22-24: 8"), 20.485797, 64.0),
         0.498583448, (128.15, 5.5172)),
        (("g5.xlarge", "int8_wo", "ap-northeast-2", _day("0-9: 29, 9-13: 43, 13-22: 5, 22-24: 19"), 27.061297, 4.0),
         0.658618008, (133.0, 7.3372)),
        (("g6e.xlarge", "fp16", "ap-northeast-2", _day("0-9: 16, 9-13: 24, 13-22: 3, 22-24: 11"), 28.01713, 32.0),
         0.681881085, (141.4, 8.0444)),
        (("g5.xlarge", "fp16", "ap-northeast-2", _day("0-9: 37, 9-13: 55, 13-22: 7, 22-24: 25"), 34.792547, 4.0),
         0.846781218, (161.2, 9.6096)),
    ],
    "traffic-batch64.yaml": [
        (("g6e.xlarge", "fp8", "ap-northeast-2", _day("0-9: 2, 9-13: 3, 13-24: 2"), 5.42313, 64.0),
         0.131988173, (290.0, 7.436)),
        (("g6e.xlarge", "int8_wo", "ap-northeast-2", _day("0-9: 3, 9-13: 4, 13-24: 2"), 6.662463, 48.0),
         0.162151075, (296.0, 8.164)),
        (("g6e.xlarge", "fp16", "ap-northeast-2", _day("0-9: 5, 9-13: 7, 13-22: 2, 22-24: 3"), 9.71313, 32.0),
         0.236398219, (292.0, 10.244)),
        (("g5.xlarge", "int8_wo", "ap-northeast-2", _day("0-9: 24, 9-13: 36, 13-22: 4, 22-24: 16"), 22.52563, 4.0),
         0.548228924, (140.0, 7.384)),
        (("g5.xlarge", "fp16", "ap-northeast-2", _day("0-9: 31, 9-13: 47, 13-22: 6, 22-24: 21"), 29.483755, 4.0),
         0.717575814, (170.0, 9.672)),
    ],
    "traffic-small.yaml": [
        (("g5.xlarge", "int8_wo", "ap-northeast-2", _day("0-24: 2"), 2.815862, 4.0), 1.222162514, (131.25, 7.3255)),
        (("g5.xlarge", "fp16", "ap-northeast-2", _day("0-24: 2"), 2.815862, 4.0), 1.222162514, (159.0, 9.594)),
        (("g6e.xlarge", "int8_wo", "ap-northeast-2", _day("0-24: 2"), 4.917862, 16.0), 2.134488903, (84.5, 5.083)),
        (("g6e.xlarge", "fp8", "ap-northeast-2", _day("0-24: 2"), 4.917862, 16.0), 2.134488903, (102.6875, 5.2715)),
        (("g6e.xlarge", "fp16", "ap-northeast-2", _day("0-24: 2"), 4.917862, 16.0), 2.134488903, (103.75, 7.4945)),
    ],
}
HISTOGRAM_POOL = {
    "traffic-seoul.yaml": (
        "ap-northeast-2", ("ap-northeast-2",), "g6e.xlarge", _day("0-9: 11, 9-13: 17, 13-22: 2, 22-24: 8"), 48.0,
        19.627797, "$19.63/h, $0.478 per 1M output tokens", 2.288, "int8_wo", 1,
        _day("0-9: 11, 9-13: 17, 13-22: 2, 22-24: 8"), _day("0-9: 11, 9-13: 17, 13-22: 2, 22-24: 8"), False, 606.48,
        0.089180981, 11.213153, None, 2140),
    "traffic-batch64.yaml": (
        "ap-northeast-2", ("ap-northeast-2",), "g6e.xlarge", _day("0-9: 2, 9-13: 3, 13-24: 2"), 64.0, 5.42313,
        "$5.42/h, $0.132 per 1M output tokens", 2.288, "fp8", 1, _day("0-9: 2, 9-13: 3, 13-24: 2"),
        _day("0-9: 2, 9-13: 3, 13-22: 1, 22-24: 2"), False, 877.24, 0.013706875, 72.95609, None, 2140),
    "traffic-small.yaml": (
        "ap-northeast-2", ("ap-northeast-2",), "g5.xlarge", _day("0-24: 2"), 4.0, 2.815862,
        "$2.82/h, $1.222 per 1M output tokens", 1.237, "int8_wo", 1, _day("0-24: 2"), _day("0-24: 2"), False, 776.27,
        0.242950417, 4.116066, None, 120),
}


@pytest.mark.parametrize("traffic", ["traffic-seoul.yaml", "traffic-batch64.yaml", "traffic-small.yaml"])
def test_a_histogram_profile_sizes_a_packing_of_one_by_the_one_model_histogram_method(traffic):
    """docs/plan.md steps 2-4 (solver.size_from_histogram). Before, the packing search ignored a profile's concurrency
    histogram and sized from its arrivals at a burstiness of 1: on traffic-seoul.yaml it planned g6e.xlarge int8_wo
    at 3 instances ($7.04/h, target 32.0) where the one-model planner planned 11 ($19.63/h, target 48), and it chose
    g6e fp8 instead of g6e int8_wo. The figures pinned are those both then gave."""
    packed, ctx, _ = build_packing(_options(traffic))
    (region,) = packed.regions
    for ev in region.ranked:
        (load,) = ev.loads
        assert load.copies == 1 and load.histogram is not None
    assert [(way, round(e.usd_per_m_output, 9), tuple(round(x, 6) for x in e.loads[0].worst()))
            for way, e in zip(_ways(region), region.ranked, strict=True)] == HISTOGRAM_WAYS[traffic]
    # What --write-config writes, the Spot advice and `plan check` read.
    (pool,) = packed.planned_pools(ctx)
    assert _pool_fields(pool) == HISTOGRAM_POOL[traffic]


def test_a_histogram_of_one_process_per_instance_is_not_read_for_packings_of_several_copies():
    """The histogram counts requests on an instance of one process; a packing of two copies sized from arrivals
    instead would be ranked against them by another method, so none is tried, and the plan says why."""
    packed, _, _ = build_packing(_options("traffic-seoul.yaml"))
    (region,) = packed.regions
    assert region.evaluations and not any(" x2" in ev.packing_text for ev in region.evaluations)
    assert any("packings of several copies are not tried" in n for n in region.notes)
    # With arrivals the search still tries two copies (refused here by memory: models[].parameters_b unknown).
    arrivals, _, _ = build_packing(_options("traffic-seoul-arrivals.yaml"))
    assert any(" x2" in ev.packing_text for ev in arrivals.regions[0].evaluations)


def _pools(packed, ctx):
    """(service region, consumer regions, instance type, instances per hour, $/h to the micro-dollar, target) per
    planned pool."""
    return [(p.region, p.consumer_regions, p.instance_type, p.instances_by_hour, round(p.cost_per_hour, 6), p.target)
            for p in packed.planned_pools(ctx)]


EVERY_REGION = ["ap-northeast-1", "eu-central-1", "eu-west-1", "us-east-1", "us-east-2", "us-west-2"]
VIRGINIA_DAY = _day("0-9: 11, 9-13: 17, 13-22: 2, 22-24: 8")


@pytest.mark.parametrize("traffic, reserved, regions, pools", [
    (ROOT / "examples/plan/two-regions/traffic.yaml", {}, {
        "us-east-1": (27, EVERY_REGION, ("g6e.xlarge [gpt2-xl fp8 x1]", "us-east-1", 3.777407)),
        "us-east-2": (20, ["ap-northeast-1", "us-east-1", "us-east-2", "us-west-2"],
                      ("g6e.xlarge [gpt2-xl fp8 x1]", "us-east-2", 3.746731))},
     [("us-east-1", ("us-east-1", "us-east-2"), "g6e.xlarge", _day("0-4: 4, 4-12: 2, 12-14: 4, 14-20: 5, 20-22: 3, "
                                                                   "22-24: 4"), 7.061968, 25.8)]),
    (SEED / "traffic-us-east-1.yaml", {}, {
        "us-east-1": (27, EVERY_REGION, ("g6e.xlarge [gpt2-xl int8_wo x1]", "us-east-1", 15.979672))},
     [("us-east-1", ("us-east-1",), "g6e.xlarge", VIRGINIA_DAY, 15.979672, 48.0)]),
    # Six g6e.xlarge already paid for in Ohio: Virginia's traffic is cheapest served from there.
    (SEED / "traffic-us-east-1.yaml", {("g6e.xlarge", "us-east-2"): 6}, {
        "us-east-1": (27, EVERY_REGION, ("g6e.xlarge [gpt2-xl int8_wo x1] @ us-east-2", "us-east-2", 7.769293))},
     [("us-east-2", ("us-east-1",), "g6e.xlarge", VIRGINIA_DAY, 7.769293, 32.0)]),
])
def test_a_packing_of_one_is_served_from_the_regions_a_one_model_plan_served_it_from(traffic, reserved, regions, pools):
    """solver.service_regions: a consumer region's one model may be served from any region offering, pricing and
    reaching it by cross-region PrivateLink, its network added. Before, the packing search evaluated only the
    consumer's own region, so with six g6e.xlarge reserved in us-east-2 the one-model planner served Virginia from
    Ohio ($7.77/h) and the packing search kept it in Virginia ($15.98/h). Pinned: how many ways to serve each region
    had, from where, the pick and the pools, as both planners gave them."""
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(traffic), config=str(ROOT / "config/fleet.yaml"),
                       today=TODAY, reserved=reserved)
    packed, ctx, _ = build_packing(opts)
    assert {r.region: (len(r.ranked), sorted({e.region for e in r.ranked}),
                       (r.winner.label, r.winner.region, round(r.winner.cost_per_hour, 6)))
            for r in packed.regions} == regions
    assert _pools(packed, ctx) == pools


@pytest.mark.parametrize("traffic, picks, pools", [
    ("traffic-seoul-arrivals.yaml", {"ap-northeast-2": (5, ("g6e.xlarge", "fp8", "ap-northeast-2", 5.804463, 31.1))},
     [("ap-northeast-2", ("ap-northeast-2",), "g6e.xlarge", _day("0-9: 3, 9-13: 4, 13-22: 1, 22-24: 2"), 5.804463,
       31.1)]),
    ("traffic-seoul.yaml", {"ap-northeast-2": (5, ("g6e.xlarge", "int8_wo", "ap-northeast-2", 19.627797, 32.0))},
     [("ap-northeast-2", ("ap-northeast-2",), "g6e.xlarge", VIRGINIA_DAY, 19.627797, 32.0)]),
    (str(ROOT / "examples/plan/two-regions/traffic.yaml"),
     {"us-east-1": (27, ("g6e.xlarge", "fp8", "us-east-1", 3.777407, 29.4)),
      "us-east-2": (20, ("g6e.xlarge", "fp8", "us-east-2", 3.746731, 24.3))},
     [("us-east-1", ("us-east-1", "us-east-2"), "g6e.xlarge", _day("0-4: 4, 4-12: 2, 12-14: 4, 14-20: 5, 20-24: 4"),
       7.217051, 23.9)]),
])
def test_one_model_is_planned_without_a_config_through_the_packing_search(traffic, picks, pools):
    """docs/plan.md, Inputs: `fleetcast plan` for one model runs without a fleet config, its SLO from --ttft-p99-ms /
    --itl-p99-ms. Before, the packing search read the config for every model's engine, memory and SLO and refused to
    start without one (load_config of None); now the model is the one the results measured, the support matrix reads
    the results' backend and the default KV-cache dtype. Pinned: the figures the one-model planner gave too."""
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / traffic), config=None, today=TODAY,
                       ttft_p99_ms=250, itl_p99_ms=35)
    packed, ctx, cfg = build_packing(opts)
    assert cfg is None and packed.models == ("gpt2-xl",) and (ctx.slo.ttft_p99_ms, ctx.slo.itl_p99_ms) == (250, 35)
    assert {r.region: (len(r.ranked), (r.winner.instance_type, r.winner.loads[0].precision, r.winner.region,
                                       round(r.winner.cost_per_hour, 6), scaling_target(r.winner)))
            for r in packed.regions} == picks
    assert _pools(packed, ctx) == pools


def test_a_plan_without_a_config_is_for_the_one_model_its_results_name(tmp_path):
    import shutil

    from fleetcast.contract.errors import UserError

    first = sorted((SEED / "results").glob("*.json"))[0]
    other = tmp_path / "other.json"
    other.write_text(first.read_text().replace('"gpt2-xl"', '"gpt2-large"'))
    shutil.copy(first, tmp_path / first.name)
    opts = PlanOptions(results=[str(tmp_path)], traffic=str(SEED / "traffic-seoul-arrivals.yaml"), config=None,
                       today=TODAY, ttft_p99_ms=250, itl_p99_ms=35)
    with pytest.raises(UserError, match=r"name gpt2-large, gpt2-xl \(labels.model\): give --config"):
        build_packing(opts)


def _two_regions(**kw):
    return PlanOptions(results=[str(SEED / "results")], traffic=str(ROOT / "examples/plan/two-regions/traffic.yaml"),
                       config=str(ROOT / "config/fleet.yaml"), today=TODAY, **kw)


def test_a_pooled_one_model_pool_scales_on_the_target_a_packing_of_one_pooled_the_same_way_gets():
    """docs/plan.md, "Pools" and "Scaling target": a shared pool is sized for the members' summed busiest minutes, so
    its H_h is the summed peaks over the summed rates (solver.pooled_traffic). Before, the one-model planner read each
    hour's H off the burstiest member alone (Ohio's 1.5 against the pool's 1.33-1.43): its target (24.3) scaled the
    Virginia-Ohio pool out past the count its SLOs need, while the packing search wrote 25.8 for the same pool."""
    from fleetcast.plan.queueing import max_safe_rate
    from fleetcast.plan.solver import pooled_traffic

    packed, ctx, _ = build_packing(_two_regions())
    (pool,) = packed.planned_pools(ctx)
    assert pool.consumer_regions == ("us-east-1", "us-east-2")
    assert pool.target == 25.8
    # The figure is the one-model rule on the pool's day: L at x* over the pool's busiest hour's H, H never the
    # burstiest member's alone.
    ((served,),) = (pool.serves,)
    assert served.sizing is not None
    day = pooled_traffic(list(served.sizing.members), pool.region, ctx)
    assert max(day.hourly_burstiness()) < max(t.hourly_burstiness()[0] for t in served.sizing.members) == 1.5
    model = served.sizing.service
    x, _, _ = max_safe_rate(model, day.output_mean, served.sizing.limits) or (0.0, None, None)
    level = predict(model, [Stream(x / max(day.hourly_burstiness()), day.output_mean)], 1.0).in_flight
    assert pool.target == floor_tenth(level)


def test_config_diff_names_the_pooled_targets_move_and_rolls_no_instance(tmp_path, capsys):
    """README, the planner section: a one-model pool across regions now writes 25.8 where it wrote 24.3; the deploy
    that takes it is a scaling change `fleetcast config diff` names on its own line, not an instance refresh."""
    from scripts.cli import main as cli

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text((ROOT / "config/fleet.yaml").read_text().replace(
        "\nslo:", "\ncalibration:\n  dataset: s3://fleetcast-staging/calibration/lambada/\n\nslo:", 1))
    assert cli(["plan", "--results", str(SEED / "results"), "--traffic",
                str(ROOT / "examples/plan/two-regions/traffic.yaml"), "--config", str(fleet),
                "--write-config", str(fleet)]) == 0
    written = fleet.read_text()
    assert written.count("target: 25.8") == 1
    before = tmp_path / "before.yaml"
    before.write_text(written.replace("target: 25.8", "target: 24.3"))
    capsys.readouterr()
    assert cli(["config", "diff", str(before), str(fleet), "--fail-on-roll"]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if "scaling.target" in x]
    assert line.split()[1:] == ["24.3", "->", "25.8"]
    assert "us-east-1/" in out and "kept: no instance replaced" in out


def _pool_fields(pool):
    """What a planned pool of one model asks of the config and what the Spot advice, `plan --check` and `plan
    simulate` read of it: its regions, instance type, instances per hour, target, cost, price, precision, copies,
    processes planned and needed per hour, the sizing method, a histogram pool's hold time and instance-seconds per
    request, the rate per instance `plan --check` baselines, the worst predicted P99 TTFT (network included) and the
    requests per day the in-flight histogram at arrival counts."""
    from fleetcast.plan import check

    ((served,),) = (pool.serves,)
    z = served.sizing
    return (pool.region, pool.consumer_regions, pool.instance_type, pool.instances_by_hour, pool.target,
            round(pool.cost_per_hour, 6), pool.cost_text, pool.price_per_hour, served.precision, served.copies,
            z.processes, z.needed, z.arrival_driven, z.hold_ms and round(z.hold_ms, 6),
            z.seconds_per_request and round(z.seconds_per_request, 9), round(check._rps_per_instance(served), 6),
            max((round(p.ttft_p99_ms + z.network_ms, 3) for p in z.predictions if p is not None), default=None),
            round(sum(check.levels_at_arrival(pool).values())))


POOLED_DAY = _day("0-4: 4, 4-12: 2, 12-14: 4, 14-20: 5, 20-22: 3, 22-24: 4")


def _pooled(region, cost, cost_text):
    """The Virginia-Ohio pool of examples/plan/two-regions, served from `region`, as _pool_fields reads it."""
    return (region, ("us-east-1", "us-east-2"), "g6e.xlarge", POOLED_DAY, 25.8, cost, cost_text, 1.861, "fp8", 1,
            POOLED_DAY, POOLED_DAY, True, None, None, 39.572122, 257.894, 2860)


@pytest.mark.parametrize("reserved, pool, spot_figures", [
    ({}, _pooled("us-east-1", 7.061968, "$7.06/h, $0.129 per 1M output tokens"),
     ("us-east-1", True, 1, 4, ["g6e.xlarge", "g6e.2xlarge"], 4.269532, 0.999973, 273.043)),
    # Three g6e.xlarge paid for in Virginia, where both regions' own choices serve from.
    ({("g6e.xlarge", "us-east-1"): 3}, _pooled("us-east-1", 2.099301, "$2.10/h, $0.038 per 1M output tokens"),
     ("us-east-1", True, 3, 2, ["g6e.xlarge", "g6e.2xlarge"], 1.168489, 0.999991, 91.014)),
    # Six in Ohio: the pool serves Virginia and Ohio from there.
    ({("g6e.xlarge", "us-east-2"): 6}, _pooled("us-east-2", 0.586814, "$0.59/h, $0.011 per 1M output tokens"),
     ("us-east-2", False, None, 0, [], None, None, 0.0)),
])
def test_a_pooled_one_model_fleet_keeps_the_figures_both_planners_agreed_on(reserved, pool, spot_figures):
    """A pool shared across regions: its regions, instances per hour, cost, target, the members' days and the Spot
    advice, pinned as the one-model planner and the packing search both gave them. Before they agreed: the packing
    search kept a pool per consumer region even where two regions' choices were the same packing served from the same
    region, so with three g6e.xlarge reserved in Virginia it ran two Virginia pools, each counting the three reserved
    instances as its own ($0.83/h for the fleet, against $2.10/h for the one pool that really runs); a packing's
    pooled pool handed Spot and `plan --check` one summed traffic named after Ohio instead of each member's; a
    one-model pooled pool's `plan --check` line quoted its first member's own cost ($3.78/h) for the pool's
    ($7.06/h) and its baseline's rate per instance read the burstiest member's minute."""
    from fleetcast.plan import spot

    packed, ctx, _ = build_packing(_two_regions(reserved=reserved, spot_prices=str(SEED / "spot-prices.yaml")))
    (planned,) = packed.planned_pools(ctx)
    assert _pool_fields(planned) == pool
    assert packed.cost_per_hour == pytest.approx(planned.cost_per_hour, abs=1e-9)
    assert [t.region for t in planned.serves[0].sizing.members] == ["us-east-1", "us-east-2"]
    (advice,) = packed.spot
    assert (advice.service_region, advice.recommended, advice.on_demand_base, advice.spot_peak,
            advice.instance_types) == spot_figures[:5]
    assert [None if x is None else round(x, 6) for x in (advice.cost_per_hour, advice.slo_attainment)] == \
        list(spot_figures[5:7])
    assert round(advice.requests_at_risk_per_day, 3) == spot_figures[7]
    assert round(spot.spot_pool(planned).mean_hold_s, 9) == 0.698972893


TWO_HISTOGRAMS = """schema: fleetcast.traffic/v1
name: virginia-ohio-histograms
description: examples/plan/two-regions' days, each region described by its own fleet's in-flight histogram (synthetic)
consumers:
  - region: us-east-1
    rate_rps: {"0-12": 40, "12-20": 120, "20-24": 60}
    concurrency: {"1-16": 0.80, "32": 0.15, "64": 0.05}
    input_tokens: 256
    output_tokens: 128
  - region: us-east-2
    rate_rps: {"0-4": 80, "4-14": 20, "14-22": 60, "22-24": 90}
    concurrency: {"1-16": 0.60, "32": 0.30, "64": 0.10}
    input_tokens: 256
    output_tokens: 128
"""
HISTOGRAM_POOLED_DAY = _day("0-4: 10, 4-12: 6, 12-14: 13, 14-20: 16, 20-22: 10, 22-24: 12")


def test_histogram_sized_regions_pool_across_regions_by_one_rule(tmp_path):
    """docs/plan.md, "Pools": with histograms, one target k <= every member's c* (the one making the summed load
    cheapest) and N_h = max(n_min, ceil(sum_i rate_i,h x S_i(k))), solver.pooled_histogram. Before, the packing search
    never pooled a histogram-sized region: it kept Virginia ($12.77/h) and Ohio ($7.93/h) apart, $20.71/h, where the
    one-model planner ran one Virginia pool at k = 32 for $20.24/h (one NLB and one set of provider endpoints)."""
    from fleetcast.plan.solver import pooled_histogram

    traffic = tmp_path / "traffic.yaml"
    traffic.write_text(TWO_HISTOGRAMS)
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(traffic), config=str(ROOT / "config/fleet.yaml"),
                       today=TODAY)
    packed, ctx, _ = build_packing(opts)
    (pool,) = packed.planned_pools(ctx)
    assert _pool_fields(pool) == (
        "us-east-1", ("us-east-1", "us-east-2"), "g6e.xlarge", HISTOGRAM_POOLED_DAY, 32.0, 20.244051,
        "$20.24/h, $0.369 per 1M output tokens", 1.861, "int8_wo", 1, HISTOGRAM_POOLED_DAY, HISTOGRAM_POOLED_DAY, False,
        625.177636, 0.082682853, 12.094406, None, 2860)
    assert packed.cost_per_hour == pytest.approx(pool.cost_per_hour, abs=1e-9)
    assert [round(r.winner.cost_per_hour, 6) for r in packed.regions] == [12.772241, 7.933981]
    assert [j.split(":")[0] for j in packed.joins] == \
        ["us-east-2 joins the us-east-1 pool (g6e.xlarge [gpt2-xl int8_wo x1], serving us-east-1, us-east-2)"]
    # The rule itself: each member's own histogram sizing on this packing in Virginia, its network included.
    members = [next(e for e in r.ranked if e.region == "us-east-1" and e.instance_type == "g6e.xlarge"
                    and e.loads[0].precision == "int8_wo") for r in packed.regions]
    days = [(e.loads[0].traffic, e.loads[0].histogram) for e in members]
    k, loads = pooled_histogram(members[0].loads[0].curve, [(t, d.max_load, d.seconds_at) for t, d in days])
    assert pool.target == k <= min(d.max_load for _, d in days)
    assert pool.instances_by_hour == tuple(max(ctx.n_min("us-east-1"), math.ceil(x - 1e-9)) for x in loads)
    (served,) = pool.serves
    assert served.sizing is not None and served.sizing.needed == tuple(math.ceil(x - 1e-9) for x in loads)
    assert not served.sizing.arrival_driven


def test_a_pool_whose_regions_ask_different_lengths_is_sized_one_stream_per_region(tmp_path):
    """solver.size_day (processes_by_hour, predictions_by_hour), the one sizing of a pool's day: each consumer region
    is one stream at its own output length, so each hour is sized for the mix it has. Before, the packing search
    sized a pooled model as one stream at the day's rate-weighted length: with Ohio asking 384 tokens and Virginia 128
    planned the Ohio pool serving both 6 instances for 00-04 UTC, when Ohio's long requests dominate, where 7 meet the
    SLO (and 6 for 12-14, when Virginia's short ones do, where 5 suffice)."""
    text = (ROOT / "examples/plan/two-regions/traffic.yaml").read_text()
    head, ohio = text.split("  - region: us-east-2")
    traffic = tmp_path / "traffic.yaml"
    traffic.write_text(head + "  - region: us-east-2" + ohio.replace("output_tokens: 128", "output_tokens: 384"))
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(traffic), config=str(ROOT / "config/fleet.yaml"),
                       today=TODAY)
    packed, ctx, _ = build_packing(opts)
    (pool,) = packed.planned_pools(ctx)
    day = _day("0-4: 7, 4-12: 3, 12-14: 5, 14-20: 8, 20-22: 6, 22-24: 8")
    assert _pool_fields(pool) == ("us-east-2", ("us-east-2", "us-east-1"), "g6e.xlarge", day, 26.7, 11.418062,
                                  "$11.42/h, $0.114 per 1M output tokens", 1.861, "fp8", 1, day, day, True, None, None,
                                  23.263724, 257.279, 2860)
    assert (pool.instances_by_hour[0], pool.instances_by_hour[12]) == (7, 5)
    # One stream per region at its own length.
    ((served,),) = (pool.serves,)
    assert [(t.region, t.output_mean) for t in served.sizing.members] == [("us-east-2", 384), ("us-east-1", 128)]
