"""A quiet account beside a flooding neighbour, on loopback, through the real gateway and the reference backend.

    python -m scripts.bench_fairness [--seconds 40] [--repeats 3] [--batch 8] [--tokens 32] [--quiet-share 0.15]
        [--flood 3] [--lead 5] [--capacity-s 10] [--device cpu|cuda] [--gateway-workers 1] [--no-pin]
        [--engine-cpus L --gateway-cpus L --quiet-cpus L --flood-cpus L] [--cpu-runs 7] [--skip-off]
        [--ttft-trace] [--json FILE] [--out DIR]
    python -m scripts.bench_fairness simulate [CAP ...] [--prefill-ms=MS] [--quiet-weight=W] [--seconds=S]
        [--stall-ms=MS]   (the admission code alone: `simulated_waits`)
    python -m scripts.bench_fairness pool DIR [DIR ...] [--png FILE]   (several runs' samples pooled)

One reference server (tiny GPT-2, `--batch` its max batch size, one torch thread; on the CPU, or on the GPU
with `--device cuda`, where its decode steps are CUDA graph replays) behind `python -m runtime.gateway` (PROXY
v2 from two VPC endpoints, one per account). Every process is pinned to cores of its own where the machine has
enough (sched_setaffinity, as taskset does; `pin_plan`): with 4 or more cores the engine, the gateway, the quiet
account's client and the neighbour's client each get their own, so the neighbour's client cannot take a core
from what it is measured against; with 2 or 3 the engine gets the first core and the rest share the others.
`--engine-cpus` etc. (taskset -c lists: 0,2 or 4-15) override the plan. The cores each process really got are
read back from /proc and recorded. Phases:
then `--repeats` rounds, each of: the engine's capacity now (the neighbour alone, `--batch` streams kept busy
for `--capacity-s`: requests per second, R), then three phases of `--seconds` (interleaved, so that a change in
the machine's load moves all three alike):
  alone: the quiet account at `--quiet-share` x R, Poisson arrivals: its TTFT;
  engine-bound: the same beside the neighbour keeping busy as many streams as fair admission lets it hold beside
    the active quiet account (the cap less the quiet account's reserved part, `held_beside`; closed loop, so
    nothing of the neighbour's waits at the gateway): what the quiet account sees when only the engine is shared,
    the best any admission order can do;
  fair: the same beside the neighbour arriving at `--flood` x R from `--lead` seconds before (its queue at the
    gateway grows), fair admission on;
and once (unless --skip-off) `fair` with `--fair-admission off` (first come, first served at the engine).
The neighbour's client is a process of its own (raw asyncio sockets), so its open streams do not delay the
quiet account's sends and reads. Each phase also reads the engine's own iteration stats (/metrics): its mean
batch and step time, and whether an admitted request ever queued inside the engine.
It prints each phase's figures, each round's ratio of the quiet P99 TTFT to its P99 alone and their spread,
and the ratio over all rounds' samples pooled (the issue's bound: 1.1x). A P99 needs samples: a phase of
`--seconds` at `--quiet-share` x R gives seconds x share x R of them, so the pooled figure is the one to read.
With --ttft-trace each quiet request's TTFT is split into hops (HOPS: client, gateway, the reference server's HTTP
and engine processes, back), given per phase (P50/P99 of each, the 10 slowest whole) with each process's event-loop
lateness and collections (runtime/ttft_trace.py; the raw lines under DIR/trace).
The last line is the verdict: PASS when the pooled fair-phase ratio is at most 1.1 (the issue's bound), with the
per-round spread beside it. The verdict is a measurement, so it is printed, never asserted by the test suite.
A device call is limited to 10 minutes, three rounds' worth; `pool` gives the verdict over several runs of one
command on one host, their quiet samples pooled (each run's fairness.json, `quiet_samples`, or for a run that wrote
none, its client trace: `pooled_runs`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import gzip
import heapq
import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from runtime.ttft_trace import ENV as TRACE_ENV, HEADER as TRACE_HEADER, Trace
from scripts.bench_gateway import (
    POOL,
    REGION,
    SERVICE_ID,
    FakeEc2Endpoints,
    _spawn,
    _wait_port,
    bench_config_data,
    bench_model,
    fair_admission_cpu_lines,
    fair_admission_cpu_runs,
    free_port,
    percentile,
    process_stats,
    write_config,
)

ROOT = Path(__file__).resolve().parents[1]
QUIET = ("quiet", "444455556666", "vpce-0aaaaaaaaaaaaaaa1")
NEIGHBOUR = ("neighbour", "777788889999", "vpce-0bbbbbbbbbbbbbbb2")


# The neighbour's max_queued unless --neighbour-max-queued says otherwise: the config's most, so every request of the
# flood waits at the gateway (the worst case for the gateway's own loop: thousands of requests held).
MOST_QUEUED = 10_000


def fairness_config(batch: int, quiet_weight: float = 1.0, neighbour_max_queued: int = MOST_QUEUED) -> dict:
    """The shipped config, its engine at `batch`, served to two accounts whose limits are far above the load; the
    quiet account's admission weight `quiet_weight` (the neighbour's is 1), so its part of the cap; the neighbour's
    waiting requests at most `neighbour_max_queued` (beyond them a 429 at once)."""
    data = bench_config_data()
    quiet = data["consumers"][0]
    neighbour = json.loads(json.dumps(quiet))
    quiet["name"] = QUIET[0]
    neighbour.update(name=NEIGHBOUR[0], account=NEIGHBOUR[1], vpc_id="vpc-0123456789abcdef1",
                     cidrs=["10.61.0.0/16"])
    neighbour.pop("api_key_secret", None)
    for consumer in (quiet, neighbour):
        consumer["limits"] = {"max_concurrency": 10000, "requests_per_minute": 10_000_000}
        consumer["admission"] = {"max_queued": MOST_QUEUED, "max_queue_wait_s": 600}
    quiet["admission"]["weight"] = quiet_weight
    neighbour["admission"]["max_queued"] = neighbour_max_queued
    data["consumers"] = [quiet, neighbour]
    for region in data["regions"]:
        principals = region.get("allowed_principals")
        if principals is not None:
            region["allowed_principals"] = sorted({*principals, f"arn:aws:iam::{NEIGHBOUR[1]}:root"})
    data["engine"]["max_batch_size"] = batch
    for model in data.get("models") or [data.get("model") or {}]:
        if model.get("engine"):
            model["engine"].pop("max_batch_size", None)
    for region in data["regions"]:
        for pool in region["pools"]:
            if pool.get("engine"):
                pool["engine"].pop("max_batch_size", None)
            if (pool.get("scaling") or {}).get("target", 0) > batch:  # a target above the batch is refused
                pool["scaling"]["target"] = batch
    return data


def proxy_header(vpce: str) -> bytes:
    from runtime.gateway import ppv2

    return ppv2.build(("10.60.1.10", 40000), ("10.40.0.5", 8000), vpce_id=vpce)


async def one(port: int, header: bytes, body: bytes, trace: dict | None = None) -> tuple[int, float | None]:
    """(status, TTFT ms) of one streamed completion on a new connection; TTFT None unless 200. `trace` (with
    --ttft-trace; it holds the request's "id"): the id goes out as the trace header, and the client's own stamps
    (CLOCK_MONOTONIC, runtime/ttft_trace.py) come back in it: sent (before the connect), connected, head (the
    response head), first (the first text event). Each is taken inside the TTFT's own perf_counter span, so the
    TTFT is never below first - sent."""
    sent = time.perf_counter()
    if trace is not None:
        trace["sent"] = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        traced = b"" if trace is None else b"%s: %s\r\n" % (TRACE_HEADER.encode(), trace["id"].encode())
        if trace is not None:
            trace["connected"] = time.monotonic()
        writer.write(header + b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                     b"%bContent-Length: %d\r\nConnection: close\r\n\r\n%b" % (traced, len(body), body))
        head = await reader.readuntil(b"\r\n\r\n")
        if trace is not None:
            trace["head"] = time.monotonic()
        status = int(head.split(b" ", 2)[1])
        ttft, buf = None, b""
        while True:
            data = await reader.read(65536)
            if not data:
                break
            if ttft is None:
                buf += data
                if b'"text"' in buf:
                    if trace is not None:
                        trace["first"] = time.monotonic()
                    ttft = (time.perf_counter() - sent) * 1000
        if trace is not None:
            trace.update(status=status, ttft_ms=ttft)
        return status, ttft if status == 200 else None
    finally:
        writer.close()


async def poisson(port: int, header: bytes, body: bytes, rate: float, seconds: float, seed: int,
                  out: list[tuple[int, float | None]], traces: list[dict] | None = None, label: str = "") -> None:
    """Poisson arrivals at `rate` for `seconds`; with `traces`, each request traced (id `label`-n) into it."""
    rng = random.Random(seed)
    tasks, at, start = [], 0.0, time.monotonic()
    while True:
        at += rng.expovariate(rate)
        if at >= seconds:
            break
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        trace = None
        if traces is not None:
            trace = {"id": f"{label}-{len(traces)}"}
            traces.append(trace)
        tasks.append(asyncio.ensure_future(one(port, header, body, trace)))
    out.extend(await asyncio.gather(*tasks, return_exceptions=False))


async def closed_loop(port: int, header: bytes, body: bytes, streams: int, seconds: float) -> int:
    done, end = [0], time.monotonic() + seconds

    async def stream() -> None:
        while time.monotonic() < end:
            status, _ = await one(port, header, body)
            done[0] += status == 200

    await asyncio.gather(*(stream() for _ in range(streams)))
    return done[0]


def ttft_figures(samples: list[tuple[int, float | None]]) -> dict:
    ttfts = [t for s, t in samples if s == 200 and t is not None]
    return {"requests": len(samples), "ok": len(ttfts), "refused": sum(1 for s, _ in samples if s != 200),
            "ttft_p50": round(percentile(ttfts, 0.5), 2), "ttft_p90": round(percentile(ttfts, 0.9), 2),
            "ttft_p99": round(percentile(ttfts, 0.99), 2)}


async def phase(port: int, body: bytes, quiet_rate: float, seconds: float, seed: int, flood_rate: float = 0.0,
                streams: int = 0, lead: float = 0.0, flood_cpus: set[int] | None = None,
                trace_label: str | None = None, flood_tokens: tuple[int, int] | None = None) -> dict:
    """The quiet account for `seconds`, alone or beside the neighbour: Poisson arrivals at `flood_rate`, or
    `streams` kept busy (closed loop); the neighbour starts `lead` seconds earlier (the quiet account arrives
    beside a load under way). The neighbour is a process of its own: its hundreds of open streams would
    otherwise delay the quiet account's sends and reads in one event loop, and the quiet figures would measure
    the client. Returns the figures and the quiet samples (for pooling); with `trace_label`, the quiet requests'
    client stamps (`traces`) and the phase's window on CLOCK_MONOTONIC (`window_monotonic`). `flood_tokens`: the
    neighbour's output tokens per request drawn from (LO, HI), where None sends `body` alike."""
    with instrument_heap():
        return await _phase(port, body, quiet_rate, seconds, seed, flood_rate, streams, lead, flood_cpus, trace_label,
                            flood_tokens)


@contextlib.contextmanager
def instrument_heap() -> Iterator[None]:
    """The measuring process collects nothing while it measures: its quiet client's sends and reads are the TTFT
    stamps, and a collection there (126 ms, a full one over the earlier phases' samples and the trace, on an H100
    host: bench/FAIRNESS_DEVICE.md, call 4) is a stall the figures would charge to the gateway. Everything alive
    before the phase is frozen (gc.freeze: ignored by every later collection), the automatic collections are off
    for the phase (gc.disable: what a phase allocates is a few thousand requests' worth, garbage or not), and
    they run between phases. A lean process of its own for the quiet client would do the same with more moving
    parts: this process has no other work during a phase than the quiet client and the engine stats' poll. The
    trace's collection watcher (gc.callbacks) does not see these deliberate collections: its per-second summary
    would put one in the phase's first or last second."""
    _unwatched_collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()
        _unwatched_collect()


def _unwatched_collect() -> None:
    watchers = list(gc.callbacks)
    gc.callbacks.clear()
    try:
        gc.collect()
    finally:
        gc.callbacks.extend(watchers)


async def _phase(port: int, body: bytes, quiet_rate: float, seconds: float, seed: int, flood_rate: float,
                 streams: int, lead: float, flood_cpus: set[int] | None, trace_label: str | None,
                 flood_tokens: tuple[int, int] | None) -> dict:
    quiet: list = []
    flood = None
    if flood_rate or streams:
        mode = ["poisson", str(flood_rate)] if flood_rate else ["closed", str(streams)]
        spread = [f"{flood_tokens[0]}-{flood_tokens[1]}"] if flood_tokens else []
        flood = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "scripts.bench_fairness", "_flood", str(port), body.decode(), *mode,
            str(seconds + lead), str(seed + 1), *spread, cwd=str(ROOT), stdout=asyncio.subprocess.PIPE)
        if flood_cpus:
            os.sched_setaffinity(flood.pid, flood_cpus)  # before it has imported anything: no request sent yet
        await asyncio.sleep(lead)
    traces: list[dict] | None = [] if trace_label is not None else None
    window, began = (time.time(), 0.0), time.monotonic()
    await poisson(port, proxy_header(QUIET[2]), body, quiet_rate, seconds, seed, quiet, traces, trace_label or "")
    window = (window[0], time.time())
    result: dict = {"quiet": ttft_figures(quiet), "window": window}
    if traces is not None:
        result.update(traces=traces, window_monotonic=(began, time.monotonic()))
    if flood is not None:
        out, _ = await flood.communicate()
        result["neighbour"] = json.loads(out)
    return {**result, "samples": quiet}


