"""One model is a packing of one (docs/plan.md, "Scaling target"; issue 34): the same model, traffic and results
give the same sizing, cost and scaling target whether they reach the planner as a one-model fleet or as a packing
of one process, and a packing's target is the same rule summed over its models."""

from __future__ import annotations

import math
from datetime import date

import pytest

from fleetcast.plan.packing import scaling_target
from fleetcast.plan.queueing import Limits, Stream, max_safe_rate, model_for, predict
from fleetcast.plan.run import PlanOptions, build_packing, build_plan
from fleetcast.plan.solver import TARGET_HEADROOM, TargetPart, floor_tenth, scaling_target as target_of

from .conftest import ROOT, SEED

TODAY = date(2026, 2, 1)


def _options(traffic: str) -> PlanOptions:
    return PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / traffic),
                       config=str(ROOT / "config" / "fleet.yaml"), today=TODAY)


@pytest.fixture(scope="module")
def both_ways():
    opts = _options("traffic-seoul-arrivals.yaml")
    _, plans, _ = build_plan(opts)
    packed, _, _ = build_packing(opts)
    return plans[0], packed.regions[0]


def test_a_one_model_plan_and_a_packing_of_one_size_and_target_the_same(both_ways):
    """Before, the packing planner read its target off the planned count at the busiest hour (6 g6e int8_wo
    instances at 225 req/s: 30.3 in flight / 1.25 = 24.2) while the one-model planner wrote 26.0 for the same
    curve: the target a pool scaled on depended on how many models were planned with it."""
    solo, packed = both_ways
    by_label = {(e.candidate.instance_type, e.candidate.precision): e for e in solo.ranked
                if e.service_region == solo.traffic.region}
    compared = 0
    for ev in packed.ranked:
        (load,) = ev.loads
        one = by_label[(ev.instance_type, load.precision)]
        assert ev.instances_by_hour == one.instances_by_hour
        assert round(ev.cost_per_hour, 6) == round(one.cost_per_hour, 6)
        assert scaling_target(ev) == one.target
        compared += 1
    assert compared >= 3  # g6e int8_wo / fp16, g5 int8_wo / fp16 at least


def test_the_target_is_the_in_flight_count_at_the_safe_rate_over_the_burst_headroom(both_ways):
    """docs/plan.md, Sizing from arrivals: kappa = L at x* / H, H the day's busiest-minute ratio (here 1.25)."""
    solo, _ = both_ways
    ev = next(e for e in solo.ranked if e.candidate.label == "g6e.xlarge int8_wo")
    model = model_for(ev.candidate.curve)
    x, _, _ = max_safe_rate(model, 128, Limits(300 - ev.network_ms, 40, 0.01))
    level = predict(model, [Stream(x / max(1.25, 1 / (1 - TARGET_HEADROOM)), 128)], 1.0).in_flight
    assert ev.target == floor_tenth(level)


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
    result, _, ctx = build_plan(opts)
    (pool,) = [p for p in result.pools if len(p.members) == 2]
    model = ctx.model(pool.evaluation.candidate)
    held = rates = 0.0
    for plan, _ in pool.members:
        for rate, p in zip(plan.traffic.hourly_rps(), pool.predictions):
            if p is not None:
                held, rates = held + rate * model.hold_ms(1.0 + p.in_flight, 128) / 1000.0, rates + rate
    read = spot.spot_pool(pool.planned(ctx))
    assert read.mean_hold_s == pytest.approx(held / rates, rel=1e-12)
    assert {t.region for t in read.traffics} == {"us-east-1", "us-east-2"}
    (advice,) = [a for a in result.spot if a.service_region == pool.service_region]
    inputs = spot.load_spot_inputs(str(SEED / "spot-prices.yaml"))
    per_interruption = pool.target / read.mean_hold_s * inputs.relaunch_s
    assert advice.requests_at_risk_per_day == pytest.approx(advice.interruptions_per_day * per_interruption)
    assert round(advice.requests_at_risk_per_day) == 273


