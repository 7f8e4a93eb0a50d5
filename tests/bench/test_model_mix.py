"""`fleetcast bench run --model-mix`: several models through one endpoint at once.
Each level is split by the shares, every model is driven with its own request shape and the body's
`model` set, one results file per model records the packing and its peers' load, and the report
gives every figure per model and in total. Bad mixes are one-line errors naming --model-mix."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetcast.bench.accuracy import TestServerProcess
from fleetcast.bench.cli import mix_out_path
from fleetcast.bench.mix import (
    parse_model_mix,
    request_split_note,
    smallest_concurrency,
    split_counts,
    split_warnings,
)
from fleetcast.bench.report import csv_rows, series_names, with_totals, write_report
from fleetcast.bench.schema import SCHEMA_REVISION, load_results
from fleetcast.bench.testserver import Timings
from fleetcast.contract.errors import UserError
from scripts.cli import main
from tests.bench.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "multi-model" / "fleet.yaml"  # pool l40s: gpt2-xl x1 (KV 8), qwen2.5-0.5b x2 (KV 4), qwen2.5-3b
MIX = "gpt2-xl:0.7,qwen2.5-0.5b:0.3"


@pytest.fixture(scope="module")
def two_models():
    """A loopback server answering gpt2-xl and qwen2.5-0.5b, each with its own timings; others get 404."""
    timings = Timings(ttft_ms=5, itl_ms=1, models=(("gpt2-xl", 12.0, 2.0), ("qwen2.5-0.5b", 4.0, 1.0)))
    with TestServerProcess(free_port(), timings) as server:
        yield server


def _run(server, tmp_path, *extra, mix=MIX, load=("--concurrency", "4,8")) -> tuple[int, Path]:
    out = tmp_path / "r.json"
    rc = main(["bench", "run", "--endpoint", server.url, "--model-mix", mix, *load, "--requests-per-level", "40",
               "--warmup", "1", "--input-tokens", "24", "--output-tokens", "6", "--quiet", "--out", str(out), *extra])
    return rc, out


def test_each_model_gets_its_share_its_own_shape_and_its_own_file(two_models, tmp_path):
    two_models.reset()
    rc, out = _run(two_models, tmp_path, "--model-input-tokens", "qwen2.5-0.5b=12",
                   "--model-output-tokens", "gpt2-xl=9", "--config", str(CONFIG), "--pool", "l40s")
    assert rc == 0
    xl = load_results(mix_out_path(out, "gpt2-xl"))
    qwen = load_results(mix_out_path(out, "qwen2.5-0.5b"))
    assert (xl.revision, xl.labels.model, qwen.labels.model) == (SCHEMA_REVISION, "gpt2-xl", "qwen2.5-0.5b")
    # Concurrency 4 -> 0.7 x 4 = 2.8 and 1.2: 3 and 1; 8 -> 5.6 and 2.4, largest remainder: 6 and 2.
    assert [r.load.concurrency for r in xl.runs] == [3, 6]
    assert [r.load.concurrency for r in qwen.runs] == [1, 2]
    assert [r.total.load.concurrency for r in xl.runs] == [4, 8]
    # Each model's own request shape, and what the server saw under each `model` agrees with it.
    assert (xl.request.input_tokens, xl.request.output_tokens) == ("24", "9")
    assert (qwen.request.input_tokens, qwen.request.output_tokens) == ("12", "6")
    truth = [t for t in two_models.truth()]
    by_model: dict[str, list[dict]] = {}
    for t in truth:
        by_model.setdefault(t["model"], []).append(t)
    assert {t["output_tokens"] for t in by_model["gpt2-xl"]} == {9}
    assert {t["output_tokens"] for t in by_model["qwen2.5-0.5b"]} == {6}
    recorded = {m: sum(r.summary.requests for r in res.runs) for m, res in (("gpt2-xl", xl), ("qwen2.5-0.5b", qwen))}
    # The server also answered the warm-up (one request per model) and calibration probes (not streamed).
    assert {m: len(v) - 1 for m, v in by_model.items()} == recorded
    # One shared request count per level: the models stop together.
    assert [a.summary.requests + b.summary.requests for a, b in zip(xl.runs, qwen.runs)] == [40, 40]


def test_the_files_record_the_packing_and_each_runs_peer_load(two_models, tmp_path):
    rc, out = _run(two_models, tmp_path, "--config", str(CONFIG), "--pool", "l40s")
    assert rc == 0
    xl, qwen = (load_results(mix_out_path(out, m)) for m in ("gpt2-xl", "qwen2.5-0.5b"))
    # The pool's serves (examples/multi-model/fleet.yaml, pool l40s) and its instance type and GPU.
    assert xl.packing == qwen.packing
    assert xl.packing.instance_type == "g6e.2xlarge" and xl.packing.gpu == "L40S"
    assert [(s.model, s.copies, s.kv_cache_gb) for s in xl.packing.serves] == [
        ("gpt2-xl", 1, 8.0), ("qwen2.5-0.5b", 2, 4.0), ("qwen2.5-3b", 1, 4.0)]
    # Each model at its own engine's precision (gpt2-xl int8_wo, the Qwens bf16 in that config), in its own
    # file's label and in every file's packing: a co-located file says what its peers ran at.
    assert [s.precision for s in xl.packing.serves] == ["int8_wo", "bf16", "bf16"]
    assert (xl.labels.precision, qwen.labels.precision) == ("int8_wo", "bf16")
    assert xl.labels.instance_type == "g6e.2xlarge"
    assert xl.model_mix.shares == {"gpt2-xl": 0.7, "qwen2.5-0.5b": 0.3}
    for a, b in zip(xl.runs, qwen.runs):
        # Each model's peers: the other's measured mean concurrency in the same run; the packed model the mix
        # did not drive was loaded and idle.
        assert a.peers == {"qwen2.5-0.5b": b.summary.mean_concurrency, "qwen2.5-3b": 0.0}
        assert b.peers == {"gpt2-xl": a.summary.mean_concurrency, "qwen2.5-3b": 0.0}
        # The total is every model's requests together.
        assert a.total == b.total
        assert a.total.summary.requests == a.summary.requests + b.summary.requests
        assert a.total.summary.ttft_ms.count == a.summary.ttft_ms.count + b.summary.ttft_ms.count
        # Both models' first and last requests lie inside the total's span.
        assert a.total.summary.duration_s >= max(a.summary.duration_s, b.summary.duration_s)


def test_model_precision_labels_each_models_file_when_no_pool_says_it(two_models, tmp_path):
    rc, out = _run(two_models, tmp_path, "--packing", "gpt2-xl:1,qwen2.5-0.5b:1", "--label", "precision=fp16",
                   "--model-precision", "qwen2.5-0.5b=bf16")
    assert rc == 0
    xl, qwen = (load_results(mix_out_path(out, m)) for m in ("gpt2-xl", "qwen2.5-0.5b"))
    # The flag for qwen2.5-0.5b; --label precision for the model without one (one label for all, as before).
    assert (xl.labels.precision, qwen.labels.precision) == ("fp16", "bf16")
    assert [(s.model, s.precision) for s in qwen.packing.serves] == [("gpt2-xl", "fp16"), ("qwen2.5-0.5b", "bf16")]
    # The total holds both models' requests: its precision is each model's, not the last file's.
    total = with_totals([xl, qwen])[-1]
    assert total.labels.model.startswith("mix total") and total.labels.precision == "gpt2-xl fp16 + qwen2.5-0.5b bf16"
    same = [f.model_copy(update={"labels": f.labels.model_copy(update={"precision": "fp16"})}) for f in (xl, qwen)]
    assert with_totals(same)[-1].labels.precision == "fp16"


def test_a_rate_level_splits_the_arrival_rate(two_models, tmp_path):
    rc, out = _run(two_models, tmp_path, "--packing", "gpt2-xl:1:20,qwen2.5-0.5b:1", "--label", "gpu=H200",
                   load=("--rate", "40", "--arrival", "constant"))
    assert rc == 0
    xl, qwen = (load_results(mix_out_path(out, m)) for m in ("gpt2-xl", "qwen2.5-0.5b"))
    assert [(r.load.mode, r.load.rate_rps) for r in xl.runs] == [("rate", pytest.approx(28.0))]
    assert [(r.load.mode, r.load.rate_rps) for r in qwen.runs] == [("rate", pytest.approx(12.0))]
    assert xl.runs[0].total.load.rate_rps == 40
    assert (xl.runs[0].summary.requests, qwen.runs[0].summary.requests) == (28, 12)  # 40 requests split 0.7/0.3
    assert xl.packing.gpu == "H200" and [s.kv_cache_gb for s in xl.packing.serves] == [20.0, None]


def test_report_and_csv_give_every_figure_per_model_and_in_total(two_models, tmp_path, monkeypatch, unrasterized):
    rc, out = _run(two_models, tmp_path, "--packing", "gpt2-xl:1,qwen2.5-0.5b:1", "--slo-ttft-ms", "500",
                   "--model-input-tokens", "qwen2.5-0.5b=12", "--report", str(tmp_path / "rep"))
    assert rc == 0
    files = [load_results(mix_out_path(out, m)) for m in ("gpt2-xl", "qwen2.5-0.5b")]
    rows = csv_rows(files)
    assert [r["series"] for r in rows] == ["gpt2-xl"] * 2 + ["qwen2.5-0.5b"] * 2 + [
        "mix total (gpt2-xl 0.7 + qwen2.5-0.5b 0.3)"] * 2
    total = rows[-1]
    assert total["concurrency"] == 8 and total["requests"] == rows[1]["requests"] + rows[3]["requests"]
    assert (rows[1]["concurrency"], rows[1]["mix_concurrency"]) == (6, 8)
    # The run's own CSV is the same rows; the report renders the models' different shapes together without
    # --allow-mixed (one mix run: each model's own shape by design) and draws a goodput plot (SLO given).
    assert len((out.with_suffix(".csv")).read_text().strip().splitlines()) == 1 + len(rows)
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "mix total (gpt2-xl 0.7 + qwen2.5-0.5b 0.3)" in page and "c=6 [c=8]" in page
    assert {p.name for p in (tmp_path / "rep").glob("*.png")} == {
        "latency_vs_load.png", "throughput_vs_latency.png", "goodput_vs_load.png"}
    # A total beside only part of a mix's files would read as their sum: left out.
    assert series_names(files[:1]) == ["gpt2-xl"] and len(csv_rows(files[:1])) == 2
    write_report(files[:1], tmp_path / "one")


def test_ctrl_c_keeps_the_levels_every_model_finished(two_models, tmp_path):
    """As a one-model run does (tests/bench/test_cli_and_report.py): the finished levels, marked, exit 130."""
    import os
    import signal
    import subprocess
    import sys

    from tests.signals import default_sigint

    out = tmp_path / "r.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "scripts.cli", "bench", "run", "--endpoint", two_models.url, "--model-mix", MIX,
         "--packing", "gpt2-xl:1,qwen2.5-0.5b:1", "--concurrency", "4,8,16", "--duration", "2", "--input-tokens", "8",
         "--output-tokens", "4", "--out", str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=default_sigint)
    seen = []
    for line in proc.stderr:  # bounded: the run ends by itself after three 2 s levels; the signal, sent as
        # the first level's line is read, lands well inside the second level's 2 s
        seen.append(line)
        if line.startswith("  qwen2.5-0.5b: concurrency 1:"):  # the last line of the first level
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 130, "".join(seen) + rest
    assert "Traceback" not in rest and "interrupted: Ctrl-C during concurrency 8" in rest
    for model in ("gpt2-xl", "qwen2.5-0.5b"):
        res = load_results(mix_out_path(out, model))
        assert [r.total.load.concurrency for r in res.runs] == [4]
        assert res.interrupted.startswith("Ctrl-C during concurrency 8: 1 of 3 level(s) finished")


@pytest.mark.parametrize("spec, said", [
    ("gpt2-xl:0.7,qwen2.5-0.5b:0.2", "the shares sum to 0.9, not 1"),
    ("gpt2-xl:1", "name at least two models"),
    ("gpt2-xl:0.5,gpt2-xl:0.5", "gpt2-xl is named twice"),
    ("gpt2-xl=0.5,qwen:0.5", "is not MODEL:SHARE"),
    ("gpt2 xl:0.5,qwen:0.5", "'gpt2 xl' is not a model id"),
    ("gpt2-xl:half,qwen2.5-0.5b:0.5", "share 'half' of gpt2-xl is not a number"),
    ("gpt2-xl:0,qwen2.5-0.5b:1", "must be above 0"),
])
def test_a_bad_mix_is_one_line_naming_model_mix(spec, said):
    with pytest.raises(UserError) as err:
        parse_model_mix(spec)
    assert "--model-mix" in str(err.value) and said in str(err.value)


@pytest.mark.parametrize("extra, said", [
    (["--model-mix", "gpt2-xl:0.7,llama:0.3", "--config", str(CONFIG), "--pool", "l40s"],
     "--model-mix: llama is not a model of the config (models: gpt2-xl, qwen2.5-0.5b, qwen2.5-3b)"),
    (["--model-mix", "gpt2-xl:0.5,qwen2.5-0.5b:0.3", "--packing", "gpt2-xl:1,qwen2.5-0.5b:1"],
     "--model-mix 'gpt2-xl:0.5,qwen2.5-0.5b:0.3': the shares sum to 0.8, not 1"),
    (["--model-mix", "gpt2-xl:0.7,qwen2.5-3b:0.3", "--packing", "gpt2-xl:1,qwen2.5-0.5b:1"],
     "--model-mix: qwen2.5-3b is not served by --packing (it serves gpt2-xl, qwen2.5-0.5b)"),
    (["--model-mix", MIX], "--model-mix records what shared the instance: give --pool NAME (with --config) or "
                           "--packing"),
    (["--model-mix", MIX, "--pool", "l40s"], "--pool needs --config"),
    (["--model-mix", MIX, "--config", str(CONFIG), "--pool", "gpu"], "--pool 'gpu': no such pool in the config "
                                                                     "(pools: l4, l40s)"),
    (["--model-mix", MIX, "--model", "gpt2-xl", "--packing", "gpt2-xl:1,qwen2.5-0.5b:1"],
     "--model and --model-mix exclude each other"),
    (["--model-mix", MIX, "--packing", "gpt2-xl:one"], "--packing: 'gpt2-xl:one': COPIES is a whole number"),
    (["--model-mix", MIX, "--packing", "gpt2-xl:1,qwen2.5-0.5b:1", "--model-input-tokens", "qwen2.5-3b=8"],
     "--model-input-tokens 'qwen2.5-3b=8': qwen2.5-3b is not in --model-mix (gpt2-xl, qwen2.5-0.5b)"),
    (["--model-mix", MIX, "--config", str(CONFIG), "--pool", "l40s", "--model-input-tokens", "gpt2-xl=1024"],
     "--model-input-tokens for gpt2-xl: up to 1024 tokens, above the model's max_input_len 768"),
    (["--packing", "gpt2-xl:1"], "--packing with one model needs --model"),
    (["--model-mix", MIX, "--config", str(CONFIG), "--pool", "l40s", "--label", "precision=bf16"],
     "--label precision=bf16: the --pool's engine builds gpt2-xl at int8_wo (the config's engine precision); drop "
     "the label, each model's precision is the pool's"),
    (["--model", "gpt2-xl", "--config", str(CONFIG), "--pool", "l40s", "--label", "precision=fp16"],
     "--label precision=fp16: the --pool's engine builds gpt2-xl at int8_wo"),
    (["--model", "qwen", "--packing", "gpt2-xl:1"], "--model: qwen is not served by --packing (it serves gpt2-xl)"),
    (["--model-endpoint", "gpt2-xl=http://127.0.0.1:9"], "--model-endpoint only go with --model-mix"),
    (["--model-precision", "gpt2-xl=fp16"], "--model-precision only go with --model-mix"),
    (["--model-mix", MIX, "--packing", "gpt2-xl:1,qwen2.5-0.5b:1", "--model-precision", "gpt2-xl=fp32"],
     "--model-precision gpt2-xl=fp32: 'fp32' is not a precision; choose one of fp16, bf16, int8_wo, int8_sq, fp8, "
     "int4_wo, nvfp4"),
    (["--model-mix", MIX, "--packing", "gpt2-xl:1,qwen2.5-0.5b:1", "--model-precision", "qwen2.5-3b=fp16"],
     "--model-precision 'qwen2.5-3b=fp16': qwen2.5-3b is not in --model-mix (gpt2-xl, qwen2.5-0.5b)"),
    (["--model-mix", MIX, "--config", str(CONFIG), "--pool", "l40s", "--model-precision", "gpt2-xl=fp16"],
     "--model-precision gpt2-xl=fp16: the --pool's engine builds gpt2-xl at int8_wo (the config's engine "
     "precision); drop the flag or use --packing"),
    (["--model-mix", MIX, "--packing", "gpt2-xl:1,qwen2.5-0.5b:1", "--model-endpoint", "gpt2-xl=ftp://x"],
     "--model-endpoint gpt2-xl=ftp://x: use an http:// or https:// URL"),
])
def test_bad_mix_arguments_are_one_line_errors(extra, said, capsys, tmp_path):
    rc = main(["bench", "run", "--endpoint", "http://127.0.0.1:9", "--concurrency", "4",
               "--out", str(tmp_path / "r.json"), *extra])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert said in err


def test_a_level_below_the_number_of_models_is_refused(capsys, tmp_path):
    rc = main(["bench", "run", "--endpoint", "http://127.0.0.1:9", "--concurrency", "1,4", "--model-mix", MIX,
               "--packing", "gpt2-xl:1,qwen2.5-0.5b:1", "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert rc == 1 and "--concurrency 1: qwen2.5-0.5b's share 0.3 is 0.3 of a worker" in err
    assert "2 models need at least 2 workers; use --concurrency 4 or more, or --rate" in err


def test_a_level_too_low_to_hold_the_shares_is_refused_with_what_it_would_run(capsys, tmp_path):
    """Issue 32: 3 workers for 0.7/0.2/0.1 ran one worker each (33/33/33), and nothing said so."""
    rc = main(["bench", "run", "--endpoint", "http://127.0.0.1:9", "--concurrency", "3,10",
               "--model-mix", "gpt2-xl:0.7,qwen2.5-0.5b:0.2,qwen2.5-3b:0.1",
               "--packing", "gpt2-xl:1,qwen2.5-0.5b:1,qwen2.5-3b:1", "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert rc == 1 and len(err.strip().splitlines()) == 1
    assert ("--concurrency 3: qwen2.5-3b's share 0.1 is 0.3 of a worker and each model needs a whole one, so the "
            "split would be 1/1/1 workers (33%/33%/33% instead of 70%/20%/10%); use --concurrency 10 or more") in err


@pytest.mark.parametrize("shares, least", [
    ({"a": 0.7, "b": 0.2, "c": 0.1}, 10), ({"a": 0.7, "b": 0.3}, 4), ({"a": 0.5, "b": 0.5}, 2),
    ({"a": 0.9, "b": 0.05, "c": 0.05}, 20),
    ({"a": 0.333333, "b": 0.333333, "c": 0.333334}, 3)])  # a bench instance's equal shares (stacks/bench_fleet.py)
def test_the_smallest_level_gives_every_model_its_share_of_a_worker(shares, least):
    assert smallest_concurrency(shares) == least
    assert all(least * s >= 0.999 for s in shares.values())
    assert any((least - 1) * s < 1 for s in shares.values())


def test_a_closed_loop_request_split_off_the_shares_is_warned():
    shares = {"gpt2-xl": 0.7, "qwen2.5-0.5b": 0.2, "qwen2.5-3b": 0.1}
    note = request_split_note({"gpt2-xl": 30, "qwen2.5-0.5b": 50, "qwen2.5-3b": 20}, shares)
    assert note.startswith("requests split 30%/50%/20% against the mix's 70%/20%/10% (gpt2-xl, qwen2.5-0.5b, "
                           "qwen2.5-3b)") and "--rate splits the requests by the shares" in note
    assert request_split_note({"gpt2-xl": 72, "qwen2.5-0.5b": 19, "qwen2.5-3b": 9}, shares) is None


def test_bench_run_warns_of_each_level_whose_requests_split_off_the_shares(two_models, tmp_path, capsys):
    """What is warned is computed from the files' own request counts: the warning and the files agree,
    whatever the machine's load made the split."""
    rc, out = _run(two_models, tmp_path, "--packing", "gpt2-xl:1,qwen2.5-0.5b:1")
    assert rc == 0
    files = [load_results(mix_out_path(out, m)) for m in ("gpt2-xl", "qwen2.5-0.5b")]
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: concurrency")]
    expected = [f"warning: {line}" for line in split_warnings(files)]
    assert warned == expected
    for i, run in enumerate(files[0].runs):
        requests = {f.labels.model: f.runs[i].summary.requests for f in files}
        off = max(abs(requests[m] / sum(requests.values()) - s) for m, s in {"gpt2-xl": 0.7, "qwen2.5-0.5b": 0.3}.items())
        assert any(w.startswith(f"warning: concurrency {run.total.load.concurrency}:") for w in warned) is (off > 0.05)


