"""Sizing for a fleet that will be resized (issue 16 item 2): per-instance concurrency is derived from the
fleet's arrivals and each candidate's curve, checked against a discrete-event simulation of the fleet.

The analytic model and the simulator share the service model (fleetcast/plan/queueing.py) and differ in
what the check is about: Little's law per instance, Poisson arrivals split at random by the NLB, the
batch an arrival joins, the busiest minute of each hour. Scenarios: the seed (examples/plan/seed,
traffic-seoul-arrivals.yaml) and examples/plan/{bursty,long-outputs,two-regions}.
"""

from __future__ import annotations

import math

import pytest

from fleetcast.plan.packing import scaling_target
from fleetcast.plan.queueing import ServiceModel, Stream, model_for, occupancy, predict
from fleetcast.plan.run import Planned, PlanOptions, build_packing
from fleetcast.plan.simulate import FleetSim, busiest_minutes, poisson_arrivals
from scripts.cli import main

from .conftest import ROOT, SEED, east_and_west_traffic

RESULTS = str(SEED / "results")
SCENARIOS = [SEED / "traffic-seoul-arrivals.yaml", ROOT / "examples/plan/bursty/traffic.yaml",
             ROOT / "examples/plan/long-outputs/traffic.yaml", ROOT / "examples/plan/two-regions/traffic.yaml"]


def build(traffic, **kw):
    opts = dict(results=[RESULTS], traffic=str(traffic), config=None, ttft_p99_ms=300.0, itl_p99_ms=40.0,
                error_rate=0.01, min_instances=1)
    opts.update(kw)
    packed, ctx, _ = build_packing(PlanOptions(**opts))
    return packed, ctx


def candidate(packed, label):
    """The way to serve labelled `label` ("g5.xlarge fp16": its instance type and precision) from the consumers' own
    region."""
    return next(served_from(r, label, r.region) for r in packed.regions)


def served_from(plan, label, region):
    """A consumer region's way to serve labelled `label` ("g5.xlarge fp16") from `region`."""
    itype, precision = label.split()
    return next(e for e in plan.ranked if e.instance_type == itype and e.loads[0].precision == precision
                and e.region == region)


@pytest.mark.parametrize("traffic", SCENARIOS, ids=lambda p: p.parent.name + "/" + p.name)
def test_planner_and_simulation_agree_within_10_percent(traffic):
    packed, ctx = build(traffic)
    # The plan's own pools, and the slowest candidate (the most instances: the sharpest count check).
    lines, ok = Planned(packed, ctx).simulate(7, None, 2, None)
    assert ok, "\n".join(lines)
    lines, ok = Planned(packed, ctx).simulate(7, ["g5.xlarge [gpt2-xl fp16 x1]"], 1, None)
    assert ok, "\n".join(lines)


def test_each_instance_obeys_littles_law_at_its_planned_load():
    packed, _ = build(SEED / "traffic-seoul-arrivals.yaml")
    ev = candidate(packed, "g5.xlarge fp16")
    (load,) = ev.loads
    model = model_for(load.curve)
    h = 10  # 180 req/s, busiest minute 1.25x
    pred = load.predictions[h]
    per_instance = 180 * 1.25 / ev.instances_by_hour[h]
    assert pred.rate_rps == pytest.approx(per_instance)
    # Little's law: requests in flight = arrival rate x the mean time each holds the instance at the batch it joins.
    pmf = occupancy(model, per_instance, 128)
    held_s = sum(w * model.hold_ms(1.0 + k, 128) for k, w in enumerate(pmf)) / 1000
    assert pred.in_flight == pytest.approx(per_instance * held_s, rel=1e-3)
    assert pred.out_of_range < 0.01
    assert pred.ttft_p99_ms <= 300 - load.network_ms and pred.ttft_p99_ms > 0.9 * (300 - load.network_ms)


