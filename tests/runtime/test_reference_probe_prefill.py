"""scripts/probe_prefill.py: the device probe of new against seen prefill shapes, before and after fair35l's warm-up
and stats, run here on the CPU with tiny sizes (the lead runs it with --device cuda)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import probe_prefill
from tests.optional import needs_torch

ROOT = Path(__file__).resolve().parents[2]


@needs_torch
@pytest.mark.xdist_group("torch-in-process")
def test_on_a_cpu_it_runs_both_variants_in_processes_of_their_own_and_prints_new_and_seen_shapes(tmp_path: Path):
    out = tmp_path / "probe.json"
    done = subprocess.run(
        [sys.executable, "-m", "scripts.probe_prefill", "--device", "cpu", "--max-batch", "4", "--rows", "1,3",
         "--lengths", "70", "--decode-tokens", "4", "--repeats", "1", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    before, after = sorted(results["runs"], key=lambda r: r["variant"] != "before")
    assert (before["variant"], after["variant"]) == ("before", "after")
    # One row per padded length on both paths before (4 lengths x 2); every bucket of rows that fits after.
    assert before["warmed_shapes"] == 8 and after["warmed_shapes"] == 2 * 4 * 3  # rows 1, 2, 4 at 64..256
    for run in (before, after):
        shapes = {(tuple(g["shape"]), g["new"]) for g in run["prefills"]}
        assert (("fresh", 1, 128, 128), False) in shapes  # one row at a padded length: warmed in both
        assert (("fresh", 3, 128, 128), True) in shapes  # three rows: no bucket, new in both
        assert (("hit", 3, 6, 70), True) in shapes and (("hit", 3, 6, 70), False) in shapes  # then seen
        assert run["decode_iterations"] >= 3
    assert "fresh new  shapes, prefill group P50 / P90 / max:" in done.stdout
    assert "collections per 1000 decode iterations" in done.stdout and done.stdout.count("process(es)") == 2


def test_its_defaults_fit_the_default_models_positions():
    """The first H100 run of the defaults failed in the engine's own check: 20 + 300 tokens past tiny's 256."""
    args = probe_prefill.parse(["--device", "cpu"])
    assert probe_prefill.DECODE_PROMPT + args.decode_tokens < 256


def test_it_refuses_rows_past_the_batch_and_prompts_past_the_models_positions(capsys):
    for argv, message in ((["--rows", "1,32", "--max-batch", "16"], "--rows: each must be at most --max-batch"),
                          (["--lengths", "300"], "--lengths: each must be below the model's 256 positions"),
                          (["--rows", "0"], "at least one number, each 1 or more"),
                          (["--decode-tokens", "300"], "--decode-tokens: 1 to 235, so that a 20-token prompt")):
        with pytest.raises(SystemExit):
            probe_prefill.parse(argv)
        assert message in capsys.readouterr().err
