"""The plan says what its inputs are (measured, synthetic, estimated) in every output, flags
old price tables, explains its columns, and its HTML page carries everything plan.md does;
its plots draw what they claim; --write-config says what a target equal to a consumer's
concurrency limit means."""

from __future__ import annotations

import json
import re
import shutil
from datetime import date
from html.parser import HTMLParser

import pytest

from fleetcast.plan.inputs import PRICE_MAX_AGE_DAYS, stale_table_warning
from fleetcast.plan.packing_report import render_terminal, write_report
from fleetcast.plan.run import PlanOptions, build_packing
from scripts.cli import main

from .conftest import ROOT, SEED, keep_figures

SLO = dict(ttft_p99_ms=300, itl_p99_ms=40)
PRICES_AS_OF = date(2026, 1, 15)  # fleetcast/config/data/instances.yaml and fixed_costs.yaml


def seed_plan(results=None, **kw):
    opts = PlanOptions(results=results or [str(SEED / "results")], traffic=str(SEED / "traffic-seoul.yaml"),
                       config=None, today=kw.pop("today", PRICES_AS_OF), **SLO, **kw)
    return build_packing(opts)


SYNTHETIC = "synthetic (authored data, not measured)"


def test_synthetic_seed_inputs_are_called_synthetic_everywhere(tmp_path, unrasterized):
    result, _, _ = seed_plan()
    text = render_terminal(result)
    assert "results: 7 synthetic solo curve(s)" in text
    assert "measured solo curve" not in text and "measured (" not in text
    assert "7 of 7 curve(s) rest on SYNTHETIC results" in text
    assert f"Recommendation: g6e.xlarge [gpt2-xl int8_wo x1] ({SYNTHETIC}) in ap-northeast-2" in text
    rows = [line for line in text.splitlines() if re.match(r"\d+  ", line)]
    assert rows and all(line.rstrip().endswith(SYNTHETIC) for line in rows)

    write_report(result, tmp_path)
    md, page = (tmp_path / "plan.md").read_text(), (tmp_path / "plan.html").read_text()
    for doc in (md, page):
        assert "7 synthetic solo curve(s)" in doc and "measured curve" not in doc
    md_sources = [line.split("|")[-2].strip() for line in md.splitlines() if re.match(r"\| \d+ \| g", line)]
    assert md_sources == [SYNTHETIC] * 5
    assert "<td>measured" not in page and page.count(f"<td>{SYNTHETIC}</td>") == 5 + 5  # feasible + other packings
    data = json.loads((tmp_path / "plan.json").read_text())
    assert {e["source"] for r in data["regions"] for e in r["evaluations"]} == {SYNTHETIC}
    assert any("SYNTHETIC" in w for w in data["warnings"])


def test_measured_and_estimated_inputs_are_called_so(tmp_path):
    # A results file without `provenance` (older than revision 2) was written by `fleetcast bench run`: measured.
    raw = json.loads((SEED / "results" / "g6e.xlarge-int8_wo.json").read_text())
    for key in ("provenance", "revision", "slo", "request"):
        raw.pop(key)
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps(raw))
    result, _, _ = seed_plan([str(measured), str(SEED / "results" / "g5.xlarge-fp16.json")],
                             estimate=["g6e.2xlarge:int8_wo"])
    sources = {e.label: e.source for e in result.regions[0].ranked}
    assert sources == {"g6e.xlarge [gpt2-xl int8_wo x1]": "measured (one process)",
                       "g5.xlarge [gpt2-xl fp16 x1]": SYNTHETIC,
                       "g6e.2xlarge [gpt2-xl int8_wo x1]": "estimated (roofline model)"}
    assert ("results: 1 estimated (roofline) solo curve(s), 1 measured solo curve(s), 1 synthetic solo curve(s)"
            in result.data_notes)
    assert result.estimator.startswith("gpt2-xl: roofline calibrated on 1 measured candidate(s), 1 synthetic "
                                       "candidate(s)")