def test_per_instance_concurrency_follows_from_the_arrivals_not_from_a_histogram():
    # Twice the arrivals: the histogram method keeps the same per-instance levels by assumption; sized from
    # arrivals the instances run near the same SLO-bound load, and the count doubles (within rounding).
    from fleetcast.plan.traffic import load_traffic

    profile = load_traffic(SEED / "traffic-seoul-arrivals.yaml")
    doubled = profile.model_copy(update={"consumers": [t.scaled(2.0) for t in profile.consumers]})
    ev = candidate(build(SEED / "traffic-seoul-arrivals.yaml")[0], "g5.xlarge fp16")
    big = candidate(build(None, traffic_profile=doubled)[0], "g5.xlarge fp16")
    for h in (0, 10):
        assert abs(big.instances_by_hour[h] - 2 * ev.instances_by_hour[h]) <= 1
        assert big.loads[0].predictions[h].in_flight == pytest.approx(ev.loads[0].predictions[h].in_flight, rel=0.1)
    # The scaling target is a property of the candidate and the bursts.
    assert scaling_target(big) == scaling_target(ev)


def test_a_histogram_only_profile_keeps_the_histogram_method():
    packed, ctx = build(SEED / "traffic-seoul.yaml", min_instances=None)
    (plan,) = packed.regions
    (load,) = plan.winner.loads
    assert not plan.traffic[0].arrival_driven and load.histogram is not None
    assert (plan.winner.label, scaling_target(plan.winner), round(plan.winner.cost_per_hour, 2)) == \
        ("g6e.xlarge [gpt2-xl int8_wo x1]", 48, 19.63)  # the published histogram figures (test_seed_scenario.py)


def test_the_simulator_is_deterministic_and_conserves_requests():
    packed, _ = build(SEED / "traffic-seoul-arrivals.yaml")
    model = model_for(candidate(packed, "g6e.xlarge fp8").loads[0].curve)
    a = busiest_minutes(model, [(150.0, 128)], 3, seed=5, minutes=1)
    b = busiest_minutes(model, [(150.0, 128)], 3, seed=5, minutes=1)
    c = busiest_minutes(model, [(150.0, 128)], 3, seed=6, minutes=1)
    assert a == b and a != c
    # Little's law inside the simulation: time-averaged requests in flight = sum of holding times / horizon.
    import random

    sim = FleetSim(model, seed=1)
    sim.start(2)
    arrivals = poisson_arrivals([60.0], 0, 0.0, lambda: 128, random.Random(2))
    sim.run(arrivals, until_s=120.0)
    area_s = sim.take_load_area() / 1000.0
    held = sum(r.done_s - r.arrival_s for r in sim.records)
    assert len(sim.records) == len(arrivals) and area_s == pytest.approx(held, rel=1e-9)


def test_the_simulators_results_are_pinned_to_the_bit():
    # The event loop is the planner's hot path and is tuned for speed (its state in locals, Random.gauss and
    # Random.choice inlined); every draw and float operation must stay as the plain loop made them. Every path
    # of the loop is taken: full batches queueing (cap 6), one-token outputs, launches, ticks and drains. The
    # digest is of the records the loop made before it was tuned (commit 07bdc97).
    import hashlib
    import random

    from fleetcast.plan.inputs import load_candidates
    from fleetcast.plan.simulate import length_sampler

    model = model_for(load_candidates([str(SEED / "results" / "g5.xlarge-fp16.json")])[0].curve)
    rng = random.Random(3)
    arrivals = sorted(poisson_arrivals([8.0, 12.0], 0, 0.0, length_sampler({"1": 0.2, "64": 0.5, "300": 0.3}, rng), rng)
                      + poisson_arrivals([4.0, 4.0], 1, 0.0, length_sampler(128, rng), rng), key=lambda a: a.t_s)
    sim = FleetSim(model, seed=4, cap=6)
    sim.start(2)
    sim.run(arrivals, until_s=400.0, tick_s=20.0,
            on_tick=lambda s, t_s: s.launch(5.0) if t_s < 50 else s.drain_one())
    rows = [(r.arrival_s, r.ttft_ms, r.itl_ms, r.done_s, r.stream, r.queued, r.ok) for r in sim.records]
    assert (len(rows), sum(r.queued for r in sim.records), sum(r.itl_ms is None for r in sim.records),
            len(sim.instances)) == (1637, 1210, 246, 4)
    assert hashlib.sha256(repr(rows).encode()).hexdigest() == \
        "911a953e495ae772d0359077b5e84f066fcf4df47b11effa7a76694c77d7d60e"


