"""One model is a packing of one (issue 34, "one report"): a packing of one model says what the one-model report
says about the same plan, from the same rendering functions: the consumers' traffic and load levels, what one
instance at night means, and the cost-vs-latency pictures."""

from __future__ import annotations

import re
from datetime import date

import pytest

from fleetcast.plan import packing_report, report
from fleetcast.plan.packing import scaling_target
from fleetcast.plan.report import figure_cells, render_markdown, render_terminal, single_instance_note, summary_line
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


def _one_process(region, plan):
    """Each packing of one process with the one-model evaluation of the same type and precision in the region."""
    by = {(e.candidate.instance_type, e.candidate.precision): e for e in plan.ranked
          if e.service_region == plan.traffic.region}
    return [(ev, by[(ev.instance_type, ev.loads[0].precision)]) for ev in region.ranked if ev.processes == 1]


def test_a_packing_of_one_prints_the_one_model_candidates_table_with_the_same_figures(arrivals_and_histogram):
    """c*, target, instances, $/h, $ per 1M output and input tokens, the weighted P99s and goodput: one function
    writes them for both (report.figure_cells), from figures each planner carries."""
    solo, plan, packed = arrivals_and_histogram
    (region,) = packed.regions
    pairs = _one_process(region, plan)
    assert len(pairs) >= 3
    for ev, one in pairs:
        assert figure_cells(ev, scaling_target(ev), True) == figure_cells(one, one.target, True)
        assert ev.rtt_ms == one.rtt_ms and ev.weighted_ttft_ci == one.weighted_ttft_ci
    header = next(line for line in render_terminal(solo).splitlines() if line.startswith("#  candidate"))
    terminal = packing_report.render_terminal(packed)
    assert header.split() == next(line for line in terminal.splitlines() if line.startswith("#  candidate")).split()
    for term in ("c*: ", "target: ", "wP99 TTFT / wP99 ITL: "):
        words = next(line for line in render_terminal(solo).splitlines() if line.startswith(f"   {term}"))
        assert words in terminal
    page = packing_report.blocks(packed)
    assert ("h3", "Feasible packings") in page
    table = page[page.index(("h3", "Feasible packings")) + 1]
    assert table[1] == report.PAGE_HEADER and len(table[2]) == len(region.ranked)


def test_a_packing_of_ones_recommendation_gives_c_star_and_the_input_token_price_in_the_one_model_words(
        arrivals_and_histogram):
    solo, plan, packed = arrivals_and_histogram
    (region,) = packed.regions
    assert plan.winner is not None and region.winner is not None
    one = report.recommendation(plan)
    mine = packing_report.recommendation(region)
    # Everything past the pick's name is the same sentence with the same figures.
    assert mine.split(f" in {region.region}: ", 1)[1] == one.split(f" in {plan.winner.service_region}: ", 1)[1]
    assert f"highest load within the SLO: {plan.winner.max_load:g})" in mine
    assert f"Recommendation: {mine}" in packing_report.render_terminal(packed)


def test_a_packing_of_ones_plan_json_has_the_one_model_winners_figures(arrivals_and_histogram):
    solo, plan, packed = arrivals_and_histogram
    one = report.to_json(solo)["regions"][0]["winner"]
    mine = packing_report.to_json(packed)["regions"][0]["winner"]
    for key in ("rtt_ms", "max_load", "target", "usd_per_m_input", "usd_per_m_output", "weighted_ttft_p99_ms",
                "weighted_ttft_ci", "weighted_itl_p99_ms", "goodput_rps_per_instance", "goodput_exact", "sizing",
                "capacity", "instances_by_hour", "estimated", "cost_per_hour", "fixed_per_hour", "measured_cap"):
        assert mine[key] == pytest.approx(one[key], rel=1e-12), key
    if one["sizing"] == "arrivals":
        for key in ("binding", "safe_rate_rps_per_instance", "predicted_by_hour"):
            assert mine[key] == pytest.approx(one[key], rel=1e-12) if key != "predicted_by_hour" else \
                mine[key] == one[key], key
    whole, packed_doc = report.to_json(solo), packing_report.to_json(packed)
    assert packed_doc["model"] == whole["model"] and packed_doc["slo"] == whole["slo"]


def test_a_packing_of_several_models_leaves_the_per_model_figures_to_its_model_table():
    """c*, the weighted P99s and goodput are per model there: null in plan.json, not a figure made up."""
    mm = ROOT / "examples" / "plan" / "multi-model"
    opts = PlanOptions(results=[str(mm / "results")], traffic=str(mm / "traffic.yaml"),
                       config=str(mm / "fleet.yaml"), today=TODAY)
    packed, _, _ = build_packing(opts)
    winner = packing_report.to_json(packed)["regions"][0]["winner"]
    assert len(winner["packing"]) > 1
    assert winner["max_load"] is None and winner["weighted_ttft_p99_ms"] is None and winner["goodput_rps_per_instance"] is None
    assert winner["usd_per_m_input"] > 0 and winner["rtt_ms"] > 0
    assert not any(line.startswith("#  candidate") for line in packing_report.render_terminal(packed).splitlines())


def test_a_packing_draws_the_one_model_reports_instances_over_the_day(arrivals_and_histogram, tmp_path):
    """One picture function (report.instances_plot) for both: demand above, each option's instances below."""
    _, _, packed = arrivals_and_histogram
    (region,) = packed.regions
    written = {p.name for p in packing_report.write_report(packed, tmp_path / "packed")}
    name = f"instances-{region.region}.png"
    assert name in written and (tmp_path / "packed" / name).stat().st_size > 10_000
    assert f"]({name})" in (tmp_path / "packed" / "plan.md").read_text()


