"""One model is a packing of one (issue 34, "one report"): a packing of one model says what the one-model report
said about the same plan, with its figures, from the same rendering functions: the consumers' traffic and load
levels, the candidates table, what one instance at night means, and the cost-vs-latency pictures."""

from __future__ import annotations

import functools
import re
from datetime import date

import pytest

from fleetcast.plan import packing_report, report
from fleetcast.plan.packing import scaling_target
from fleetcast.plan.report import (
    ARRIVALS_GLOSSARY,
    GLOSSARY,
    figure_cells,
    glossary_lines,
    single_instance_note,
    summary_line,
)
from fleetcast.plan.run import PlanOptions, build_packing

from .conftest import ROOT, SEED

TODAY = date(2026, 2, 1)
ARRIVALS, HISTOGRAM = "traffic-seoul-arrivals.yaml", "traffic-seoul.yaml"

# What the one-model report (its solver and report body, gone since issue 34, one pipeline) said about these
# very plans, kept as the figures and words a packing of one must go on giving: the recommendation past the pick's
# name, each candidate's table row (report.figure_cells: c*, target, instances, $/h, $ per 1M output and input
# tokens, the weighted P99s, goodput), plan.json's winner, and its peak-throughput and statistical notes. Both
# planners gave the same before the one-model one was deleted; the seed's curves are synthetic.
ONE_MODEL = {
    ARRIVALS: dict(
        recommendation="$6.66/h ($0.162 per 1M output tokens, $0.081 per 1M input), 2-4 instances over the day (3 on "
                       "average; capacity min 2, max 4), target 31.1 in-flight requests per instance (highest load "
                       "within the SLO: 42.9)",
        rows={"g6e.xlarge fp8": ["42.9", "31.1", "2-4", "6.66", "0.162", "0.081", "225 ms", "6.4 ms", ">=55.6 rps"],
              "g6e.xlarge int8_wo": ["39.1", "26", "2-6", "8.47", "0.206", "0.103", "237 ms", "6.9 ms", ">=42.1 rps"],
              "g6e.xlarge fp16": ["26.8", "18.9", "2-10", "12.95", "0.315", "0.158", "254 ms", "9.4 ms", ">=23.7 rps"],
              "g5.xlarge int8_wo": ["6.1", "4.6", "4-32", "20.67", "0.503", "0.252", "293 ms", "8.0 ms", ">=6.9 rps"],
              "g5.xlarge fp16": ["5.5", "4.2", "5-45", "28.04", "0.682", "0.341", "300 ms", "10.4 ms", ">=4.9 rps"]},
        ci=None,
        winner={"rtt_ms": 1.0, "max_load": 42.9, "target": 31.1, "usd_per_m_input": 0.08107553751298026,
                "usd_per_m_output": 0.16215107502596052, "weighted_ttft_p99_ms": 224.7520608652467,
                "weighted_ttft_ci": None, "weighted_itl_p99_ms": 6.437640885135342,
                "goodput_rps_per_instance": 55.58564021529504, "goodput_exact": False, "sizing": "arrivals",
                "capacity": {"min": 2, "desired": 3, "max": 4},
                "instances_by_hour": [3] * 9 + [4] * 4 + [2] * 11, "estimated": False,
                "cost_per_hour": 6.662463370666665, "fixed_per_hour": 0.4657967039999999, "measured_cap": 64.0,
                "binding": "measured range", "safe_rate_rps_per_instance": 56.720041036015346},
        busiest_hour={"rate_rps_per_instance": 56.25, "in_flight": 42.39403032820151,
                      "ttft_p99_ms": 247.64368669383987, "itl_p99_ms": 6.722614989900171,
                      "out_of_range": 0.008137680313589857},
        peak_notes=["highest peak throughput of all candidates: g7e.2xlarge fp8, 19,522 output tok/s at concurrency "
                    "64; not the choice: ruled out: g7e is not offered in ap-northeast-2 (availability as of "
                    "2026-01-15)",
                    "highest peak throughput of the types offered in ap-northeast-2: g6e.xlarge fp8, 9,338 output "
                    "tok/s at concurrency 64; it is also the choice"],
        stats_notes=[]),
    HISTOGRAM: dict(
        recommendation="$19.63/h ($0.478 per 1M output tokens, $0.239 per 1M input), 2-17 instances over the day (9 "
                       "on average; capacity min 2, max 17), target 48 in-flight requests per instance (highest load "
                       "within the SLO: 48)",
        rows={"g6e.xlarge int8_wo": ["48", "48", "2-17", "19.63", "0.478", "0.239", "117 ms", "5.5 ms", ">=47.0 rps"],
              "g6e.xlarge fp8": ["64", "64", "2-17", "20.49", "0.499", "0.249", "128 ms", "5.5 ms", ">=71.5 rps"],
              "g5.xlarge int8_wo": ["4", "4", "5-43", "27.06", "0.659", "0.329", "133 ms", "7.3 ms", ">=5.0 rps"],
              "g6e.xlarge fp16": ["32", "32", "3-24", "28.02", "0.682", "0.341", "141 ms", "8.0 ms", ">=26.6 rps"],
              "g5.xlarge fp16": ["4", "4", "7-55", "34.79", "0.847", "0.423", "161 ms", "9.6 ms", ">=3.8 rps"]},
        ci={"g6e.xlarge int8_wo": (111.57440000000001, 124.23200000000001), "g6e.xlarge fp8": (121.9988, 135.839),
            "g5.xlarge int8_wo": (126.61600000000001, 140.98), "g6e.xlarge fp16": (134.6128, 149.88400000000001),
            "g5.xlarge fp16": (153.4624, 170.872)},
        winner={"rtt_ms": 1.0, "max_load": 48.0, "target": 48.0, "usd_per_m_input": 0.23885071923676002,
                "usd_per_m_output": 0.47770143847352003, "weighted_ttft_p99_ms": 117.19999999999999,
                "weighted_ttft_ci": [111.57440000000001, 124.23200000000001], "weighted_itl_p99_ms": 5.512,
                "goodput_rps_per_instance": 46.96673189823875, "goodput_exact": False, "sizing": "histogram",
                "capacity": {"min": 2, "desired": 9, "max": 17},
                "instances_by_hour": [11] * 9 + [17] * 4 + [2] * 9 + [8] * 2, "estimated": False,
                "cost_per_hour": 19.62779670399999, "fixed_per_hour": 0.4657967039999999, "measured_cap": None},
        busiest_hour=None,
        peak_notes=["highest peak throughput of all candidates: g7e.2xlarge fp8, 19,522 output tok/s at concurrency "
                    "64; not the choice: ruled out: g7e is not offered in ap-northeast-2 (availability as of "
                    "2026-01-15)",
                    "highest peak throughput of the types offered in ap-northeast-2: g6e.xlarge fp8, 9,338 output "
                    "tok/s at concurrency 64, a load 5% of ap-northeast-2's requests run at; not the choice: +4% cost "
                    "for this traffic"],
        stats_notes=["g6e.xlarge int8_wo and g6e.xlarge fp8 are within noise on traffic-weighted P99 TTFT (112-124 "
                     "vs 122-136 ms, 95% CI)",
                     "g6e.xlarge int8_wo: at its target load 48 the P99 TTFT CI (282-314 ms) contains the 300 ms SLO: "
                     "the pass is within noise; if a longer run fails there, the target drops to 32 and the cost to "
                     "$19.63/h (+0.0%), still the cheapest",
                     "g6e.xlarge fp8: at its target load 64 the P99 TTFT CI (276-307 ms) contains the 300 ms SLO: the "
                     "pass is within noise; if a longer run fails there, the target drops to 48 and the cost to "
                     "$20.49/h (+0.0%)"]),
}


