"""`make bench-spot-drain` (scripts/bench_spot_drain.py): its arguments, and the figure it writes is the one the
planner reads. The measurement itself is a benchmark, not a test (docs/runbook.md#spot-tier quotes it)."""

from __future__ import annotations

import pytest

from fleetcast.contract.instance_env import Var
from fleetcast.plan import spot as plan_spot
from scripts import bench_spot_drain as bench


def test_bad_arguments_are_refused_naming_the_flag(capsys):
    for argv, flag in ((["--scale", "2"], "--scale"), (["--lengths", "0,10"], "--lengths"),
                       (["--notice-s", "-1"], "--notice-s"), (["--lengths", "a"], "--lengths")):
        with pytest.raises(SystemExit) as exc:
            bench.build_parser().parse_args(argv)
        assert exc.value.code == 2 and flag in capsys.readouterr().err


def test_the_written_figure_is_what_the_planner_reads(tmp_path, monkeypatch):
    res = {"notice_s": 120.0, "exit_reserve_s": 10.0, "scale": 0.3, "safe_tokens_here": 175, "safe_request_s": 97.4}
    path = tmp_path / "spot_drain.yaml"
    bench.write_data(str(path), res)
    monkeypatch.setenv(Var.SPOT_DRAIN, str(path))
    inputs = plan_spot.load_spot_inputs()
    assert inputs.drain_safe_s == 97.0 and "make bench-spot-drain" in inputs.drain_source
