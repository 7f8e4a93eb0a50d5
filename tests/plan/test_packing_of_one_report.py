"""One model is a packing of one (issue 34, "one report"): a packing of one model says what the one-model report
says about the same plan, from the same rendering functions: the consumers' traffic and load levels, what one
instance at night means, and the cost-vs-latency pictures."""

from __future__ import annotations

from datetime import date

import pytest

from fleetcast.plan import packing_report
from fleetcast.plan.report import render_markdown, render_terminal, single_instance_note, summary_line
from fleetcast.plan.run import PlanOptions, build_packing, build_plan

from .conftest import ROOT, SEED

TODAY = date(2026, 2, 1)


def _both(traffic: str, **kw):
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / traffic),
                       config=str(ROOT / "config" / "fleet.yaml"), today=TODAY, **kw)
    solo, plans, _ = build_plan(opts)
    packed, _, _ = build_packing(opts)
    return solo, plans[0], packed


@pytest.fixture(scope="module", params=["traffic-seoul-arrivals.yaml", "traffic-seoul.yaml"])
def arrivals_and_histogram(request):
    return _both(request.param)


@pytest.fixture(scope="module")
def one_instance_at_night():
    return _both("traffic-seoul-arrivals.yaml", min_instances=1)


def test_a_packing_of_one_states_its_consumers_traffic_and_load_levels_as_the_one_model_report_does(
        arrivals_and_histogram):
    solo, plan, packed = arrivals_and_histogram
    line = summary_line(plan.traffic)
    assert "concurrency levels " in line
    assert line in render_terminal(solo) and line in render_markdown(solo, {})
    assert line in packing_report.render_terminal(packed)
    assert ("p", line) in packing_report.blocks(packed)


def test_a_packing_of_one_says_what_one_instance_means_as_the_one_model_report_does(one_instance_at_night):
    solo, plan, packed = one_instance_at_night
    (region,) = packed.regions
    assert region.winner is not None and region.winner.capacity()[0] == 1
    note = single_instance_note(region.winner)
    assert note is not None and note.startswith("capacity min 1: for ")
    # The same pick sized the same way: the same hours, the same words.
    assert note == single_instance_note(plan.winner)
    assert f"note: {note}" in render_terminal(solo)
    assert f"note: {note}" in packing_report.render_terminal(packed)
    assert ("ul", [("one instance", note)]) in packing_report.blocks(packed)


def test_a_packing_of_several_processes_says_it_too_when_it_runs_one_instance():
    """The note is about the pool's instances, whatever each runs."""
    class Day:
        instances_by_hour = [1] * 6 + [2] * 18
        price_per_hour = 2.4

        def capacity(self):
            return 1, 2, 2
    assert "for 6 h a day (UTC 00-06)" in (single_instance_note(Day()) or "")  # type: ignore[arg-type]


def test_a_packing_of_one_draws_the_one_model_reports_cost_vs_latency_pictures(arrivals_and_histogram, tmp_path):
    solo, plan, packed = arrivals_and_histogram
    (region,) = packed.regions
    written = packing_report.write_report(packed, tmp_path / "packed")
    names = {p.name for p in written}
    for kind in ("ttft", "itl"):
        name = f"cost_vs_{kind}-{region.region}.png"
        assert name in names and (tmp_path / "packed" / name).stat().st_size > 10_000
        assert f"]({name})" in (tmp_path / "packed" / "plan.md").read_text()


def test_a_packing_of_several_models_draws_no_single_model_cost_vs_latency_picture(tmp_path):
    mm = ROOT / "examples" / "plan" / "multi-model"
    opts = PlanOptions(results=[str(mm / "results")], traffic=str(mm / "traffic.yaml"),
                       config=str(mm / "fleet.yaml"), today=TODAY)
    packed, _, _ = build_packing(opts)
    written = packing_report.write_report(packed, tmp_path / "mm")
    assert not any(p.name.startswith("cost_vs_") for p in written)
    assert all(not line.startswith("Consumers in ") for line in packing_report.render_terminal(packed).splitlines())


def test_a_packing_of_one_says_and_writes_the_target_the_one_model_report_does(arrivals_and_histogram, tmp_path):
    """The figure the pool scales on (scaling.target), in the recommendation and in plan.json's winner."""
    solo, plan, packed = arrivals_and_histogram
    (region,) = packed.regions
    assert plan.winner is not None and region.winner is not None
    words = f"target {plan.winner.target:g} in-flight requests per instance"
    assert words in render_terminal(solo)
    assert words in packing_report.recommendation(region)
    assert packing_report.to_json(packed)["regions"][0]["winner"]["target"] == plan.winner.target
    blocks = packing_report.blocks(packed)
    reading = dict(blocks[blocks.index(("h2", "Reading this report")) + 1][1])
    assert reading["target"].startswith("the load per instance the pool scales on")