@functools.cache
def _plan(traffic: str, config: str = str(ROOT / "config" / "fleet.yaml"), min_instances: int | None = None):
    """The seed's plan for this traffic, made once for the module's tests (none changes it)."""
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / traffic), config=config, today=TODAY,
                       min_instances=min_instances)
    packed, _, _ = build_packing(opts)
    return packed


@functools.cache
def _several_models():
    """examples/plan/multi-model's plan, made once."""
    mm = ROOT / "examples" / "plan" / "multi-model"
    opts = PlanOptions(results=[str(mm / "results")], traffic=str(mm / "traffic.yaml"),
                       config=str(mm / "fleet.yaml"), today=TODAY)
    packed, _, _ = build_packing(opts)
    return packed


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(directory, file names) of a plan's report, written once for the tests that read its files."""
    done: dict = {}

    def write(packed):
        if id(packed) not in done:
            directory = tmp_path_factory.mktemp("report") / "packed"
            done[id(packed)] = (directory, {p.name for p in packing_report.write_report(packed, directory)})
        return done[id(packed)]
    return write


@pytest.fixture(scope="module", params=[ARRIVALS, HISTOGRAM])
def arrivals_and_histogram(request):
    """(the traffic's name, its plan): the seed sized from arrivals and from its concurrency histogram."""
    return request.param, _plan(request.param)


@pytest.fixture(scope="module")
def one_instance_at_night():
    return _plan(ARRIVALS, min_instances=1)