def _flood(argv: list[str]) -> None:
    """The neighbour's process: Poisson arrivals at a rate (`poisson RATE`) or a number of streams kept busy
    (`closed N`) for `seconds`, then what has not finished within a second is abandoned (its connections
    closed: the gateway withdraws what still waits); figures as JSON. A last `LO-HI`: each request's max_tokens
    drawn from LO to HI (`--flood-tokens`), else every request is `body`."""
    port, body, mode, level, seconds, seed = (int(argv[0]), argv[1].encode(), argv[2], float(argv[3]),
                                              float(argv[4]), int(argv[5]))
    rng = random.Random(seed)
    if len(argv) > 6:
        lo, hi = token_range(argv[6])
        bodies = [json.dumps({**json.loads(body), "max_tokens": n}).encode() for n in range(lo, hi + 1)]
        lengths = random.Random(seed + 1)  # its own stream: the arrivals are those of a run without a range

        def next_body() -> bytes:
            return lengths.choice(bodies)
    else:
        def next_body() -> bytes:
            return body

    async def run() -> dict:
        header = proxy_header(NEIGHBOUR[2])
        tasks: list[asyncio.Future] = []
        start = time.monotonic()
        if mode == "closed":
            samples: list[tuple[int, float | None]] = []

            async def stream() -> None:
                while time.monotonic() < start + seconds:
                    samples.append(await one(port, header, next_body()))

            await asyncio.gather(*(stream() for _ in range(int(level))))
            return {**ttft_figures(samples), "sent": len(samples), "abandoned": 0}
        at = 0.0
        while (at := at + rng.expovariate(level)) < seconds:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            tasks.append(asyncio.ensure_future(one(port, header, next_body())))
        done, pending = await asyncio.wait(tasks, timeout=1.0) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        figures = ttft_figures([t.result() for t in done if t.exception() is None])
        return {**figures, "sent": len(tasks), "abandoned": len(pending)}

    print(json.dumps(asyncio.run(run())))


def stop(proc: subprocess.Popen, wait_s: float) -> None:
    """SIGTERM (each drains), then a kill past `wait_s`."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()


def admission_waits(emf: Path, consumer: str, window: tuple[float, float] | None = None) -> dict:
    """What the gateway's records say the account's requests waited for an engine slot (P50/P99/max, ms), those
    timestamped within `window` (epoch seconds) if given."""
    waits = []
    for line in emf.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("Consumer") != consumer:
            continue
        stamp = (record.get("_aws") or {}).get("Timestamp", 0) / 1000
        if window is None or window[0] <= stamp <= window[1]:  # records are stamped at the arrival
            waits.append(float(record.get("admission_wait_ms", 0.0)))
    return {"p50": round(percentile(waits, 0.5), 2), "p99": round(percentile(waits, 0.99), 2),
            "max": max(waits, default=0.0)}


class EngineStats:
    """The reference server's iteration stats (/metrics, dequeued on read), read every half second."""

    def __init__(self, port: int):
        self.port = port
        self.stats: list[dict] = []
        self._task: asyncio.Task | None = None

    async def _poll(self) -> None:
        first = True
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
                raw = await reader.read()
                writer.close()
                stats = json.loads(raw.split(b"\r\n\r\n", 1)[1])
                if not first:  # the first read holds what ran before the phase
                    self.stats += stats
                first = False
            except (OSError, ValueError, IndexError):
                pass
            await asyncio.sleep(0.5)

    def start(self) -> None:
        self.stats.clear()
        self._task = asyncio.ensure_future(self._poll())

    async def stop(self) -> dict:
        """The engine while the phase ran: mean requests per decode step, mean step time, and whether a request
        the gateway let through ever waited inside the engine (queued there: admitted later than its arrival)."""
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        return engine_figures(self.stats)


def engine_figures(stats: list[dict]) -> dict:
    """A phase's engine iteration stats (in the engine's order) summed up: mean batch and step; the longest an admitted
    request waited inside the engine (the mean of the requests one iteration admitted, the longest such mean); where
    that wait went: the longest step, what it admitted and completed, and the step before the longest wait
    (`before_max_queue_ms`, as the engine timed it). A wait about as long as the step before it was spent in that step
    (a prefill, a delivery, a pause inside the iteration); a wait far longer, between steps, where the engine thread
    did not run (the interpreter lock, the engine's own lock, or an engine idle until the request came)."""
    steps = [s for s in stats if s.get("numActiveRequests", 0) or s.get("numNewActiveRequests", 0)]
    busy = [s for s in steps if s.get("numActiveRequests", 0)]
    longest = max(steps, key=lambda s: s["iterLatencyMS"], default=None)
    waited = max(steps, key=lambda s: s.get("newActiveRequestsQueueLatencyMS", 0.0), default=None)
    before: list[float] = []
    if waited is not None:
        at = stats.index(waited)
        if at:  # the iteration before it (idle ones too: the engine's own order)
            before = [stats[at - 1]["iterLatencyMS"]]
    return {"steps": len(steps),
            "mean_batch": round(sum(s["numActiveRequests"] for s in busy) / len(busy), 2) if busy else 0.0,
            "mean_step_ms": round(sum(s["iterLatencyMS"] for s in steps) / len(steps), 2) if steps else 0.0,
            "max_engine_queued": max((s.get("numQueuedRequests", 0) for s in steps), default=0),
            "max_engine_queue_ms": round(waited.get("newActiveRequestsQueueLatencyMS", 0.0), 2) if waited else 0.0,
            "max_step_ms": round(longest["iterLatencyMS"], 2) if longest else 0.0,
            "max_step_admitted": longest.get("numNewActiveRequests", 0) if longest else 0,
            "max_step_completed": longest.get("numCompletedRequests", 0) if longest else 0,
            "before_max_queue_ms": round(before[0], 2) if before else None,
            "steps_over_5ms": sum(1 for s in steps if s["iterLatencyMS"] > 5.0)}


