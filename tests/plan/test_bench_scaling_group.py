"""The simulated Auto Scaling group behind `make bench-scaling` (scripts/bench_scaling.py) does what the
synthesized policies do (stacks/fleet_scaling.py; EC2 Auto Scaling "Set the default instance warmup for an
Auto Scaling group": warming instances count toward current capacity, a repeated breach in one step range
adds nothing): tested minute by minute with the metrics it would read."""

from __future__ import annotations

import argparse

import pytest

from fleetcast.plan.inputs import load_candidates
from fleetcast.plan.queueing import ServiceModel
from fleetcast.plan.simulate import FleetSim
from scripts.bench_scaling import SCALE_IN_MINUTES, Group, Policy, diurnal_trace

from .conftest import SEED

SLO = argparse.Namespace(ttft_p99_ms=300.0, itl_p99_ms=40.0)


@pytest.fixture()
def group():
    (cand,) = load_candidates([str(SEED / "results" / "g5.xlarge-fp16.json")])

    def make(slo_protection=True, target=5.0, n=4):
        sim = FleetSim(ServiceModel(cand.curve), seed=1)
        g = Group(sim, Policy("p", target, slo_protection), SLO, min_n=1, max_n=40, warm_size=0, cold_s=120.0,
                  warm_s=60.0)
        sim.start(n - 1)  # Group started one
        return g, sim
    return make


def feed(g, sim, minutes, load, ratio, t0=60.0):
    stats = iter([(load, ratio, 100)] * (minutes + 1))
    g._minute_stats = lambda t: next(stats)
    for k in range(minutes + 1):
        g.tick(sim, t0 + 60.0 * k)


def test_an_slo_breach_under_target_scales_out_once_while_the_new_instance_warms(group):
    g, sim = group()
    feed(g, sim, 3, load=2.0, ratio=0.95)  # load far under target 5; P99 at 95% of the SLO for 3 minutes
    assert g.launches == 1 and sim.pending == 1  # +20% of 4 -> one instance, asked for again, launched once


def test_past_the_slo_the_step_grows_and_only_the_difference_launches(group):
    g, sim = group(n=8)
    feed(g, sim, 1, load=2.0, ratio=0.95)
    assert g.launches == 1
    feed(g, sim, 1, load=2.0, ratio=1.3, t0=180.0)  # past the SLO: +50% of 8 serving = 12, one already coming
    assert g.launches == 4 and sim.pending == 4


def test_without_slo_protection_only_load_scales_out(group):
    g, sim = group(slo_protection=False)
    feed(g, sim, 5, load=2.0, ratio=1.5)
    assert g.launches == 0
    feed(g, sim, 3, load=7.5, ratio=0.0, t0=600.0)  # 3 minutes above target: ceil(7.5 * 4 / 5) = 6
    assert g.launches == 2


def test_no_scale_in_while_the_slo_ratio_is_above_the_lower_threshold(group):
    g, sim = group()
    feed(g, sim, SCALE_IN_MINUTES + 5, load=1.0, ratio=0.8)  # idle, but P99 at 80% of the SLO (> 0.7)
    assert len(sim.routable) == 4
    feed(g, sim, SCALE_IN_MINUTES + 1, load=1.0, ratio=0.5, t0=2000.0)
    assert len(sim.routable) == 3


def test_the_trace_is_diurnal_with_bursts_and_seeded():
    a, b = diurnal_trace(40.0, 3), diurnal_trace(40.0, 3)
    assert a == b and len(a) == 24 * 60
    assert min(a) == pytest.approx(10.0, rel=0.05) and 40.0 < max(a) <= 40.0 * 1.9
    assert diurnal_trace(40.0, 4) != a


# What the bench prints for both policies (attainment, instance-hours, the launch times) is checked on the one run of
# it that tests/plan/test_day_pictures.py makes (test_bench_scaling_draws_instances_and_slo_windows_per_policy): a
# second hour-long run of the same command would check nothing more.