def test_a_packing_of_one_states_its_consumers_traffic_and_load_levels_as_the_one_model_report_does(
        arrivals_and_histogram):
    _, packed = arrivals_and_histogram
    (region,) = packed.regions
    line = summary_line(region.traffic[0])
    assert "concurrency levels " in line
    assert line in packing_report.render_terminal(packed)
    assert ("p", line) in packing_report.blocks(packed)


def test_a_packing_of_one_says_what_one_instance_means_as_the_one_model_report_does(one_instance_at_night):
    packed = one_instance_at_night
    (region,) = packed.regions
    assert region.winner is not None and region.winner.capacity()[0] == 1
    note = single_instance_note(region.winner)
    # The one-model report's words for this pick: the same hours, the same cost of a second AZ.
    assert note is not None and note.startswith("capacity min 1: for 9 h a day (UTC 13-22) this pool is one instance "
                                                "in one Availability Zone.")
    assert "capacity.min 2 keeps one instance in each of two AZs for +$0.86/h on average" in note
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


def test_a_packing_of_one_draws_the_one_model_reports_cost_vs_latency_pictures(arrivals_and_histogram, written):
    _, packed = arrivals_and_histogram
    (region,) = packed.regions
    directory, names = written(packed)
    for kind in ("ttft", "itl"):
        name = f"cost_vs_{kind}-{region.region}.png"
        assert name in names and (directory / name).stat().st_size > 10_000
        assert f"]({name})" in (directory / "plan.md").read_text()


def test_a_packing_of_several_models_draws_no_single_model_cost_vs_latency_picture(tmp_path, unrasterized):
    packed = _several_models()
    written = packing_report.write_report(packed, tmp_path / "mm")
    assert not any(p.name.startswith("cost_vs_") for p in written)
    assert all(not line.startswith("Consumers in ") for line in packing_report.render_terminal(packed).splitlines())


def test_a_packing_of_one_says_and_writes_the_target_the_one_model_report_does(arrivals_and_histogram, tmp_path):
    """The figure the pool scales on (scaling.target), in the recommendation and in plan.json's winner."""
    traffic, packed = arrivals_and_histogram
    (region,) = packed.regions
    target = ONE_MODEL[traffic]["winner"]["target"]
    assert region.winner is not None and scaling_target(region.winner) == target
    assert f"target {target:g} in-flight requests per instance" in packing_report.recommendation(region)
    assert packing_report.to_json(packed)["regions"][0]["winner"]["target"] == target
    blocks = packing_report.blocks(packed)
    reading = dict(blocks[blocks.index(("h2", "Reading this report")) + 1][1])
    assert reading["target"].startswith("the load per instance the pool scales on")


def _one_process(region):
    """Each packing of one process in its consumers' region, by the one-model candidate it is ("g6e.xlarge fp8")."""
    return {f"{ev.instance_type} {ev.loads[0].precision}": ev for ev in region.ranked
            if ev.processes == 1 and ev.region == region.region}


def test_a_packing_of_one_prints_the_one_model_candidates_table_with_the_same_figures(arrivals_and_histogram):
    """c*, target, instances, $/h, $ per 1M output and input tokens, the weighted P99s and goodput: one function
    writes them (report.figure_cells), the figures the one-model table gave for each candidate."""
    traffic, packed = arrivals_and_histogram
    (region,) = packed.regions
    one = ONE_MODEL[traffic]
    mine = _one_process(region)
    assert set(mine) == set(one["rows"])
    for label, ev in mine.items():
        assert figure_cells(ev, scaling_target(ev), True) == one["rows"][label], label
        assert ev.rtt_ms == 1.0 and ev.weighted_ttft_ci == (one["ci"] or {}).get(label)
    terminal = packing_report.render_terminal(packed)
    header = next(line for line in terminal.splitlines() if line.startswith("#  candidate"))
    assert header.split() == " ".join(report.TERMINAL_HEADER).split()
    # The sized columns in the words of the method the region was sized with.
    meanings = dict(ARRIVALS_GLOSSARY if traffic == ARRIVALS else GLOSSARY)
    for line in glossary_lines(region.traffic):
        term, meaning = line.strip().split(": ", 1)
        assert line in terminal and meanings[term] == meaning
    page = packing_report.blocks(packed)
    assert ("h3", "Feasible packings") in page
    table = page[page.index(("h3", "Feasible packings")) + 1]
    assert table[1] == report.PAGE_HEADER and len(table[2]) == len(region.ranked)