# A traced quiet request's time to first token, hop by hop (--ttft-trace; runtime/ttft_trace.py): (name, from, to),
# each stamp "<process>.<stamp>", in the order the request passes them, so the hops add up to the client's TTFT.
HOPS = (
    ("connect", "client.sent", "gateway.accepted"),  # the connect, the kernel's accept queue, the gateway loop's turn
    ("gateway_head", "gateway.accepted", "gateway.head"),  # the PROXY v2 header and the request head
    ("gateway_body", "gateway.head", "gateway.parsed"),  # the body and the caller's identity
    ("gateway_slot", "gateway.parsed", "gateway.admitted"),  # limits, routing, the salt, the wait for an engine slot
    ("gateway_send", "gateway.admitted", "gateway.sent"),
    ("to_http", "gateway.sent", "http.received"),  # an upstream connection, loopback, the HTTP process's loop and parse
    ("http_submit", "http.received", "http.submitted"),  # the body and its checks
    ("to_engine", "http.submitted", "engine.received"),  # the SUBMIT over the channel, the engine's main thread
    ("engine_queue", "engine.received", "engine.admitted"),  # until an iteration takes it (the one under way ends)
    ("prefill", "engine.admitted", "engine.first_sent"),  # that iteration up to its first token's message leaving
    ("to_http_first", "engine.first_sent", "http.taken"),  # the channel, the dispatch, the stream handler's wake-up
    ("http_write", "http.taken", "http.writing"),  # the first SSE event's encoding
    ("to_gateway_first", "http.writing", "gateway.first"),  # loopback and the gateway loop's turn
    ("to_client_first", "gateway.first", "client.first"),  # the gateway's write, loopback, the quiet client loop's turn
)
SLOWEST = 10


def read_trace(directory: Path) -> dict:
    """The trace files of every process (DIR/<role>-<pid>.jsonl, or .jsonl.gz as committed under bench/data):
    requests by id (the engine's by its own id, which the HTTP process's line names), and the stall lines (loop lag,
    collections), each with its file's name."""
    out: dict = {"client": {}, "gateway": {}, "http": {}, "engine": {}, "stalls": []}
    for path in sorted([*directory.glob("*.jsonl"), *directory.glob("*.jsonl.gz")]):
        gzipped = path.suffix == ".gz"
        text = gzip.decompress(path.read_bytes()).decode() if gzipped else path.read_text()
        source = path.name.removesuffix(".gz").removesuffix(".jsonl")
        for line in text.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut by a process that was killed mid-write
            kind = rec.get("kind")
            if kind in ("client", "gateway", "http"):
                out[kind][rec["id"]] = rec
            elif kind == "engine":
                out["engine"][rec["rid"]] = rec
            else:
                out["stalls"].append({**rec, "source": source})
    return out


def request_hops(client: dict, trace: dict) -> dict | None:
    """One traced request: its hops (ms, HOPS' order), the longest of them, and what the engine says of the
    iteration that admitted it; None when a stamp is missing (refused, or its client gave up)."""
    http = trace["http"].get(client["id"])
    engine = trace["engine"].get(http.get("rid")) if http else None
    if engine is not None and "admitted" not in engine:  # traces before the admission stamp: the iteration's start
        engine = {**engine, "admitted": engine["iter_start"]}
    stamps = {"client": client, "gateway": trace["gateway"].get(client["id"]), "http": http, "engine": engine}
    hops = {}
    for name, start, end in HOPS:
        (p0, k0), (p1, k1) = start.split("."), end.split(".")
        a, b = (stamps[p0] or {}).get(k0), (stamps[p1] or {}).get(k1)
        if a is None or b is None or client.get("ttft_ms") is None:
            return None
        hops[name] = round((b - a) * 1000, 3)
    engine = stamps["engine"]
    assert engine is not None
    return {"id": client["id"], "ttft_ms": round(client["ttft_ms"], 3), "hops": hops,
            "dominant": max(hops, key=lambda h: hops[h]), "fair": admission_note(stamps["gateway"]),
            "engine": {"admitted_with": engine["iter_admitted"],
                       "iteration_ms": round((engine["iter_end"] - engine["iter_start"]) * 1000, 3),
                       # It came while the iteration before was running: its queue is that iteration's rest.
                       "came_during_previous": engine["prev_iter_start"] <= engine["received"] <= engine["prev_iter_end"],
                       "previous_ms": round((engine["prev_iter_end"] - engine["prev_iter_start"]) * 1000, 3),
                       "previous_admitted": engine["prev_iter_admitted"]}}


def admission_note(gateway: dict | None) -> dict | None:
    """What fair admission's trace note (runtime/gateway/fair.py, `FairAdmission._noted`) says of one request: the
    worker, the outcome at its acquire (granted within its part or into free room, or why it queued), the wait for the
    shared lock there (ms), every account's [held, waiting] and the engine's held / cap as the decision read them, and
    for a request that queued, the path that handed it a slot (release, a poke from the other worker, the sweep), how
    long after its acquire (ms), and the counts then; None without a note (fair admission off, or an older gateway)."""
    fair = (gateway or {}).get("fair")
    if not fair or "asked" not in fair:
        return None
    asked = fair["asked"]
    out = {"worker": fair.get("worker"), "outcome": fair.get("outcome"),
           "lock_wait_ms": round((asked["lock_got"] - asked["lock_asked"]) * 1000, 3),
           "accounts": asked["accounts"], "used": asked["used"], "cap": asked["cap"],
           "waiting_all": asked["waiting_all"], "waiting_here": asked["waiting_here"]}
    granted = fair.get("granted")
    if granted:
        out["granted"] = {"via": granted.get("via"), "after_ms": round((granted["lock_got"] - asked["lock_got"]) * 1000,
                                                                       3),
                          "accounts": granted["accounts"], "used": granted["used"]}
    return out


def admission_summary(rows: list[dict], account: str) -> dict:
    """A phase's traced requests of `account` by fair admission's outcome at their acquire; for those that queued,
    how many requests `account` held there (a histogram: below its part, a queued request names a defect), how they
    were handed their slot, and the longest wait for the shared lock at an acquire."""
    notes = [r["fair"] for r in rows if r.get("fair")]
    outcomes: dict[str, int] = {}
    held_when_queued: dict[int, int] = {}
    via: dict[str, int] = {}
    for n in notes:
        outcomes[n["outcome"]] = outcomes.get(n["outcome"], 0) + 1
        if str(n["outcome"]).startswith("queued"):
            held = n["accounts"].get(account, [0, 0])[0]
            held_when_queued[held] = held_when_queued.get(held, 0) + 1
            if n.get("granted"):
                via[n["granted"]["via"]] = via.get(n["granted"]["via"], 0) + 1
    return {"noted": len(notes), "outcomes": outcomes, "held_when_queued": dict(sorted(held_when_queued.items())),
            "granted_via": via, "lock_wait_max_ms": max((n["lock_wait_ms"] for n in notes), default=None)}


def stalls_in(records: list[dict], windows: list[tuple[float, float]]) -> dict:
    """Each process's stalls within `windows` (a phase's, one a round; CLOCK_MONOTONIC): its loop's most late-by of a
    1 ms tick and the 5 longest lags of 5 ms or more (s after their window's start, ms), its collections by
    generation ([count, total ms, longest ms]) and the 5 longest of 1 ms or more (s, ms, generation)."""
    out: dict = {}
    for rec in records:
        # The second lines are stamped at their second's start: one that began before a window may reach into it.
        window = next((w for w in windows if w[0] - 1.0 <= rec["at"] <= w[1]), None)
        if window is None:
            continue
        entry = out.setdefault(rec["source"], {"loop_late_max_ms": None, "lags": [], "gc": {}, "gc_pauses": [],
                                               "gc_walked_max": {}, "cycles": None, "lock": None})
        kind = rec["kind"]
        if kind in ("lock", "lock_second"):  # the gateway workers' shared lock, as this worker took it
            lock = entry["lock"] = entry["lock"] or {"taken": 0, "wait_max_ms": 0.0, "hold_max_ms": 0.0, "longest": []}
            if kind == "lock_second":
                lock["taken"] += rec["count"]
                lock["wait_max_ms"] = max(lock["wait_max_ms"], rec["wait_max_ms"])
                lock["hold_max_ms"] = max(lock["hold_max_ms"], rec["hold_max_ms"])
            elif rec["at"] >= window[0]:
                lock["longest"].append((round(rec["at"] - window[0], 3), rec["wait_ms"], rec["hold_ms"], rec["where"]))
        elif kind == "lag_second":
            entry["loop_late_max_ms"] = max(entry["loop_late_max_ms"] or 0.0, rec["max_ms"])
        elif kind == "lag" and rec["at"] >= window[0]:
            entry["lags"].append((round(rec["at"] - window[0], 3), rec["ms"]))
        elif kind == "gc_second":
            for generation, (count, total, longest) in rec["by_generation"].items():
                g = entry["gc"].setdefault(generation, [0, 0.0, 0.0])
                g[0], g[1], g[2] = g[0] + count, round(g[1] + total, 3), max(g[2], longest)
            for generation, walked in rec.get("walked_max", {}).items():
                entry["gc_walked_max"][generation] = max(entry["gc_walked_max"].get(generation, 0), walked)
        elif kind == "cycles" and rec["at"] >= window[0]:
            c = entry["cycles"] = entry["cycles"] or {"sampled": 0, "freed": 0, "types": {}, "frames": {}}
            c["sampled"] += 1
            c["freed"] += rec["freed"]
            for part in ("types", "frames"):
                for name, n in rec[part]:
                    c[part][name] = c[part].get(name, 0) + n
        elif kind == "gc" and rec["at"] >= window[0]:
            entry["gc_pauses"].append((round(rec["at"] - window[0], 3), rec["ms"], rec["generation"]))
    for entry in out.values():
        if entry["cycles"]:
            for part in ("types", "frames"):
                entry["cycles"][part] = sorted(entry["cycles"][part].items(), key=lambda kv: -kv[1])[:5]
        if entry["lock"]:
            entry["lock"]["longest"] = sorted(entry["lock"]["longest"], key=lambda x: -max(x[1], x[2]))[:5]
        entry["lags"] = sorted(entry["lags"], key=lambda x: -x[1])[:5]
        entry["gc_pauses"] = sorted(entry["gc_pauses"], key=lambda x: -x[1])[:5]
    return out


