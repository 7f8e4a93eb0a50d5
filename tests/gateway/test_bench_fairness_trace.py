"""The fairness bench's TTFT breakdown (`--ttft-trace`, runtime/ttft_trace.py) on loopback: every quiet request's
hops, stamped by the client, the gateway and the reference server's two processes on one clock, add up to no
more than the TTFT the client measured, none is negative, and the slowest requests' longest hop is named.
The figures themselves are load-dependent: only how they fit together is asserted."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.ttft_trace import ENV
from scripts.bench_fairness import (
    HOPS,
    SLOWEST,
    read_trace,
    request_hops,
    run_samples,
    stalls_in,
    ttft_breakdown,
    ttft_figures,
)
from tests.optional import needs_torch

ROOT = Path(__file__).resolve().parents[2]
HOP_NAMES = [name for name, _, _ in HOPS]


def test_the_hops_chain_from_the_clients_send_to_its_first_byte_each_ending_where_the_next_begins():
    assert HOPS[0][1] == "client.sent" and HOPS[-1][2] == "client.first"
    for (_, _, end), (_, start, _) in zip(HOPS, HOPS[1:], strict=False):
        assert end == start  # so the hops add up to first - sent, and a gap cannot hide between two


def _stamps(rid: int, at: float, hop_ms: list[float]) -> dict:
    """One request's files as the processes write them, its hops `hop_ms` from `at` on."""
    times, t = [], at
    for ms in hop_ms:
        times.append(t)
        t += ms / 1000
    times.append(t)
    named = {stamp: times[i] for i, (_, stamp, _) in enumerate(HOPS)} | {HOPS[-1][2]: times[-1]}
    by_process: dict[str, dict] = {}
    for key, value in named.items():
        process, stamp = key.split(".")
        by_process.setdefault(process, {})[stamp] = value
    engine = {**by_process["engine"], "rid": rid, "iter_start": by_process["engine"]["admitted"] - 0.0001,
              "iter_end": by_process["engine"]["first_sent"] + 0.001, "iter_admitted": 3, "prev_iter_start": at,
              "prev_iter_end": by_process["engine"]["admitted"] - 0.0001, "prev_iter_admitted": 2}
    return {"client": {**by_process["client"], "id": f"q-{rid}", "ttft_ms": (t - at) * 1000 + 0.01},
            "gateway": {**by_process["gateway"], "id": f"q-{rid}"},
            "http": {**by_process["http"], "id": f"q-{rid}", "rid": rid}, "engine": engine}


def test_a_requests_breakdown_names_the_hop_that_took_its_time_and_says_what_the_engine_was_doing():
    slow = [0.2] * len(HOPS)
    slow[HOP_NAMES.index("engine_queue")] = 40.0
    files = _stamps(7, 100.0, slow)
    trace = {"gateway": {"q-7": files["gateway"]}, "http": {"q-7": files["http"]}, "engine": {7: files["engine"]}}
    row = request_hops(files["client"], trace)
    assert row is not None
    assert row["dominant"] == "engine_queue" and row["hops"]["engine_queue"] == pytest.approx(40.0)
    assert row["engine"]["came_during_previous"] and row["engine"]["admitted_with"] == 3
    # A request with a process's side missing (refused, or its client gave up) is not joined with a hole in it.
    assert request_hops(files["client"], {**trace, "engine": {}}) is None


def test_a_phases_breakdown_gives_each_hops_p50_and_p99_and_the_slowest_requests_whole():
    trace: dict = {"gateway": {}, "http": {}, "engine": {}}
    clients = []
    for rid in range(30):
        hops = [0.1] * len(HOPS)
        hops[rid % len(HOPS)] = 1.0 + rid  # the slowest ones are slow in different hops
        files = _stamps(rid, 10.0 + rid, hops)
        clients.append(files["client"])
        trace["gateway"][f"q-{rid}"], trace["http"][f"q-{rid}"] = files["gateway"], files["http"]
        trace["engine"][rid] = files["engine"]
    b = ttft_breakdown([request_hops(c, trace) for c in clients] + [None])
    assert (b["traced"], b["complete"]) == (31, 30)
    assert set(b["hops"]) == set(HOP_NAMES)
    assert [r["id"] for r in b["slowest"]] == [f"q-{rid}" for rid in range(29, 29 - SLOWEST, -1)]
    assert b["slowest"][0]["dominant"] == HOP_NAMES[29 % len(HOPS)]


