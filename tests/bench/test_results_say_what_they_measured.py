"""Results and reports say what was measured: the load a run really had, the SLOs and request
shape behind its figures, the server's reason for failures; plots that read as labelled; no
comparison across request shapes unless asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetcast.bench.accuracy import TestServerProcess
from fleetcast.bench.client import error_message
from fleetcast.bench.distributions import parse_distribution
from fleetcast.bench.report import series_name
from fleetcast.bench.runner import Bench, BenchOptions, Level
from fleetcast.bench.schema import ERROR_DETAIL_MAX_CHARS, SCHEMA_REVISION, dump_results, load_results
from fleetcast.bench.testserver import Timings
from scripts.cli import main
from tests.bench.conftest import free_port
from tests.bench.test_network_share import INSTANCE, PRIVATELINK

ROOT = Path(__file__).resolve().parents[2]


def test_a_level_the_request_count_cannot_reach_is_refused(tmp_path, capsys):
    rc = main(["bench", "run", "--endpoint", "http://127.0.0.1:9", "--concurrency", "1,64",
               "--requests-per-level", "8", "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "--requests-per-level 8" in err and "--concurrency level(s) 64" in err
    # The default count (100) is checked too.
    assert main(["bench", "run", "--endpoint", "http://127.0.0.1:9", "--concurrency", "128",
                 "--out", str(tmp_path / "r.json")]) == 1
    assert "--requests-per-level 100" in capsys.readouterr().err


def test_a_run_below_its_concurrency_is_marked_in_results_and_report(fast_server, tmp_path, unrasterized):
    # Library callers (and --duration runs) are not stopped by the CLI check: the run says so instead.
    opts = BenchOptions(endpoint=fast_server.url, input_tokens=parse_distribution("8", "i"),
                        output_tokens=parse_distribution("4", "o"), levels=[Level("concurrency", concurrency=8)],
                        requests_per_level=3, warmup=0)
    res = Bench(opts).run()
    note = res.runs[0].summary.load_note
    assert note and "only 3 request(s) ran at concurrency 8" in note
    from fleetcast.bench.report import write_report

    page = write_report([res], tmp_path / "rep").read_text()
    assert "LOAD NOT REACHED" in page


def test_results_and_report_header_record_slos_and_request_shape(fast_server, tmp_path, unrasterized):
    out = tmp_path / "r.json"
    assert main(["bench", "run", "--endpoint", fast_server.url, "--concurrency", "1,2", "--requests-per-level", "4",
                 "--input-tokens", "16", "--output-tokens", "normal:6,1", "--slo-ttft-ms", "500", "--slo-itl-ms", "40",
                 "--label", "gpu=H200", "--label", "backend=reference", "--out", str(out), "--quiet",
                 "--report", str(tmp_path / "rep")]) == 0
    raw = json.loads(out.read_text())
    assert raw["revision"] == SCHEMA_REVISION and raw["provenance"] == "measured"
    assert raw["slo"] == {"ttft_ms": 500.0, "itl_ms": 40.0, "e2e_ms": None}
    assert raw["request"]["input_tokens"] == "16" and raw["request"]["output_tokens"] == "normal:6,1"
    assert raw["request"]["prompts"].startswith("words") and raw["request"]["force_output"] is True
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "TTFT &lt;= 500 ms, ITL &lt;= 40 ms" in page
    assert "input 16 tokens, output normal:6,1 tokens, prompts approximate" in page
    # Labels read as key=value, never as a Python dict.
    assert "gpu=H200, backend=reference" in page and "{&#x27;" not in page and "{'" not in page


def test_the_servers_error_text_is_kept_bounded(tmp_path):
    timings = Timings(ttft_ms=2, itl_ms=1, max_output_tokens=8)
    with TestServerProcess(free_port(), timings) as server:
        out = tmp_path / "r.json"
        assert main(["bench", "run", "--endpoint", server.url, "--concurrency", "2", "--requests-per-level", "12",
                     "--input-tokens", "8", "--output-tokens", "4:0.5,32:0.5", "--warmup", "0", "--seed", "3",
                     "--out", str(out), "--quiet", "--report", str(tmp_path / "rep")]) == 0
    res = load_results(out)
    failed = [r for r in res.runs[0].records if not r.ok]
    assert failed and all(r.error == "http_400" for r in failed)
    assert all("max_tokens (32) exceeds this server's limit of 8" in r.error_detail for r in failed)
    assert res.runs[0].summary.error_messages["http_400"].startswith("max_tokens (32)")
    assert "http_400: " in (page := (tmp_path / "rep" / "report.html").read_text()) and "exceeds this server" in page


@pytest.mark.parametrize("body, said", [
    # TensorRT-LLM's ErrorResponse (tensorrt_llm/serve/openai_protocol.py): message at the top level.
    (b'{"object": "error", "message": "prompt too long", "type": "BadRequestError", "param": null, "code": 400}',
     "prompt too long"),
    # OpenAI / vLLM: nested under "error".
    (b'{"error": {"message": "model not found", "type": "NotFoundError", "code": 404}}', "model not found"),
    (b"<html><body>502 Bad\n  Gateway</body></html>", "<html><body>502 Bad Gateway</body></html>"),
    (b"", None),
])
def test_error_message_reads_both_error_shapes(body, said):
    assert error_message(body) == said


def test_error_message_is_bounded():
    text = error_message(json.dumps({"message": "x" * 5000}).encode())
    assert len(text) == ERROR_DETAIL_MAX_CHARS and text.endswith("...")


def _shape(res, input_mean, output_mean):
    runs = [r.model_copy(update={"lengths": r.lengths.model_copy(update={
        "input_mean": input_mean, "output_mean": output_mean,
        "spec": f"input={input_mean:g} output={output_mean:g} prompts=tokenizer force_output=True"})})
        for r in res.runs]
    return res.model_copy(update={"runs": runs})


def test_report_and_network_share_refuse_different_request_shapes(tmp_path, capsys, unrasterized):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    dump_results(_shape(INSTANCE, 128, 128), a)
    dump_results(_shape(PRIVATELINK, 64, 64), b)
    assert main(["bench", "network-share", str(a), str(b)]) == 1
    err = capsys.readouterr()
    assert "different request shapes" in err.err and "--allow-mixed" in err.err and "e2e_p99" not in err.out
    assert "input 128 tokens" in err.err and "input 64 tokens" in err.err
    assert main(["bench", "report", str(a), str(b), "--out", str(tmp_path / "rep")]) == 1
    assert "--allow-mixed" in capsys.readouterr().err and not (tmp_path / "rep").exists()
    # Asked for, they are compared, and the page says the shapes differ.
    assert main(["bench", "network-share", str(a), str(b), "--allow-mixed"]) == 0
    assert main(["bench", "report", str(a), str(b), "--out", str(tmp_path / "rep"), "--allow-mixed"]) == 0
    assert "Mixed request shapes" in (tmp_path / "rep" / "report.html").read_text()
    # Same shape: no refusal.
    dump_results(_shape(PRIVATELINK, 128, 128), b)
    assert main(["bench", "network-share", str(a), str(b)]) == 0


def _figures(monkeypatch, results_list, tmp_path):
    """Render the report and keep the matplotlib figures it saves."""
    from matplotlib.figure import Figure

    from fleetcast.bench.report import write_report

    saved = []
    real = Figure.savefig

    def keep(fig, path, *a, **k):
        saved.append((Path(path).name, fig))
        return real(fig, path, *a, **k)

    monkeypatch.setattr(Figure, "savefig", keep)
    write_report(results_list, tmp_path)
    return dict(saved)


@pytest.fixture(scope="module")
def rate_sweep_figures(tmp_path_factory):
    """The report of one open-loop sweep with both SLOs, its last run saturated, rendered once for the tests that read
    its figures (each figure's text layout and rasterizing, 2 s of CPU a report): none of them changes a figure."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        rate = _rate_sweep({"ttft_ms": 60, "itl_ms": 8})
        return rate, _figures(monkeypatch, [rate], tmp_path_factory.mktemp("rate-sweep"))


def test_plots_read_as_labelled(monkeypatch, tmp_path):
    sweep = load_results(ROOT / "bench/data/h200-reference-sweep.json")
    mix = load_results(ROOT / "bench/data/h200-reference-mix.json")
    figs = _figures(monkeypatch, [sweep, mix], tmp_path)
    latency, throughput = figs["latency_vs_load.png"], figs["throughput_vs_latency.png"]
    latency.canvas.draw()  # the tick labels are set when the figure is drawn; once for all its axes
    for ax in latency.axes:
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        assert ticks == ["1", "2", "4", "8", "16", "32", "64"]  # not 2^0 .. 2^6
    # One colour per series in both figures; percentiles differ by line style only.
    def colours(ax):
        by_series = {}
        for line in ax.get_lines():
            label = line.get_label()
            if not label.startswith("_"):
                by_series.setdefault(label.rsplit(" p", 1)[0] if " p" in label else label, set()).add(line.get_color())
        return by_series
    lat, thr = colours(latency.axes[0]), colours(throughput.axes[0])
    assert all(len(c) == 1 for c in lat.values()) and lat == thr and len(thr) == 2
    assert len({next(iter(c)) for c in thr.values()}) == 2  # two series, two colours
    # Throughput-latency: markers only, never a line joining runs.
    for ax in throughput.axes:
        for line in ax.get_lines():
            assert line.get_linestyle() == "None"


def _rate_sweep(slo):
    """The reference sweep re-labelled as an open-loop `--rate` sweep, the last run saturated."""
    from fleetcast.bench.schema import SloSpec

    sweep = load_results(ROOT / "bench/data/h200-reference-sweep.json")
    runs = []
    for i, (run, rate) in enumerate(zip(sweep.runs, (1, 2, 4, 6, 9, 12, 16))):
        load = run.load.model_copy(update={"mode": "rate", "concurrency": None, "rate_rps": rate, "arrival": "poisson"})
        summary = run.summary.model_copy(update={"saturated": i == len(sweep.runs) - 1})
        runs.append(run.model_copy(update={"load": load, "summary": summary}))
    return sweep.model_copy(update={"runs": runs, "slo": SloSpec(**slo)})


def _below_the_axes(fig):
    fig.canvas.draw()
    [legend] = fig.legends
    return legend.get_window_extent().y1 <= min(ax.get_window_extent().y0 for ax in fig.axes)


def test_a_rate_sweep_is_plotted_against_the_rates_swept_with_its_slos(rate_sweep_figures):
    rate, figs = rate_sweep_figures
    latency, throughput, goodput = (figs[n] for n in ("latency_vs_load.png", "throughput_vs_latency.png",
                                                      "goodput_vs_load.png"))
    for ax, slo in zip(latency.axes, (60, 8)):
        # The x axis is the rates swept, linear and ticked at each, so the rate where P99 crosses the SLO reads off.
        assert ax.get_xscale() == "linear" and list(ax.get_xticks()) == [1, 2, 4, 6, 9, 12, 16]
        assert "offered rate" in ax.get_xlabel()
        p99 = [ln for ln in ax.get_lines() if ln.get_label().endswith(" p99")]
        assert len(p99) == 1 and list(p99[0].get_xdata()) == [1, 2, 4, 6, 9, 12, 16]
        # The SLO is a horizontal line at its value, named in the legend.
        [line] = [ln for ln in ax.get_lines() if ln.get_label().split(" SLO: ")[-1].startswith(f"{slo:g} ms")]
        assert list(line.get_ydata()) == [slo, slo] and ax.get_ylim()[0] < slo < ax.get_ylim()[1]
    ttft_p99_axis = throughput.axes[0]
    assert [list(ln.get_ydata()) for ln in ttft_p99_axis.get_lines() if "SLO" in ln.get_label()] == [[60, 60]]
    # Goodput: one line per series at the rates swept; the offered rate drawn as the diagonal to compare.
    [ax] = goodput.axes
    [good] = [ln for ln in ax.get_lines() if ln.get_label() == series_name(rate)]
    assert list(good.get_xdata()) == [1, 2, 4, 6, 9, 12, 16]
    assert list(good.get_ydata()) == [r.summary.goodput_rps for r in rate.runs]
    assert any(ln.get_label().startswith("offered") for ln in ax.get_lines())
    for fig in (latency, throughput, goodput):
        assert _below_the_axes(fig)
        assert any("client saturated" in t.get_text() for t in fig.legends[0].get_texts())


def test_saturated_runs_are_ringed_under_every_series_marker(rate_sweep_figures):
    _, figs = rate_sweep_figures  # its SLO lines are told apart from the series by their label
    for fig in figs.values():
        for ax in fig.axes:
            rings = [ln for ln in ax.get_lines() if ln.get_label() == "_saturated"]
            series = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_") and "SLO" not in ln.get_label()
                      and not ln.get_label().startswith("offered")]
            assert len(rings) == 1 and series
            # Hollow, and drawn before (under) every series' markers: it can hide none of them.
            assert rings[0].get_markerfacecolor() == "none"
            assert rings[0].get_zorder() < min(ln.get_zorder() for ln in series)