def test_a_trace_or_level_mix_is_refused(capsys, tmp_path):
    rc = main(["bench", "run", "--endpoint", "http://127.0.0.1:9", "--mix", "2:1", "--model-mix", MIX,
               "--packing", "gpt2-xl:1,qwen2.5-0.5b:1", "--out", str(tmp_path / "r.json")])
    assert rc == 1 and "--model-mix takes --concurrency or --rate" in capsys.readouterr().err


def test_a_model_the_endpoint_does_not_serve_is_named(two_models, tmp_path, capsys):
    rc, out = _run(two_models, tmp_path, "--packing", "gpt2-xl:1,qwen2.5-3b:1", mix="gpt2-xl:0.5,qwen2.5-3b:0.5")
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert (f"--model-mix: --endpoint {two_models.url} does not serve qwen2.5-3b to this caller "
            "(GET /v1/models lists gpt2-xl, qwen2.5-0.5b)") in err
    assert not list(tmp_path.glob("r*"))  # nothing written


@pytest.mark.parametrize("total, shares, expected", [
    (2, {"a": 0.7, "b": 0.3}, {"a": 1, "b": 1}),
    (8, {"a": 0.7, "b": 0.3}, {"a": 6, "b": 2}),
    (10, {"a": 0.7, "b": 0.2, "c": 0.1}, {"a": 7, "b": 2, "c": 1}),
    (3, {"a": 0.9, "b": 0.05, "c": 0.05}, {"a": 1, "b": 1, "c": 1}),
    (100, {"a": 0.5, "b": 0.5}, {"a": 50, "b": 50}),
])
def test_a_level_is_split_by_largest_remainder_with_one_worker_each(total, shares, expected):
    assert split_counts(total, shares) == expected
    assert sum(split_counts(total, shares).values()) == total