def test_one_rank_key_on_a_cost_tie_fewer_instance_hours_win_before_a_lower_p99(both_ways):
    """docs/plan.md, Objective: one order for one model and for packings. Before, a one-model plan broke a cost
    tie on the weighted P99 TTFT first and a packing on instance-hours first, so the same two ways to serve ranked
    one way or the other by how many models were planned. The exact count now comes before the noisy P99."""
    from dataclasses import replace

    solo, _ = both_ways
    ev = solo.ranked[0]
    faster = replace(ev, weighted_ttft_p99=ev.weighted_ttft_p99 - 50, instances_by_hour=[n + 1 for n in ev.instances_by_hour])
    fewer = replace(ev, weighted_ttft_p99=ev.weighted_ttft_p99, instances_by_hour=list(ev.instances_by_hour))
    assert round(faster.cost_per_hour, 2) == round(fewer.cost_per_hour, 2)
    assert sorted([faster, fewer], key=type(ev).rank_key)[0] is fewer
    # Same instance-hours: the lower P99 (more SLO headroom) wins, as a packing's lower SLO use does.
    same_hours = replace(faster, instances_by_hour=list(ev.instances_by_hour))
    assert sorted([fewer, same_hours], key=type(ev).rank_key)[0] is same_hours


def test_a_one_model_plan_and_a_packing_of_one_rank_in_the_same_order(both_ways):
    solo, packed = both_ways
    home = [(e.candidate.instance_type, e.candidate.precision) for e in solo.ranked
            if e.service_region == solo.traffic.region]
    packs = [(e.instance_type, e.loads[0].precision) for e in packed.ranked]
    assert [k for k in home if k in packs] == [k for k in packs if k in home]
    assert len(packs) >= 3


@pytest.mark.parametrize("kw, starts", [
    ({"min_instances": 40}, "the floor of 40 instances"),
    ({"reserved": {("g5.xlarge", "ap-northeast-2"): 32}}, "the capacity reservation (32 x g5.xlarge in ap-northeast-2"),
])
def test_a_floor_or_reservation_that_decides_the_pick_is_named_for_a_packing_as_for_one_model(kw, starts):
    """solver.deciding_constraints, one rule for both entry points. Before, only a one-model plan said that a floor
    (every candidate pays for 40 instances, so the cheaper g5 wins) or a reservation, not the traffic, decided."""
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / "traffic-seoul-arrivals.yaml"),
                       config=str(ROOT / "config" / "fleet.yaml"), today=TODAY, **kw)
    _, plans, _ = build_plan(opts)
    packed, _, _ = build_packing(opts)
    (solo,), (region,) = plans, packed.regions
    assert region.winner.instance_type == solo.winner.candidate.instance_type == "g5.xlarge"
    (one,), (note,) = solo.decided_by, region.decided_by
    assert one.startswith(starts) and note.startswith(starts)
    assert "decided the pick: without it g6e.xlarge [" in note and "fp8 x1]" in note


def test_a_packing_plan_says_why_not_each_other_instance_type_as_a_one_model_plan_does(both_ways):
    """packing.loss_reason, one explanation with one wording: for one model each other instance type x precision
    with the one-model detail clauses (the instance-seconds a request holds, the price, the region). Before, a
    packing plan named only each other instance type's best packing, by its cost."""
    solo, packed = both_ways
    why = dict(packed.why_not())
    assert list(why) == ["g6e.xlarge [gpt2-xl int8_wo x1]", "g6e.xlarge [gpt2-xl fp16 x1]",
                         "g5.xlarge [gpt2-xl int8_wo x1]", "g5.xlarge [gpt2-xl fp16 x1]"]
    assert why["g5.xlarge [gpt2-xl int8_wo x1]"] == ("costs $20.67/h vs $6.66/h (+210%, $0.503 vs $0.162 per 1M output "
                                                     "tokens); each request holds an instance 183 ms vs 30 ms at the "
                                                     "traffic's load levels")
    for (itype, precision), text in [(("g6e.xlarge", "int8_wo"), "39 ms vs 30 ms"),
                                     (("g6e.xlarge", "fp16"), "61 ms vs 30 ms"), (("g5.xlarge", "fp16"), "250 ms vs 30 ms")]:
        assert f"each request holds an instance {text}" in why[f"{itype} [gpt2-xl {precision} x1]"]