def test_price_tables_older_than_90_days_are_flagged():
    fresh, _, _ = seed_plan(today=date(2026, 4, 15))  # 90 days after the tables' date
    assert not any("days old" in w for w in fresh.warnings)
    stale, _, _ = seed_plan(today=date(2026, 4, 16))
    assert ("on-demand prices are 91 days old (as of 2026-01-15, more than 90): refresh them (--refresh-prices) "
            "or give current ones (--prices FILE)") in stale.warnings
    assert any(w.startswith("fixed costs (NLB, PrivateLink, transfer) are 91 days old") for w in stale.warnings)
    assert "warning: on-demand prices are 91 days old" in render_terminal(stale)
    assert PRICE_MAX_AGE_DAYS == 90
    assert "carry no date" in stale_table_warning("on-demand prices", "undated", date(2026, 1, 1), "x")
    # --refresh-prices dates its table "YYYY-MM-DD (AWS Pricing API)": today's, so not stale.
    assert stale_table_warning("p", "2026-04-16 (AWS Pricing API)", date(2026, 4, 16), "x") is None


class _Text(HTMLParser):
    """Headings, list items and table rows of a page, as plain text."""

    def __init__(self):
        super().__init__()
        self.items: list[str] = []
        self._buf: list[str] | None = None
        self._row: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag in ("h1", "h2", "h3", "li", "td", "th"):
            self._buf = []
        elif tag == "tr":
            self._row = []
        elif tag == "p" and ("class", "rec") in attrs:
            self._buf = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._buf is not None:
            self._row.append("".join(self._buf).strip())
            self._buf = None
        elif tag in ("h1", "h2", "h3", "li", "p") and self._buf is not None:
            self.items.append("".join(self._buf).strip())
            self._buf = None
        elif tag == "tr":
            self.items.append(" | ".join(self._row))
            self._row = None

    def handle_data(self, data):
        if self._buf is not None:
            self._buf.append(data)


def _markdown_items(md: str) -> list[str]:
    items = []
    for line in md.splitlines():
        if line.startswith("#"):
            items.append(line.lstrip("#").strip())
        elif line.startswith("- "):
            items.append(re.sub(r"\*\*(.*?)\*\*", r"\1", line[2:]))
        elif line.startswith("**Recommendation:**"):
            items.append(line.replace("**", ""))
        elif line.startswith("|") and not line.startswith("|---"):
            items.append(" | ".join(c.strip() for c in line.strip().strip("|").split("|")))
    return items


def test_plan_html_has_everything_plan_md_has(tmp_path, unrasterized):
    # Output 100 tokens against results at 128: the winner gets a note (E2E rescaled), which the page must carry.
    traffic = tmp_path / "traffic.yaml"
    traffic.write_text((SEED / "traffic-seoul.yaml").read_text().replace("output_tokens: 128", "output_tokens: 100"))
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(traffic), config=None, today=PRICES_AS_OF,
                       estimate=["g6e.2xlarge:int8_wo"], **SLO)
    result, _, _ = build_packing(opts)
    write_report(result, tmp_path)
    md_items = _markdown_items((tmp_path / "plan.md").read_text())
    parser = _Text()
    parser.feed((tmp_path / "plan.html").read_text())
    assert md_items == parser.items
    # The parts that used to be missing from the page.
    assert "The recommendation hour by hour (UTC)" in parser.items
    assert any(re.match(r"09 \| 180 \| \d+ \| ", i) for i in parser.items)
    assert any(i.startswith("note: synthetic results at 128 output tokens") for i in parser.items)
    assert any(i.startswith("Performance model: gpt2-xl: roofline calibrated") for i in parser.items)


def test_the_page_explains_its_columns(tmp_path, unrasterized):
    result, _, _ = seed_plan()
    write_report(result, tmp_path)
    for doc in ((tmp_path / "plan.md").read_text(), (tmp_path / "plan.html").read_text()):
        for term in ("c*", "target", "wP99 TTFT / wP99 ITL", "source"):
            assert re.search(rf"<b>{re.escape(term)}</b>: |\*\*{re.escape(term)}\*\*: ", doc), term
        assert "the highest measured load (requests in flight per instance)" in doc
        assert "scaling.target" in doc and "traffic-weighted P99" in doc


def _saved_figures(monkeypatch, result, tmp_path):
    saved = keep_figures(monkeypatch, rasterize=False)  # what the plots draw is read, not their pixels
    write_report(result, tmp_path)
    return saved