def test_the_p99_less_the_slot_waits_takes_each_requests_own_gateway_slot_hop_out():
    """Two requests of 100 waited 50 ms for a slot: the TTFT P99 is theirs, and without their waits it is what the
    rest of the tail says."""
    trace: dict = {"gateway": {}, "http": {}, "engine": {}}
    clients = []
    slot = HOP_NAMES.index("gateway_slot")
    for rid in range(100):
        hops = [0.1] * len(HOPS)
        hops[0] = 1.0 + rid / 100  # connect: 1.00-1.99 ms
        if rid in (10, 20):
            hops[slot] = 50.0
        files = _stamps(rid, 10.0 + rid, hops)
        clients.append(files["client"])
        trace["gateway"][f"q-{rid}"], trace["http"][f"q-{rid}"] = files["gateway"], files["http"]
        trace["engine"][rid] = files["engine"]
    b = ttft_breakdown([request_hops(c, trace) for c in clients])
    rest = 0.1 * (len(HOPS) - 2) + 0.01  # every hop but connect and the slot, and _stamps' first byte
    assert b["ttft_p99"] > 50
    assert b["ttft_p99_less_slot"] == pytest.approx(1.98 + rest, abs=0.005)  # the 99th of 100: connect 1.98 ms


def test_a_processs_stalls_are_counted_in_the_phase_they_fell_in():
    records = [{"source": "gateway-1", "kind": "lag_second", "at": 99.0, "max_ms": 3.0, "ticks": 990},
               {"source": "gateway-1", "kind": "lag", "at": 100.5, "ms": 12.0},
               {"source": "gateway-1", "kind": "lag", "at": 300.0, "ms": 80.0},  # another phase
               {"source": "http-2", "kind": "gc", "at": 101.0, "ms": 4.0, "generation": 2, "collected": 10},
               {"source": "http-2", "kind": "gc_second", "at": 101.0, "by_generation": {"0": [5, 1.0, 0.4]},
                "walked_max": {"0": 900}},
               {"source": "http-2", "kind": "gc_second", "at": 102.0, "by_generation": {"0": [1, 0.1, 0.1]},
                "walked_max": {"0": 700}}]
    stalls = stalls_in(records, [(100.0, 110.0)])
    assert stalls["gateway-1"]["loop_late_max_ms"] == 3.0 and stalls["gateway-1"]["lags"] == [(0.5, 12.0)]
    assert stalls["http-2"]["gc_pauses"] == [(1.0, 4.0, 2)] and stalls["http-2"]["gc"] == {"0": [6, 1.1, 0.4]}
    assert stalls["http-2"]["gc_walked_max"] == {"0": 900}  # the most objects one collection walked: its pause's size


def test_the_trace_counts_the_objects_each_collection_walks(tmp_path: Path):
    """A collection walks the tracked objects of the generations it collects (docs.python.org/3/library/gc.html#
    gc.get_objects): the trace records that count, which sizes a pause on any machine, beside its wall time."""
    import gc

    from runtime.ttft_trace import Trace

    trace = Trace(str(tmp_path), "probe")
    kept = [[i] for i in range(5_000)]
    gc.collect()  # kept: in the oldest generation, walked by a full collection only
    gc.disable()  # only the collections below
    trace.watch_gc()
    try:
        gc.collect(0)
        gc.collect(2)
        trace._gc_at = -1  # the next collection closes this second's summary
        gc.collect(0)
    finally:
        trace.stop()
        gc.enable()
    lines = [json.loads(line) for path in tmp_path.glob("*.jsonl") for line in path.read_text().splitlines()]
    walked: dict[str, int] = {}
    for summary in (r for r in lines if r["kind"] == "gc_second"):  # one, or two if a second began between
        for generation, n in summary["walked_max"].items():
            walked[generation] = max(walked.get(generation, 0), n)
    assert walked["2"] >= len(kept) > walked["0"]