def test_each_model_can_be_driven_at_its_own_server(tmp_path):
    """--model-endpoint: each model's engine process directly (as a bench instance does, behind no gateway)."""
    with TestServerProcess(free_port(), Timings(models=(("gpt2-xl", 6.0, 1.0),))) as xl, \
            TestServerProcess(free_port(), Timings(models=(("qwen2.5-0.5b", 2.0, 1.0),))) as qwen:
        out = tmp_path / "r.json"
        rc = main(["bench", "run", "--endpoint", xl.url, "--model-mix", MIX, "--concurrency", "4",
                   "--requests-per-level", "20", "--warmup", "1", "--input-tokens", "8", "--output-tokens", "3",
                   "--model-endpoint", f"qwen2.5-0.5b={qwen.url}", "--packing", "gpt2-xl:1,qwen2.5-0.5b:1",
                   "--quiet", "--out", str(out)])
        assert rc == 0
        xl_truth, qwen_truth = xl.truth(), qwen.truth()
    xl_res, qwen_res = (load_results(mix_out_path(out, m)) for m in ("gpt2-xl", "qwen2.5-0.5b"))
    # Each server saw its own model's requests only (plus one warm-up each), as many as its file records.
    assert {t["model"] for t in xl_truth} == {"gpt2-xl"} and {t["model"] for t in qwen_truth} == {"qwen2.5-0.5b"}
    assert len(xl_truth) - 1 == xl_res.runs[0].summary.requests
    assert len(qwen_truth) - 1 == qwen_res.runs[0].summary.requests