@pytest.mark.parametrize("traffic", ["traffic-seoul.yaml", "traffic-batch64.yaml", "traffic-small.yaml"])
def test_a_histogram_profile_sizes_a_packing_of_one_by_the_one_model_histogram_method(traffic):
    """docs/plan.md steps 2-4 (solver.size_from_histogram, one rule for both entry points). Before, the packing
    search ignored a profile's concurrency histogram and sized from its arrivals at a burstiness of 1: on
    traffic-seoul.yaml it planned g6e.xlarge int8_wo at 3 instances ($7.04/h, target 32.0) where the one-model
    planner plans 11 ($19.63/h, target 48), and it chose g6e fp8 instead of g6e int8_wo."""
    opts = _options(traffic)
    result, plans, ctx = build_plan(opts)
    packed, packed_ctx, _ = build_packing(opts)
    (solo,), (region,) = plans, packed.regions
    by_label = {(e.candidate.instance_type, e.candidate.precision): e for e in solo.ranked}
    assert [(e.instance_type, e.loads[0].precision) for e in region.ranked] == list(by_label)
    for ev in region.ranked:
        (load,) = ev.loads
        one = by_label[(ev.instance_type, load.precision)]
        assert load.copies == 1 and load.histogram is not None
        assert ev.instances_by_hour == one.instances_by_hour
        assert round(ev.cost_per_hour, 6) == round(one.cost_per_hour, 6)
        assert round(ev.usd_per_m_output, 9) == round(one.usd_per_m_output, 9)
        assert scaling_target(ev) == one.target
        assert load.worst() == (one.weighted_ttft_p99, one.weighted_itl_p99)
    # What --write-config writes, the Spot advice and `plan check` read: the same pool either way.
    (mine,), (theirs,) = packed.planned_pools(packed_ctx), result.planned_pools(ctx)
    assert (mine.instance_type, mine.instances_by_hour, mine.target) == \
        (theirs.instance_type, theirs.instances_by_hour, theirs.target)
    assert mine.cost_per_hour == pytest.approx(theirs.cost_per_hour, abs=1e-9)
    ((a,), (b,)) = (mine.serves, theirs.serves)
    assert a.precision == b.precision and a.sizing is not None and b.sizing is not None
    assert not a.sizing.arrival_driven and not b.sizing.arrival_driven
    assert a.sizing.hold_ms == pytest.approx(b.sizing.hold_ms, rel=1e-12)
    assert a.sizing.seconds_per_request == pytest.approx(b.sizing.seconds_per_request, rel=1e-12)


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


def _compared(solo, region):
    """(label, service region, instances, cost to the micro-dollar, target) per ranked way to serve, either side."""
    mine = [(e.instance_type, e.loads[0].precision, e.region, tuple(e.instances_by_hour), round(e.cost_per_hour, 6),
             scaling_target(e)) for e in region.ranked]
    theirs = [(e.candidate.instance_type, e.candidate.precision, e.service_region, tuple(e.instances_by_hour),
               round(e.cost_per_hour, 6), e.target) for e in solo.ranked]
    return mine, theirs


