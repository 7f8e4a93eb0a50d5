"""The report's words mean what the plan did: terms defined by the method the plan was sized with, one
peak-throughput story, an attainment no more precise than the assumptions behind it, what one instance
at night means, and a reason said once rather than once per region."""

from __future__ import annotations

import functools
import json
from datetime import date

import pytest

from fleetcast.plan.packing_report import blocks, render_terminal, to_json
from fleetcast.plan.report import ARRIVALS_GLOSSARY, GLOSSARY, blocks_markdown, glossary
from fleetcast.plan.run import PlanOptions, build_packing
from fleetcast.plan.spot import attainment_text

from .conftest import ROOT, SEED

SLO = dict(ttft_p99_ms=300, itl_p99_ms=40)
PRICES_AS_OF = date(2026, 1, 15)


@functools.cache
def plan(traffic, **kw):
    """The plan of one model for this traffic, made once for the module's tests (none changes it)."""
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(traffic), config=None, today=PRICES_AS_OF,
                       **SLO, **kw)
    result, _, _ = build_packing(opts)
    return result


def render_markdown(result) -> str:
    return blocks_markdown(blocks(result))


def _reading_the_tables(md: str) -> str:
    return md.split("### Reading the tables")[1].split("\n## ")[0]


def test_reading_the_tables_defines_the_terms_by_the_method_the_plan_was_sized_with():
    arrivals = plan(SEED / "traffic-seoul-arrivals.yaml")
    histogram = plan(SEED / "traffic-seoul.yaml")
    md_a, md_h = (_reading_the_tables(render_markdown(r)) for r in (arrivals, histogram))
    by_term = dict(GLOSSARY)
    for term, meaning in ARRIVALS_GLOSSARY:
        # Sized from arrivals: Little's law and the busiest minute, not the histogram's levels.
        assert f"**{term}**: {meaning}" in md_a and by_term[term] not in md_a
        assert f"**{term}**: {by_term[term]}" in md_h and meaning not in md_h
    assert "Little's law" in render_terminal(arrivals) and "Little's law" not in render_terminal(histogram)
    # Terms that do not depend on the method are defined once either way.
    assert md_a.count("**instances/h**") == md_h.count("**instances/h**") == 1


def test_regions_sized_differently_get_each_definition_with_the_regions_it_applies_to():
    arrivals = plan(SEED / "traffic-seoul-arrivals.yaml")
    histogram = plan(SEED / "traffic-us-east-1.yaml")
    terms = dict(glossary(arrivals.consumers() + histogram.consumers()))
    assert terms["c* (sized from arrivals: ap-northeast-2)"] == dict(ARRIVALS_GLOSSARY)["c*"]
    assert terms["c* (sized from the in-flight histogram: us-east-1)"] == dict(GLOSSARY)["c*"]


def test_the_peak_throughput_section_names_the_scope_of_each_peak():
    (p,) = plan(SEED / "traffic-seoul-arrivals.yaml").regions
    overall, local = p.peak_notes
    # g7e is the peak of all candidates but not offered in Seoul; g6e fp8 is the peak of the offered ones and wins.
    assert overall.startswith("highest peak throughput of all candidates: g7e.2xlarge fp8")
    assert "not the choice: ruled out: g7e is not offered in ap-northeast-2" in overall
    assert "cannot serve" not in overall  # not offered is not "cannot serve within the SLOs"
    assert local.startswith("highest peak throughput of the types offered in ap-northeast-2: g6e.xlarge fp8")
    assert local.endswith("it is also the choice") and p.winner.label == "g6e.xlarge [gpt2-xl fp8 x1]"


@pytest.mark.parametrize("attainment, text", [
    (1 - 0.0000120, "about 99.998%"),   # the seed's 99.9988%: loss 0.0012% rounded up to 0.002%
    (1 - 0.0002, "about 99.98%"),
    (1 - 0.00034, "about 99.96%"),
    (0.99, "about 99%"),
    (1.0, "100%"),
])
def test_attainment_from_assumed_rates_keeps_one_significant_figure_of_loss_rounded_up(attainment, text):
    assert attainment_text(attainment) == text


def test_the_spot_line_says_its_attainment_rests_on_assumed_rates():
    result = plan(SEED / "traffic-seoul-arrivals.yaml", spot_prices=str(SEED / "spot-prices.yaml"))
    text = render_terminal(result)
    assert "expected SLO attainment about 99.99" in text and "from ASSUMED interruption rates" in text
    assert "99.9988%" not in text


def test_one_instance_at_night_is_said_to_be_one_instance_in_one_az():
    result = plan(ROOT / "examples/plan/two-regions/traffic.yaml")
    md, text = render_markdown(result), render_terminal(result)
    for p in result.regions:
        assert p.winner.capacity()[0] == 1
        hours = [h for h, n in enumerate(p.winner.instances_by_hour) if n == 1]
        extra = len(hours) * p.winner.price_per_hour / 24
        for page in (md, text):
            assert f"capacity min 1: for {len(hours)} h a day" in page
            assert f"capacity.min 2 keeps one instance in each of two AZs for +${extra:.2f}/h" in page
    assert md.count("one instance in one Availability Zone") == 2
    seoul = plan(SEED / "traffic-seoul.yaml")  # a floor of 2: nothing to say
    assert "one Availability Zone" not in render_terminal(seoul)


def test_a_refusal_is_given_once_for_every_region_that_could_serve_and_once_across_consumer_regions():
    """g7e's two precisions (fp8, fp16) are refused by the support matrix wherever they would serve: one line for the
    type in the first consumer region, whatever the service regions; the second region points to it. plan.json keeps
    every region's reasons whole."""
    result = plan(ROOT / "examples/plan/two-regions/traffic.yaml")
    first, second = (r.region for r in result.regions)
    refusal = "no TensorRT-LLM 1.2.x source says the engine flow builds for this architecture"
    assert dict(result.regions[1].ruled_out())["2 candidate(s)"].count(refusal) == 1  # before it is said once
    for page in (render_markdown(result), render_terminal(result)):
        assert page.count(refusal) == 1
        assert page.count(f"the same reason as for {first} above (the tensorrt backend is not supported ...)") == 1
        # The memory refusals of the packings of several copies too: a count per region, the reason once.
        assert page.count("memory: size unknown without a fleet config") == 1
    # plan.json is read by programs: each region's reasons whole.
    doc = json.dumps(to_json(result))
    assert "the same reason as for" not in doc and "above (" not in doc


def test_a_long_losing_reason_is_said_once_and_short_figures_stay():
    from types import SimpleNamespace

    from fleetcast.plan.packing_report import said_once

    caveat = ("measured only up to concurrency 64, lower than the load it could carry within the SLOs (it meets "
              "every SLO there)")

    def region(name, price):
        return SimpleNamespace(region=name, ruled_out=lambda: [],
                               why_not=lambda: [("g7e.2xlarge [m fp8 x1]", f"costs ${price}/h vs $3/h; {caveat}")])
    said = said_once([region("us-east-1", 4), region("us-east-2", 5)])
    assert said["us-east-1"][1] == [("g7e.2xlarge [m fp8 x1]", f"costs $4/h vs $3/h; {caveat}")]
    assert said["us-east-2"][1] == [("g7e.2xlarge [m fp8 x1]", "costs $5/h vs $3/h; as for us-east-1 above (measured "
                                                               "only up to concurrency 64, ...)")]