def test_the_search_gives_up_on_a_window_only_once_it_fails_on_its_queued_share():
    # check_sizing's search for the fewest instances reads only whether each window meets the limits: it stops a
    # simulation once more of the window's requests have waited for a batch slot than the limit allows (the whole
    # run would fail on it too), and one it does not stop, served a minute at a time, is the one-piece run to the bit.
    import random

    from fleetcast.plan.inputs import load_candidates
    from fleetcast.plan.queueing import MAX_OUT_OF_RANGE
    from fleetcast.plan.simulate import _serve_window, length_sampler

    model = model_for(load_candidates([str(SEED / "results" / "g5.xlarge-fp16.json")])[0].curve)
    shares = []
    for rate in (17.9, 20.0):  # one instance: 0.8% of the requests wait, then 14%
        rng = random.Random(5)
        window = (poisson_arrivals([rate] * 4, 0, 0.0, length_sampler(128, rng), rng), 240.0)
        whole, searched = _serve_window(model, window, 1, 5), _serve_window(model, window, 1, 5, give_up=True)
        shares.append(whole.queued_share)
        if whole.queued_share <= MAX_OUT_OF_RANGE:
            assert searched == whole
        else:
            assert MAX_OUT_OF_RANGE < searched.queued_share <= whole.queued_share
            assert searched.requests < whole.requests / 2  # given up early, not at the end
    assert 0 < shares[0] <= MAX_OUT_OF_RANGE < shares[1]