@pytest.mark.parametrize("traffic, reserved", [
    (ROOT / "examples/plan/two-regions/traffic.yaml", {}),
    (SEED / "traffic-us-east-1.yaml", {}),
    # Six g6e.xlarge already paid for in Ohio: Virginia's traffic is cheapest served from there.
    (SEED / "traffic-us-east-1.yaml", {("g6e.xlarge", "us-east-2"): 6}),
])
def test_a_packing_of_one_is_served_from_the_regions_a_one_model_plan_serves_it_from(traffic, reserved):
    """solver.service_regions, one rule for both entry points: a consumer region's one model may be served from any
    region offering, pricing and reaching it by cross-region PrivateLink, its network added. Before, the packing
    search evaluated only the consumer's own region, so with six g6e.xlarge reserved in us-east-2 the one-model
    planner served Virginia from Ohio ($7.77/h) and the packing search kept it in Virginia ($15.98/h)."""
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(traffic), config=str(ROOT / "config/fleet.yaml"),
                       today=TODAY, reserved=reserved)
    result, plans, ctx = build_plan(opts)
    packed, packed_ctx, _ = build_packing(opts)
    for solo, region in zip(plans, packed.regions, strict=True):
        mine, theirs = _compared(solo, region)
        # The same ways to serve with the same figures; the order within a tie of cost and instance-hours is each
        # side's latency tie-break (weighted P99 TTFT vs share of the SLO), which the pick below must survive.
        assert sorted(mine) == sorted(theirs)
        assert [m[3:5] for m in mine] == [t[3:5] for t in theirs]
        assert any(e.service_region != solo.traffic.region for e in solo.ranked)  # cross-region was on the table
        assert (region.winner.instance_type, region.winner.region) == \
            (solo.winner.candidate.instance_type, solo.winner.service_region)
    mine_pools, their_pools = packed.planned_pools(packed_ctx), result.planned_pools(ctx)
    assert [(p.region, p.consumer_regions, p.instances_by_hour, round(p.cost_per_hour, 6)) for p in mine_pools] == \
        [(p.region, p.consumer_regions, p.instances_by_hour, round(p.cost_per_hour, 6)) for p in their_pools]
    if reserved:
        (pool,) = mine_pools
        assert (pool.region, pool.consumer_regions) == ("us-east-2", ("us-east-1",))
        assert pool.label.endswith("@ us-east-2")


@pytest.mark.parametrize("traffic", ["traffic-seoul-arrivals.yaml", "traffic-seoul.yaml",
                                     str(ROOT / "examples/plan/two-regions/traffic.yaml")])
