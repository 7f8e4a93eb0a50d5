"""`plan simulate --report DIR` and `make bench-scaling` (`--plot PNG`) draw the day: instances per hour and
the hours or minutes out of the SLO. Checked on what is drawn (the lines' data, the SLO's y, the legend
below the panels), not on pixels."""

from __future__ import annotations

import pytest

from scripts.bench_scaling import main as bench_scaling
from scripts.cli import main

from .conftest import ROOT, SEED, keep_figures


@pytest.fixture
def saved(monkeypatch):
    # Each figure is read, and drawn on its canvas by _legend_below (a plot that fails to render still fails); the
    # file at its path is a placeholder: encoding the PNG, with its tight bounding box drawn twice, reads nothing.
    return keep_figures(monkeypatch, rasterize=False)


def _legend_below(fig) -> bool:
    fig.canvas.draw()
    [legend] = fig.legends
    return legend.get_window_extent().y1 <= min(ax.get_window_extent().y0 for ax in fig.axes)


def test_plan_simulate_draws_the_day_where_report_points(saved, tmp_path, capsys):
    from fleetcast.plan.run import PlanOptions, build_packing

    args = ["--results", str(SEED / "results"), "--traffic", str(SEED / "traffic-seoul-arrivals.yaml"),
            "--config", str(ROOT / "config" / "fleet.yaml")]
    assert main(["plan", "simulate", *args, "--max-hours", "1", "--report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    [name] = saved
    assert name == "simulate-g6e.xlarge--gpt2-xl-fp8-x1--ap-northeast-2.png" and (tmp_path / name).is_file()
    assert f"pictures: {tmp_path / name}" in out
    result, ctx, _ = build_packing(PlanOptions(results=[str(SEED / "results")],
                                            traffic=str(SEED / "traffic-seoul-arrivals.yaml"),
                                            config=str(ROOT / "config" / "fleet.yaml"), ttft_p99_ms=300,
                                            itl_p99_ms=40))
    [pool] = result.pools
    fig = saved[name]
    inst, ttft, itl = fig.axes
    lines = {ln.get_label(): ln for ln in inst.get_lines()}
    assert list(lines["instances the plan runs"].get_ydata())[:-1] == pool.instances_by_hour
    # The config's floor (capacity.min 2) holds more than the SLOs need at night: both are drawn, told apart.
    needed = lines["instances the SLOs need, by the planner (before capacity.min)"]
    assert list(needed.get_ydata())[:-1] == pool.loads[0].processes_by_hour != pool.instances_by_hour
    # --max-hours 1: one group of hours simulated, one marker per hour of it, at mid-hour.
    sim = lines["fewest meeting the SLOs in the simulation (busiest minutes)"]
    assert all(x % 1 == 0.5 for x in sim.get_xdata()) and 0 < len(sim.get_xdata()) < 24
    # The TTFTs drawn include the network, so the line is the SLO as given (300 ms), not the in-region budget.
    for ax, slo in ((ttft, 300), (itl, 40)):
        [line] = [ln for ln in ax.get_lines() if ln.get_label().startswith("SLO")]
        assert list(line.get_ydata()) == [slo, slo] and ax.get_ylim()[1] > slo
    assert _legend_below(fig)


def test_simulate_without_report_draws_nothing(saved, capsys):
    assert main(["plan", "simulate", "--results", str(SEED / "results"), "--traffic",
                 str(SEED / "traffic-seoul-arrivals.yaml"), "--max-hours", "1"]) == 0
    assert not saved and "pictures:" not in capsys.readouterr().out


def test_bench_scaling_draws_instances_and_slo_windows_per_policy(saved, tmp_path, capsys):
    import matplotlib.colors

    from scripts.bench_scaling import diurnal_trace

    png = tmp_path / "day.png"
    # 8 req/s at the peak (9,000 requests): what is drawn is checked against what the run did, whatever the load;
    # at 20 (23,000) the search tried 16 policies where here it tries 3, for the same claims.
    assert bench_scaling(["--hours", "1", "--peak-rps", "8", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert png.is_file() and f"picture: {png}" in out
    # What it prints for both policies (the one run of the bench in the suite: tests/plan/test_bench_scaling_group.py
    # tests its group minute by minute).
    assert "(a) load target" in out and "(b) load target" in out and "+ SLO protection" in out
    assert "windows in SLO" in out and "requests in SLO" in out and "instance-hours" in out
    assert "cold 127 s" in out and "1.31" in out
    fig = saved["day.png"]
    arrivals, inst, windows = fig.axes
    assert list(arrivals.get_lines()[0].get_ydata()) == diurnal_trace(8.0, 11, 1.0)
    drawn = [ln.get_label() for ln in inst.get_lines()]
    assert drawn[0].startswith("(b) load target") and drawn[1].startswith("(a) load target")
    assert all("instance-hours" in d and "windows in SLO" in d for d in drawn)
    # One row of out-of-SLO minutes per policy drawn, each labelled with the policy.
    rows = [t.get_text() for t in windows.get_yticklabels()]
    assert [r.split(" target ")[0] for r in rows] == [d.split(" load target ")[0] for d in drawn]
    assert [r.split(" target ")[1].split()[0] for r in rows] == [d.split(" load target ")[1].split()[0].rstrip(":") for d in drawn]
    assert [c.get_facecolor()[0].tolist() for c in windows.collections] == \
        [list(matplotlib.colors.to_rgba(line.get_color())) for line in inst.get_lines()]
    assert len(windows.collections) == len(drawn)
    assert any(len(c.get_paths()) for c in windows.collections)  # this trace has minutes out of the SLO to mark
    assert _legend_below(fig)
