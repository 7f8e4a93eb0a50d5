"""The roofline model for unmeasured candidates: calibrated, error reported, always labelled."""

from __future__ import annotations

import math

import pytest

from fleetcast.config import catalog
from fleetcast.contract.errors import UserError
from fleetcast.plan.estimate import MODEL_SHAPES, Estimator, estimate_specs, ideal
from fleetcast.plan.inputs import load_candidates
from fleetcast.plan.run import PlanOptions, build_packing

from .conftest import ROOT, SEED, write_plan


@pytest.fixture(scope="module")
def measured():
    return load_candidates(sorted(str(p) for p in (SEED / "results").glob("*.json")))


def test_ideal_times_follow_the_roofline_by_hand():
    gpu = catalog.gpu_by_name("L40S")     # 864 GB/s, 362 TFLOPS fp16
    shape = MODEL_SHAPES["gpt2-xl"]       # 1.558e9 params, 48 layers, KV width 1600
    t = ideal(gpu, "int8_wo", shape, c=1, i=256, o=128)
    wb = 1.558e9 * 1.0
    kv = 2 * 48 * 1600 * 2
    t_dec = (wb + 1 * kv * (256 + 64)) / 864e9             # memory-bound at batch 1
    t_pre = max(wb / 864e9, 2 * 1.558e9 * 256 / 362e12)    # = 2.2 ms compute vs 1.8 ms memory
    itl = t_dec + t_pre / 128
    assert t["itl_p99"] == pytest.approx(itl * 1e3)
    assert t["ttft_p99"] == pytest.approx((t_pre + itl) * 1e3)
    assert t["e2e_mean"] == pytest.approx((t_pre + itl + 127 * itl) * 1e3)
    # Halving the weight bytes (int8 vs fp16) speeds memory-bound decode; FP8 math speeds prefill.
    assert ideal(gpu, "fp16", shape, 1, 256, 128)["itl_p99"] > t["itl_p99"]
    assert ideal(gpu, "fp8", shape, 64, 256, 128)["ttft_p99"] < ideal(gpu, "int8_wo", shape, 64, 256, 128)["ttft_p99"]


def test_the_calibrated_model_reports_its_error(measured):
    est = Estimator(MODEL_SHAPES["gpt2-xl"], measured, 256, 128)
    for errors in (est.error_in_sample, est.error_leave_one_out):
        assert set(errors) == {"ttft_p99", "itl_p99", "e2e_mean"}
        assert all(0 < v < 0.5 for v in errors.values()), errors
    # Predicting a candidate from a fit on the others is harder than fitting it.
    assert sum(est.error_leave_one_out.values()) >= sum(est.error_in_sample.values())
    assert "leave-one-candidate-out" in est.describe()


def test_estimates_are_labelled_and_reuse_a_measured_twin(measured):
    out, _ = estimate_specs(["g6e.2xlarge:int8_wo", "g6.xlarge:fp8", "g6e.xlarge:bf16"], measured, "gpt2-xl", None, 256, 128)
    by_label = {c.label: c for c in out}
    assert all(c.estimated for c in out)
    twin = by_label["g6e.2xlarge int8_wo"]
    g6e = next(c for c in measured if c.label == "g6e.xlarge int8_wo")
    assert twin.curve is g6e.curve and "same L40S GPU" in twin.sources[0]
    assert by_label["g6e.xlarge bf16"].curve is next(c for c in measured if c.label == "g6e.xlarge fp16").curve
    l4 = by_label["g6.xlarge fp8"]
    assert l4.sources == ("roofline model",)
    # L4 has a third of L40S's bandwidth: its estimated ITL at batch 1 is well above g6e's measured one.
    g6e_fp8 = next(c for c in measured if c.label == "g6e.xlarge fp8")
    assert l4.curve.points[0].itl_p99 > 1.5 * g6e_fp8.curve.points[0].itl_p99


def test_measured_choice_beats_a_cheaper_estimate_and_says_so():
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / "traffic-seoul.yaml"), config=None,
                       ttft_p99_ms=300, itl_p99_ms=40, estimate=["g5.xlarge:int4_wo"])
    result, _, _ = build_packing(opts)
    (plan,) = result.regions
    estimate = "g5.xlarge [gpt2-xl int4_wo x1]"  # served in its consumers' region: its label names no other
    assert plan.ranked[0].label == estimate and plan.ranked[0].estimated and plan.ranked[0].region == "ap-northeast-2"
    assert plan.winner.label == "g6e.xlarge [gpt2-xl int8_wo x1]"
    # One wording for a cheaper estimate, one model or a packing (solver.cheaper_words; test_packing.py).
    why = dict(plan.why_not())[estimate]
    assert why.startswith(f"estimated only: would cost ${plan.ranked[0].cost_per_hour:.2f}/h vs "
                          f"${plan.winner.cost_per_hour:.2f}/h")
    assert why.endswith("not chosen: benchmark it before choosing it")
    assert any(f"estimated candidate(s) rank above the synthetic (authored data, not measured) choice; the best, "
               f"{estimate}: estimated only: would cost $" in n for n in plan.stats_notes)
    # The estimator per model (one here), on the model's 7 synthetic solo curves.
    assert result.estimator.startswith("gpt2-xl: roofline calibrated on 7 synthetic candidate(s) (authored data, "
                                       "not measured)")


def test_write_config_refuses_an_estimated_choice(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text((ROOT / "config" / "fleet.yaml").read_text())
    opts = PlanOptions(results=[str(SEED / "results" / "g7e.2xlarge-fp8.json")], traffic=str(SEED / "traffic-seoul.yaml"),
                       config=None, ttft_p99_ms=300, itl_p99_ms=40, estimate=["g6e.xlarge:int8_wo"])
    result, ctx, _ = build_packing(opts)
    assert result.regions[0].winner.estimated        # the only feasible candidate in Seoul
    before = fleet.read_text()
    with pytest.raises(UserError, match=r"\(g6e.xlarge \[gpt2-xl int8_wo x1\]\) is estimated \(roofline model\), "
                                  r"not measured: benchmark it first"):
        write_plan(fleet, result, ctx)
    assert fleet.read_text() == before


@pytest.mark.parametrize("spec, expected", [
    ("p5.48xlarge", "--estimate: 'p5.48xlarge' is not in the instance catalog"),
    ("g6e.xlarge:int3", "--estimate: precision 'int3' is not one of"),
])
def test_bad_estimate_specs(measured, spec, expected):
    with pytest.raises(UserError, match=expected):
        estimate_specs([spec], measured, "gpt2-xl", None, 256, 128)


def test_unknown_model_shape(measured):
    with pytest.raises(UserError, match="no architecture figures for model 'mystery'"):
        estimate_specs(["g6.xlarge"], measured, "mystery", None, 256, 128)
    assert all(math.isfinite(s.params) for s in MODEL_SHAPES.values())