def test_one_model_is_planned_without_a_config_through_the_packing_search_as_by_the_one_model_planner(traffic):
    """docs/plan.md, Inputs: `fleetcast plan` for one model runs without a fleet config, its SLO from --ttft-p99-ms /
    --itl-p99-ms. Before, the packing search read the config for every model's engine, memory and SLO and refused to
    start without one (load_config of None); now the model is the one the results measured, the support matrix reads
    the results' backend and the default KV-cache dtype as a one-model plan does, and the figures are the same."""
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / traffic), config=None, today=TODAY,
                       ttft_p99_ms=250, itl_p99_ms=35)
    result, plans, ctx = build_plan(opts)
    packed, packed_ctx, cfg = build_packing(opts)
    assert cfg is None and packed.models == ("gpt2-xl",) and packed_ctx.slo == ctx.slo
    for solo, region in zip(plans, packed.regions, strict=True):
        mine, theirs = _compared(solo, region)
        assert sorted(mine) == sorted(theirs) and mine
        assert (region.winner.instance_type, region.winner.loads[0].precision, region.winner.region) == \
            (solo.winner.candidate.instance_type, solo.winner.candidate.precision, solo.winner.service_region)
    key = [(p.region, p.consumer_regions, p.instance_type, p.instances_by_hour, round(p.cost_per_hour, 6))
           for p in packed.planned_pools(packed_ctx)]
    assert key == [(p.region, p.consumer_regions, p.instance_type, p.instances_by_hour, round(p.cost_per_hour, 6))
                   for p in result.planned_pools(ctx)]


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
    its H_h is the summed peaks over the summed rates (solver.pooled_traffic, the one rule both entry points call).
    Before, the one-model planner read each hour's H off the burstiest member alone (Ohio's 1.5 against the pool's
    1.33-1.43): its target (24.3) scaled the Virginia-Ohio pool out past the count its SLOs need, while the packing
    search wrote 25.8 for the same pool."""
    from fleetcast.plan.queueing import max_safe_rate, model_for
    from fleetcast.plan.solver import pooled_traffic

    opts = _two_regions()
    result, _, ctx = build_plan(opts)
    packed, packed_ctx, _ = build_packing(opts)
    (theirs,), (mine,) = result.planned_pools(ctx), packed.planned_pools(packed_ctx)
    assert theirs.consumer_regions == mine.consumer_regions == ("us-east-1", "us-east-2")
    assert theirs.target == mine.target == 25.8
    # The figure is the one-model rule on the pool's day: L at x* over the pool's busiest hour's H, H never the
    # burstiest member's alone.
    ((served,),) = (theirs.serves,)
    assert served.sizing is not None
    day = pooled_traffic(list(served.sizing.members), theirs.region, ctx)
    assert max(day.hourly_burstiness()) < max(t.hourly_burstiness()[0] for t in served.sizing.members) == 1.5
    model = model_for(result.pools[0].evaluation.candidate.curve)
    x, _, _ = max_safe_rate(model, day.output_mean, served.sizing.limits) or (0.0, None, None)
    level = predict(model, [Stream(x / max(day.hourly_burstiness()), day.output_mean)], 1.0).in_flight
    assert theirs.target == floor_tenth(level)


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
    """What a pooled plan asks of the config and what the Spot advice, `plan --check` and `plan simulate` read of it,
    less the label and the model's name (a one-model candidate has neither brackets nor, without `models:`, a name)."""
    from fleetcast.plan import check

    ((served,),) = (pool.serves,)
    z = served.sizing
    return (pool.region, pool.consumer_regions, pool.instance_type, pool.instances_by_hour, pool.target,
            round(pool.cost_per_hour, 9), pool.cost_text, pool.price_per_hour, served.precision, served.copies,
            [(t.region, t.hourly_rps(), t.hourly_burstiness(), t.output_mean) for t in z.members], z.limits,
            z.network_ms, z.processes, z.needed, z.predictions, z.arrival_driven, z.hold_ms, z.seconds_per_request,
            round(check._rps_per_instance(served), 9), check.levels_at_arrival(pool))


@pytest.mark.parametrize("reserved", [
    {},
    # Three g6e.xlarge paid for in Virginia, where both regions' own choices serve from.
    {("g6e.xlarge", "us-east-1"): 3},
    # Six in Ohio: the pool serves Virginia and Ohio from there.
    {("g6e.xlarge", "us-east-2"): 6},
])
def test_a_pooled_one_model_fleet_is_the_same_fleet_through_either_entry_point(reserved):
    """Every field of a pool shared across regions (its regions, instances per hour, cost, target, the members' own
    days, predictions and the Spot advice) comes out the same from the one-model planner and the packing search.
    Before: the packing search kept a pool per consumer region even where two regions' choices were the same packing
    served from the same region, so with three g6e.xlarge reserved in Virginia it ran two Virginia pools, each counting
    the three reserved instances as its own ($0.83/h for the fleet, against $2.10/h for the one pool that really runs);
    a packing's pooled pool handed Spot and `plan --check` one summed traffic named after Ohio instead of each
    member's; a one-model pooled pool's `plan --check` line quoted its first member's own cost ($3.78/h) for the
    pool's ($7.06/h) and its baseline's rate per instance read the burstiest member's minute."""
    from fleetcast.plan import spot

    opts = _two_regions(reserved=reserved, spot_prices=str(SEED / "spot-prices.yaml"))
    result, _, ctx = build_plan(opts)
    packed, packed_ctx, _ = build_packing(opts)
    theirs, mine = result.planned_pools(ctx), packed.planned_pools(packed_ctx)
    assert [_pool_fields(p) for p in mine] == [_pool_fields(p) for p in theirs]
    (pool,) = theirs
    assert pool.consumer_regions == ("us-east-1", "us-east-2")
    assert packed.cost_per_hour == pytest.approx(sum(p.cost_per_hour for p in result.pools), abs=1e-9)
    assert pool.cost_text.startswith(f"${pool.cost_per_hour:.2f}/h, ")
    for a, b in zip(result.spot, packed.spot, strict=True):
        assert (a.service_region, a.recommended, a.on_demand_base, a.spot_peak, a.instance_types) == \
            (b.service_region, b.recommended, b.on_demand_base, b.spot_peak, b.instance_types)
        assert (a.cost_per_hour, a.slo_attainment, a.requests_at_risk_per_day) == \
            pytest.approx((b.cost_per_hour, b.slo_attainment, b.requests_at_risk_per_day), rel=1e-12)
    assert [spot.spot_pool(p).mean_hold_s for p in mine] == pytest.approx([spot.spot_pool(p).mean_hold_s for p in theirs])


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


