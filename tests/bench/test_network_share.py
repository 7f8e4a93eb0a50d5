"""`fleetcast bench network-share`: PrivateLink minus instance, per load level, from two results files."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from fleetcast.bench.network_share import network_share
from fleetcast.bench.schema import (
    ClientInfo,
    Labels,
    Lengths,
    Load,
    Results,
    Run,
    Stat,
    Summary,
    dump_results,
    load_results,
)
from fleetcast.contract.errors import UserError
from scripts.cli import main


def stat(p50, p99):
    return Stat(count=100, mean=p50, p50=p50, p90=p99, p95=p99, p99=p99, min=p50, max=p99)


def run(concurrency, ttft, e2e, rtt, saturated=False):
    empty = Stat(count=0)
    return Run(load=Load(mode="concurrency", concurrency=concurrency),
               lengths=Lengths(input_mean=128, output_mean=128, spec="input=128 output=128"),
               summary=Summary(requests=100, completed=100, errors=0, duration_s=10.0, ttft_ms=stat(*ttft),
                               itl_ms=stat(10, 12), e2e_ms=stat(*e2e), chunk_gap_ms=stat(10, 12),
                               output_throughput_tps=1000, total_throughput_tps=2000, request_throughput_rps=10,
                               error_rate=0.0, mean_concurrency=concurrency, saturated=saturated,
                               schedule_lag_ms=empty, event_loop_lag_ms=empty, network_rtt_ms=rtt))


def results(path, runs):
    now = datetime.now(UTC)
    return Results(labels=Labels(model="gpt2-xl", path=path), endpoint="http://x:8000", api="completions",
                   client=ClientInfo(host="h", cpus=2, python="3.11", fleetcast_version="0.1.0"),
                   started_at=now, finished_at=now, seed=0, runs=runs)


# Instance: loopback RTT 0.05 ms. PrivateLink: RTT 0.85 ms. Level 16 only through PrivateLink.
INSTANCE = results("instance", [run(1, (50.0, 70.0), (1300.0, 1400.0), 0.05),
                                run(8, (55.0, 90.0), (1350.0, 1500.0), 0.05)])
PRIVATELINK = results("privatelink", [run(1, (52.5, 74.0), (1304.0, 1410.0), 0.85),
                                      run(8, (58.0, 89.0), (1356.0, 1520.5), 0.85, saturated=True),
                                      run(16, (70.0, 120.0), (1500.0, 1700.0), 0.85)])


def test_deltas_per_level_are_privatelink_minus_instance():
    shares, only_one = network_share(INSTANCE, PRIVATELINK)
    assert [s.level for s in shares] == ["concurrency=1", "concurrency=8"]
    one, eight = shares
    assert one.delta == pytest.approx({"ttft_p50": 2.5, "ttft_p99": 4.0, "e2e_p50": 4.0, "e2e_p99": 10.0})
    # A tail can be better through PrivateLink than on the instance: a difference of percentiles.
    assert eight.delta == pytest.approx({"ttft_p50": 3.0, "ttft_p99": -1.0, "e2e_p50": 6.0, "e2e_p99": 20.5})
    # The round trip PrivateLink adds is 0.85 - 0.05 = 0.8 ms; TTFT P50 beyond it: 2.5 - 0.8 and 3.0 - 0.8.
    assert one.ttft_p50_beyond_rtt_ms == pytest.approx(1.7)
    assert eight.ttft_p50_beyond_rtt_ms == pytest.approx(2.2)
    assert (one.privatelink_rtt_ms, one.instance_rtt_ms) == (0.85, 0.05)
    assert eight.saturated == (False, True)
    assert only_one == ["concurrency=16"]


def test_without_an_instance_rtt_the_whole_privatelink_rtt_counts():
    no_rtt = results("instance", [run(1, (50.0, 70.0), (1300.0, 1400.0), None)])
    (share,), _ = network_share(no_rtt, PRIVATELINK)
    assert share.ttft_p50_beyond_rtt_ms == pytest.approx(2.5 - 0.85)


def test_files_without_a_common_level_are_refused_with_both_level_lists():
    other = results("privatelink", [run(32, (1, 2), (3, 4), 1.0)])
    with pytest.raises(UserError, match=r"no load level.*concurrency=1, concurrency=8.*concurrency=32"):
        network_share(INSTANCE, other)


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    inst, pl = tmp_path / "inst.json", tmp_path / "pl.json"
    dump_results(INSTANCE, inst)
    dump_results(PRIVATELINK, pl)
    assert load_results(pl).labels.path == "privatelink"
    out_json = tmp_path / "share.json"
    assert main(["bench", "network-share", str(inst), str(pl), "--json", str(out_json)]) == 0
    captured = capsys.readouterr()
    assert "concurrency=1" in captured.out and "50.00 / 52.50 / +2.50" in captured.out
    assert "saturated: privatelink" in captured.out
    assert "concurrency=16" in captured.err
    data = json.loads(out_json.read_text())
    assert data["levels"][1]["delta"]["e2e_p99"] == pytest.approx(20.5)
    assert data["unmatched_levels"] == ["concurrency=16"]


def test_cli_warns_when_the_files_look_swapped(tmp_path, capsys):
    inst, pl = tmp_path / "inst.json", tmp_path / "pl.json"
    dump_results(INSTANCE, inst)
    dump_results(PRIVATELINK, pl)
    assert main(["bench", "network-share", str(pl), str(inst)]) == 0
    assert "first file is labeled path=privatelink" in capsys.readouterr().err


def test_cli_names_a_missing_file(tmp_path, capsys):
    assert main(["bench", "network-share", str(tmp_path / "nope.json"), str(tmp_path / "b.json")]) != 0
    assert "does not exist" in capsys.readouterr().err