def test_one_model_on_a_packed_instance_records_its_peers_idle(two_models, tmp_path):
    out = tmp_path / "alone.json"
    rc = main(["bench", "run", "--endpoint", two_models.url, "--model", "gpt2-xl", "--concurrency", "1,2",
               "--requests-per-level", "6", "--warmup", "1", "--input-tokens", "8", "--output-tokens", "3",
               "--config", str(CONFIG), "--pool", "l40s", "--quiet", "--out", str(out)])
    assert rc == 0
    res = load_results(out)
    assert res.labels.model == "gpt2-xl" and res.packing.models() == ["gpt2-xl", "qwen2.5-0.5b", "qwen2.5-3b"]
    # Its precision and its peers' from the pool's engines, the label set from them (no --label precision given).
    assert [s.precision for s in res.packing.serves] == ["int8_wo", "bf16", "bf16"] and res.labels.precision == "int8_wo"
    assert all(r.peers == {"qwen2.5-0.5b": 0.0, "qwen2.5-3b": 0.0} for r in res.runs)
    assert res.model_mix is None and all(r.total is None for r in res.runs)


def test_repeats_run_each_level_n_times_and_the_files_record_them_and_the_gpu_sharing(two_models, tmp_path):
    """Issue 33 §3: each co-located point measured several times, the mode it ran under recorded (revision 7)."""
    rc, out = _run(two_models, tmp_path, "--packing", "gpt2-xl:1,qwen2.5-0.5b:1", "--gpu-sharing", "mps",
                   "--repeats", "3", load=("--concurrency", "4"))
    assert rc == 0
    for model in ("gpt2-xl", "qwen2.5-0.5b"):
        res = load_results(mix_out_path(out, model))
        assert res.revision == SCHEMA_REVISION >= 7
        assert res.packing.gpu_sharing == "mps" and res.packing.text().endswith("(mps)")
        assert [(r.total.load.concurrency, r.repeat) for r in res.runs] == [(4, 1), (4, 2), (4, 3)]