def ttft_breakdown(rows: list[dict | None]) -> dict:
    """A phase's traced requests: P50/P99/max of each hop, the SLOWEST requests whole, and the TTFT P99 with each
    request's `gateway_slot` hop taken out (`ttft_p99_less_slot`): what is left of the tail without the waits for a
    slot that the admission order decides (the engine's, the gateway's loop's and the client's part)."""
    done = [r for r in rows if r is not None]
    hops = {name: {"p50": round(percentile([r["hops"][name] for r in done], 0.5), 3),
                   "p99": round(percentile([r["hops"][name] for r in done], 0.99), 3),
                   "max": max((r["hops"][name] for r in done), default=0.0)} for name, _, _ in HOPS}
    ttfts = [r["ttft_ms"] for r in done]
    return {"traced": len(rows), "complete": len(done),
            "ttft_p50": round(percentile(ttfts, 0.5), 3), "ttft_p99": round(percentile(ttfts, 0.99), 3),
            "ttft_p99_less_slot": round(percentile([r["ttft_ms"] - r["hops"]["gateway_slot"] for r in done], 0.99), 3),
            "hops": hops, "slowest": sorted(done, key=lambda r: -r["ttft_ms"])[:SLOWEST],
            "admission": admission_summary(done, QUIET[0])}


def trace_breakdowns(trace: dict, traced: list[tuple[dict, str, list[dict], tuple[float, float]]]) -> dict:
    """Each traced phase's breakdown, into its round's row (`ttft_breakdown`, `stalls`) and pooled over the rounds
    (returned, by phase: the breakdown and the stalls over every round's window of it)."""
    by_phase: dict[str, tuple[list, list]] = {}
    for row, name, clients, window in traced:
        rows = [request_hops(c, trace) for c in clients]
        row["ttft_breakdown"], row["stalls"] = ttft_breakdown(rows), stalls_in(trace["stalls"], [window])
        pooled_rows, windows = by_phase.setdefault(name, ([], []))
        pooled_rows += rows
        windows.append(window)
    return {name: {**ttft_breakdown(rows), "stalls": stalls_in(trace["stalls"], windows)}
            for name, (rows, windows) in by_phase.items()}


def breakdown_lines(name: str, breakdown: dict, stalls: dict | None = None) -> list[str]:
    """The report's lines for one phase's breakdown (pooled) and, if given, its stalls."""
    lines = [f"TTFT breakdown, {name}: {breakdown['complete']} of {breakdown['traced']} quiet requests traced whole; "
             f"TTFT P50 / P99 {breakdown['ttft_p50']} / {breakdown['ttft_p99']} ms (P99 less each request's "
             f"gateway_slot {breakdown.get('ttft_p99_less_slot', '-')} ms); each hop P50 / P99 / max ms:"]
    lines += [f"    {hop:<17} {f['p50']:>8.3f} {f['p99']:>9.3f} {f['max']:>9.3f}" for hop, f in breakdown["hops"].items()]
    lines.append(f"  the {len(breakdown['slowest'])} slowest (TTFT ms: its longest hops; the engine's iteration):")
    for r in breakdown["slowest"]:
        top = sorted(r["hops"].items(), key=lambda kv: -kv[1])[:3]
        e = r["engine"]
        lines.append(f"    {r['id']} {r['ttft_ms']:.1f}: " + ", ".join(f"{h} {v:.1f}" for h, v in top)
                     + f"; admitted with {e['admitted_with']}, its iteration {e['iteration_ms']:.1f} ms"
                     + (f", came during the one before ({e['previous_ms']:.1f} ms, admitted {e['previous_admitted']})"
                        if e["came_during_previous"] else ""))
        f = r.get("fair")
        if f:
            g = f.get("granted")
            lines.append(f"      fair (worker {f['worker']}): {f['outcome']}; lock wait {f['lock_wait_ms']:.2f} ms; "
                         f"[held, waiting] {f['accounts']}, engine {f['used']}/{f['cap']}, waiting {f['waiting_all']} "
                         f"({f['waiting_here']} here)"
                         + (f"; granted via {g['via']} {g['after_ms']:.1f} ms later, then {g['accounts']}, engine "
                            f"{g['used']}" if g else ""))
    a = breakdown.get("admission")
    if a and a["noted"]:
        lines.append(f"  fair admission at the quiet account's acquire: {a['outcomes']}; its held requests when one "
                     f"queued {a['held_when_queued']}; handed over via {a['granted_via']}; lock wait max "
                     f"{a['lock_wait_max_ms']} ms")
    for source, s in sorted((stalls or {}).items()):
        walked = s.get("gc_walked_max", {})
        gc_text = ", ".join(f"gen {g}: {c} ({t:.1f} ms, max {m:.1f}"
                            + (f"; walked at most {walked[g]} objects)" if g in walked else ")")
                            for g, (c, t, m) in sorted(s["gc"].items()))
        lines.append(f"  stalls {source}: loop late max {s['loop_late_max_ms']} ms"
                     + (f" (>= 5 ms: {s['lags']})" if s["lags"] else "")
                     + f"; collections {gc_text or 'none'}"
                     + (f"; pauses >= 1 ms (s into the phase, ms, gen): {s['gc_pauses']}" if s["gc_pauses"] else ""))
        lock = s.get("lock")
        if lock:
            lines.append(f"    shared lock {source}: taken {lock['taken']} times, wait max {lock['wait_max_ms']} ms, hold "
                         f"max {lock['hold_max_ms']} ms; the longest (s into the phase, wait ms, hold ms, where): "
                         f"{lock['longest']}")
        c = s.get("cycles")
        if c:
            lines.append(f"    cyclic garbage {source}: {c['sampled']} sampled collections freed {c['freed']} objects "
                         f"({c['freed'] / c['sampled']:.0f} each); types {c['types']}; frames {c['frames']}")
    return lines


ROLES = ("engine", "gateway", "quiet", "flood")
# Sockets the neighbour's client and the gateway may each hold: 3 R for the phase and its lead, most of it waiting.
WANT_OPEN_FILES = 65536


def cpu_list(text: str) -> set[int]:
    """A taskset -c list (0,2 or 4-15) as a set of cores."""
    cores: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return cores


def pin_plan(pin: bool, cores: list[int] | None = None, given: dict[str, set[int] | None] | None = None
             ) -> dict[str, set[int] | None]:
    """The cores of each role (engine, gateway, quiet client, flooding client); None: left unpinned.

    4 or more cores: each role its own (6 or more: the engine and the gateway two each, the engine's HTTP process and
    its engine process, the gateway's loop and the kernel's work for its sockets); the flooding client gets all
    the rest, so it never takes a core from the processes whose latency it is measured against. 2 or 3: the engine
    the first, the others share the rest (the development VM). `given` (from --engine-cpus etc.) overrides a role."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else sorted(cores)
    plan: dict[str, set[int] | None] = dict.fromkeys(ROLES)
    if pin and len(cores) >= 6:
        plan.update(engine=set(cores[0:2]), gateway=set(cores[2:4]), quiet={cores[4]}, flood=set(cores[5:]))
    elif pin and len(cores) >= 4:
        plan.update(engine={cores[0]}, gateway={cores[1]}, quiet={cores[2]}, flood=set(cores[3:]))
    elif pin and len(cores) >= 2:
        rest = set(cores[1:])
        plan.update(engine={cores[0]}, gateway=rest, quiet=rest, flood=rest)
    for role, chosen in (given or {}).items():
        if chosen:
            plan[role] = chosen
    return plan


def affinity_of(pid: int) -> str:
    """The cores `pid` may run on, as the kernel says (/proc/PID/status Cpus_allowed_list)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("Cpus_allowed_list")), "?")
    except OSError:
        return "?"


