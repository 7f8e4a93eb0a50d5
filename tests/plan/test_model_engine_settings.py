"""The planner reads each model's own engine settings (fleet engine <- models[].engine), and one calibration rule
holds for one model or several: a precision whose build needs a calibration set stays a candidate, and
--write-config refuses it, naming the command that stages one, until the model names a set (issue 34).

Which builds calibrate is contract/support.needs_calibration (TensorRT-LLM 1.2.x engine flow: SmoothQuant, FP8 and
any quantized KV cache; its sources are named there and checked in tests/contract/test_support.py)."""

from __future__ import annotations

import json
import shutil
from datetime import date

from fleetcast.plan.run import PlanOptions, build_packing
from scripts.cli import main

from .conftest import ROOT, SEED

EXAMPLE = ROOT / "examples" / "plan" / "multi-model"
STAGE = "fleetcast stage calibration"


def test_a_one_model_plan_checks_candidates_against_the_models_own_kv_cache_dtype(tmp_path):
    """The fleet engine says kv_cache_dtype auto, the model's own engine int8: fp8 weights with an INT8 KV cache
    have no 1.2.x source (contract/support.py), so every fp8 candidate is refused, and ruled out with that reason
    though the model keeps other precisions on the type. Before, the planner read the fleet's `auto` and kept them;
    the packing search then dropped the refused precision without a word."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text((ROOT / "config" / "fleet.yaml").read_text()
                     .replace("  max_output_len: 256\n", "  max_output_len: 256\n  engine: {kv_cache_dtype: int8}\n", 1)
                     .replace("\nslo:", "\ncalibration:\n  dataset: s3://fleetcast-staging/calibration/lambada/\n\nslo:",
                              1))
    result, _, _ = build_packing(PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / "traffic-seoul.yaml"),
                                             config=str(fleet), today=date(2026, 2, 1)))
    (plan,) = result.regions
    assert plan.winner is not None and not any(ld.precision == "fp8" for e in plan.evaluations for ld in e.loads)
    # g6e.xlarge has an fp8 curve and serves Seoul (g7e's is not offered there, ruled out as a type first).
    assert dict(plan.refused)["gpt2-xl fp8 on g6e.xlarge"].startswith(
        "int8 KV cache is not built with precision fp8 on the tensorrt backend")
    assert ("gpt2-xl fp8 on g6e.xlarge", dict(plan.refused)["gpt2-xl fp8 on g6e.xlarge"]) in plan.ruled_out()


def test_a_packing_reads_each_models_own_kv_cache_dtype(tmp_path):
    """The fleet engine says kv_cache_dtype fp8 (the two PyTorch models use it), gpt2-xl's own engine says auto: its
    int8_wo TensorRT build takes no FP8 KV cache, so reading the fleet's value left gpt2-xl without a precision and
    no packing served the region."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text((EXAMPLE / "fleet.yaml").read_text()
                     .replace("  port: 8000\n", "  port: 8000\n  kv_cache_dtype: fp8\n", 1)
                     .replace("precision: int8_wo, max_batch_size", "precision: int8_wo, kv_cache_dtype: auto, "
                              "max_batch_size", 1))
    result, _, _ = build_packing(PlanOptions(results=[str(EXAMPLE / "results")], traffic=str(EXAMPLE / "traffic.yaml"),
                                             config=str(fleet), today=date(2026, 2, 1)))
    (region,) = result.regions
    assert region.winner is not None
    assert {m.model: m.precision for m in region.winner.loads}["gpt2-xl"] in ("int8_wo", "fp16")


def _fp8_only_for_gpt2(tmp_path):
    """The example's results with gpt2-xl measured at fp8 only (a TensorRT build that calibrates)."""
    results = tmp_path / "results"
    shutil.copytree(EXAMPLE / "results", results)
    for path in results.glob("*gpt2-xl*.json"):
        path.unlink()
    doc = json.loads((EXAMPLE / "results" / "g6e.xlarge-gpt2-xl-int8_wo.json").read_text())
    doc["labels"]["precision"] = "fp8"
    (results / "g6e.xlarge-gpt2-xl-fp8.json").write_text(json.dumps(doc))
    fleet = tmp_path / "fleet.yaml"
    shutil.copy(EXAMPLE / "fleet.yaml", fleet)
    return results, fleet


def test_a_packing_keeps_a_calibrated_precision_and_the_write_refuses_it_naming_the_command(tmp_path, capsys):
    """Before, the packing search dropped gpt2-xl fp8 silently (the model names no calibration set), so no packing
    served the region, while a one-model plan keeps such a candidate and refuses only the write."""
    results, fleet = _fp8_only_for_gpt2(tmp_path)
    before = fleet.read_text()
    code = main(["plan", "--results", str(results), "--traffic", str(EXAMPLE / "traffic.yaml"), "--config", str(fleet),
                 "--write-config", str(fleet), "--allow-estimated"])
    out, err = capsys.readouterr()
    assert "gpt2-xl fp8 x1" in out
    assert "refuses: gpt2-xl fp8 on g6e.xlarge in ap-northeast-2: fp8 is calibrated" in out
    assert code == 1 and "models[gpt2-xl].calibration.dataset" in err and STAGE in err
    assert fleet.read_text() == before


def test_a_packing_with_a_calibrated_precision_is_written_where_the_model_names_a_set(tmp_path, capsys):
    results, fleet = _fp8_only_for_gpt2(tmp_path)
    fleet.write_text(fleet.read_text().replace(
        "    parameters_b: 1.56 ", "    calibration: {dataset: 's3://fleetcast-staging/calibration/lambada/'}\n"
        "    parameters_b: 1.56 ", 1))
    code = main(["plan", "--results", str(results), "--traffic", str(EXAMPLE / "traffic.yaml"), "--config", str(fleet),
                 "--write-config", str(fleet), "--allow-estimated"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "note: gpt2-xl fp8 on g6e.xlarge in ap-northeast-2: fp8 is calibrated" in out
    assert "models[gpt2-xl].engine.precision = fp8" in out
