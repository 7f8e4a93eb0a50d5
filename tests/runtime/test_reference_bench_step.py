"""scripts/bench_step.py: the reference engine's step split into a fixed part and a part per sequence. It runs
end to end on a small setting and reports every path; its figures depend on the machine and are never asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripts.bench_step import decode_only, fit, low, parse_args, report
from tests.optional import needs_torch

from .reference_helpers import ROOT


def test_the_fit_splits_a_step_into_its_fixed_part_and_its_part_per_sequence():
    fixed, per_seq = fit([(1, 1.25), (4, 2.0), (8, 3.0), (16, 5.0)])
    assert fixed == pytest.approx(1.0) and per_seq == pytest.approx(0.25)


def test_only_decode_iterations_at_the_batch_count_and_the_low_quantile_drops_the_waits_for_a_core():
    def stat(ms: float, gen: int, new: int = 0) -> dict:
        return {"iterLatencyMS": ms, "numNewActiveRequests": new, "inflightBatchingStats": {"numGenRequests": gen}}

    stats = [stat(9.0, 4, new=1), stat(2.0, 4), stat(3.0, 3), stat(2.5, 4)]
    assert decode_only(stats, 4) == [2.0, 2.5]  # not the one that also prefilled, nor another batch
    assert low([1.0, 1.1, 1.2, 1.3, 1.4, 9.0, 9.5, 9.9, 10.0, 12.0]) == 1.2


def test_the_report_prints_each_batch_and_the_fits_of_both_paths():
    engine = {1: {"step_ms": 1.0, "model_ms": 0.8}, 16: {"step_ms": 2.5, "model_ms": 1.6}}
    server = {1: {"engine_ms": 1.2, "period_ms": 1.4, "cpu_ms": 1.3, "engine_cpu_ms": 1.0, "http_cpu_ms": 0.3},
              16: {"engine_ms": 3.0, "period_ms": 4.4, "cpu_ms": 4.3, "engine_cpu_ms": 1.75, "http_cpu_ms": 2.55}}
    text = "\n".join(report(engine, server))
    assert "batch  16: iteration   2.500 ms, model   1.600 ms, the rest   0.900 ms" in text
    assert "fit (iteration): fixed   900.0 µs +  100.0 µs per sequence-step" in text
    assert "fit (iteration less model: the engine's Python): fixed   153.3 µs +   46.7 µs" in text
    assert "fit (token period): fixed  1200.0 µs +  200.0 µs per sequence-step" in text
    assert ("batch  16: engine   3.000 ms, token period   4.400 ms, CPU   4.300 ms (engine process   1.750 ms, "
            "HTTP process   2.550 ms)") in text
    assert "fit (server CPU): fixed  1100.0 µs +  200.0 µs per sequence-step" in text
    assert "fit (engine process CPU): fixed   950.0 µs +   50.0 µs per sequence-step" in text
    assert "fit (HTTP process CPU): fixed   150.0 µs +  150.0 µs per sequence-step" in text


def test_the_report_prints_the_step_admitting_each_count_of_prefix_hits_and_its_fit():
    text = "\n".join(report(None, None, {1: {"step_ms": 1.5}, 13: {"step_ms": 4.5}}))
    assert "   13 hits: step   4.500 ms" in text
    assert "fit (admission step): fixed  1250.0 µs +  250.0 µs per admitted hit" in text


def test_arguments_are_checked_before_anything_runs():
    with pytest.raises(SystemExit):
        parse_args(["--batches", "4"])
    with pytest.raises(SystemExit):
        parse_args(["--paths", "gpu"])
    with pytest.raises(SystemExit):
        parse_args(["--hits", "0,4"])
    assert parse_args(["--batches", "8,1,8"]).batch_list == [1, 8]
    assert parse_args(["--hits", "13,1"]).hit_list == [1, 13] and parse_args([]).path_set == {"engine", "server", "admit"}


@needs_torch
@pytest.mark.usefixtures("forked_engines")  # the benchmark and the server it starts: forks, PyTorch imported
def test_the_benchmark_runs_every_path_and_writes_its_figures(tmp_path):
    out = tmp_path / "step.json"
    run = subprocess.run([sys.executable, "-m", "scripts.bench_step", "--batches", "1,2", "--steps", "6", "--repeats", "2",
                          "--hits", "1,2", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    figures = json.loads(out.read_text())
    assert set(figures["engine"]) == set(figures["server"]) == {"1", "2"}
    for row in figures["server"].values():  # the engine process's CPU and the HTTP process's make the server's
        assert row["engine_cpu_ms"] >= 0 and row["engine_cpu_ms"] + row["http_cpu_ms"] == pytest.approx(row["cpu_ms"])
    assert all(v["step_ms"] > 0 and v["model_ms"] > 0 for v in figures["engine"].values())
    assert all(v["period_ms"] > 0 and v["cpu_ms"] > 0 for v in figures["server"].values())
    assert set(figures["admit"]) == {"1", "2"} and all(v["step_ms"] > 0 for v in figures["admit"].values())
    assert "µs per sequence-step" in run.stdout