def _named_as_candidates(notes):
    """Notes with each pick named as a one-model candidate is: "g6e.xlarge [gpt2-xl fp8 x1]" and
    "g6e.xlarge fp8 @ ap-northeast-2" both read "g6e.xlarge fp8" (the labels differ by design)."""
    return [re.sub(r"(\S+) \[\S+ (\S+) x1\]", r"\1 \2", re.sub(r" @ [a-z0-9-]+", "", n)) for n in notes]


def test_a_packing_of_one_gives_the_one_model_peak_throughput_and_statistical_notes(arrivals_and_histogram):
    """One function each (solver.peak_notes, solver.stats_notes) over the same curves and figures: the same
    sentences, in the terminal and on the page under the same headings."""
    solo, plan, packed = arrivals_and_histogram
    (region,) = packed.regions
    assert plan.peak_notes and region.peak_notes
    assert _named_as_candidates(region.peak_notes) == _named_as_candidates(plan.peak_notes)
    assert _named_as_candidates(region.stats_notes) == _named_as_candidates(plan.stats_notes)
    terminal = packing_report.render_terminal(packed)
    assert "Peak throughput is not the decision metric:" in terminal
    assert all(f"  - {n}" in terminal for n in region.peak_notes + region.stats_notes)
    page = packing_report.blocks(packed)
    assert ("h3", "Peak throughput") in page
    doc = packing_report.to_json(packed)["regions"][0]
    assert doc["peak_notes"] == region.peak_notes and doc["stats_notes"] == region.stats_notes


def test_the_statistical_notes_weigh_the_ttft_ci_against_the_models_own_slo(tmp_path):
    """A model's own SLO (models[].slo) is the one its packings are sized by, so the statistical notes read it too.
    Before, they read the fleet's (ctx.slo): with the fleet at 250 ms and the model at 300 ms the note on the
    pick's TTFT CI was weighed against 250 ms, an SLO this model is not held to."""
    text = (ROOT / "config" / "fleet.yaml").read_text()
    own = tmp_path / "own.yaml"
    own.write_text(text.replace("  max_output_len: 256\n", "  max_output_len: 256\n  slo: {ttft_p99_ms: 300, "
                                "itl_p99_ms: 40}\n", 1).replace("slo:\n  ttft_p99_ms: 300", "slo:\n  ttft_p99_ms: 250"))

    def notes(config: str) -> list[str]:
        opts = PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / "traffic-seoul.yaml"), config=config,
                           today=TODAY)
        packed, ctx, _ = build_packing(opts)
        return packed.regions[0].stats_notes

    plain = notes(str(ROOT / "config" / "fleet.yaml"))
    assert any("contains the 300 ms SLO" in n for n in plain)
    assert notes(str(own)) == plain


def test_a_packing_of_one_keeps_what_the_one_model_report_showed(tmp_path):
    """One report for every fleet (issue 34): a one-model user loses nothing the one-model report gave. The SLO
    line, the pick's own notes (here its load capped by the measured range), the hour-by-hour table, and in
    plan.json each evaluation's notes, seconds per request, precision and service region. Before, the packing
    report had none of them."""
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / "traffic-seoul-arrivals.yaml"),
                       config=str(ROOT / "config" / "fleet.yaml"), today=TODAY)
    packed, _, _ = build_packing(opts)
    terminal = packing_report.render_terminal(packed)
    assert "SLO: P99 TTFT <= 300 ms (network included), P99 ITL <= 40 ms, errors <= 1.0%" in terminal
    assert "  note: measured only up to concurrency 64, where it still meets every SLO" in terminal
    md = (tmp_path / "r" / "plan.md")
    packing_report.write_report(packed, tmp_path / "r")
    page = md.read_text()
    assert "### The recommendation hour by hour (UTC)" in page and "| 09 | 180 | 4 | 9.75 |" in page  # the one-model table's row
    winner = packing_report.to_json(packed)["regions"][0]["winner"]
    assert (winner["precision"], winner["service_region"]) == ("fp8", "ap-northeast-2")
    assert winner["notes"][0].startswith("measured only up to concurrency 64")
    assert winner["seconds_per_request"] == pytest.approx(sum(winner["instances_by_hour"]) /
                                                          sum(packed.regions[0].traffic[0].hourly_rps()))


def test_a_precision_the_support_matrix_refuses_is_ruled_out_with_its_reason():
    """contract/support.py: the engine flow does not build for sm120 (g7e). A one-model plan ruled each g7e precision
    out with that reason and its peak-throughput note named it; the packing search said only 'no curve (at a
    precision its GPU runs)' and 'no packing of it serves'. Now both say the matrix's reason."""
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(ROOT / "examples/plan/two-regions/traffic.yaml"),
                       config=str(ROOT / "config" / "fleet.yaml"), today=TODAY)
    packed, _, _ = build_packing(opts)
    region = packed.regions[0]
    (label, why), *_ = region.ruled_out()
    assert label == "2 candidate(s)" and why.startswith("the tensorrt backend is not supported on g7e.2xlarge")
    assert "(e.g. gpt2-xl fp16 on g7e.2xlarge)" in why
    assert region.peak_notes[0].endswith("not the choice: ruled out: the tensorrt backend is not supported on "
                                         "g7e.2xlarge (RTXPRO6000, sm120)")
    assert not any("no curve (at a precision its GPU runs)" in n for n in region.notes)