def raise_open_files() -> int:
    """Lift this process's open-file limit to its hard limit (inherited by the children): the neighbour's client
    and the gateway each hold a socket per waiting request, thousands at 3x capacity. Returns the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Above the hard limit only root may go (the device host runs as root); else up to the hard limit.
    for want in ((WANT_OPEN_FILES, max(hard, WANT_OPEN_FILES)), (min(hard, WANT_OPEN_FILES), hard)):
        if want[0] <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, want)
            break
        except (ValueError, OSError):
            continue
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def pooled_figures(samples: dict[str, list]) -> tuple[dict, dict]:
    """Each phase's figures over its samples, and each phase's P99 over alone's (the ratio the bound reads)."""
    figures = {name: ttft_figures(rows) for name, rows in samples.items()}
    alone = figures["alone"]["ttft_p99"]
    return figures, {name: round(figures[name]["ttft_p99"] / alone, 2) for name in figures if name != "alone"}


def run_samples(run: Path) -> tuple[int, dict[str, list]]:
    """A finished run's rounds and quiet samples per phase: its fairness.json's `quiet_samples`, or, where it wrote
    none (a run cut short after its rounds, or one from before the field), its client trace (--ttft-trace: a line
    per quiet request, id `r<round>-<phase>-<n>`). ValueError naming the file or directory that has neither."""
    results = run / "fairness.json"
    try:
        written = json.loads(results.read_text()) if results.is_file() else {}
        if "quiet_samples" in written:
            return len(written["rounds"]), {name: [(status, ttft) for status, ttft in rows]
                                            for name, rows in written["quiet_samples"].items()}
    except OSError as e:
        raise ValueError(f"{results}: unreadable ({e.strerror or e})") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{results}: not a fairness.json this bench wrote ({type(e).__name__}: {e})") from None
    samples: dict[str, list] = {}
    rounds = set()
    try:
        clients = read_trace(run / "trace")["client"].values() if (run / "trace").is_dir() else []
    except (OSError, EOFError, UnicodeDecodeError, KeyError) as e:
        raise ValueError(f"{run / 'trace'}: unreadable ({type(e).__name__}: {e})") from None
    for rec in clients:
        if "ttft_ms" in rec:
            parts = str(rec["id"]).split("-")
            if len(parts) != 3:
                raise ValueError(f"{run / 'trace'}: a client line's id {rec['id']!r} is not r<round>-<phase>-<n>")
            round_label, name, _ = parts
            rounds.add(round_label)
            samples.setdefault(name, []).append((rec.get("status"), rec["ttft_ms"]))
    if "alone" not in samples or "fair" not in samples:
        raise ValueError(f"{run}: no quiet samples of the alone and fair phases (neither a fairness.json with "
                         f"quiet_samples nor a client trace, trace/client-*.jsonl[.gz], written with --ttft-trace)")
    return len(rounds), samples


def pooled_runs(runs: list[Path], png: Path | None = None) -> list[str]:
    """The report of `pool`: each run's P99 per phase and ratio, then the figures over every run's samples together
    and the verdict on them (the bound reads the pooled ratio, as one run's does; the runs' own ratios beside it);
    with `png`, the picture of it (`draw_pooled`)."""
    lines, together, ratios, each_rounds, per_run = [], {}, [], [], []
    for run in runs:
        run_rounds, samples = run_samples(run)
        each_rounds.append(run_rounds)
        figures, ratio = pooled_figures(samples)
        ratios.append(ratio["fair"])
        per_run.append((run.name, ratio))
        lines.append(f"{run} ({run_rounds} rounds): " + ", ".join(
            f"{name} P99 {f['ttft_p99']} ms" + (f" ({ratio[name]}x)" if name in ratio else f" ({f['ok']} samples)")
            for name, f in figures.items()))
        for name, rows in samples.items():
            together.setdefault(name, []).extend(rows)
    figures, ratio = pooled_figures(together)
    n_runs = f"{len(runs)} run{'s' if len(runs) != 1 else ''}"
    lines.append(f"pooled over {n_runs} ({sum(each_rounds)} rounds, {figures['alone']['ok']} samples a phase): " + ", ".join(
        f"{name} P99 {f['ttft_p99']} ms" + (f" ({ratio[name]}x)" if name in ratio else "")
        for name, f in figures.items()))
    v = verdict({"pooled_ratio": ratio, "round_ratios": {"fair": spread(ratios)}})
    if png is not None:
        draw_pooled(png, together, figures, ratio, per_run, each_rounds)
        lines.append(f"drew {png}")
    return lines + [verdict_line(v, "the neighbour", f"pooled over {n_runs}", "runs")]


PHASE_LABELS = {"alone": "alone", "engine_bound": "engine-bound (the neighbour held to its part)",
                "fair": "beside the flood, fair admission", "fcfs": "beside the flood, first come first served"}


