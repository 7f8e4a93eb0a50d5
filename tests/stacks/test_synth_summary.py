"""`fleetcast synth summary`: the summary `make synth` prints, and its refusal of a stale cloud assembly."""

from __future__ import annotations

import re

from ruamel.yaml import YAML

from scripts.cli import main

from .synthesized import (
    DEFAULT_CONFIG,
    MULTI_MODEL_CONFIG,
    default_fleet,
    multi_model_fleet,
    variant_doc,
    variant_fleet,
)


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["synth", "summary", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_summary_lists_stacks_regions_pools_and_consumers(capsys):
    code, out, err = run(capsys, "--config", str(DEFAULT_CONFIG), "--out", str(default_fleet().outdir))
    assert code == 0, err
    for stack in ("fleetcast-provider-ap-northeast-2", "fleetcast-provider-us-east-1",
                  "fleetcast-consumer-voice-app", "fleetcast-consumer-analytics"):
        assert stack in out
    assert "aws://111122223333/ap-northeast-2" in out
    assert "pool l40s: g6e.xlarge (L40S), capacity min 2 max 6, precision int8_wo, backend tensorrt" in out
    assert "analytics (777788889999, us-west-2 -> us-east-1 (cross-region))" in out


def test_summary_names_skipped_consumers_and_why(capsys, tmp_path):
    config = tmp_path / "variant.yaml"
    YAML().dump(variant_doc(), config)
    code, out, err = run(capsys, "--config", str(config), "--out", str(variant_fleet().outdir))
    assert code == 0, err
    assert "late-team (555566667777, ap-northeast-2 -> ap-northeast-2): skipped: no endpoint_service_name yet" in out
    assert "pool a10g: g5.2xlarge (A10G)" in out and "listener TLS:8000" in out


def test_summary_refuses_an_assembly_built_from_another_config(capsys):
    code, out, err = run(capsys, "--config", str(DEFAULT_CONFIG), "--out", str(variant_fleet().outdir))
    assert code == 1
    assert "was synthesized from a different config" in err and "run `make synth` again" in err


def test_summary_without_an_assembly_says_what_to_run(capsys, tmp_path):
    code, out, err = run(capsys, "--config", str(DEFAULT_CONFIG), "--out", str(tmp_path / "nothing"))
    assert code == 1
    assert "manifest.json not found: run `make synth`" in err


def test_a_mismatch_is_refused_before_any_summary_is_printed(capsys):
    code, out, err = run(capsys, "--config", str(DEFAULT_CONFIG), "--out", str(variant_fleet().outdir))
    assert code == 1 and out == ""  # nothing on stdout that describes stacks the assembly does not hold


def test_the_hint_names_the_config_given(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(DEFAULT_CONFIG.parents[1])  # where make runs: CONFIG defaults to config/fleet.yaml
    other = tmp_path / "other fleet.yaml"
    other.write_text(DEFAULT_CONFIG.read_text())
    code, out, err = run(capsys, "--config", str(other), "--out", str(variant_fleet().outdir))
    assert code == 1 and f"run `make synth CONFIG='{other}'` again" in err
    code, out, err = run(capsys, "--config", "config/fleet.yaml", "--out", str(tmp_path / "nothing"))
    assert code == 1 and "manifest.json not found: run `make synth` first" in err


def test_summary_lists_what_each_instance_of_a_multi_model_pool_serves(capsys):
    code, out, err = run(capsys, "--config", str(MULTI_MODEL_CONFIG), "--out", str(multi_model_fleet().outdir))
    assert code == 0, err
    assert "pool l40s: g6e.2xlarge (L40S), capacity min 1 max 4, warm pool 0; each instance serves:" in out
    assert "qwen2.5-0.5b x2: precision bf16, backend pytorch, batch 64, KV 4.00 GiB each" in out
    assert ("gpt2-xl x1: precision int8_wo, backend tensorrt, batch 64, KV share about 2.08 GiB each (planned on "
            "the instance)") in out
    # KV space against batch (issue 32): the L4's share holds fewer full gpt2-xl sequences than its batch of 64.
    assert re.search(r"warning: regions\[0\]\.pools\[1\]\.serves\[0\]: gpt2-xl's KV share of [0-9.]+ GiB holds "
                     r"[0-9.]+ full sequences, against max_batch_size 64", out), out