def test_simulate_cli_prints_the_comparison_and_exits_0_when_they_agree(capsys):
    code = main(["plan", "simulate", "--results", RESULTS, "--traffic", str(SEED / "traffic-seoul-arrivals.yaml"),
                 "--config", str(ROOT / "config" / "fleet.yaml"), "--max-hours", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "N plan" in out and "TTFT sim" in out and "agree within 10%" in out


def test_simulate_refuses_an_unknown_candidate_naming_the_choices(capsys):
    code = main(["plan", "simulate", "--results", RESULTS, "--traffic", str(SEED / "traffic-seoul-arrivals.yaml"),
                 "--config", str(ROOT / "config" / "fleet.yaml"), "--candidate", "p5.48xlarge fp8"])
    err = capsys.readouterr().err
    assert code in (1, 2) and "--candidate 'p5.48xlarge fp8'" in err and "g5.xlarge [gpt2-xl fp16 x1]" in err


# ---------------------------------------------------------------- pools: one target, every member checked


def test_a_histogram_pool_is_sized_at_the_one_target_it_scales_on(tmp_path):
    # us-west-2 on the us-east-1 pool: 65 ms more network caps it at 32 where us-east-1 alone runs at 48. The pool
    # scales on one target, so both members' load counts at that target: 111.5 req/s at S(48) fits 10 instances,
    # at S(32) it needs 11. Sized member by member (each at its own target) the pool claimed 10 and a saving.
    from fleetcast.plan.packing import _pooled_histogram

    results = [str(SEED / "results" / f) for f in ("g6e.xlarge-int8_wo.json", "g5.xlarge-int8_wo.json")]
    packed, ctx = build(east_and_west_traffic(tmp_path, '{"0-24": 111.5}', '{"0-24": 0.5}'), results=results)
    east, west = packed.regions
    members = [east.winner, served_from(west, "g6e.xlarge int8_wo", "us-east-1")]
    assert members[0].region == "us-east-1"
    days = [ev.loads[0].histogram for ev in members]
    assert [d.target for d in days] == [48, 32]
    pool = _pooled_histogram(east.winner, [east, west], ctx)
    assert pool is not None and pool.consumer_regions == ("us-east-1", "us-west-2")
    assert scaling_target(pool) == 32 and all(32 <= d.max_load for d in days)
    load = sum(ev.loads[0].traffic.hourly_rps()[0] * d.seconds_at(32) for ev, d in zip(members, days))
    assert pool.instances_by_hour == [math.ceil(load)] * 24 == [11] * 24
    # Joining costs the pool an instance, more than the west's own pool: the regions stay apart.
    assert sorted(p.consumer_regions or (p.region,) for p in packed.pools) == [("us-east-1",), ("us-west-2",)]


def test_an_arrivals_pool_meets_every_members_slo_with_its_own_network(tmp_path):
    # g5 only (many instances, so one fewer is a sharp check). Served from us-east-1, the west's 65 ms go into
    # its TTFT, so the whole pool runs at the load that leaves the west its SLO. plan.json's member_checks say what
    # each member gets (before issue 34 only a one-model plan's pools said it).
    from fleetcast.plan import packing

    results = [str(SEED / "results" / "g5.xlarge-int8_wo.json")]
    packed, ctx = build(east_and_west_traffic(tmp_path, '{"0-24": 100}', '{"0-24": 20}', extra="burstiness: 1.2"),
                        results=results)
    east, west = packed.regions
    members = [east.winner, served_from(west, "g5.xlarge int8_wo", "us-east-1")]
    curves = packing.load_model_curves(results, ("gpt2-xl",))
    pool = packing._pooled(None, curves, east.winner, [east, west], ctx, ctx.slo, {"lab": {}})
    assert pool is not None
    model: ServiceModel = model_for(east.winner.loads[0].curve)
    streams = [Stream(ev.loads[0].traffic.hourly_rps()[0] * 1.2, 128) for ev in members]
    n = pool.instances_by_hour[0]
    pred = predict(model, streams, 1.0 / n)
    networks = [ev.loads[0].network_ms for ev in members]
    assert all(pred.ttft_p99_ms + net <= 300 for net in networks)
    fewer = predict(model, streams, 1.0 / (n - 1))
    assert fewer.ttft_p99_ms + networks[1] > 300  # the west's SLO is what sets the count
    assert fewer.ttft_p99_ms + networks[0] <= 300  # the east alone would take one fewer
    checks = packing.member_checks(pool, ctx)
    assert set(checks) == {"us-east-1", "us-west-2"} and checks["us-west-2"]["gpt2-xl"][0] <= 300
    worst = max((p for p in pool.loads[0].predictions if p is not None), key=lambda p: p.ttft_p99_ms)
    for region, net in zip(("us-east-1", "us-west-2"), networks):
        assert checks[region]["gpt2-xl"] == pytest.approx((worst.ttft_p99_ms + net, worst.itl_p99_ms))


# ---------------------------------------------------------------- explanations say what decided


def test_a_candidate_capped_by_its_measured_range_says_so_before_the_price():
    # With a 400 ms TTFT SLO g6e int8_wo and fp8 meet every SLO at their highest level, 64: the load they could carry
    # is unknown, so the plan caps them there and must say that is why they cost what they cost.
    packed, _ = build(SEED / "traffic-seoul-arrivals.yaml", ttft_p99_ms=400.0)
    (plan,) = packed.regions
    reasons = dict(plan.why_not())
    capped = [label for label in ("g6e.xlarge int8_wo", "g6e.xlarge fp8")
              if candidate(packed, label) is not plan.winner]
    for label in capped:
        ev = candidate(packed, label)
        assert ev.measured_cap == 64
        assert reasons[ev.label].startswith("measured only up to concurrency 64, lower than the load it could "
                                            "carry"), reasons[ev.label]
    assert capped and any("measured only up to concurrency 64" in n for n in plan.winner.notes)


def test_a_config_floor_that_decides_the_pick_is_named():
    # A floor of 40 instances all day: every candidate pays for 40, and g5 (cheaper per instance) wins only
    # because of it; the traffic alone picks g6e fp8. Its why-not says so (before issue 34 only a one-model plan's did).
    packed, _ = build(SEED / "traffic-seoul-arrivals.yaml", min_instances=40)
    (plan,) = packed.regions
    assert plan.winner.instance_type.startswith("g5.")
    (note,) = plan.decided_by
    assert note.startswith("the floor of 40 instances")
    assert "decided the pick: without it g6e.xlarge [gpt2-xl fp8 x1]" in note
    assert "without the floor of 40 instances" in dict(plan.why_not())["g6e.xlarge [gpt2-xl fp8 x1]"]


def test_a_reservation_that_decides_the_pick_is_named():
    packed, _ = build(SEED / "traffic-seoul-arrivals.yaml", reserved={("g5.xlarge", "ap-northeast-2"): 32})
    (plan,) = packed.regions
    assert plan.winner.instance_type == "g5.xlarge"
    (note,) = plan.decided_by
    assert note.startswith("the capacity reservation (32 x g5.xlarge in ap-northeast-2")
    assert "g6e.xlarge [gpt2-xl fp8 x1]" in note


def test_no_decided_by_note_when_the_traffic_decides():
    packed, _ = build(SEED / "traffic-seoul-arrivals.yaml", min_instances=2)
    assert packed.regions[0].decided_by == []


def test_with_a_constant_holding_time_the_occupancy_is_poisson():
    # The birth-death chain reduces to M/G/inf's Poisson count when W does not depend on the batch.
    from fleetcast.plan.curves import Curve, LoadPoint

    flat = ServiceModel(Curve((LoadPoint(1, 50.0, 8.0, 1000.0, ttft_mean=40.0, itl_mean=7.5),
                               LoadPoint(64, 50.0, 8.0, 1000.0, ttft_mean=40.0, itl_mean=7.5))))
    hold = flat.hold_ms(1.0, 128) / 1000
    pmf = occupancy(flat, 10.0, 128)
    mean = 10.0 * hold
    for k in (0, 5, 10, 20):
        assert pmf[k] == pytest.approx(math.exp(-mean) * mean ** k / math.factorial(k), rel=1e-9)


def _plain_bisection(cdf, q, hi):
    """The quantile as the planner first computed it: double until above q, then bisect from 0 to a relative 1e-9."""
    lo = 0.0
    while cdf(hi) < q and hi < 1e9:
        hi *= 2
    for _ in range(60):
        if hi - lo <= 1e-9 * hi:
            break
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < q else (lo, mid)
    return hi


@pytest.mark.parametrize("start", [50.0, 300.0, 755.0, 5000.0])
def test_the_p99_of_a_batch_mixture_is_the_bisections_to_the_bit_in_a_third_of_its_evaluations(start):
    # Every P99 the planner prints is a mixture quantile, and each evaluation sums every batch level's
    # lognormal; the secant bracket settles most of the bisection's midpoints without evaluating the mixture,
    # and must leave its answer unchanged to the last bit, whatever the starting guess.
    from fleetcast.plan.queueing import LogNormal, _mixture_cdf, _quantile

    mix = [(0.3, LogNormal(5.0, 0.3)), (0.5, LogNormal(5.3, 0.4)), (0.2, LogNormal(5.8, 0.5)), (1e-4, LogNormal(6.5, 0.0))]
    cdf = _mixture_cdf(mix, sum(w for w, _ in mix))
    calls = []

    def counted(x):
        calls.append(x)
        return cdf(x)

    for q in (0.5, 0.99, 0.999):
        calls.clear()
        expected = _plain_bisection(counted, q, start)
        plain = len(calls)
        calls.clear()
        assert _quantile(counted, q, start) == expected
        assert len(calls) <= plain / 2, (q, len(calls), plain)


def _plain_occupancy(model, rate_rps, output_mean):
    """The birth-death walk as the planner first wrote it: one level at a time, max() over every weight so far."""
    top = int(model.top)
    per_ms = rate_rps / 1000.0
    if per_ms >= top / model.hold_ms(float(top), output_mean):
        return None
    weights, w, k = [1.0], 1.0, 0
    while True:
        k += 1
        b = min(k, top)
        w *= per_ms / (b / model.hold_ms(float(b), output_mean))
        weights.append(w)
        if k > top and w < 1e-12 * max(weights):
            break
        if k > 50 * top + 1000:
            return None
    total = sum(weights)
    return [x / total for x in weights]


@pytest.mark.parametrize("output_mean", [1.0, 128.0, 700.0])
def test_the_occupancy_is_the_plain_walks_to_the_bit_from_idle_to_saturation(output_mean):
    # occupancy() is the planner's inner loop (every predict() walks it): above the highest measured level it
    # multiplies one factor, and it keeps the peak as it goes. Its distribution must stay the plain walk's, float
    # for float, at every load: near saturation (a long tail, or one too long: None) and past it.
    from fleetcast.plan.inputs import load_candidates

    for name in ("g5.xlarge-fp16.json", "g6e.xlarge-fp8.json"):
        model = ServiceModel(load_candidates([str(SEED / "results" / name)])[0].curve)
        drain = model.top / model.hold_ms(float(model.top), output_mean) * 1000.0  # req/s the top level drains
        for share in (0.01, 0.3, 0.9, 0.99, 0.999, 1.0, 1.5):
            got, want = occupancy(model, drain * share, output_mean), _plain_occupancy(model, drain * share, output_mean)
            assert got == want, (name, share)
        assert len(occupancy(model, drain * 0.99, output_mean)) > 2000  # a long tail above the top level
        assert occupancy(model, drain * 0.999, output_mean) is None  # a tail past 50 x top + 1000 levels
