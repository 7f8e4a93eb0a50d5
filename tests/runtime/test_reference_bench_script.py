"""scripts/bench_decode.py in its CPU mode: the H200 benchmark's plumbing and its correctness check."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.optional import needs_torch

from .reference_helpers import ROOT

# Beside the in-process engine modules: the worker that runs them has PyTorch imported (3.5 s of CPU elsewhere).
pytestmark = [needs_torch, pytest.mark.xdist_group("torch-in-process")]


def load_script():
    spec = importlib.util.spec_from_file_location("bench_decode", ROOT / "scripts" / "bench_decode.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_mode_checks_greedy_decoding_and_reports_the_floor_ratio(tmp_path, capsys):
    out = tmp_path / "decode.json"
    # The copy bandwidth on 8 MiB, not the CPU default's 256: filling and copying that buffer 105 times was 10 of the
    # test's 12 s of CPU, and what is checked here is that the floor is measured and divided by, not its value.
    rc = load_script().main(["--device", "cpu", "--size", "tiny", "--batches", "1,2", "--reps", "2", "--inner", "1",
                             "--long-context", "100", "--attention", "sdpa,bmm", "--copy-mib", "8", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    for variant in ("sdpa", "bmm"):
        check = result["variants"][variant]["greedy_check"]
        assert check["tokens_matched"] == check["steps"] == 8
        assert set(result["variants"][variant]["steps"]) == {"B1_ctx128", "B2_ctx128", "B1_ctx100"}
    assert result["floor_ms"] > 0 and result["batch1_vs_floor"] == pytest.approx(result["batch1_step_ms"] / result["floor_ms"])
    assert "BATCH-1 STEP" in capsys.readouterr().out