@needs_torch
@pytest.mark.usefixtures("forked_engines")
def test_on_loopback_every_quiet_requests_hops_add_up_to_at_most_its_ttft(tmp_path: Path):
    """The real bench, shortened (one round of 1 s phases, a cap of 4, 8 tokens, half a second's warm-up and
    capacity read), the engine on the CPU. Each phase's quiet arrivals are its seed's (the same in every phase):
    the first comes 0.14/rate s in, so within the second at any capacity above 1 request/s (86 on this machine).
    The bench, its reference server (and that server's engine process) and its gateway are forks of the worker's
    fork server (`forked_engines`: real processes, each its own pid, stamping its own trace file), which has
    PyTorch and the gateway imported: each of the four started its own interpreter before, 10 s of CPU in imports."""
    out = tmp_path / "fairness"
    done = subprocess.run(
        [sys.executable, "-m", "scripts.bench_fairness", "--device", "cpu", "--batch", "4", "--tokens", "8",
         "--seconds", "1", "--lead", "0.3", "--capacity-s", "0.5", "--warmup", "0.5", "--repeats", "1",
         "--cpu-runs", "0",
         "--skip-off", "--ttft-trace", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, env=_without_trace_env())
    assert done.returncode == 0, done.stderr[-3000:]
    trace = read_trace(out / "trace")
    sources = {path.stem.split("-")[0] for path in (out / "trace").glob("*.jsonl")}
    assert sources == {"client", "gateway", "http", "engine"}
    # The engine process's own iteration lines (scripts/trace_iterations.py attributes them): the first live prefix-hit
    # batch runs a shape the warm-up did not, and every second gets a summary.
    engine_kinds = {json.loads(line)["kind"] for path in (out / "trace").glob("engine-*.jsonl")
                    for line in path.read_text().splitlines()}
    assert {"iteration", "iteration_second"} <= engine_kinds
    rows = [request_hops(client, trace) for client in trace["client"].values() if client.get("status") == 200]
    joined = [r for r in rows if r is not None]
    assert joined and len(joined) == len(rows)  # every answered quiet request is traced whole
    for r in joined:
        assert all(ms >= 0 for ms in r["hops"].values()), (r["id"], {h: v for h, v in r["hops"].items() if v < 0})
        # The client's own span holds every hop: up to each figure's rounding to the microsecond (half of one each).
        assert r["ttft_ms"] + 0.0005 * (len(r["hops"]) + 1) >= sum(r["hops"].values()), r
        assert r["dominant"] in HOP_NAMES
    results = json.loads((out / "fairness.json").read_text())
    for phase in ("alone", "engine_bound", "fair"):
        breakdown = results["ttft_breakdown"][phase]
        assert breakdown["complete"] > 0 and set(breakdown["hops"]) == set(HOP_NAMES)
        assert all(r["dominant"] in HOP_NAMES for r in breakdown["slowest"])
        assert any(source.startswith("gateway-") for source in breakdown["stalls"])  # its ticker ran every phase
        # Fair admission's note on every quiet request: what its acquire read and decided.
        admission = breakdown["admission"]
        assert admission["noted"] == breakdown["complete"] and sum(admission["outcomes"].values()) == admission["noted"]
        assert set(admission["outcomes"]) <= OUTCOMES
        assert all(r["fair"]["accounts"].keys() == {"quiet", "neighbour"} for r in breakdown["slowest"])
    report = done.stdout
    assert "TTFT breakdown, fair:" in report and "slowest" in report
    # `pool` reads a run back from its fairness.json and, for a run that wrote none, from its client trace: the
    # run's own pooled P99 either way.
    from_results = run_samples(out)
    (out / "fairness.json").rename(out / "results-kept-aside.json")
    from_trace = run_samples(out)
    assert from_results[0] == from_trace[0] == 1
    for phase in ("alone", "engine_bound", "fair"):
        for _, samples in (from_results, from_trace):
            figures = ttft_figures(samples[phase])
            assert (figures["ok"], figures["ttft_p99"]) == (results["pooled"][phase]["ok"],
                                                            results["pooled"][phase]["ttft_p99"])


OUTCOMES = {"within_part", "free_room", "queue_full", "queued:cap_full", "queued:behind_own_waiting",
            "queued:others_waiting", "queued:room_reserved_for_others"}


def _without_trace_env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != ENV}