def test_histogram_sized_regions_pool_across_regions_by_one_rule_through_either_entry_point(tmp_path):
    """docs/plan.md, "Pools": with histograms, one target k <= every member's c* (the one making the summed load
    cheapest) and N_h = max(n_min, ceil(sum_i rate_i,h x S_i(k))), solver.pooled_histogram for one model or a packing
    of one process. Before, the packing search never pooled a histogram-sized region: it kept Virginia ($12.77/h) and
    Ohio ($7.93/h) apart, $20.71/h, where the one-model planner runs one Virginia pool at k = 32 for $20.24/h (one
    NLB and one set of provider endpoints)."""
    from fleetcast.plan.solver import pooled_histogram

    traffic = tmp_path / "traffic.yaml"
    traffic.write_text(TWO_HISTOGRAMS)
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(traffic), config=str(ROOT / "config/fleet.yaml"),
                       today=TODAY)
    result, plans, ctx = build_plan(opts)
    packed, packed_ctx, _ = build_packing(opts)
    theirs, mine = result.planned_pools(ctx), packed.planned_pools(packed_ctx)
    assert [_pool_fields(p) for p in mine] == [_pool_fields(p) for p in theirs]
    (pool,) = mine
    assert pool.consumer_regions == ("us-east-1", "us-east-2") and pool.region == "us-east-1"
    assert packed.cost_per_hour == pytest.approx(sum(p.cost_per_hour for p in result.pools), abs=1e-9)
    assert packed.cost_per_hour < sum(r.winner.cost_per_hour for r in packed.regions) - 0.01
    assert [j.split(":")[0] for j in packed.joins] == \
        ["us-east-2 joins the us-east-1 pool (g6e.xlarge [gpt2-xl int8_wo x1], serving us-east-1, us-east-2)"]
    # The rule itself: each member's own histogram sizing on this candidate in Virginia, its network included.
    members = [next(e for e in plan.ranked if e.service_region == "us-east-1"
                    and e.candidate.label == "g6e.xlarge int8_wo") for plan in plans]
    k, loads = pooled_histogram(members[0].candidate.curve,
                                [(e_plan.traffic, e.max_load, e.seconds_at) for e_plan, e in zip(plans, members)])
    assert pool.target == k <= min(e.max_load for e in members)
    assert pool.instances_by_hour == tuple(max(ctx.n_min("us-east-1"), math.ceil(x - 1e-9)) for x in loads)
    (served,) = pool.serves
    assert served.sizing is not None and served.sizing.needed == tuple(math.ceil(x - 1e-9) for x in loads)
    assert all(not s.sizing.arrival_driven for s in pool.serves if s.sizing is not None)


def test_a_pool_whose_regions_ask_different_lengths_is_sized_one_stream_per_region_either_way(tmp_path):
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
    result, _, ctx = build_plan(opts)
    packed, packed_ctx, _ = build_packing(opts)
    theirs, mine = result.planned_pools(ctx), packed.planned_pools(packed_ctx)
    assert [_pool_fields(p) for p in mine] == [_pool_fields(p) for p in theirs]
    (pool,) = mine
    assert (pool.region, pool.consumer_regions) == ("us-east-2", ("us-east-2", "us-east-1"))
    assert (pool.instances_by_hour[0], pool.instances_by_hour[12]) == (7, 5)