def draw_pooled(png: Path, samples: dict[str, list], figures: dict, ratio: dict, per_run: list[tuple[str, dict]],
                each_rounds: list[int]) -> None:
    """Left: the quiet account's TTFT tail pooled over the runs, per phase (the share of requests slower than each
    TTFT, log scale, down to the slowest), each P99 marked and the bound (1.1x alone's P99) drawn, so a reader sees
    where the fair tail leaves alone's. Right: each run's P99 ratio to alone, fair and engine-bound, against the
    bound and the pooled ratio."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tail, runs_ax) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [1.6, 1]})
    for i, (name, rows) in enumerate((n, samples[n]) for n in PHASE_LABELS if n in samples):
        ttfts = sorted(t for st, t in rows if st == 200 and t is not None)
        share_slower = [(len(ttfts) - k) / len(ttfts) for k in range(len(ttfts))]
        p99 = figures[name]["ttft_p99"]
        label = f"{PHASE_LABELS[name]}: P99 {p99:g} ms" + (f" ({ratio[name]}x)" if name in ratio else "")
        tail.step(ttfts, share_slower, where="post", color=f"C{i}", linewidth=1.4, label=label)
        tail.plot([p99], [0.01], marker="o", color=f"C{i}")
    bound = BOUND * figures["alone"]["ttft_p99"]
    tail.axvline(bound, color="0.3", linestyle="--", linewidth=1)
    tail.text(bound, 0.5, f" bound: {BOUND:g}x alone's P99\n = {bound:.2f} ms", fontsize=8, va="top")
    tail.axhline(0.01, color="0.7", linewidth=0.8)
    tail.set_yscale("log")
    tail.set_xscale("log")
    # Plain milliseconds at a few round values: matplotlib's minor labels of a log axis (3x10^0, 4x10^0) overlap.
    lo, hi = tail.get_xlim()
    ticks = [t for t in (1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 70, 100, 150, 200, 300, 500, 1000) if lo <= t <= hi]
    tail.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
    tail.xaxis.set_major_formatter(matplotlib.ticker.FixedFormatter([f"{t:g}" for t in ticks]))
    tail.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    tail.set_xlabel("quiet account's TTFT (ms, log scale)")
    tail.set_ylabel("share of its requests slower (log scale)")
    tail.set_title(f"Quiet account's TTFT tail, {figures['alone']['ok']} requests a phase pooled over "
                   f"{len(per_run)} run{'s' if len(per_run) != 1 else ''}; dots: each P99", fontsize=10)
    tail.legend(fontsize=8, loc="lower left")
    tail.grid(alpha=0.3, which="both")
    xs = range(len(per_run))
    runs_ax.plot(xs, [r.get("engine_bound") for _, r in per_run], "s", color="C1", label="engine-bound")
    runs_ax.plot(xs, [r["fair"] for _, r in per_run], "o", color="C2", label="fair admission")
    runs_ax.axhline(BOUND, color="0.3", linestyle="--", linewidth=1, label=f"bound {BOUND:g}x")
    runs_ax.axhline(ratio["fair"], color="C2", linewidth=1, alpha=0.6, label=f"fair, pooled: {ratio['fair']}x")
    runs_ax.axhline(1.0, color="0.7", linewidth=0.8)
    runs_ax.set_xticks(list(xs))
    # The runs' directories, less the part they share (fairness-h200-...-1, -2: "1", "2"), the whole name where
    # that leaves nothing.
    names = [name for name, _ in per_run]
    common = os.path.commonprefix(names) if len(names) > 1 else ""
    labels = [name[len(common):] or name for name in names]
    long_labels = max(map(len, labels)) > 6
    runs_ax.set_xticklabels(labels, rotation=30 if long_labels else 0, ha="right" if long_labels else "center",
                            fontsize=8)
    if common:
        runs_ax.set_xlabel(f"run ({common}...)", fontsize=8)
    runs_ax.set_ylabel("P99 TTFT over alone's, same run")
    same = set(each_rounds)
    runs_ax.set_title(f"Each run ({each_rounds[0]} rounds)" if len(same) == 1 else "Each run", fontsize=10)
    runs_ax.legend(fontsize=8)
    runs_ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    # Written whole or not at all: a failed write leaves no half a picture where an earlier one was.
    partial = png.with_name(png.name + ".partial")
    try:
        png.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(partial, dpi=110, format="png")
        partial.replace(png)
    finally:
        plt.close(fig)
        partial.unlink(missing_ok=True)


def spread(values: list[float]) -> dict:
    ordered = sorted(v for v in values if v == v)
    if not ordered:
        return {"min": float("nan"), "median": float("nan"), "max": float("nan")}
    return {"min": ordered[0], "median": round(percentile(ordered, 0.5), 2), "max": ordered[-1]}


async def main_async(args: argparse.Namespace) -> dict:
    import importlib.util

    from runtime.gateway.fair import held_beside
    from runtime.reference.build import build_artifact

    if importlib.util.find_spec("boto3") is None:  # the gateway's identity lookup (EC2, here the loopback fake)
        raise SystemExit("bench_fairness: the gateway needs boto3, which this Python lacks (on the device host: carry "
                         "its wheels, bench/FAIRNESS_DEVICE.md)")
    cores = pin_plan(args.pin, given={role: getattr(args, f"{role}_cpus") for role in ROLES})
    if cores["quiet"]:
        os.sched_setaffinity(0, cores["quiet"])  # this process (the quiet client); each child is pinned after
    open_files = raise_open_files()
    tmp = Path(tempfile.mkdtemp(prefix="bench-fairness-"))
    logs = Path(args.out) if args.out else tmp
    logs.mkdir(parents=True, exist_ok=True)
    build_artifact(tmp / "artifact", size="tiny")
    config = tmp / "fleet.json"
    write_config(config, fairness_config(args.batch, args.quiet_weight, args.neighbour_max_queued))
    ec2 = FakeEc2Endpoints([(QUIET[2], QUIET[1]), (NEIGHBOUR[2], NEIGHBOUR[1])])
    ec2_port = await ec2.start()
    env = {"AWS_ENDPOINT_URL_EC2": f"http://127.0.0.1:{ec2_port}", "AWS_ACCESS_KEY_ID": "bench",
           "AWS_SECRET_ACCESS_KEY": "bench", "AWS_MAX_ATTEMPTS": "1"}
    traced: list[tuple[dict, str, list[dict], tuple[float, float]]] = []  # (row, phase, client stamps, window)
    client_trace = None
    if args.ttft_trace:
        os.environ[TRACE_ENV] = str(logs / "trace")  # before the engine and the gateway start: they inherit it
        client_trace = Trace(os.environ[TRACE_ENV], "client")
        client_trace.watch_loop()
        client_trace.watch_gc()
    up_port = free_port()
    engine = _spawn(["-m", "runtime.reference.server", "--artifact", str(tmp / "artifact"), "--port", str(up_port),
                     "--max-batch-size", str(args.batch), "--threads", "1", "--served-model-name", bench_model(),
                     "--device", args.device],
                    cpus=cores["engine"], stderr=open(logs / "engine.log", "w"))  # noqa: SIM115 - the child's stderr
    body = json.dumps({"model": bench_model(), "prompt": "the quick brown fox " * 8, "max_tokens": args.tokens,
                       "ignore_eos": True, "stream": True}).encode()
    results: dict = {"config": vars(args), "pinned": {role: sorted(c) if c else None for role, c in cores.items()},
                     "affinity": {"engine": affinity_of(engine.pid), "quiet": affinity_of(os.getpid())},
                     "open_files_limit": open_files, "rounds": []}
    pooled: dict[str, list] = {"alone": [], "engine_bound": [], "fair": []}
    stats = EngineStats(up_port)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    async def measured(name: str, **kw) -> dict:
        stats.start()
        before = {"gateway": process_stats(gateway.pid), "engine": process_stats(engine.pid)}
        started = time.monotonic()
        label = f"r{len(results['rounds']) + 1}-{name}" if args.ttft_trace else None
        row = await phase(port, body, args.quiet_share * capacity, args.seconds, seed, flood_cpus=cores["flood"],
                          trace_label=label, flood_tokens=args.flood_tokens, **kw)
        if label is not None and client_trace is not None:
            clients = row.pop("traces")
            for stamps in clients:  # the trace directory holds every process's side of each request
                client_trace.write({"kind": "client", **stamps})
            traced.append((row, name, clients, row.pop("window_monotonic")))
        row["engine"] = await stats.stop()
        elapsed = time.monotonic() - started
        for proc, pid in (("gateway", gateway.pid), ("engine", engine.pid)):
            after = process_stats(pid)
            # Its share of a core it used, and of a second it waited runnable for one (other processes had it).
            row["engine"][f"{proc}_cpu"] = round((after.cpu_s - before[proc].cpu_s) / elapsed, 2)
            row["engine"][f"{proc}_runq"] = round((after.runq_wait_s - before[proc].runq_wait_s) / elapsed, 3)
        pooled.setdefault(name, []).extend(row.pop("samples"))
        say(f"  {name}: quiet {row['quiet']}; engine {row['engine']}"
            + (f"; neighbour {row['neighbour']}" if "neighbour" in row else ""))
        return row

    try:
        await _wait_port(up_port, None, timeout=120)
        for mode in ("on", "off"):
            if mode == "off" and args.skip_off:
                break
            port = free_port()
            emf = tmp / f"emf-{mode}.log"
            gateway = _spawn(["-m", "runtime.gateway", "--listen", f"127.0.0.1:{port}", "--upstream",
                              f"127.0.0.1:{up_port}", "--config-json", str(config), "--region", REGION, "--pool", POOL,
                              "--service-id", SERVICE_ID, "--fair-admission", mode,
                              "--workers", str(args.gateway_workers)], env,
                             stdout=open(emf, "w"), stderr=open(logs / f"gateway-{mode}.log", "w"),  # noqa: SIM115
                             cpus=cores["gateway"])
            try:
                await _wait_port(port, proxy_header(QUIET[2]))
                results["affinity"][f"gateway_{mode}"] = affinity_of(gateway.pid)
                await closed_loop(port, proxy_header(NEIGHBOUR[2]), body, args.batch, args.warmup)
                if mode == "on":
                    for r in range(args.repeats):
                        seed = 1 + r
                        # Each round's rates from the engine's capacity now: on a shared machine it moves with
                        # the load, and a quiet rate set from a stale capacity can outgrow its share.
                        served = await closed_loop(port, proxy_header(NEIGHBOUR[2]), body, args.batch,
                                                   args.capacity_s)
                        if not served:
                            raise SystemExit(f"bench_fairness: the engine completed no request in {args.capacity_s:g} "
                                             "s; are the prompt and --tokens within the model's context (tiny: 256 "
                                             "positions)?")
                        capacity = served / args.capacity_s
                        results.setdefault("capacity_rps", []).append(round(capacity, 2))
                        say(f"round {r + 1} of {args.repeats}: capacity {capacity:.2f} requests/s at batch "
                            f"{args.batch}")
                        row: dict = {"capacity_rps": round(capacity, 2), "alone": await measured("alone"),
                               # The most the neighbour holds beside the active quiet account (equal weights):
                               # the cap less the quiet account's part.
                               "engine_bound": await measured("engine_bound",
                                                              streams=held_beside(args.batch, [1.0, args.quiet_weight]),
                                                              lead=args.lead),
                               "fair": await measured("fair", flood_rate=args.flood * capacity, lead=args.lead)}
                        for name in ("alone", "engine_bound", "fair"):
                            waits = admission_waits(emf, QUIET[0], row[name]["window"])
                            row[name]["quiet_admission_wait_ms"] = waits
                        alone = row["alone"]["quiet"]["ttft_p99"]
                        for name in ("engine_bound", "fair"):
                            row[f"ratio_{name}"] = round(row[name]["quiet"]["ttft_p99"] / alone, 2)
                        results["rounds"].append(row)
                        say(f"  P99 ratio to alone: engine-bound {row['ratio_engine_bound']}x, "
                            f"fair {row['ratio_fair']}x; the quiet account's wait at the gateway P99: "
                            + ", ".join(f"{n} {row[n]['quiet_admission_wait_ms']['p99']} ms"
                                        for n in ("alone", "engine_bound", "fair")))
                else:
                    seed, capacity = 1, statistics.median(results["capacity_rps"])
                    results["fcfs"] = await measured("fcfs", flood_rate=args.flood * capacity, lead=args.lead)
            finally:
                stop(gateway, 30)
    finally:
        stop(engine, 40)
        await ec2.stop() if hasattr(ec2, "stop") else None
    if client_trace is not None:
        client_trace.stop()
        results["ttft_breakdown"] = trace_breakdowns(read_trace(Path(os.environ[TRACE_ENV])), traced)
    results["quiet_samples"] = pooled
    results["pooled"], results["pooled_ratio"] = pooled_figures(pooled)
    results["round_ratios"] = {name: spread([r[f"ratio_{name}"] for r in results["rounds"]])
                               for name in ("engine_bound", "fair")}
    return results


async def simulated_waits(cap: int, workers: int = 2, seconds: float = 10.0, tokens: int = 64, step_ms: float = 0.6,
                          per_seq_ms: float = 0.025, quiet_share: float = 0.15, flood: float = 3.0, lead: float = 2.0,
                          seed: int = 1, stall_ms: float = 0.0, stall_every_s: float = 0.5,
                          prefill_ms: float = 0.0, quiet_weight: float = 1.0,
                          flood_tokens: tuple[int, int] | None = None) -> dict:
    """The admission code alone (runtime/gateway/fair.py, `workers` gateway workers' admissions sharing one state,
    in process) in front of a simulated engine process, in virtual time: deterministic for a seed, whatever the
    machine's load. The engine runs continuous batching as the reference engine does: each iteration admits the
    requests granted since the last one, steps every request it holds by one token in `step_ms` + `per_seq_ms` x
    its batch (the defaults: the H200 host's reference engine, bench/FAIRNESS_DEVICE.md calls 2 and 3), and frees
    a request's slot at the end of the iteration of its last token. So requests started in one iteration end in
    one, and slots free in bunches, as on the device. The neighbour arrives at `flood` x the engine's capacity R
    (cap requests per request time at a full batch) from `lead` s before the quiet account's `seconds` at
    `quiet_share` x R (Poisson), each request through the next worker in turn. Returns how many of the quiet
    account's requests waited for a slot, its wait's P99 and max (virtual ms), how many of those it sent two request
    times or more after it came waited (`waited_later`: by then the neighbour's requests from before have ended, the
    last of them granted as the quiet account's first request came and ending a step or two past a request's time),
    and the most the neighbour held when a slot was granted to it while the quiet account held or waited for one.
    `stall_ms`: the engine stops that long once every `stall_every_s` (the step under way then lasts that much
    longer), as the device's engine queue says it did (bench/FAIRNESS_DEVICE.md); `quiet_least_own_when_waiting`: the
    fewest requests the quiet account held or waited for when one of its requests counted in `waited_later` had to
    wait (None: none did). `prefill_ms`: what each request an iteration admits adds to that iteration (its prefill:
    2-8 ms an iteration that admitted one on the H100 host, bench/FAIRNESS_DEVICE.md call 4), so that a burst
    stretches every request's time as on the device; `quiet_own_when_waiting`: how many the quiet account held or
    waited for at each of its requests that waited (a histogram: at or past its part, the burst is the cause).
    `quiet_weight`: the quiet account's admission weight (the neighbour's is 1): its part of the cap.
    `flood_tokens`: each of the neighbour's requests' tokens drawn from (LO, HI) (`--flood-tokens`), else `tokens`."""
    from fleetcast.config import parse_config
    from runtime.gateway.fair import CLIENT_GONE, FairAdmission
    from runtime.gateway.identity import Refusal
    from runtime.gateway.shared import SharedState

    rng = random.Random(seed)
    lengths = random.Random(seed + 1)  # its own stream: the arrivals are the same with and without drawn lengths
    data = fairness_config(cap, quiet_weight)
    consumers = parse_config(data, "<bench config>").consumers
    now = [0.0]
    engine = type("Engine", (), {"host_header": "sim:1"})()
    state = SharedState(workers)
    admissions = [FairAdmission(state, {"m": [engine]}, {"m": cap}, consumers, worker=w, poll_s=3600,
                                clock=lambda: now[0]) for w in range(workers)]
    for admission in admissions:
        admission.start()
    group = admissions[0].groups["m"]
    request_s = tokens * (step_ms + per_seq_ms * cap) / 1000
    rate = cap / request_s
    events: list[tuple[float, int, str, str]] = []
    order = iter(range(1 << 62))

    def at(t: float, kind: str, who: str = "") -> None:
        heapq.heappush(events, (t, next(order), kind, who))

    t = 0.0
    while (t := t + rng.expovariate(flood * rate)) < lead + seconds:
        at(t, "arrive", NEIGHBOUR[0])
    t = lead
    while (t := t + rng.expovariate(quiet_share * rate)) < lead + seconds:
        at(t, "arrive", QUIET[0])
    granted: list[tuple[str, FairAdmission]] = []
    batch: list[list] = []  # [account, tokens left, its admission]
    stepping, waits, settled, tasks, most, own_at_wait = [False], [], [], [], [0], []
    own_any: list[int] = []
    beside = [0, 0]  # the neighbour's and the quiet account's requests granted a slot during the quiet `seconds`

    async def request(who: str, admission: FairAdmission) -> None:
        asked = now[0]
        own = sum(group._int(cell) for cell in group.consumer_cells(who))  # its held and waiting requests
        got = await admission.acquire(who, "m", lambda: False)
        if isinstance(got, Refusal):  # the backlog flushed at the end
            return
        if who == QUIET[0]:
            waits.append((now[0] - asked) * 1000)
            if now[0] > asked:
                own_any.append(own)
            if asked >= lead + 2 * request_s + stall_ms / 1000:  # the neighbour's requests from before have ended
                settled.append(now[0] - asked)
                if now[0] > asked:
                    own_at_wait.append(own)
        elif sum(group._int(cell) for cell in group.consumer_cells(QUIET[0])):  # the quiet account is active
            most[0] = max(most[0], group._int(group.consumer_cells(NEIGHBOUR[0])[0]))
        if lead <= now[0] < lead + seconds:
            beside[who == QUIET[0]] += 1
        granted.append((who, admission))
        if not stepping[0]:
            stepping[0] = True
            at(now[0], "step")

    async def settle() -> None:  # the acquires, hand-overs and pokes an event set off
        for _ in range(6):
            await asyncio.sleep(0)

    turn = 0
    while events:
        now[0], _, kind, who = heapq.heappop(events)
        if kind == "arrive":
            tasks.append(asyncio.ensure_future(request(who, admissions[turn % workers])))
            turn += 1
        elif kind == "step":
            batch.extend([account, tokens if flood_tokens is None or account == QUIET[0] else lengths.randint(*flood_tokens),
                          admission] for account, admission in granted)
            admitted = len(granted)
            granted.clear()
            if batch:
                took = (step_ms + per_seq_ms * len(batch) + prefill_ms * admitted) / 1000
                if stall_ms and int(now[0] / stall_every_s) != int((now[0] + took) / stall_every_s):
                    took += stall_ms / 1000
                at(now[0] + took, "stepped")
            else:
                stepping[0] = False
        else:  # stepped: every request in the batch has one more token
            for entry in list(batch):
                entry[1] -= 1
                if not entry[1]:
                    batch.remove(entry)
                    entry[2].release(entry[0], "m", engine)
            at(now[0], "step")
        await settle()
        if kind == "arrive" and now[0] >= lead + seconds:
            break
    for admission in admissions:
        admission.flush(CLIENT_GONE)
        admission.stop()
    await settle()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    waited = [w for w in waits if w > 0.0]
    return {"cap": cap, "workers": workers, "quiet_requests": len(waits), "waited": len(waited),
            "waited_share": round(len(waited) / len(waits), 3) if waits else 0.0,
            "wait_p99_ms": round(percentile(waits, 0.99), 1) if waits else 0.0,
            "wait_max_ms": round(max(waits, default=0.0), 1), "request_ms": round(request_s * 1000, 1),
            "waited_later": sum(w > 0.0 for w in settled),
            "neighbour_most_held": most[0], "quiet_least_own_when_waiting": min(own_at_wait, default=None),
            "neighbour_served": beside[0], "neighbour_share": round(beside[0] / max(sum(beside), 1), 3),
            "quiet_own_when_waiting": {n: own_any.count(n) for n in sorted(set(own_any))}}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_flood"]:
        _flood(argv[1:])
        return 0
    if argv[:1] == ["pool"]:
        p = argparse.ArgumentParser(prog="python -m scripts.bench_fairness pool",
                                    description="The verdict over several runs' quiet samples pooled: each DIR a "
                                                "run's --out directory (its fairness.json, or its client trace).")
        p.add_argument("runs", nargs="+", type=Path, metavar="DIR",
                       help="a run's --out directory; pool runs of one command on one host")
        p.add_argument("--png", type=Path, help="draw the pooled TTFT tail per phase and each run's ratio")
        pool = p.parse_args(argv[1:])
        try:
            print("\n".join(pooled_runs(pool.runs, pool.png)))
        except ValueError as e:
            p.error(str(e))
        except OSError as e:  # the runs were read (their errors are ValueErrors): the picture could not be written
            p.error(f"--png {pool.png}: cannot write it ({e.strerror or e})")
        return 0
    if argv[:1] == ["simulate"]:
        # python -m scripts.bench_fairness simulate [CAP ...]: the admission code alone before a simulated engine
        sim = parse_simulate_args(argv[1:])
        for cap in sim.caps or [4, 16]:
            for workers, seed in ((w, seed) for w in (1, 2) for seed in range(1, sim.seeds + 1)):
                row = asyncio.run(simulated_waits(cap, workers, seconds=sim.seconds, prefill_ms=sim.prefill_ms,
                                                  stall_ms=sim.stall_ms, quiet_weight=sim.quiet_weight, seed=seed,
                                                  flood_tokens=sim.flood_tokens))
                print(f"cap {cap}, {workers} gateway worker{'s' if workers > 1 else ''}"
                      f"{f', seed {seed}' if sim.seeds > 1 else ''}: {row['waited']} of "
                      f"{row['quiet_requests']} quiet requests waited for a slot ({row['waited_share']:.1%}); wait P99 "
                      f"{row['wait_p99_ms']} ms, max {row['wait_max_ms']} ms (a request holds its slot "
                      f"{row['request_ms']:g} ms at a full batch); beside it the neighbour held at most "
                      f"{row['neighbour_most_held']}; the quiet account's own requests (held and waiting) when one "
                      f"waited: {row['quiet_own_when_waiting']}; the neighbour was served {row['neighbour_served']} "
                      f"requests while the quiet account sent ({row['neighbour_share']:.1%} of those served)")
        return 0
    args = parse_args(argv)
    results = asyncio.run(main_async(args))
    if args.cpu_runs:
        results["admission_cpu_us"] = fair_admission_cpu_runs(args.batch, runs=args.cpu_runs)
    results["verdict"] = verdict(results)
    print("\n" + "\n".join(report_lines(results, args)))
    for path in filter(None, (args.json, args.out and Path(args.out) / "fairness.json")):
        Path(path).write_text(results_json(results))
    return 0


def results_json(results: dict) -> str:
    """The results as JSON; the cores given by --engine-cpus and the like (sets, in `config`) as sorted lists. Before,
    a run with any of them ended in a TypeError after its report, and wrote no fairness.json."""
    def plain(value: object) -> object:
        if isinstance(value, (set, frozenset)):
            return sorted(value)
        if isinstance(value, Path):
            return str(value)
        raise TypeError(f"{type(value).__name__} is not JSON serializable")

    return json.dumps(results, indent=1, default=plain)


def token_range(text: str) -> tuple[int, int]:
    """`LO-HI` (or one number) as output tokens, 1 <= LO <= HI."""
    parts = text.split("-")
    try:
        if len(parts) > 2:
            raise ValueError
        low, high = int(parts[0]), int(parts[-1])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LO-HI, two whole numbers such as 32-96") from None
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 1 <= LO <= HI")
    return low, high


def parse_simulate_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m scripts.bench_fairness simulate",
                                description="the admission code alone before a simulated engine process, in virtual "
                                            "time (simulated_waits): how many quiet requests waited for a slot")
    p.add_argument("caps", nargs="*", type=int, metavar="CAP", help="admission caps to simulate (default: 4 16)")
    p.add_argument("--seconds", type=float, default=10.0, help="the quiet account's seconds (default 10)")
    p.add_argument("--prefill-ms", type=float, default=0.0,
                   help="what each request an iteration admits adds to it (default 0)")
    p.add_argument("--stall-ms", type=float, default=0.0, help="an engine stall every 0.5 s, this long (default 0)")
    p.add_argument("--quiet-weight", type=float, default=1.0, help="the quiet account's weight (default 1)")
    p.add_argument("--flood-tokens", type=token_range, default=None, metavar="LO-HI",
                   help="the neighbour's tokens per request drawn from LO to HI (default: 64 for every request)")
    p.add_argument("--seeds", type=int, default=1, help="runs with seeds 1 to this, each printed (default 1)")
    args = p.parse_args(argv)
    if any(cap < 1 for cap in args.caps):
        p.error(f"CAP {min(args.caps)}: must be at least 1")
    if not args.seconds > 0 or args.prefill_ms < 0 or args.stall_ms < 0 or not args.quiet_weight > 0 or args.seeds < 1:
        p.error("--seconds and --quiet-weight must be above 0, --prefill-ms and --stall-ms at least 0, --seeds at "
                "least 1")
    return args


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m scripts.bench_fairness", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=40.0, help="length of each measured phase (default 40)")
    p.add_argument("--repeats", type=int, default=3, help="rounds of (alone, engine-bound, fair) (default 3)")
    p.add_argument("--batch", type=int, default=8, help="the engine's max batch size, so its admission cap (default 8)")
    p.add_argument("--tokens", type=int, default=32, help="output tokens per request (default 32)")
    p.add_argument("--flood-tokens", type=token_range, default=None, metavar="LO-HI",
                   help="the neighbour's output tokens per request, drawn uniformly from LO to HI for each request "
                        "(default: --tokens for every request, so its streams started in one iteration end in one; "
                        "centre the range on --tokens to keep the load that --flood sets, which the capacity R, read "
                        "at --tokens, scales)")
    p.add_argument("--quiet-weight", type=float, default=1.0,
                   help="the quiet account's admission weight, the neighbour's being 1 (default 1: equal parts)")
    p.add_argument("--neighbour-max-queued", type=int, default=MOST_QUEUED,
                   help=f"the neighbour's consumers[].admission.max_queued: its requests that may wait at the gateway, "
                        f"beyond them a 429 at once (default {MOST_QUEUED}, the config's most: every request waits; the "
                        f"config's own default is 64)")
    p.add_argument("--quiet-share", type=float, default=0.15,
                   help="the quiet account's arrival rate as a share of the engine's capacity (default 0.15, under "
                        "a third of its fair share of two)")
    p.add_argument("--flood", type=float, default=3.0,
                   help="the neighbour's arrival rate as a multiple of the engine's capacity (default 3)")
    p.add_argument("--lead", type=float, default=5.0,
                   help="seconds the neighbour loads the engine before the quiet account's phase starts (default 5)")
    p.add_argument("--warmup", type=float, default=3.0,
                   help="seconds of the neighbour's closed loop at the cap before the first capacity read, the "
                        "engine's and the gateway's first requests out of the measurements (default 3)")
    p.add_argument("--capacity-s", type=float, default=10.0,
                   help="seconds of each round's capacity measurement (default 10)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the reference engine runs (default cpu; cuda: CUDA graph decode steps)")
    p.add_argument("--gateway-workers", type=int, default=1, help="the gateway's --workers (default 1)")
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="leave every process on every core (default: each role on cores of its own where there are "
                        "4 or more, else the engine on the first core and the rest on the others)")
    for role, what in (("engine", "the reference server"), ("gateway", "the gateway (all its workers)"),
                       ("quiet", "this process: the quiet account's client"),
                       ("flood", "the neighbour's client")):
        p.add_argument(f"--{role}-cpus", type=cpu_list, default=None,
                       help=f"cores of {what}, a taskset -c list such as 2,3 or 5-15 (default: the plan)")
    p.add_argument("--cpu-runs", type=int, default=7,
                   help="runs of fair admission's in-process CPU timing at the end (default 7; 0: skip)")
    p.add_argument("--skip-off", action="store_true", help="skip the phase with fair admission off")
    p.add_argument("--ttft-trace", action="store_true",
                   help="trace every quiet request's TTFT hop by hop through the gateway, the reference server's two "
                        "processes and back, and each process's loop lag and collections (runtime/ttft_trace.py; "
                        "the breakdown per phase goes to the report and the JSON)")
    p.add_argument("--json", help="write the figures here as JSON")
    p.add_argument("--out", help="a directory for fairness.json, the engine's and the gateway's logs")
    args = p.parse_args(argv)
    for name in ("seconds", "capacity_s", "quiet_share", "flood"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be above 0")
    if args.repeats < 1 or args.batch < 1 or args.gateway_workers < 1 or args.cpu_runs < 0:
        p.error("--repeats, --batch and --gateway-workers must be at least 1, --cpu-runs at least 0")
    from fleetcast.config import ConfigError, parse_config

    # The bounds of the weight and of max_queued are the config's (consumers[].admission), said once there.
    for flag, value, data in (
            ("--quiet-weight", args.quiet_weight, fairness_config(args.batch, args.quiet_weight)),
            ("--neighbour-max-queued", args.neighbour_max_queued,
             fairness_config(args.batch, neighbour_max_queued=args.neighbour_max_queued))):
        try:
            parse_config(data, "<bench config>")
        except ConfigError as exc:
            p.error(f"{flag} {value}: {exc}")
    return args


BOUND = 1.1  # the issue's: the quiet account's P99 TTFT beside the neighbour over its P99 alone


def verdict(results: dict) -> dict:
    """PASS when the fair phase's pooled P99 ratio is within BOUND; with the per-round spread and the floor."""
    ratio = results["pooled_ratio"]["fair"]
    return {"pass": ratio <= BOUND, "bound": BOUND, "pooled_ratio": ratio,
            "round_ratios": results["round_ratios"]["fair"],
            "engine_bound_ratio": results["pooled_ratio"]["engine_bound"]}