def test_no_slo_no_slo_line_and_no_goodput_plot(monkeypatch, tmp_path):
    # Run without --slo-*: its goodput_rps counts every completed request, which a "goodput" plot would misname.
    sweep = load_results(ROOT / "bench/data/h200-reference-sweep.json")
    assert sweep.slo is None and all(r.summary.goodput_rps is not None for r in sweep.runs)
    figs = _figures(monkeypatch, [sweep], tmp_path)
    assert set(figs) == {"latency_vs_load.png", "throughput_vs_latency.png"}
    assert not any("SLO" in ln.get_label() for f in figs.values() for ax in f.axes for ln in ax.get_lines())
    assert figs["latency_vs_load.png"].axes[0].get_xscale() == "log"  # closed-loop levels: log-2 concurrency


def test_older_results_files_still_load_and_render(tmp_path):
    files = sorted((ROOT / "bench" / "data").glob("h200-reference-*.json"))
    loaded = []
    for f in files:
        if json.loads(f.read_text()).get("schema") != "fleetcast.bench/v1":
            continue  # the decode benchmark's notes, not a results file
        res = load_results(f)
        assert res.revision == 1 and res.slo is None and res.provenance == "measured"
        shape = res.request_shape()
        assert (shape.input_tokens, shape.output_tokens, shape.prompts) == ("128", "128", "tokenizer")
        loaded.append(res)
    assert len(loaded) == 2
    assert main(["bench", "report", *[str(f) for f in files if "decode" not in f.name],
                 "--out", str(tmp_path / "rep")]) == 0
    assert "not recorded (file older than revision 2)" in (tmp_path / "rep" / "report.html").read_text()
