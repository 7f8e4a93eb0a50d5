"""scripts/bench_overflow.py: the simulation drives the gateway's real spill decision and prints its figures."""

from __future__ import annotations

import json

from scripts.bench_overflow import HOME, REMOTE, main


def test_the_overflow_bench_reports_slo_windows_with_and_without_spill_the_share_and_the_added_latency(tmp_path, capsys):
    out = tmp_path / "overflow.json"
    assert main(["--day-s", "2400", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "windows within the P99 TTFT SLO" in printed and "trade-off:" in printed
    figures = json.loads(out.read_text())
    off, on = figures["off"], figures["on"]
    assert off["spill_share"] == 0 and on["spill_share"] > 0  # strict residency when the consumer allows nothing
    assert on[HOME]["within_slo"] > off[HOME]["within_slo"]  # the home's overloaded windows are what spill buys
    assert on[REMOTE]["windows"] == off[REMOTE]["windows"] == 40
    assert on["spilled_added_ms_median"] >= figures["assumptions"]["rtt_ms"]  # a spilled request pays the trip
