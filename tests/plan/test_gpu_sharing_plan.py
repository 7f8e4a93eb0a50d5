"""The packing search under a pool's GPU sharing (issue 33 §3; docs/plan.md, "GPU sharing in the plan"): co-located
curves hold only for the mode they were measured under, every pick says what backs it (measured (MPS), measured
(time slicing), estimated), an MPS pool without MPS measurements plans with the MPS estimator, whose calibration and
error are worked out here from the measured pair it ships with, and an MPS plan is priced against time slicing."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from fleetcast.contract.errors import UserError
from fleetcast.plan.curves import Curve, LoadPoint
from fleetcast.plan.estimate import (
    SHARING_DATA,
    calibrate_mps,
    colocated,
    load_sharing_dataset,
    mps_calibration,
    stretched,
    time_sliced,
)
from fleetcast.plan.packing import MEASURED_COLOCATED
from fleetcast.plan.run import PlanOptions, build_packing
from fleetcast.plan.sharing import ESTIMATED, MEASURED, MPS, TIME_SLICING, pool_sharing

from .conftest import ROOT

DATA = ROOT / "bench" / "data"
SCENARIO = ROOT / "examples" / "plan" / "h200-colocate"
FILES = [str(DATA / f"h200-colocate-{m}-{k}.json") for m in ("gpt2-medium", "gpt2-xl") for k in ("alone", "together")]
LAB = {"H200": "lab.h200"}

SHARING_RUNS = sorted((DATA / "h200-sharing").glob("*/sharing.json"))


def _pooled(mode: str, kind: str, level: int, model: str, metric: str) -> list[float]:
    """Every repeat of one point over the committed H200 sharing runs, both start orders (read here, not through
    bench/h200_sharing.py, so the shipped medians are checked against the raw runs independently)."""
    return [rep[metric] for path in SHARING_RUNS for run in [json.loads(path.read_text())]
            if run["gpu_sharing"] == mode for row in run["table"]
            if (row["kind"], row["level"], row["model"]) == (kind, level, model) for rep in row["repeats"]]


WAYS = {"alone": ("time_slicing", "alone"), "time_slicing": ("time_slicing", "together"),
        "mps": ("mps", "together"), "mps_alone": ("mps", "alone")}
PAIR = ("gpt2-xl-shape", "gpt2-medium-shape")


def test_the_shipped_sharing_dataset_is_the_medians_of_the_committed_h200_runs():
    """data/gpu_sharing.yaml: per level (16, 64), model and way, each metric the median of every repeat of both start
    orders, with the repeats counted and the lowest and highest repeat as its spread; 'alone' is the solo without an
    MPS daemon (the time-sliced runs'), the one a solo curve measures."""
    import statistics

    assert len(SHARING_RUNS) == 6  # two MPS runs, two time-sliced runs and their two concurrency-1 top-ups
    data = load_sharing_dataset()
    assert data.gpu == "H200" and data.backend == "reference" and "bench/data/h200-sharing" in data.provenance
    assert [p.concurrency for p in data.pairs] == [16, 64]
    raw = YAML(typ="safe").load(SHARING_DATA.read_text())
    for pair, doc in zip(data.pairs, raw["pairs"]):
        for model in PAIR:
            for way, (mode, kind) in WAYS.items():
                figures = doc["models"][model][way]
                for metric in ("output_tps", "itl_p99_ms", "ttft_p99_ms"):
                    values = _pooled(mode, kind, int(pair.concurrency), model, metric)
                    assert figures[metric] == pytest.approx(statistics.median(values), abs=0.051)
                    assert figures["spread"][metric] == pytest.approx([min(values), max(values)], abs=0.051)
                    assert figures["repeats"] == len(values) >= 3
                if way != "mps_alone":  # recorded, not calibrated on
                    assert pair.figures[model][way]["output_tps"] == figures["output_tps"]
    # The file is what the command it names writes from those runs.
    from bench.h200_sharing import calibration_yaml

    runs = [json.loads(p.read_text()) for p in SHARING_RUNS]
    command = raw["command"]
    assert command.startswith("python3 bench/h200_sharing.py --summarize ") and "--calibration" in command
    assert SHARING_DATA.read_text() == calibration_yaml(runs, command)


def _figures(level: float) -> dict[str, dict[str, dict[str, float]]]:
    (pair,) = [p for p in load_sharing_dataset().pairs if p.concurrency == level]
    return pair.figures


def test_the_mps_estimator_takes_the_largest_serialised_share_the_pairs_imply_and_states_its_error():
    """k worked out by hand: a model's solo step is its streams over its solo tok/s; XL's throughput at 16 streams
    under MPS (1508.5 tok/s against 1926.1 alone, no daemon) implies the largest share of any model, level and metric:
    (1926.1 / 1508.5 - 1) x step_xl / step_medium."""
    f16 = _figures(16)
    xl, med = f16["gpt2-xl-shape"], f16["gpt2-medium-shape"]
    assert (xl["alone"]["output_tps"], xl["mps"]["output_tps"]) == (1926.1, 1508.5)
    step_xl, step_med = 16 / xl["alone"]["output_tps"], 16 / med["alone"]["output_tps"]
    k = (1926.1 / 1508.5 - 1) * step_xl / step_med
    cal = mps_calibration()
    assert cal.serialised == pytest.approx(k) and 0.34 < k < 0.35
    # In sample it errs slow everywhere: every throughput at or under the measured median, every latency over it.
    assert cal.in_sample["output_tps"][1] == pytest.approx(0, abs=1e-9) and cal.in_sample["output_tps"][0] < -0.2
    assert cal.in_sample["itl_p99_ms"][0] > 0 and cal.in_sample["ttft_p99_ms"][0] > 0
    # Medium at 16 streams: F = 1 + k x step_xl / step_medium.
    f_med = 1 + k * step_xl / step_med
    assert cal.in_sample["itl_p99_ms"][1] >= med["alone"]["itl_p99_ms"] * f_med / med["mps"]["itl_p99_ms"] - 1 > 0.25
    # Leave one model out: fitted on medium's figures alone (its largest share, its throughput at 16), XL comes out
    # optimistic at 16 streams.
    pairs = load_sharing_dataset().pairs
    k_med = max(p.implied("gpt2-medium-shape", MPS, m) for p in pairs for m in ("output_tps", "itl_p99_ms",
                                                                              "ttft_p99_ms"))
    assert k_med == pytest.approx((2390.1 / 2078.4 - 1) * step_med / step_xl)
    xl_pred = 1926.1 / (1 + k_med * step_med / step_xl)
    assert cal.leave_one_out["output_tps"][1] >= xl_pred / 1508.5 - 1 > 0.15
    # The time-slicing rule (k = 1) on the same pairs, its lowest throughput error XL's at 16 streams:
    # 1926.1 / (1 + step_med / step_xl) against 1024.2 measured; its highest under 10%.
    assert cal.time_slicing["output_tps"][0] == pytest.approx(1926.1 / (1 + step_med / step_xl) / 1024.2 - 1)
    assert cal.time_slicing["output_tps"][1] < 0.1
    text = cal.describe()
    assert "bench/data/h200-sharing" in text and "16 and 64 streams each" in text and "3-6 repeats" in text
    assert "leave-one-model-out" in text and "P99 TTFT" in text


def test_one_stretch_rule_serves_both_modes():
    curve = Curve((LoadPoint(16, ttft_p99=50, itl_p99=12, e2e_mean=1200, itl_mean=10, output_tps=1700),))
    sliced = time_sliced(curve, lambda _c: 10.0).points[0]
    assert (sliced.itl_p99, sliced.output_tps) == (24, 850)  # F = (10 + 10) / 10
    assert stretched(curve, lambda _c: 10.0, 1.0) == time_sliced(curve, lambda _c: 10.0)
    under_mps = colocated(MPS, curve, 10.0).points[0]
    k = mps_calibration().serialised
    assert under_mps.itl_p99 == pytest.approx(12 * (1 + k)) and under_mps.output_tps == pytest.approx(1700 / (1 + k))
    assert colocated(TIME_SLICING, curve, 10.0) == time_sliced(curve, lambda _c: 10.0)


def test_a_dataset_missing_a_figure_is_one_error_naming_it(tmp_path):
    doc = YAML(typ="safe").load(SHARING_DATA.read_text())
    del doc["pairs"][0]["models"]["gpt2-xl-shape"]["mps"]["itl_p99_ms"]
    path = tmp_path / "sharing.yaml"
    YAML().dump(doc, path)
    with pytest.raises(UserError, match=r"pairs\[0\]\.models\.gpt2-xl-shape\.mps\.itl_p99_ms: a positive number"):
        calibrate_mps(load_sharing_dataset(path))


def test_a_spread_that_does_not_hold_its_median_is_one_error_naming_it(tmp_path):
    doc = YAML(typ="safe").load(SHARING_DATA.read_text())
    doc["pairs"][1]["models"]["gpt2-medium-shape"]["mps"]["spread"]["itl_p99_ms"] = [30.0, 40.0]
    path = tmp_path / "sharing.yaml"
    YAML().dump(doc, path)
    with pytest.raises(UserError, match=r"pairs\[1\]\.models\.gpt2-medium-shape\.mps\.spread\.itl_p99_ms: "
                                        r"\[lowest, highest\] around the median 23\.1"):
        load_sharing_dataset(path)


def _config(tmp_path, sharing: str | None) -> str:
    yaml = YAML()
    doc = yaml.load(SCENARIO / "fleet.yaml")
    if sharing is not None:
        doc["regions"][0]["pools"][0]["gpu_sharing"] = sharing
    path = tmp_path / f"fleet-{sharing}.yaml"
    yaml.dump(doc, path)
    return str(path)


def _plan(config: str, traffic: str = "traffic.yaml", results: list[str] | None = None, **kw):
    opts = PlanOptions(results=results or FILES, traffic=str(SCENARIO / traffic), config=config,
                       prices=str(SCENARIO / "prices.yaml"), lab=LAB, today=date(2026, 2, 1), **kw)
    result, _, _ = build_packing(opts)
    (region,) = result.regions
    return result, region


def test_a_pool_shares_the_way_its_config_says_or_the_what_if_says():
    from fleetcast.config import load_config

    cfg = load_config(SCENARIO / "fleet.yaml")
    assert pool_sharing(cfg, "ap-northeast-2", "lab.h200") == TIME_SLICING
    assert pool_sharing(cfg, "ap-northeast-2", "lab.h200", MPS) == MPS
    assert pool_sharing(cfg, "us-east-1", "g6e.xlarge") == TIME_SLICING  # no such region in the config


def test_an_mps_pool_never_uses_time_sliced_curves_and_plans_with_the_mps_estimator(tmp_path):
    """The H200 dataset's co-located curves were measured time-sliced (files before revision 7): under an MPS pool
    they are left out, the packing is estimated from the solo curves, and the report says both."""
    _, sliced = _plan(_config(tmp_path, None))
    assert sliced.winner.source == MEASURED_COLOCATED == MEASURED[TIME_SLICING] and sliced.winner.sharing == TIME_SLICING
    assert [a.name for a in sliced.alternatives] == ["one model per pool", "one model per fleet"]
    _, mps = _plan(_config(tmp_path, "mps"))
    w = mps.winner
    assert w.sharing == MPS and w.estimated and w.label.endswith("under MPS")
    assert {m.source for m in w.loads} == {ESTIMATED[MPS]}
    assert all(e.sharing == MPS for e in mps.evaluations)
    assert any("measured under time slicing on lab.h200 were not used" in n for n in mps.notes)
    assert any(n.startswith("MPS estimator: ") for n in mps.notes)
    # Priced against the same region time-sliced: that plan's choice, as a plan without MPS makes it.
    alt = {a.name: a for a in mps.alternatives}
    assert set(alt) == {"one model per pool", "one model per fleet", "time slicing"}
    assert alt["time slicing"].parts[0].label == sliced.winner.label
    assert alt["time slicing"].cost_per_hour == pytest.approx(sliced.winner.cost_per_hour)
    assert any(s.startswith("vs time slicing (") for s in mps.savings())


def test_at_ten_times_the_traffic_mps_wins_and_the_report_states_both_savings(tmp_path):
    """examples/plan/h200-colocate/traffic-busy.yaml: time-sliced, the measured pair needs more instances than one
    model per pool; under MPS the estimated packing needs fewer than either."""
    _, mps = _plan(_config(tmp_path, None), "traffic-busy.yaml", gpu_sharing=MPS)
    alt = {a.name: a for a in mps.alternatives}
    w = mps.winner
    assert w.sharing == MPS and w.cost_per_hour < alt["one model per pool"].cost_per_hour < alt["time slicing"].cost_per_hour
    saving_pool = 1 - w.cost_per_hour / alt["one model per pool"].cost_per_hour
    saving_ts = 1 - w.cost_per_hour / alt["time slicing"].cost_per_hour
    assert saving_pool > 0.4 and saving_ts > saving_pool
    said = " ".join(mps.savings())
    assert "vs one model per pool" in said and "vs time slicing" in said and "the packing saves" in said


def test_measured_mps_curves_back_an_mps_pool_and_only_an_mps_pool(tmp_path):
    """A co-located file recorded under MPS (packing.gpu_sharing, revision 7) is 'measured (MPS)' in an MPS pool
    and is not used by a time-sliced one. (Made from the time-sliced files by relabelling: a test of the routing,
    not a measurement.)"""
    files = []
    for f in FILES:
        doc = json.loads(Path(f).read_text())
        if f.endswith("together.json"):
            doc["packing"]["gpu_sharing"] = "mps"
            doc["revision"] = 7
        path = tmp_path / f.rsplit("/", 1)[1]
        path.write_text(json.dumps(doc))
        files.append(str(path))
    _, mps = _plan(_config(tmp_path, "mps"), results=files)
    assert mps.winner.source == MEASURED[MPS] and not mps.winner.estimated
    assert {m.source for m in mps.winner.loads} == {"measured (MPS)"}
    _, sliced = _plan(_config(tmp_path, None), results=files)
    assert sliced.winner.estimated and {m.source for m in sliced.winner.loads} == {ESTIMATED[TIME_SLICING]}
    assert any("measured under MPS on lab.h200 were not used" in n for n in sliced.notes)


def test_the_what_if_is_refused_with_write_config_and_for_one_model(capsys, tmp_path):
    from scripts.cli import main

    args = ["plan", "--results", *FILES, "--traffic", str(SCENARIO / "traffic.yaml"), "--lab", "H200=lab.h200",
            "--prices", str(SCENARIO / "prices.yaml"), "--gpu-sharing", "mps"]
    config = _config(tmp_path, None)
    assert main([*args, "--config", config, "--write-config", config]) == 2
    assert "--gpu-sharing plans a what-if" in capsys.readouterr().err
    # One model is a packing of one (issue 34): the what-if is refused with --write-config for it as well.
    seed = ROOT / "examples" / "plan" / "seed"
    one = str(tmp_path / "one.yaml")
    Path(one).write_text((ROOT / "config" / "fleet.yaml").read_text())
    code = main(["plan", "--results", str(seed / "results"), "--traffic", str(seed / "traffic-small.yaml"),
                 "--config", one, "--gpu-sharing", "mps", "--write-config", one])
    assert code == 2 and "--gpu-sharing plans a what-if" in capsys.readouterr().err


SHARING_FILES = sorted(str(p) for p in (DATA / "h200-sharing").glob("*/h200-sharing-*.json"))


@pytest.fixture(scope="module")
def busy_sliced_on_sharing_data(tmp_path_factory):
    """(result, region) of traffic-busy.yaml planned time-sliced from bench/data/h200-sharing, planned once: read by
    the measured-dataset savings test and the curve-warnings test."""
    return _plan(_config(tmp_path_factory.mktemp("fleet"), None), "traffic-busy.yaml", results=SHARING_FILES)


def test_on_the_measured_sharing_dataset_mps_wins_measured_and_the_report_states_both_savings(
        tmp_path, busy_sliced_on_sharing_data):
    """examples/plan/h200-colocate/README.md: at traffic-busy.yaml, from bench/data/h200-sharing (both modes
    measured), the plan under MPS picks the measured MPS pair; its saving against one model per pool and against
    the measured time-sliced pair is in the report. Without the what-if the pool time-slices and the measured
    time-sliced pair is the choice."""
    _, mps = _plan(_config(tmp_path, None), "traffic-busy.yaml", results=SHARING_FILES, gpu_sharing=MPS)
    w = mps.winner
    assert w.source == MEASURED[MPS] and not w.estimated and w.sharing == MPS
    assert {(m.model, m.copies, m.source) for m in w.loads} == {
        ("gpt2-medium-shape", 1, "measured (MPS)"), ("gpt2-xl-shape", 1, "measured (MPS)")}
    alt = {a.name: a.cost_per_hour for a in mps.alternatives}
    assert (round(w.cost_per_hour, 2), round(alt["one model per pool"], 2), round(alt["time slicing"], 2)) == (
        14.78, 20.61, 27.28)
    said = " ".join(mps.savings())
    assert "vs one model per pool" in said and "vs time slicing" in said
    assert any("estimated (solo curves, MPS)" in n and "$8.94/h" in n for n in mps.notes)
    _, sliced = busy_sliced_on_sharing_data
    assert sliced.winner.source == MEASURED[TIME_SLICING] and round(sliced.winner.cost_per_hour, 2) == 27.28


def test_the_solo_curve_is_the_one_without_an_mps_daemon_whatever_the_order_of_the_curves():
    """A model measured alone beside an idle peer both time-sliced (no daemon) and as an MPS client: the solo-like
    curve that one model per pool and both estimators read is the one without the daemon (what the MPS estimator is
    calibrated against), not whichever file sorts first."""
    from fleetcast.plan.packing import _curve_for, load_model_curves

    curves = load_model_curves(SHARING_FILES, PAIR, lab=LAB)
    key = (("gpt2-medium-shape", 1), ("gpt2-xl-shape", 1))
    precisions = (("gpt2-medium-shape", "fp16"), ("gpt2-xl-shape", "fp16"))
    for order in (curves, curves[::-1]):
        for sharing in (MPS, TIME_SLICING):
            coloc, solo = _curve_for(order, "gpt2-xl-shape", "lab.h200", "fp16", key, precisions, sharing)
            assert solo is not None and not solo.colocated and solo.sharing == TIME_SLICING
            assert coloc is not None and coloc.sharing == sharing


def test_each_curve_warning_names_the_model_and_which_of_its_curves_it_is(busy_sliced_on_sharing_data):
    """Four curves per model (alone and co-located, each mode): each spread warning says whose and which, and the
    figure is that curve's own (medium alone as an MPS client: P99 TTFT 86.4 to 267.9 ms at 64 streams, 210%)."""
    result, _ = busy_sliced_on_sharing_data
    spread = [w for w in result.warnings if "repeats at" in w]
    heads = sorted(w.split(": ", 1)[0] for w in spread)
    assert heads == sorted(f"{m} on lab.h200 fp16, {kind} curve" for m in PAIR for kind in (
        "alone, peers idle (MPS)", "alone, peers idle (time slicing)", "co-located (MPS)", "co-located (time slicing)"))
    (medium_mps_alone,) = [w for w in spread if w.startswith("gpt2-medium-shape on lab.h200 fp16, alone, peers idle "
                                                             "(MPS)")]
    assert "P99 TTFT 210% (at 64)" in medium_mps_alone
