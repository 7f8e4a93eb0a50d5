"""scripts/bench_overflow_replay.py (`make bench-overflow`) on loopback, a few seconds of a compressed day: both
regions' gateway and engine processes and the inter-region path, overflow off and on. Its figures depend on the
machine's load; what is checked here does not: every request the client sent is metered once, by the gateway
that served it; nothing spills with overflow off; the strict-residency consumer never spills; at 3x the home's
capacity the home spills some of the consumer's requests that may, and the remote meters each as from home."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from scripts.bench_overflow_replay import HOME, REMOTE, main

# Gateways and fake engines as forks of this worker's fork server for them (tests/conftest.py, forked_gateways).
pytestmark = pytest.mark.usefixtures("forked_gateways")


def test_the_replay_meters_each_request_once_keeps_residency_and_spills_only_with_overflow_on(tmp_path, capsys):
    def replay(mode: str) -> dict[str, Any]:
        out = tmp_path / f"overflow-{mode}.json"
        argv = ["--day-s", "4", "--windows", "2", "--peak", "3", "--calibration", "1", "--modes", mode]
        assert main([*argv, "--json", str(out)]) == 0
        return dict(json.loads(out.read_text())[mode])

    # Each mode is a run of its own (its processes, ports, path and event loop) that mostly waits on the replayed
    # day's clock: side by side the two take the time of one.
    with ThreadPoolExecutor(2) as pool:
        figures = dict(zip(("off", "on"), pool.map(replay, ("off", "on"))))
    printed = capsys.readouterr().out
    assert "home windows within the P99 SLO" in printed and "trade-off:" in printed
    for mode in ("off", "on"):
        run = figures[mode]
        assert run["metering"]["one_record_per_request"], (mode, run["metering"])
        assert run[HOME]["requests"] > 0 and run[REMOTE]["requests"] > 0
        assert run["spilled_by_consumer"]["reports"] == run["spilled_by_consumer"]["west"] == 0  # residency
    assert figures["off"]["spilled"] == 0 and figures["off"]["metering"]["home_spilled_out"] == 0
    on = figures["on"]
    assert on["spilled"] > 0 and on["spilled_by_consumer"]["checkout"] == on["spilled"]
    assert on["metering"]["remote_served_for_home"] == on["spilled"]