@pytest.mark.parametrize("traffic", ["traffic-seoul.yaml", "traffic-us-east-1.yaml", "traffic-batch64.yaml"])
def test_plots_draw_what_they_claim(monkeypatch, tmp_path, traffic):
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / traffic), config=None, today=PRICES_AS_OF,
                       **SLO)
    result, _, _ = build_packing(opts)
    (plan,) = result.regions
    figs = _saved_figures(monkeypatch, result, tmp_path)
    region = plan.region
    for name, latency, slo_ms in (("cost_vs_ttft", 0, SLO["ttft_p99_ms"]), ("cost_vs_itl", 1, SLO["itl_p99_ms"])):
        ax = figs[f"{name}-{region}.png"].axes[0]
        # Every point drawn is labelled: each candidate at its cheapest region, and the front on this latency.
        points = [(e.loads[0].worst()[latency], e.usd_per_m_output) for e in plan.ranked]
        front = {e.label for e, (x, y) in zip(plan.ranked, points)
                 if not any(x2 <= x and y2 <= y and (x2, y2) != (x, y) for x2, y2 in points)}
        cheapest = {}
        for e in plan.ranked:
            cheapest.setdefault((e.instance_type, e.loads[0].precision), e.label)
        assert sorted(a.get_text() for a in ax.texts) == sorted(front | set(cheapest.values()))
        assert front <= {a.get_text() for a in ax.texts if a.get_color() == "C3"}
        # The SLO is a vertical line at its value, named in the legend, and inside the x range.
        slo_lines = [line for line in ax.get_lines() if list(line.get_xdata()) == [slo_ms, slo_ms]]
        assert len(slo_lines) == 1 and ax.get_xlim()[1] > slo_ms
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any(t.endswith(f"SLO: {slo_ms:g} ms") for t in legend)
        assert any(t.startswith("Pareto front") for t in legend)
        steps = [line for line in ax.get_lines() if len(line.get_xdata()) >= 2 and line not in slo_lines]
        assert len(steps) == (1 if len(front) > 1 else 0)
        # The legend sits below the axes, where it covers no point.
        assert ax.get_legend().get_bbox_to_anchor().transformed(ax.transAxes.inverted()).y1 < 0
        assert "[synthetic inputs]" in ax.get_title()
    demand, instances = figs[f"instances-{region}.png"].axes
    # Demand and instances on their own panels and scales.
    assert not demand.get_lines() and demand.collections and demand.get_ylabel() == "requests/s"
    feasible = {e.label.split(" @ ")[0] for e in plan.ranked}
    lines = instances.get_lines()
    assert {re.sub(r" \((this region's pick|under the pick: .*)\)$", "", line.get_label()).split(" @ ")[0]
            for line in lines} == feasible
    pick = [line for line in lines if line.get_label().endswith("(this region's pick)")]
    assert len(pick) == 1 and pick[0].get_zorder() == max(line.get_zorder() for line in lines)  # drawn on top
    if region == "ap-northeast-2":
        assert len(feasible) == 5  # the seed's five feasible candidates (the old plot drew four)


def test_the_instances_plot_draws_the_pooled_fleet_the_plan_writes(monkeypatch, tmp_path):
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(ROOT / "examples/plan/two-regions/traffic.yaml"),
                       config=None, today=PRICES_AS_OF, **SLO)
    result, _, _ = build_packing(opts)
    [pool] = [p for p in result.pools if len(p.consumer_regions) > 1]
    figs = _saved_figures(monkeypatch, result, tmp_path)
    for region in pool.consumer_regions:
        [drawn] = [line for line in figs[f"instances-{region}.png"].axes[1].get_lines()
                   if line.get_label().startswith("the planned fleet")]
        assert list(drawn.get_ydata())[:-1] == pool.instances_by_hour
        assert f"pooled in {pool.region}" in drawn.get_label() and drawn.get_linestyle() == "--"


