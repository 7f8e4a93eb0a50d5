"""Noise (issue 33 §3): a load level measured several times is sized from its worst repeat, every latency at its
highest and throughput at its lowest, and the spread is kept for the report (docs/plan.md, "Noise")."""

from __future__ import annotations

import copy
import json

from fleetcast.plan.curves import LoadPoint, spread_text, worst_of
from fleetcast.plan.inputs import load_candidates

from .conftest import SEED


def _repeated(tmp_path, scale_by_repeat: list[float]) -> str:
    """The seed's g6e int8_wo file with its first level run once per scale, each repeat's latencies times the scale
    (throughput divided by it), numbered as `bench run --repeats` numbers them."""
    doc = json.loads((SEED / "results" / "g6e.xlarge-int8_wo.json").read_text())
    first = doc["runs"][0]
    repeats = []
    for i, f in enumerate(scale_by_repeat, start=1):
        run = copy.deepcopy(first)
        s = run["summary"]
        for metric in ("ttft_ms", "itl_ms", "e2e_ms"):
            for k in ("mean", "p99"):
                if s[metric].get(k) is not None:
                    s[metric][k] *= f
        s["output_throughput_tps"] /= f
        run["repeat"] = i
        repeats.append(run)
    doc["runs"] = repeats + doc["runs"][1:]
    path = tmp_path / "repeats.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_repeats_of_a_level_size_from_the_worst_and_keep_the_spread(tmp_path):
    (once,) = load_candidates([str(SEED / "results" / "g6e.xlarge-int8_wo.json")])
    (cand,) = load_candidates([_repeated(tmp_path, [1.0, 1.3, 0.9])])
    base, p = once.curve.points[0], cand.curve.points[0]
    assert p.concurrency == base.concurrency and len(cand.curve.points) == len(once.curve.points)
    assert p.ttft_p99 == base.ttft_p99 * 1.3 and p.itl_p99 == base.itl_p99 * 1.3 and p.e2e_mean == base.e2e_mean * 1.3
    assert p.output_tps == base.output_tps / 1.3
    assert p.spread is not None and p.spread.repeats == 3
    assert abs(p.spread.width("ttft_p99") - (1.3 / 0.9 - 1)) < 1e-9
    text = spread_text(cand.curve)
    assert text.startswith("3 repeats at 1 of ") and "P99 TTFT 44%" in text and "sized from the worst" in text
    assert spread_text(once.curve) is None


def test_worst_of_takes_each_metric_at_its_own_worst_repeat():
    a = LoadPoint(16, ttft_p99=100, itl_p99=30, e2e_mean=900, output_tps=2000, error_rate=0.0)
    b = LoadPoint(16, ttft_p99=80, itl_p99=40, e2e_mean=950, output_tps=2100, error_rate=0.01)
    w = worst_of([a, b])
    assert (w.ttft_p99, w.itl_p99, w.e2e_mean, w.output_tps, w.error_rate) == (100, 40, 950, 2000, 0.01)
    assert worst_of([a]) is a


def test_the_spread_is_one_of_the_curves_notes_so_every_plan_reports_it(tmp_path):
    (cand,) = load_candidates([_repeated(tmp_path, [1.0, 1.2, 1.1])])
    assert any(n.startswith("3 repeats at 1 of ") and "P99 TTFT 20%" in n for n in cand.curve.notes)


def test_a_one_model_plan_sizes_from_the_worst_repeat_and_says_how_wide_the_spread_was(tmp_path, capsys):
    """The seed's g6e int8_wo at its first level measured three times, one repeat 50% slower: the plan of that
    candidate alone costs at least what the single run's does, and its output names the spread."""
    from scripts.cli import main

    def plan(results: str) -> str:
        assert main(["plan", "--results", results, "--traffic", str(SEED / "traffic-seoul.yaml"),
                     "--config", "config/fleet.yaml", "--json"]) in (0, 3)
        return capsys.readouterr().out

    once = json.loads(plan(str(SEED / "results" / "g6e.xlarge-int8_wo.json")))
    worst = json.loads(plan(_repeated(tmp_path, [1.0, 1.5, 1.1])))
    assert "sized from the worst" in json.dumps(worst["warnings"]) and "P99 TTFT 50%" in json.dumps(worst["warnings"])
    cost = [min(e["cost_per_hour"] for r in doc["regions"] for e in r["evaluations"] if e.get("cost_per_hour"))
            for doc in (once, worst)]
    assert cost[1] >= cost[0]
