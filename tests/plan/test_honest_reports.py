"""What a plan says when it cannot serve (issue 34, "Honest reports"): the real reason in a region's headline, the
unpacked figures it computed, and nothing cut short when the writing is interrupted."""

from __future__ import annotations

from datetime import date

import pytest

from fleetcast.plan.packing_report import recommendation, render_terminal
from fleetcast.plan.run import PlanOptions, build_packing

from .conftest import ROOT, SEED

EXAMPLE = ROOT / "examples" / "plan" / "multi-model"
TODAY = date(2026, 2, 1)


def _packing(tmp_path, results=None, region=None, **kw):
    traffic = EXAMPLE / "traffic.yaml"
    if region is not None:
        moved = tmp_path / "traffic.yaml"
        moved.write_text(traffic.read_text().replace("region: ap-northeast-2", f"region: {region}"))
        traffic = moved
    opts = PlanOptions(results=results or [str(EXAMPLE / "results")], traffic=str(traffic),
                       config=str(EXAMPLE / "fleet.yaml"), today=TODAY)
    return build_packing(opts, **kw)[0]


def test_a_region_where_no_type_with_results_is_offered_headlines_not_offered(tmp_path):
    """Singapore offers neither g6 nor g6e (availability.yaml). Before: "no packing serves every model within its
    SLO", as if the curves had failed."""
    result = _packing(tmp_path, region="ap-southeast-1")
    text = render_terminal(result)
    assert ("ap-southeast-1: not offered: g6.xlarge, g6e.xlarge (the instance types with results) are not offered "
            "in ap-southeast-1") in text
    assert "within its SLO" not in text


def test_a_one_model_region_where_nothing_is_offered_headlines_not_offered(tmp_path):
    traffic = tmp_path / "traffic.yaml"
    traffic.write_text((SEED / "traffic-small.yaml").read_text().replace("ap-northeast-2", "sa-east-1"))
    only_g6e = [str(p) for p in (SEED / "results").glob("g6e.xlarge-*.json")]
    result, _, _ = build_packing(PlanOptions(results=only_g6e, traffic=str(traffic),
                                             config=str(ROOT / "config" / "fleet.yaml"), today=TODAY))
    (region,) = result.regions
    assert recommendation(region).startswith("sa-east-1: not offered: g6e.xlarge (the instance types with results) "
                                             "is not offered in sa-east-1")
    assert "within its SLO" not in render_terminal(result)


def test_when_no_packing_serves_the_unpacked_figures_are_still_shown(tmp_path):
    """L4 only: no packing holds qwen2.5-0.5b's 150 ms P99 TTFT beside gpt2-xl (docs/plan.md), but each model on
    g6.xlarge instances of its own does. Before, those figures were computed and dropped."""
    results = [str(p) for p in sorted((EXAMPLE / "results").glob("g6.xlarge-*.json"))]
    result = _packing(tmp_path, results=results)
    (region,) = result.regions
    assert region.winner is None and len(region.alternatives) == 2
    text = render_terminal(result)
    pool, fleet = (alt for alt in region.alternatives)
    assert f"no packing serves; one model per pool: ${pool.cost_per_hour:.2f}/h" in text
    assert f"no packing serves; one model per fleet: ${fleet.cost_per_hour:.2f}/h" in text


@pytest.mark.parametrize("existing", [False, True])
def test_an_interrupted_report_leaves_no_half_written_directory(tmp_path, monkeypatch, existing):
    """Ctrl-C after the plots are drawn, while the pages render: before, the directory held the new plots and no (or
    the old) pages. Now the report is written into a sibling stage and moved into place only when complete: a new
    directory does not appear, an existing one keeps every file as it was, and no stage is left behind."""
    from fleetcast.plan import packing_report, report

    result, _, _ = build_packing(PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / "traffic-small.yaml"),
                                             config=str(ROOT / "config" / "fleet.yaml"), today=TODAY))
    drawn = []

    def plots(plan, directory, pools=()):
        # What the pictures show does not matter here, only that each write draws new ones (matplotlib's CPU spared).
        drawn.append(plan.region)
        path = directory / f"instances-{plan.region}.png"
        path.write_bytes(f"drawing {len(drawn)}".encode())
        return [path]

    monkeypatch.setattr(packing_report, "write_plots", plots)
    target = tmp_path / "report"
    before = {}
    if existing:
        packing_report.write_report(result, target)
        (target / "simulate-x.png").write_bytes(b"kept")
        before = {p.name: p.read_bytes() for p in target.iterdir()}

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "blocks_html", interrupted)
    with pytest.raises(KeyboardInterrupt):
        packing_report.write_report(result, target)
    assert len(drawn) == (2 if existing else 1)  # interrupted after the plots were drawn
    assert [p.name for p in tmp_path.iterdir()] == (["report"] if existing else [])
    if existing:
        assert {p.name: p.read_bytes() for p in target.iterdir()} == before
