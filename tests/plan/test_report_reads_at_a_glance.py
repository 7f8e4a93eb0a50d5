"""The report's words mean what the plan did: terms defined by the method the plan was sized with, one
peak-throughput story, an attainment no more precise than the assumptions behind it, what one instance
at night means, and a reason said once rather than once per region."""

from __future__ import annotations

from datetime import date

import pytest

from fleetcast.plan.report import ARRIVALS_GLOSSARY, GLOSSARY, glossary, render_markdown, render_terminal
from fleetcast.plan.run import PlanOptions, build_plan
from fleetcast.plan.spot import attainment_text

from .conftest import ROOT, SEED

SLO = dict(ttft_p99_ms=300, itl_p99_ms=40)
PRICES_AS_OF = date(2026, 1, 15)


def plan(traffic, **kw):
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(traffic), config=None, today=PRICES_AS_OF,
                       **SLO, **kw)
    return build_plan(opts)


def _reading_the_tables(md: str) -> str:
    return md.split("### Reading the tables")[1].split("\n## ")[0]


def test_reading_the_tables_defines_the_terms_by_the_method_the_plan_was_sized_with():
    arrivals, _, _ = plan(SEED / "traffic-seoul-arrivals.yaml")
    histogram, _, _ = plan(SEED / "traffic-seoul.yaml")
    md_a, md_h = (_reading_the_tables(render_markdown(r, {})) for r in (arrivals, histogram))
    by_term = dict(GLOSSARY)
    for term, meaning in ARRIVALS_GLOSSARY:
        # Sized from arrivals: Little's law and the busiest minute, not the histogram's levels.
        assert f"**{term}**: {meaning}" in md_a and by_term[term] not in md_a
        assert f"**{term}**: {by_term[term]}" in md_h and meaning not in md_h
    assert "Little's law" in render_terminal(arrivals) and "Little's law" not in render_terminal(histogram)
    # Terms that do not depend on the method are defined once either way.
    assert md_a.count("**instances/h**") == md_h.count("**instances/h**") == 1


def test_regions_sized_differently_get_each_definition_with_the_regions_it_applies_to():
    arrivals, _, _ = plan(SEED / "traffic-seoul-arrivals.yaml")
    histogram, _, _ = plan(SEED / "traffic-us-east-1.yaml")
    terms = dict(glossary(arrivals.regions + histogram.regions))
    assert terms["c* (sized from arrivals: ap-northeast-2)"] == dict(ARRIVALS_GLOSSARY)["c*"]
    assert terms["c* (sized from the in-flight histogram: us-east-1)"] == dict(GLOSSARY)["c*"]


def test_the_peak_throughput_section_names_the_scope_of_each_peak():
    result, (p,), _ = plan(SEED / "traffic-seoul-arrivals.yaml")
    overall, local = p.peak_notes
    # g7e is the peak of all candidates but not offered in Seoul; g6e fp8 is the peak of the offered ones and wins.
    assert overall.startswith("highest peak throughput of all candidates: g7e.2xlarge fp8")
    assert "not the choice: ruled out: g7e is not offered in ap-northeast-2" in overall
    assert "cannot serve" not in overall  # not offered is not "cannot serve within the SLOs"
    assert local.startswith("highest peak throughput of the types offered in ap-northeast-2: g6e.xlarge fp8")
    assert local.endswith("it is also the choice") and p.winner.candidate.label == "g6e.xlarge fp8"


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
    result, _, _ = plan(SEED / "traffic-seoul-arrivals.yaml", spot_prices=str(SEED / "spot-prices.yaml"))
    text = render_terminal(result)
    assert "expected SLO attainment about 99.99" in text and "from ASSUMED interruption rates" in text
    assert "99.9988%" not in text


def test_one_instance_at_night_is_said_to_be_one_instance_in_one_az():
    result, (p,), _ = plan(SEED / "traffic-us-east-1.yaml")
    lo, _, _ = p.winner.capacity()
    assert lo == 1
    hours = [h for h, n in enumerate(p.winner.instances_by_hour) if n == 1]
    extra = len(hours) * p.winner.price_per_hour / 24
    md, text = render_markdown(result, {}), render_terminal(result)
    for page in (md, text):
        assert f"capacity min 1: for {len(hours)} h a day" in page and "one instance in one Availability Zone" in page
        assert f"capacity.min 2 keeps one instance in each of two AZs for +${extra:.2f}/h" in page
    seoul, _, _ = plan(SEED / "traffic-seoul.yaml")  # a floor of 2: nothing to say
    assert "one Availability Zone" not in render_terminal(seoul)


def test_a_reason_given_for_one_region_is_not_repeated_for_the_next():
    result, plans, _ = plan(ROOT / "examples/plan/two-regions/traffic.yaml")
    assert len(plans) == 2
    first = plans[0].traffic.region
    for page in (render_markdown(result, {}), render_terminal(result)):
        caveat = "lower than the load it could carry within the SLOs"
        # Said once per candidate (g7e fp8 and fp16), then pointed to.
        assert page.count(caveat) == 2 and page.count(f"as for {first} above (measured only up to") == 2
        # Short, region-specific figures stay.
        assert page.count("at $3.363/h per instance vs $1.861/h") == 4
