"""`make soak-gateway` (scripts/soak_gateway.py): its settings and config; running it is a benchmark, not a test."""

from __future__ import annotations

import json

import pytest

from fleetcast.config import config_from_json
from scripts import soak_gateway


def test_minutes_come_from_the_flag_else_soak_minutes_else_thirty(monkeypatch):
    monkeypatch.delenv("SOAK_MINUTES", raising=False)
    assert soak_gateway.build_parser().parse_args([]).minutes == 30
    monkeypatch.setenv("SOAK_MINUTES", "2.5")
    assert soak_gateway.build_parser().parse_args([]).minutes == 2.5
    assert soak_gateway.build_parser().parse_args(["--minutes", "3"]).minutes == 3
    for bad in (["--minutes", "0"], ["--minutes", "inf"], ["--clients", "0"]):
        with pytest.raises(SystemExit):
            soak_gateway.build_parser().parse_args(bad)


def test_the_soak_config_serves_a_well_behaved_and_a_limited_consumer(tmp_path):
    path = tmp_path / "fleet.json"
    soak_gateway._config(path)
    cfg = config_from_json(path.read_text())
    consumers = {c.account: c for c in cfg.consumers_of(soak_gateway.REGION)}
    assert consumers[soak_gateway.BENCH_ACCOUNT].limits.max_concurrency >= 1000
    assert consumers[soak_gateway.FLOOD_ACCOUNT].limits.max_concurrency == 2
    assert json.loads(path.read_text())["consumers"][1]["name"] == "flooder"