class _Writer:
    """What a response body writes to: the client's stream writer, recorded."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.transport = self

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    async def drain(self) -> None:
        return None


@pytest.mark.parametrize("reads", [1, 2], ids=["the whole body in one read", "the first token, then the rest"])
def test_the_gateways_first_byte_stamp_is_taken_however_many_reads_bring_the_body(reads: int):
    """The class of the one quiet request in 51 the loopback run did not trace whole: a gateway loop away (a
    collection, a late tick) while the server sent a whole short stream reads it in one go, its chunked ending
    included; the first bytes then leave with the ending (`_Body.finish`), and were not stamped there."""
    from runtime.gateway.drain import Drain
    from runtime.gateway.http import ChunkedDecoder
    from runtime.gateway.meter import Exchange
    from runtime.gateway.proxy import _Body

    events = [b'data: {"choices":[{"text":"a"}]}\n\n', b'data: {"choices":[{"text":"b"}]}\n\n', b"data: [DONE]\n\n"]
    wire = [b"%x\r\n%s\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]
    parts = [b"".join(wire)] if reads == 1 else [wire[0], b"".join(wire[1:])]
    exchange = Exchange(0.0, trace={})
    writer = _Writer()
    body = _Body(writer, b"HTTP/1.1 200 OK\r\n\r\n", ChunkedDecoder(), None, True, exchange,  # type: ignore[arg-type]
                 [0.0], Drain(1.0, None))
    for part in parts:
        body.take(part)
    asyncio.run(body.finish())
    assert b"".join(writer.out).startswith(b"HTTP/1.1 200 OK\r\n\r\n") and body.complete
    assert exchange.trace is not None and "first" in exchange.trace


def test_the_trace_names_what_a_collection_frees_and_the_process_then_frees_it(tmp_path: Path):
    """The H100 run's engine process freed 2,600 objects on average in each of its 652 collections of 1 ms or more
    (it ran 2,235 a fair phase): cycles made on its hot path. A sampled collection a second has them named by type
    and by the code of their frames."""
    import gc
    import weakref

    from runtime.ttft_trace import Trace

    class Node:
        pass

    def make_cycle() -> weakref.ref:
        node = Node()
        node.me = node  # type: ignore[attr-defined]
        return weakref.ref(node)

    trace = Trace(str(tmp_path), "probe")
    gc.collect()
    gc.disable()  # the cycles are freed by the collection below, not one their allocation triggers
    trace.watch_gc()
    try:
        refs = [make_cycle() for _ in range(50)]
        gc.collect(0)
    finally:
        trace.stop()
        gc.enable()
    gc.collect()
    lines = [json.loads(line) for path in tmp_path.glob("*.jsonl") for line in path.read_text().splitlines()]
    cycles = next(r for r in lines if r["kind"] == "cycles")
    assert {n: k for n, k in cycles["types"] if n.endswith("Node")} == {f"{Node.__qualname__}": 50}
    assert all(r() is None for r in refs) and not gc.garbage and not gc.get_debug() & gc.DEBUG_SAVEALL