def report_lines(results: dict, args: argparse.Namespace) -> list[str]:
    pooled, ratio, rounds = results["pooled"], results["pooled_ratio"], results["round_ratios"]
    lines = [f"engine capacity R {results['capacity_rps']} requests/s (per round) at batch {args.batch}; quiet at "
             f"{args.quiet_share:g} R, {len(results['rounds'])} rounds of {args.seconds:g} s; engine on "
             f"{getattr(args, 'device', 'cpu')}"
             + (f"; the neighbour's output tokens {args.flood_tokens[0]}-{args.flood_tokens[1]} (uniform), the quiet "
                f"account's {args.tokens}" if getattr(args, "flood_tokens", None) else ""),
             "cores (as planned; as the kernel reports each process's affinity): "
             + ", ".join(f"{role} {results['pinned'].get(role) or 'any'}" for role in ROLES) + "; "
             + ", ".join(f"{k} {v}" for k, v in (results.get("affinity") or {}).items()),
             "quiet account P99 TTFT (pooled over the rounds, P50 / P90 / P99 ms, samples):"]
    for name, label in (("alone", "alone"), ("engine_bound", "beside a neighbour held to the cap less the quiet part"),
                        ("fair", f"beside a neighbour at {args.flood:g} R, fair admission"),
                        ("fcfs", f"beside a neighbour at {args.flood:g} R, first come first served")):
        if name in pooled:
            f = pooled[name]
            extra = f" ({ratio[name]}x alone)" if name in ratio else ""
            lines.append(f"  {label}: {f['ttft_p50']} / {f['ttft_p90']} / {f['ttft_p99']}{extra}, {f['ok']} samples")
    for name in ("engine_bound", "fair"):
        r = rounds[name]
        lines.append(f"  per-round P99 ratio, {name}: min {r['min']}x, median {r['median']}x, max {r['max']}x")
    lines.append("the bound: 1.1x (fair); engine-bound is the floor any admission order reaches on this engine")
    for name, b in (results.get("ttft_breakdown") or {}).items():
        lines += breakdown_lines(name, b, b.get("stalls"))
    if "admission_cpu_us" in results:
        lines += fair_admission_cpu_lines(results["admission_cpu_us"])
    return lines + [verdict_line(results["verdict"], f"a neighbour at {args.flood:g} R", "pooled", "rounds")]


def verdict_line(v: dict, beside: str, pooled: str, spread_of: str) -> str:
    """The report's last line: `verdict`'s pass, the pooled ratio against the bound, the spread of the rounds' (or
    the runs') own ratios and the engine-bound floor."""
    r = v["round_ratios"]
    return (f"fairness: {'PASS' if v['pass'] else 'FAIL'}: quiet P99 TTFT beside {beside} is {v['pooled_ratio']}x "
            f"its P99 alone ({pooled}; bound {v['bound']}x; {spread_of} {r['min']}-{r['max']}x, median {r['median']}x; "
            f"engine-bound floor {v['engine_bound_ratio']}x)")


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    sys.exit(run_quietly(main))