def test_without_gpu_sharing_a_packing_by_hand_records_time_slicing(two_models, tmp_path):
    rc, out = _run(two_models, tmp_path, "--packing", "gpt2-xl:1,qwen2.5-0.5b:1", load=("--concurrency", "4"))
    assert rc == 0
    res = load_results(mix_out_path(out, "gpt2-xl"))
    assert res.packing.gpu_sharing == "time_slicing" and [r.repeat for r in res.runs] == [None]


@pytest.mark.parametrize("extra, said", [
    (("--repeats", "0"), "--repeats: 0 is out of range"),
    (("--gpu-sharing", "mps"), "--gpu-sharing describes a packing"),
])
def test_bad_repeats_and_a_mode_without_a_packing_are_one_line_errors(extra, said, capsys, tmp_path):
    rc = main(["bench", "run", "--endpoint", "http://127.0.0.1:9", "--concurrency", "4", "--model", "gpt2-xl",
               *extra, "--out", str(tmp_path / "r.json")])
    assert rc == 1 and said in capsys.readouterr().err


def test_a_pool_records_its_own_gpu_sharing_and_a_contradicting_flag_is_refused(tmp_path):
    import copy

    from ruamel.yaml import YAML

    from fleetcast.bench.mix import packing_from_args, packing_of_pool
    from fleetcast.config import load_config

    yaml = YAML()
    doc = yaml.load(Path("examples/multi-model/fleet.yaml"))
    pool = doc["regions"][0]["pools"][0]
    pool["gpu_sharing"] = "mps"
    path = tmp_path / "fleet.yaml"
    yaml.dump(copy.deepcopy(doc), path)
    cfg = load_config(path)
    assert packing_of_pool(cfg, pool["name"]).gpu_sharing == "mps"

    from types import SimpleNamespace

    args = SimpleNamespace(pool=pool["name"], packing=None, gpu_sharing="time_slicing")
    with pytest.raises(UserError, match=r"--gpu-sharing time_slicing: pool .* shares its GPU by mps"):
        packing_from_args(args, cfg, None)