def test_a_packing_of_ones_recommendation_gives_c_star_and_the_input_token_price_in_the_one_model_words(
        arrivals_and_histogram):
    traffic, packed = arrivals_and_histogram
    (region,) = packed.regions
    assert region.winner is not None
    mine = packing_report.recommendation(region)
    # Everything past the pick's name is the one-model report's sentence with its figures.
    assert mine.split(f" in {region.region}: ", 1)[1] == ONE_MODEL[traffic]["recommendation"]
    assert f"highest load within the SLO: {ONE_MODEL[traffic]['winner']['max_load']:g})" in mine
    assert f"Recommendation: {mine}" in packing_report.render_terminal(packed)


def test_a_packing_of_ones_plan_json_has_the_one_model_winners_figures(arrivals_and_histogram):
    traffic, packed = arrivals_and_histogram
    one = ONE_MODEL[traffic]["winner"]
    doc = packing_report.to_json(packed)
    mine = doc["regions"][0]["winner"]
    for key, value in one.items():
        assert mine[key] == (pytest.approx(value, rel=1e-12) if value is not None else None), key
    if one["sizing"] == "arrivals":
        hours = mine["predicted_by_hour"]
        assert len(hours) == 24 and hours[9] == pytest.approx(ONE_MODEL[traffic]["busiest_hour"], rel=1e-12)
    assert doc["model"] == "gpt2-xl" and doc["slo"] == {"ttft_p99_ms": 300.0, "itl_p99_ms": 40.0, "error_rate": 0.01}


def test_a_packing_of_several_models_leaves_the_per_model_figures_to_its_model_table():
    """c*, the weighted P99s and goodput are per model there: null in plan.json, not a figure made up."""
    packed = _several_models()
    winner = packing_report.to_json(packed)["regions"][0]["winner"]
    assert len(winner["packing"]) > 1
    assert winner["max_load"] is None and winner["weighted_ttft_p99_ms"] is None and winner["goodput_rps_per_instance"] is None
    assert winner["usd_per_m_input"] > 0 and winner["rtt_ms"] > 0
    assert not any(line.startswith("#  candidate") for line in packing_report.render_terminal(packed).splitlines())


def test_a_packing_draws_the_one_model_reports_instances_over_the_day(arrivals_and_histogram, written):
    """One picture function (report.instances_plot) for both: demand above, each option's instances below."""
    _, packed = arrivals_and_histogram
    (region,) = packed.regions
    directory, names = written(packed)
    name = f"instances-{region.region}.png"
    assert name in names and (directory / name).stat().st_size > 10_000
    assert f"]({name})" in (directory / "plan.md").read_text()


def _named_as_candidates(notes):
    """Notes with each pick named as a one-model candidate is: "g6e.xlarge [gpt2-xl fp8 x1]" and
    "g6e.xlarge fp8 @ ap-northeast-2" both read "g6e.xlarge fp8" (the labels differ by design)."""
    return [re.sub(r"(\S+) \[\S+ (\S+) x1\]", r"\1 \2", re.sub(r" @ [a-z0-9-]+", "", n)) for n in notes]


def test_a_packing_of_one_gives_the_one_model_peak_throughput_and_statistical_notes(arrivals_and_histogram):
    """One function each (solver.peak_notes, solver.stats_notes) over the same curves and figures: the one-model
    report's sentences, in the terminal and on the page under the same headings."""
    traffic, packed = arrivals_and_histogram
    (region,) = packed.regions
    assert region.peak_notes
    assert _named_as_candidates(region.peak_notes) == ONE_MODEL[traffic]["peak_notes"]
    assert _named_as_candidates(region.stats_notes) == ONE_MODEL[traffic]["stats_notes"]
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

    plain = _plan(HISTOGRAM).regions[0].stats_notes
    assert any("contains the 300 ms SLO" in n for n in plain)
    assert _plan(HISTOGRAM, str(own)).regions[0].stats_notes == plain


def test_a_packing_of_one_keeps_what_the_one_model_report_showed(written):
    """One report for every fleet (issue 34): a one-model user loses nothing the one-model report gave. The SLO
    line, the pick's own notes (here its load capped by the measured range), the hour-by-hour table, and in
    plan.json each evaluation's notes, seconds per request, precision and service region. Before, the packing
    report had none of them."""
    packed = _plan(ARRIVALS)
    terminal = packing_report.render_terminal(packed)
    assert "SLO: P99 TTFT <= 300 ms (network included), P99 ITL <= 40 ms, errors <= 1.0%" in terminal
    assert "  note: measured only up to concurrency 64, where it still meets every SLO" in terminal
    directory, _ = written(packed)
    page = (directory / "plan.md").read_text()
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
