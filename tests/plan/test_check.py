"""`fleetcast plan --check` on the seed scenario: 0 on the traffic the config was written from, 3 with what
and why once it doubles or moves to batch 64; argument mistakes exit 2 naming the flag."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from scripts import cli

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "plan" / "seed"


@pytest.fixture
def planned(tmp_path, capsys):
    config = tmp_path / "fleet.yaml"
    shutil.copy(ROOT / "config" / "fleet.yaml", config)
    assert cli.main(["plan", "--results", str(SEED / "results"), "--traffic", str(SEED / "traffic-seoul.yaml"),
                     "--config", str(config), "--write-config", str(config)]) == 0
    capsys.readouterr()
    return config


def check(config: Path, traffic: Path, capsys, *extra: str) -> tuple[int, str]:
    rc = cli.main(["plan", "--check", "--results", str(SEED / "results"), "--traffic", str(traffic),
                   "--config", str(config), *extra])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_the_traffic_it_was_planned_from_fits(planned, capsys):
    rc, out = check(planned, SEED / "traffic-seoul.yaml", capsys)
    assert rc == 0 and "fits the plan" in out


def test_doubled_traffic_outgrows_max_capacity(planned, tmp_path, capsys):
    doc = YAML(typ="safe").load((SEED / "traffic-seoul.yaml").read_text())
    doc["consumers"][0]["rate_rps"] = {k: 2 * v for k, v in doc["consumers"][0]["rate_rps"].items()}
    doubled = tmp_path / "doubled.yaml"
    YAML().dump(doc, doubled)
    rc, out = check(planned, doubled, capsys)
    assert rc == 3
    assert "capacity.max would change 17 -> 33" in out
    assert "traffic grew past the SLO-safe throughput of max capacity" in out


def test_batch_64_changes_the_pick_and_the_mix(planned, capsys):
    rc, out = check(planned, SEED / "traffic-batch64.yaml", capsys)
    assert rc == 3
    assert "the plan picks g6e.xlarge [gpt2-xl fp8 x1]" in out and "the config runs g6e.xlarge int8_wo" in out
    assert "the mix moved to larger batches: 100% of requests arrive with more than 48 in flight" in out


def test_the_threshold_bounds_relative_changes_but_not_running_out_of_capacity(planned, tmp_path, capsys):
    doc = YAML(typ="safe").load((SEED / "traffic-seoul.yaml").read_text())
    doc["consumers"][0]["rate_rps"] = {k: 1.3 * v for k, v in doc["consumers"][0]["rate_rps"].items()}
    more = tmp_path / "more.yaml"
    YAML().dump(doc, more)
    rc, out = check(planned, more, capsys)  # default 0.2: max 17 -> 21 is +24%
    assert rc == 3 and "capacity.max would change 17 -> 21" in out
    rc, out = check(planned, more, capsys, "--threshold", "0.5")
    assert rc == 3 and "capacity.max" not in out
    assert "traffic grew past the SLO-safe throughput" in out  # 234 req/s > what 17 instances serve, at any threshold


def test_without_a_baseline_it_checks_the_replan_and_says_so(planned, capsys):
    planned.with_name("fleet.plan-baseline.json").unlink()
    rc, out = check(planned, SEED / "traffic-seoul.yaml", capsys)
    assert rc == 0 and "no plan baseline" in out


@pytest.mark.parametrize("argv,message", [
    (["--traffic-from", "cloudwatch"], "--traffic-from cloudwatch needs --since"),
    (["--traffic", "X", "--since", "7d"], "--since/--region go with --traffic-from"),
    (["--traffic", "X", "--check", "--write-config", "c.yaml"], "--check only compares"),
])
def test_flag_mistakes_exit_2_naming_the_flag(argv, message, capsys):
    rc = cli.main(["plan", "--results", str(SEED / "results"), *argv])
    assert rc == 2 and message in capsys.readouterr().err
