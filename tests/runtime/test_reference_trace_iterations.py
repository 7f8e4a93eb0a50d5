"""The engine process's iteration lines (runtime/ttft_trace.py IterationWatch) and the report that attributes the
long ones (scripts/trace_iterations.py), on small synthetic traces."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from runtime import ttft_trace
from runtime.ttft_trace import IterationWatch, Trace
from scripts import trace_iterations as ti


def _lines(directory: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(directory.glob("*.jsonl")) for line in path.read_text().splitlines()]


def _record(start: float, ms: float, admitted: int = 0, groups: list | None = None) -> dict:
    return {"start": start, "decode_at": start + ms / 2000, "end": start + ms / 1000, "admitted": admitted, "active": 3,
            "groups": groups or []}


def test_a_long_iteration_or_one_with_a_new_shape_gets_a_line_and_every_one_counts_in_its_seconds_summary(
        tmp_path: Path, monkeypatch):
    clock = iter([(1.000, 0.000), (1.002, 0.007)] + [(2.0, 0.0)] * 8)
    monkeypatch.setattr(ttft_trace, "thread_clock", lambda: next(clock))
    watch = IterationWatch(Trace(str(tmp_path), "engine"))
    watch.end(watch.begin(), _record(10.0, 12.0, 1, [{"shape": ["hit", 1, 32, 160], "new": False, "ms": 9.0}]))
    watch.end(watch.begin(), _record(10.5, 1.0, 2, [{"shape": ["hit", 2, 32, 160], "new": True, "ms": 0.6}]))
    watch.end(watch.begin(), _record(10.6, 0.5))  # short, nothing new: counted, no line
    watch.end(watch.begin(), _record(11.1, 0.5))  # the next second: the first's summary is written
    lines = _lines(tmp_path)
    long, new = [r for r in lines if r["kind"] == "iteration"]
    # 12 ms of wall time: 2 on the CPU, 7 waiting for one, the rest (3) blocked.
    assert (long["ms"], long["cpu_ms"], long["runq_ms"], long["blocked_ms"], long["decode_ms"]) == (12.0, 2.0, 7.0, 3.0, 6.0)
    assert new["ms"] == 1.0 and new["groups"][0]["new"]
    (summary,) = [r for r in lines if r["kind"] == "iteration_second"]
    assert summary == {"kind": "iteration_second", "at": 10.0, "count": 3, "long": 1, "ms": 13.5, "max_ms": 12.0,
                       "admitting": 2, "admitting_ms": 13.0, "role": "engine"}


def test_a_run_queue_wait_the_kernel_adds_from_before_the_iteration_is_held_to_what_its_wall_time_leaves(
        tmp_path: Path, monkeypatch):
    clock = iter([(1.000, 0.000), (1.004, 0.050)])  # 50 ms of run-queue wait added in a 10 ms iteration
    monkeypatch.setattr(ttft_trace, "thread_clock", lambda: next(clock))
    watch = IterationWatch(Trace(str(tmp_path), "engine"))
    watch.end(watch.begin(), _record(10.0, 10.0, 1))
    (line,) = [r for r in _lines(tmp_path) if r["kind"] == "iteration"]
    assert (line["cpu_ms"], line["runq_ms"], line["blocked_ms"]) == (4.0, 6.0, 0.0)


def test_the_thread_clock_reads_this_threads_cpu_time_and_run_queue_wait():
    on_cpu, waiting = ttft_trace.thread_clock()
    spin = sum(range(200_000))
    assert spin and ttft_trace.thread_clock()[0] > on_cpu and waiting >= 0.0


def write_trace(directory: Path, engine: list[dict], http: list[dict] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "engine-10.jsonl").write_text("".join(json.dumps(r) + "\n" for r in engine))
    (directory / "http-9.jsonl").write_text("".join(json.dumps(r) + "\n" for r in http or []))
    return directory


def _iteration(at: float, ms: float, admitted: int = 1, new: bool = False, gc: int = 0, cpu: float | None = None,
               runq: float = 0.0) -> dict:
    cpu = ms - runq if cpu is None else cpu
    return {"kind": "iteration", "at": at, "ms": ms, "admitted": admitted, "active": 4, "decode_ms": 0.5,
            "groups": [{"shape": ["hit", admitted, 32, 160], "new": new, "ms": ms - 1}] if admitted else [],
            "cpu_ms": cpu, "runq_ms": runq, "blocked_ms": max(0.0, ms - cpu - runq), "gc": gc, "role": "engine"}


def test_each_long_iteration_is_labelled_with_every_cause_the_trace_shows(tmp_path: Path):
    trace = ti.read_trace(write_trace(tmp_path / "t", [
        _iteration(1.0, 9.0, new=True),
        _iteration(3.0, 8.0, gc=2),
        _iteration(5.0, 10.0, runq=6.0),
        _iteration(7.0, 12.0, cpu=2.0),  # 10 ms off the CPU, not waiting for one: blocked
        _iteration(9.0, 7.0),  # the HTTP process's loop was late meanwhile
        _iteration(11.0, 6.0),  # nothing the trace shows
        _iteration(13.0, 1.0, new=True),  # short: a line for its new shape, not a long one
        {"kind": "iteration_second", "at": 1.0, "count": 500, "long": 6, "ms": 600.0, "max_ms": 12.0,
         "admitting": 40, "admitting_ms": 100.0},
    ], http=[{"kind": "lag", "at": 9.002, "ms": 6.0}]))
    result = ti.attribute(trace)
    assert [it["labels"] for it in result["long"]] == [["new_shape"], ["gc"], ["runq"], ["blocked"], ["http_lag"], []]
    assert result["by_label"]["unexplained"] == 1 and result["all_iterations"] == 500
    assert result["split"] == {"ms": 52.0, "cpu_ms": 36.0, "runq_ms": 6.0, "blocked_ms": 10.0}
    text = "\n".join(ti.report(result))
    assert "6 of 5 ms or more" in text and "blocked 10.0" in text and "hit/1/32/160 NEW" in text


def test_an_engine_gc_line_inside_an_iteration_labels_it_and_the_same_window_later_is_the_chance_baseline(
        tmp_path: Path):
    trace = ti.read_trace(write_trace(tmp_path / "t", [
        _iteration(1.0, 9.0), {"kind": "gc", "at": 1.003, "ms": 2.0, "generation": 0},
        _iteration(2.0, 9.0), {"kind": "gc", "at": 2.503, "ms": 2.0, "generation": 0},
    ]))
    result = ti.attribute(trace)
    assert [it["labels"] for it in result["long"]] == [["gc"], []]
    assert result["chance"] == {"gc": 1}  # the second's window, half a second on, holds the other collection


def test_an_older_trace_is_rebuilt_from_the_traced_requests_iterations_and_a_first_admitted_count_counts_as_new(
        tmp_path: Path):
    def engine_line(start: float, ms: float, admitted: int, prev: tuple[float, float, int]) -> dict:
        return {"kind": "engine", "rid": 1, "received": start, "iter_start": start, "iter_end": start + ms / 1000,
                "iter_admitted": admitted, "first_sent": None, "prev_iter_start": prev[0], "prev_iter_end": prev[1],
                "prev_iter_admitted": prev[2]}

    directory = write_trace(tmp_path / "trace", [
        engine_line(1.0, 2.5, 1, (0.999, 0.9995, 0)),
        engine_line(2.0, 11.0, 1, (1.9, 1.906, 0)),  # long, a count seen before; its previous (6 ms) too
        engine_line(3.0, 8.0, 4, (2.99, 2.9905, 0)),  # long, the first iteration that admitted 4
    ])
    archive = tmp_path / "trace.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(directory, arcname="trace")
    result = ti.attribute(ti.read_trace(archive))
    assert not result["own_lines"] and result["known"] == 6
    assert [(round(it["ms"], 1), it["labels"]) for it in result["long"]] == [(6.0, []), (11.0, []), (8.0, ["new_shape"])]
    assert result["by_admitted"][1]["n"] == 2


def test_the_command_prints_the_attribution_and_refuses_a_trace_without_an_engine_file(tmp_path: Path, capsys):
    directory = write_trace(tmp_path / "t", [_iteration(1.0, 9.0, new=True)])
    assert ti.main([str(directory)]) == 0
    assert "new_shape" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    try:
        ti.main([str(tmp_path / "empty")])
    except SystemExit as exc:
        assert exc.code == 2
    assert "holds no engine-*.jsonl" in capsys.readouterr().err
