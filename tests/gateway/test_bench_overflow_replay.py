"""scripts/bench_overflow_replay.py (`make bench-overflow`) on loopback, a few seconds of a compressed day: both
regions' gateway and engine processes and the inter-region path, overflow off and on. Its figures depend on the
machine's load; what is checked here does not: every request the client sent is metered once, by the gateway
that served it; nothing spills with overflow off; the strict-residency consumer never spills; at 3x the home's
capacity the home spills some of the consumer's requests that may, and the remote meters each as from home."""

from __future__ import annotations

import json

import pytest

from scripts.bench_overflow_replay import HOME, REMOTE, main

# Gateways and fake engines as forks of this worker's fork server for them (tests/conftest.py, forked_gateways).
pytestmark = pytest.mark.usefixtures("forked_gateways")


def test_the_replay_meters_each_request_once_keeps_residency_and_spills_only_with_overflow_on(tmp_path, capsys):
    out = tmp_path / "overflow.json"
    assert main(["--day-s", "4", "--windows", "2", "--peak", "3", "--calibration", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "home windows within the P99 SLO" in printed and "trade-off:" in printed
    figures = json.loads(out.read_text())
    for mode in ("off", "on"):
        run = figures[mode]
        assert run["metering"]["one_record_per_request"], (mode, run["metering"])
        assert run[HOME]["requests"] > 0 and run[REMOTE]["requests"] > 0
        assert run["spilled_by_consumer"]["reports"] == run["spilled_by_consumer"]["west"] == 0  # residency
    assert figures["off"]["spilled"] == 0 and figures["off"]["metering"]["home_spilled_out"] == 0
    on = figures["on"]
    assert on["spilled"] > 0 and on["spilled_by_consumer"]["checkout"] == on["spilled"]
    assert on["metering"]["remote_served_for_home"] == on["spilled"]
