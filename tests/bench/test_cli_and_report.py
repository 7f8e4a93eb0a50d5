"""`fleetcast bench run|report` end to end, the results file contract, and bad input."""

import base64
import csv
import json
from pathlib import Path

import pytest

from fleetcast.bench.schema import SCHEMA_ID, load_results
from fleetcast.contract.errors import UserError
from scripts.cli import main


def test_run_writes_schema_json_csv_and_report(fast_server, tmp_path, capsys):
    out = tmp_path / "results.json"
    rc = main(["bench", "run", "--endpoint", fast_server.url, "--concurrency", "1,2", "--requests-per-level", "6",
               "--input-tokens", "16", "--output-tokens", "4", "--label", "backend=reference", "--label", "gpu=H200",
               "--slo-ttft-ms", "500", "--rtt-probe", "--out", str(out), "--report", str(tmp_path / "rep")])
    assert rc == 0
    raw = json.loads(out.read_text())
    assert raw["schema"] == SCHEMA_ID
    assert set(raw) >= {"labels", "endpoint", "api", "config_hash", "client", "started_at", "finished_at", "seed", "runs"}
    run0 = raw["runs"][0]
    assert set(run0) == {"load", "lengths", "summary", "records", "peers", "total", "repeat"}
    assert run0["peers"] is None and run0["total"] is None and run0["repeat"] is None and raw["packing"] is None  # one model alone
    assert set(run0["summary"]["ttft_ms"]) >= {"count", "mean", "p50", "p90", "p95", "p99", "min", "max", "p99_ci", "tail_note"}
    assert run0["records"][0].keys() >= {"start_s", "ttft_ms", "e2e_ms", "itl_ms", "input_tokens", "output_tokens",
                                         "ok", "error", "chunk_gaps_ms"}
    res = load_results(out)
    assert [r.load.concurrency for r in res.runs] == [1, 2]
    assert res.labels.backend == "reference" and res.labels.gpu == "H200"
    assert res.runs[0].summary.goodput_rps == pytest.approx(res.runs[0].summary.request_throughput_rps)
    assert res.runs[0].summary.network_rtt_ms is not None

    rows = list(csv.DictReader(out.with_suffix(".csv").open()))
    assert [row["concurrency"] for row in rows] == ["1", "2"] and rows[0]["label_gpu"] == "H200"

    html = (tmp_path / "rep" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3 and "src='http" not in html
    png = html.split("data:image/png;base64,")[1].split("'")[0]
    assert base64.b64decode(png)[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "rep" / "latency_vs_load.png").stat().st_size > 1000

    # `report` re-renders from files and compares several results: its pages, not its pictures, are read here (the
    # figures are built, a failing plot still fails; rasterizing two series is tests/bench/test_results_say_what_
    # they_measured.py's), so its saves write placeholders, as tests/conftest.py's `unrasterized` does.
    from matplotlib.figure import Figure

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Figure, "savefig", lambda fig, path, *a, **k: Path(path).write_bytes(b""))
        assert main(["bench", "report", str(out), str(out), "--out", str(tmp_path / "rep2")]) == 0
    assert (tmp_path / "rep2" / "report.html").is_file()


@pytest.mark.parametrize("args, message", [
    (["--concurrency", "1,0"], "--concurrency"),
    (["--concurrency", "1", "--rate", "2"], "exactly one of"),
    ([], "exactly one of"),
    (["--concurrency", "1", "--label", "colour=red"], "--label 'colour=red'"),
    (["--concurrency", "1", "--label", "backend=vllm"], "backend"),
    (["--concurrency", "1", "--input-tokens", "lots"], "--input-tokens"),
    (["--rate", "fast"], "--rate"),
    (["--concurrency", "1", "--header", "nocolon"], "--header"),
    (["--concurrency", "1", "--requests-per-level", "0"], "--requests-per-level"),
])
def test_bad_arguments_give_one_clear_line(args, message, tmp_path, capsys):
    rc = main(["bench", "run", "--endpoint", "http://127.0.0.1:9", "--out", str(tmp_path / "r.json"), *args])
    err = capsys.readouterr().err
    assert rc == 1
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_results_loader_rejects_other_files(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"schema": "something/v9"}))
    with pytest.raises(UserError, match="expected 'fleetcast.bench/v1'"):
        load_results(bad)
    bad.write_text(json.dumps({"schema": SCHEMA_ID, "endpoint": "e"}))
    with pytest.raises(UserError, match="api"):
        load_results(bad)


def test_results_reader_ignores_fields_added_later(fast_server, tmp_path):
    out = tmp_path / "r.json"
    main(["bench", "run", "--endpoint", fast_server.url, "--concurrency", "1", "--requests-per-level", "2",
          "--output-tokens", "2", "--out", str(out), "--no-records", "--quiet"])
    data = json.loads(out.read_text())
    data["future_field"] = 1
    data["runs"][0]["summary"]["future_metric"] = {"x": 1}
    out.write_text(json.dumps(data))
    assert load_results(out).runs[0].records == []


def test_ctrl_c_keeps_the_finished_levels_marked_interrupted(fast_server, tmp_path):
    """Ctrl-C after a level finished: the file holds that level, says the run was interrupted and which levels
    were cut or never ran, and the command exits 130 (128 + SIGINT) without a traceback."""
    import os
    import signal
    import subprocess
    import sys

    from tests.signals import default_sigint

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "results.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "scripts.cli", "bench", "run", "--endpoint", fast_server.url, "--concurrency", "1,2,4",
         "--duration", "2", "--input-tokens", "16", "--output-tokens", "4", "--out", str(out)],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=default_sigint)
    seen = []
    for line in proc.stderr:  # bounded: the run ends by itself after three 2 s levels; the signal, sent as
        # the first level's line is read, lands well inside the second level's 2 s
        seen.append(line)
        if line.startswith("concurrency 1:"):
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 130, "".join(seen) + rest
    assert "Traceback" not in rest and "interrupted: Ctrl-C during concurrency 2" in rest
    res = load_results(out)
    assert [r.load.concurrency for r in res.runs] == [1]
    assert res.interrupted.startswith("Ctrl-C during concurrency 2: 1 of 3 level(s) finished")
    assert "not run: concurrency 4" in res.interrupted
    assert out.with_suffix(".csv").is_file()