def test_an_option_hidden_under_the_picks_line_is_named_so_in_the_legend(tmp_path):
    """Two-regions' Ohio picture drew g6e int8_wo at the fp8 pick's counts every hour: its blue line lay under the
    bold black one, and the legend listed a line the reader could not find."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fleetcast.plan.report import DayLine, instances_plot

    same, other = [3] * 12 + [2] * 12, [5] * 24
    shown = [DayLine("pick", same, True), DayLine("twin", list(same), False), DayLine("other", other, False)]
    figures: list = []
    real_close = plt.close
    plt.close = figures.append  # keep the figure to read its legend
    try:
        instances_plot(plt, "us-east-2", [1.0] * 24, shown, [], "", tmp_path)
    finally:
        plt.close = real_close
    labels = [t.get_text() for t in figures[0].axes[1].get_legend().get_texts()]
    real_close(figures[0])
    assert labels == ["twin (under the pick: the same counts)", "other", "pick (this region's pick)"]


def test_write_config_says_what_a_target_at_the_consumers_limit_means(capsys, tmp_path):
    fleet = tmp_path / "fleet.yaml"
    shutil.copy(ROOT / "config" / "fleet.yaml", fleet)
    # voice-app (ap-northeast-2) allows 48 requests in flight per instance; the seed plan's target is 48.
    code = main(["plan", "--results", str(SEED / "results"), "--traffic", str(SEED / "traffic-seoul.yaml"),
                 "--config", str(fleet), "--ttft-p99-ms", "300", "--itl-p99-ms", "40", "--write-config", str(fleet)])
    out = capsys.readouterr().out
    assert code == 0
    assert ("note: consumers[voice-app].limits.max_concurrency is 48, equal to the scaling.target 48 of "
            "ap-northeast-2") in out
    assert "429 (concurrency_limit_exceeded)" in out
    # Headroom above the target: nothing to say.
    fleet.write_text(fleet.read_text().replace("limits: {max_concurrency: 48,", "limits: {max_concurrency: 64,"))
    main(["plan", "--results", str(SEED / "results"), "--traffic", str(SEED / "traffic-seoul.yaml"),
          "--config", str(fleet), "--ttft-p99-ms", "300", "--itl-p99-ms", "40", "--write-config", str(fleet)])
    assert "max_concurrency" not in capsys.readouterr().out


def test_an_interrupted_bench_run_is_named_in_the_warnings(tmp_path):
    """A results file `fleetcast bench run` cut with Ctrl-C holds the levels that finished; the plan says the
    curve ends there because the run was cut, not because the endpoint stopped there."""
    doc = json.loads((SEED / "results" / "g6e.xlarge-int8_wo.json").read_text())
    doc["runs"] = doc["runs"][:3]
    doc["interrupted"] = "Ctrl-C during concurrency 16: 3 of 6 level(s) finished"
    cut = tmp_path / "g6e.xlarge-int8_wo.json"
    cut.write_text(json.dumps(doc))
    result, _, _ = build_packing(PlanOptions(results=[str(cut)], traffic=str(SEED / "traffic-seoul.yaml"), config=None,
                                             ttft_p99_ms=300, itl_p99_ms=40))
    assert any("the bench run was interrupted (Ctrl-C during concurrency 16" in w for w in result.warnings)


def test_plan_json_says_what_each_member_of_a_pooled_pool_gets():
    """A pool serving Virginia and Ohio is sized for its farthest member; plan.json's member_checks give each member's
    predicted P99 TTFT (its own network) and ITL at the pool's worst planned minute, per model, as a one-model plan's
    pools did before issue 34."""
    from fleetcast.plan.packing_report import to_json

    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(ROOT / "examples/plan/two-regions/traffic.yaml"),
                       config=str(ROOT / "config/fleet.yaml"), today=PRICES_AS_OF)
    result, ctx, _ = build_packing(opts)
    (pool,) = to_json(result)["pools"]
    checks = pool["member_checks"]
    assert set(checks) == {"us-east-1", "us-east-2"} and all(set(c) == {"gpt2-xl"} for c in checks.values())
    east, ohio = checks["us-east-1"]["gpt2-xl"], checks["us-east-2"]["gpt2-xl"]
    # One worst minute, each member's own network: Ohio's round trip to Virginia is the only difference.
    rtt = ctx.latency.between("us-east-2", "us-east-1") - ctx.latency.same_region_ms
    assert ohio["ttft_p99_ms"] - east["ttft_p99_ms"] == pytest.approx(rtt)
    assert ohio["itl_p99_ms"] == east["itl_p99_ms"]
    assert max(ohio["ttft_p99_ms"], east["ttft_p99_ms"]) <= 300
