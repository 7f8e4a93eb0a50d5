"""Runs a benchmark: warm-up, then one run per load level, and assembles the
results file.

Load modes (docs/bench.md, "Load modes"):
- concurrency: closed loop, N workers each keeping one request in flight;
  one run per level of the sweep.
- rate: open loop, arrivals at a fixed rate, Poisson or constant spacing;
  one run per rate.
- trace: open loop, arrivals and lengths replayed from a JSONL/CSV file.
- mix: closed loop whose concurrency changes phase by phase according to a
  weighted distribution ("1-16:0.8,32:0.15,64:0.05"); the share of requests
  at each level follows the weights, and every record keeps its level.

Everything the client does during a run stays light: prompts and request
bytes are built between sends, responses are decoded after the run.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import platform
import random
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleetcast import __version__
from fleetcast.bench.client import (
    ConnectionPool,
    Endpoint,
    build_http_request,
    http_json,
    send_request,
    tcp_rtt_ms,
)
from fleetcast.bench.distributions import IntDistribution, parse_distribution
from fleetcast.bench.metrics import Sent, Slo, summarize, to_record
from fleetcast.bench.prompts import PromptFactory, calibrate_from_usage
from fleetcast.bench.schedstat import ThreadWait, process_wait_ns, wait_between
from fleetcast.bench.schema import (
    SCHEMA_REVISION,
    Api,
    Arrival,
    ClientInfo,
    Labels,
    Lengths,
    Load,
    LoadMode,
    RequestShape,
    Results,
    Run,
    SloSpec,
    Stat,
    Summary,
)
from fleetcast.contract import bench as bench_defaults
from fleetcast.contract.errors import UserError

_clock = time.perf_counter
LOOP_PROBE_INTERVAL_S = 0.005


class LoopLagProbe:
    """Measures how long an external event waits before the event loop runs it.

    A helper thread posts a timestamped callback into the loop at random
    moments (`call_soon_threadsafe` wakes the loop exactly like a socket
    becoming readable); the delay until the callback runs is the delay a
    network read would see before `data_received` stamps it, i.e. the
    client's timestamp error at that moment. Lag is counted from the moment
    the thread planned to post, so time the OS kept the whole process off the
    CPU is counted too. A timer in the loop would instead measure epoll's
    millisecond rounding.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float = LOOP_PROBE_INTERVAL_S) -> None:
        import threading

        self.loop = loop
        self.interval_s = interval_s
        self.lags_ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._post, name="loop-lag-probe", daemon=True)

    def _seen(self, t_posted: float) -> None:
        self.lags_ms.append((_clock() - t_posted) * 1000.0)

    def _post(self) -> None:
        rng = random.Random(1)
        planned = _clock()
        while not self._stop.is_set():
            planned += self.interval_s * rng.uniform(0.5, 1.5)
            delay = planned - _clock()
            if delay > 0 and self._stop.wait(delay):
                return
            try:
                # Stamped with the PLANNED time: if the OS deschedules the whole
                # process, this thread wakes late too, and that delay counts.
                self.loop.call_soon_threadsafe(self._seen, planned)
            except RuntimeError:
                return  # loop closed
            planned = max(planned, _clock() - self.interval_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[float]:
        self._stop.set()
        self._thread.join()
        return self.lags_ms


class RunQueueMeter:
    """How long the OS kept the client runnable but off a CPU during one run (Linux schedstat).

    Made in the event-loop thread: its reader hands the connections that
    thread's own wait, read around each request (`ConnectionPool(rq_wait=)`);
    `stop` gives the wait of every thread of the process over the run per
    second of wall time. The client is one process, so its threads are all of
    it. Without schedstat both are None, said once per process through `log`.
    """

    _said = False

    def __init__(self, log: Callable[[str], None]) -> None:
        self._thread = ThreadWait()
        self.rq_wait = self._thread if self._thread.available else None
        self._start = process_wait_ns()
        self._wall0 = _clock()
        if self.rq_wait is None and not RunQueueMeter._said:
            RunQueueMeter._said = True
            log(f"client run-queue wait not measured (recorded null): {self._thread.why}")

    def stop(self) -> float | None:
        wait_ns = wait_between(self._start, process_wait_ns())
        self._thread.close()
        return None if wait_ns is None else wait_ns / 1e9 / max(_clock() - self._wall0, 1e-9)


@dataclass
class TraceRow:
    at_s: float
    input_tokens: int
    output_tokens: int


@dataclass
class Level:
    """One run's load: what the records and summary are labeled with. Each mode sets its own field (concurrency,
    rate_rps and arrival, mix, trace), which the code running that mode reads."""

    mode: LoadMode
    concurrency: int | None = None
    rate_rps: float | None = None
    arrival: Arrival | None = None
    mix: IntDistribution | None = None
    trace: list[TraceRow] | None = None


@dataclass
class BenchOptions:
    endpoint: str
    api: Api = "completions"
    model: str | None = None
    input_tokens: IntDistribution = field(default_factory=lambda: parse_distribution(bench_defaults.INPUT_TOKENS, "--input-tokens"))
    output_tokens: IntDistribution = field(default_factory=lambda: parse_distribution(bench_defaults.OUTPUT_TOKENS, "--output-tokens"))
    levels: list[Level] = field(default_factory=list)
    requests_per_level: int | None = 100
    duration_s: float | None = None
    warmup: int = 2
    seed: int = 0
    timeout_s: float = 600.0
    slo: Slo = field(default_factory=Slo)
    headers: dict[str, str] = field(default_factory=dict)
    tokenizer_dir: str | None = None
    force_output: bool = True
    rtt_probe: bool = False
    keep_records: bool = True
    labels: Labels = field(default_factory=Labels)
    config_hash: str | None = None
    max_inflight: int = 4096
    mix_phases: int = 8
    progress: bool = False
    ca_bundle: str | None = None


# ---------------------------------------------------------------- inputs


def _number(row: dict[str, Any], *keys: str) -> float:
    """The first of `keys` the row has, as a number: TypeError or ValueError where it has none or not a number."""
    for key in keys:
        if key in row:
            return float(row[key])
    raise TypeError(f"none of {', '.join(keys)}")


def load_trace(path: str, speed: float = 1.0) -> list[TraceRow]:
    """Trace rows from JSONL or CSV. Columns: timestamp (ms, as in Mooncake/AIPerf
    traces; or `timestamp_s` in seconds), input_length|input_tokens,
    output_length|output_tokens. Times are made relative to the first row."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--trace: {path} does not exist")
    rows: list[dict[str, Any]] = []
    if p.suffix.lower() == ".csv":
        with p.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    else:
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    raise UserError(f"--trace: {path} line {i} is not JSON") from None
    out = []
    for i, row in enumerate(rows, 1):
        try:
            if "timestamp_s" in row:
                at = float(row["timestamp_s"])
            else:
                at = _number(row, "timestamp", "timestamp_ms") / 1000.0
            inp = int(_number(row, "input_length", "input_tokens"))
            outp = int(_number(row, "output_length", "output_tokens"))
        except (TypeError, ValueError):
            raise UserError(
                f"--trace: {path} row {i} needs timestamp (ms) or timestamp_s, input_length and output_length"
            ) from None
        if inp < 1 or outp < 1:
            raise UserError(f"--trace: {path} row {i}: lengths must be >= 1")
        out.append(TraceRow(at, inp, outp))
    if not out:
        raise UserError(f"--trace: {path} has no rows")
    out.sort(key=lambda r: r.at_s)
    t0 = out[0].at_s
    return [TraceRow((r.at_s - t0) / speed, r.input_tokens, r.output_tokens) for r in out]


# ---------------------------------------------------------------- the benchmark


class Bench:
    """One benchmark session against one endpoint."""

    def __init__(self, opts: BenchOptions, log: Callable[[str], None] | None = None) -> None:
        self.opts = opts
        self.ep = Endpoint.parse(opts.endpoint)
        self.path = "/v1/chat/completions" if opts.api == "chat" else "/v1/completions"
        self.rng = random.Random(opts.seed)
        self.log = log or (lambda msg: None)
        self.model = opts.model
        self.prompts: PromptFactory | None = None
        self._headers = dict(opts.headers)
        self._started: datetime | None = None
        self._runs: list[Run] = []  # the levels finished so far: what an interrupted run keeps

    # -- control plane (not timed)
    async def _discover(self) -> None:
        """Model id and prompt calibration, through plain blocking HTTP in a thread:
        untimed, and it keeps the client free of extra HTTP libraries."""
        if self.model is None:
            models = await self._served_models()
            if not models:
                raise UserError(f"--endpoint {self.ep.url}: GET /v1/models gave no model id; pass --model")
            self.model = models[0]
        self.prompts = await self._calibrate(self.model, self.opts.tokenizer_dir)

    @property
    def _prompts(self) -> PromptFactory:
        assert self.prompts is not None, "the prompt factory is made in _discover, before any request"
        return self.prompts

    @property
    def _base(self) -> str:
        return _base_url(self.ep)

    async def _served_models(self, ep: Endpoint | None = None) -> list[str]:
        """The ids GET /v1/models lists (through a gateway: the ones this caller may use); [] when it lists none."""
        ep = ep or self.ep
        try:
            status, body = await asyncio.to_thread(http_json, "GET", f"{_base_url(ep)}/v1/models", None,
                                                self._headers, 60.0, self.opts.ca_bundle)
            return [m["id"] for m in body["data"]]
        except OSError as exc:
            raise UserError(f"--endpoint {ep.url}: cannot connect ({exc})") from None
        except (ValueError, KeyError, IndexError, TypeError):
            return []

    async def _calibrate(self, model: str, tokenizer_dir: str | None, ep: Endpoint | None = None) -> PromptFactory:
        """Prompts of the asked token lengths for `model`: exact with its tokenizer, else calibrated from the
        server's reported prompt_tokens."""
        ep = ep or self.ep
        base = _base_url(ep)
        if tokenizer_dir:
            return PromptFactory(tokenizer_dir=tokenizer_dir)
        samples: list[tuple[int, int | None]] = []
        probe = PromptFactory()
        # Small probes: short-context models (max_seq_len 256) must accept them.
        for words in (4, 16):
            body = self._body(probe.prompt(words, random.Random(words)), 1, model)
            body.pop("stream_options", None)
            body["stream"] = False
            try:
                status, data = await asyncio.to_thread(http_json, "POST", f"{base}{self.path}", body, self._headers,
                                                    60.0, self.opts.ca_bundle)
            except OSError as exc:
                raise UserError(f"--endpoint {ep.url}: cannot connect ({exc})") from None
            if status != 200 or not isinstance(data, dict):
                self.log(f"prompt calibration of {model}: {self.path} answered {status}: {str(data)[:160]}; "
                         "assuming 1 token per word (pass a tokenizer for exact prompts)")
                samples = []
                break
            samples.append((words, (data.get("usage") or {}).get("prompt_tokens")))
        return PromptFactory(calibration=calibrate_from_usage(samples))

    def _body(self, prompt: str, max_tokens: int, model: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model or self.model, "max_tokens": max_tokens, "stream": True,
                      "stream_options": {"include_usage": True}}
        if self.opts.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if self.opts.force_output:
            # TensorRT-LLM and vLLM extensions: generate exactly max_tokens.
            body["ignore_eos"] = True
            body["min_tokens"] = max_tokens
        return body

    def _request(self, n_in: int, n_out: int) -> bytes:
        body = self._body(self._prompts.prompt(n_in, self.rng), n_out)
        return build_http_request(self.ep, self.path, json.dumps(body, separators=(",", ":")).encode(), self._headers)

    def _shape(self) -> tuple[int, int]:
        return self.opts.input_tokens.sample(self.rng), self.opts.output_tokens.sample(self.rng)

    # -- load generators
    async def _closed_loop(self, pool: ConnectionPool, concurrency: int, count: int | None,
                           deadline: float | None, sink: list[Sent], counter: list[int],
                           shape: Callable[[], tuple[int, int]] | None = None,
                           build: Callable[[int, int], bytes] | None = None) -> None:
        """`counter` may be shared by several loops (a model mix): together they stop at `count` requests."""
        shape = shape or self._shape
        build = build or self._request

        async def worker() -> None:
            ready = None
            while True:
                if count is not None and counter[0] >= count:
                    return
                if deadline is not None and _clock() >= deadline:
                    return
                counter[0] += 1
                n_in, n_out = shape()
                request = build(n_in, n_out)
                raw = await send_request(pool, request, self.opts.timeout_s)
                sink.append(Sent(raw, n_in, n_out, ready=ready, concurrency=concurrency))
                ready = raw.t_done

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def _open_loop(self, pool: ConnectionPool, plan: list[tuple[float, int, int]], sink: list[Sent],
                         deadline: float | None, build: Callable[[int, int], bytes] | None = None) -> None:
        """plan: (offset_s, input_tokens, output_tokens), sorted by offset."""
        build = build or self._request
        gate = asyncio.Semaphore(self.opts.max_inflight)
        tasks = []

        async def one(planned: float, n_in: int, n_out: int, request: bytes) -> None:
            async with gate:
                raw = await send_request(pool, request, self.opts.timeout_s)
            sink.append(Sent(raw, n_in, n_out, planned=planned))

        t0 = _clock()
        for offset, n_in, n_out in plan:
            request = build(n_in, n_out)
            planned = t0 + offset
            if deadline is not None and planned >= deadline:
                break
            delay = planned - _clock()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(planned, n_in, n_out, request)))
        await asyncio.gather(*tasks)

    def _rate_plan(self, level: Level, count: int, shape: Callable[[], tuple[int, int]] | None = None,
                   rate_rps: float | None = None) -> list[tuple[float, int, int]]:
        shape = shape or self._shape
        rate = rate_rps or level.rate_rps
        assert rate is not None, "a rate level sets rate_rps"
        t, plan = 0.0, []
        for _ in range(count):
            n_in, n_out = shape()
            plan.append((t, n_in, n_out))
            t += self.rng.expovariate(rate) if level.arrival == "poisson" else 1.0 / rate
        return plan

    def _mix_phases(self, level: Level, total: int) -> list[tuple[int, int]]:
        """(concurrency, requests) phases whose request shares follow the mix weights."""
        assert level.mix is not None, "a mix level sets mix"
        buckets = level.mix.buckets
        wsum = sum(b.weight for b in buckets)
        phases = []
        for b in buckets:
            share = round(total * b.weight / wsum)
            if share <= 0:
                continue
            parts = 1 if b.lo == b.hi else max(1, min(self.opts.mix_phases, share // max(b.hi, 1)))
            for k in range(parts):
                n = share // parts + (1 if k < share % parts else 0)
                if n:
                    phases.append((b.lo if b.lo == b.hi else self.rng.randint(b.lo, b.hi), n))
        self.rng.shuffle(phases)
        return phases

    async def _run_level(self, level: Level, progress: _Progress | None
                         ) -> tuple[list[Sent], list[float], float, bool, float | None]:
        opts = self.opts
        meter = RunQueueMeter(self.log)
        pool = ConnectionPool(self.ep, ca_bundle=self.opts.ca_bundle, rq_wait=meter.rq_wait)
        sink: list[Sent] = []
        lags: list[float] = []
        probe = LoopLagProbe(asyncio.get_running_loop())
        probe.start()
        if progress:
            progress.start(level, sink)
        cpu0, wall0 = time.process_time(), _clock()
        deadline = wall0 + opts.duration_s if opts.duration_s else None
        try:
            if level.mode == "concurrency":
                await self._closed_loop(pool, _concurrency(level), opts.requests_per_level, deadline, sink, [0])
            elif level.mode == "mix":
                total = opts.requests_per_level or 1000
                for conc, n in self._mix_phases(level, total):
                    # A phase with fewer requests than its level never reaches that level: say what ran.
                    await self._closed_loop(pool, min(conc, n), n, deadline, sink, [0])
            elif level.mode == "rate":
                count = opts.requests_per_level or int(_rate(level) * _duration(opts)) + 1
                await self._open_loop(pool, self._rate_plan(level, count), sink, deadline)
            elif level.mode == "trace":
                assert level.trace is not None, "a trace level sets trace"
                rows = level.trace if opts.requests_per_level is None else level.trace[: opts.requests_per_level]
                await self._open_loop(pool, [(r.at_s, r.input_tokens, r.output_tokens) for r in rows], sink, deadline)
        finally:
            cpu = (time.process_time() - cpu0) / max(_clock() - wall0, 1e-9)
            rq_share = meter.stop()
            lags = probe.stop()
            if progress:
                progress.stop()
            pool.close()
        return sink, lags, cpu, pool.kernel_stamps, rq_share

    async def _warmup(self) -> None:
        if self.opts.warmup <= 0:
            return
        pool = ConnectionPool(self.ep, ca_bundle=self.opts.ca_bundle)
        first = self.opts.levels[0]
        conc = max(1, min(self.opts.warmup, first.concurrency or 1))
        sink: list[Sent] = []
        try:
            await self._closed_loop(pool, conc, self.opts.warmup, None, sink, [0])
        finally:
            pool.close()
        failed = [s for s in sink if to_record(s, self.opts.api, 0.0).ok is False]
        if len(failed) == len(sink):
            rec = to_record(sink[0], self.opts.api, 0.0)
            said = f": {rec.error_detail}" if rec.error_detail else ""
            raise UserError(f"--endpoint {self.ep.url}: every warm-up request failed (first error: {rec.error}{said})")

    # What a session without levels is told to give.
    _LOAD_FLAGS = "--concurrency, --rate, --trace or --mix"

    async def _start(self) -> float | None:
        """Discovery, the RTT probe and the warm-up before the first level; the TCP connect time or None."""
        if not self.opts.levels:
            raise UserError(f"nothing to run: give {self._LOAD_FLAGS}")
        self._started = datetime.now(UTC)
        await self._discover()
        rtt = await tcp_rtt_ms(self.ep) if self.opts.rtt_probe else None
        await self._warmup()
        return rtt

    async def run_async(self) -> Results:
        opts = self.opts
        rtt = await self._start()
        progress = _Progress(opts.requests_per_level, opts.duration_s) if opts.progress else None
        runs = self._runs
        for level in opts.levels:
            sink, lags, cpu, kernel_stamps, rq_share = await self._run_level(level, progress)
            t0 = min((s.raw.t_send for s in sink), default=0.0)
            sink.sort(key=lambda s: s.raw.t_send)
            records = [to_record(s, opts.api, t0) for s in sink]
            summary = summarize(sink, records, opts.slo, lags, cpu, rtt, kernel_stamps, rq_share)
            if level.mode == "concurrency" and level.concurrency and summary.requests < level.concurrency:
                # Only possible with --duration (the CLI refuses a request count below the level).
                summary = summary.model_copy(update={"load_note": (
                    f"only {summary.requests} request(s) ran at concurrency {level.concurrency}: the load never "
                    f"reached its label (mean concurrency {summary.mean_concurrency:.1f})")})
            self.log(_level_line(level, summary))
            runs.append(Run(
                load=Load(mode=level.mode, concurrency=level.concurrency, rate_rps=level.rate_rps,
                          arrival=level.arrival),
                lengths=Lengths(
                    input_mean=opts.input_tokens.expected(), output_mean=opts.output_tokens.expected(),
                    spec=f"input={opts.input_tokens.spec} output={opts.output_tokens.spec} "
                         f"prompts={self._prompts.describe()} force_output={opts.force_output}"
                         + (f" mix={level.mix.spec}" if level.mix else ""),
                ),
                summary=summary,
                records=records if opts.keep_records else [],
            ))
        return self._results()

    def _results(self, interrupted: str | None = None) -> Results:
        opts, runs = self.opts, list(self._runs)
        labels = opts.labels
        if labels.model is None and self.model:
            labels = labels.model_copy(update={"model": self.model})
        prompts = self._prompts.describe()
        assert self._started is not None, "results are made after _start"
        return Results(
            labels=labels, endpoint=opts.endpoint, api=opts.api, config_hash=opts.config_hash,
            client=client_info(), started_at=self._started, finished_at=datetime.now(UTC), seed=opts.seed, runs=runs,
            revision=SCHEMA_REVISION, provenance="measured",
            slo=SloSpec(ttft_ms=opts.slo.ttft_ms, itl_ms=opts.slo.itl_ms, e2e_ms=opts.slo.e2e_ms),
            request=RequestShape(
                input_tokens=opts.input_tokens.spec, output_tokens=opts.output_tokens.spec,
                input_mean=opts.input_tokens.expected(), output_mean=opts.output_tokens.expected(),
                prompts=prompts, force_output=opts.force_output,
            ),
            interrupted=interrupted,
        )

    def run(self) -> Results:
        """The session's results. Ctrl-C after some levels finished returns those, marked interrupted (the level
        it cut is dropped: its figures would describe a shorter, unfinished load); before any finished, it raises."""
        try:
            return asyncio.run(self.run_async())
        except KeyboardInterrupt:
            if not self._runs:
                raise
            done = len(self._runs)
            if done == len(self.opts.levels):
                return self._results()  # every level had finished
            cut, never = self.opts.levels[done], self.opts.levels[done + 1:]
            return self._results(interrupted=(
                f"Ctrl-C during {_level_name(cut)}: {done} of {len(self.opts.levels)} level(s) finished; "
                f"{_level_name(cut)} dropped" + (f", not run: {', '.join(_level_name(x) for x in never)}"
                                                 if never else "")))


def _concurrency(level: Level) -> int:
    assert level.concurrency is not None, "a concurrency level sets concurrency"
    return level.concurrency


def _rate(level: Level) -> float:
    assert level.rate_rps is not None, "a rate level sets rate_rps"
    return level.rate_rps


def _duration(opts: BenchOptions) -> float:
    # Without a request count a rate level runs for --duration (the CLI defaults the count where none is given).
    assert opts.duration_s is not None, "a rate level without requests_per_level has duration_s"
    return opts.duration_s


def _base_url(ep: Endpoint) -> str:
    return ep.url.rstrip("/").removesuffix("/v1")


def client_info() -> ClientInfo:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return ClientInfo(host=socket.gethostname(), cpus=cpus, python=platform.python_version(),
                      fleetcast_version=__version__)


def _level_name(level: Level) -> str:
    if level.mode == "concurrency":
        return f"concurrency {level.concurrency}"
    if level.mode == "rate":
        return f"rate {level.rate_rps:g} rps ({level.arrival})"
    if level.mode == "mix":
        assert level.mix is not None, "a mix level sets mix"
        return f"mix {level.mix.spec}"
    return "trace"


def _level_line(level: Level, s: Summary) -> str:
    def f(stat: Stat, q: str) -> str:
        v = getattr(stat, q)
        return "-" if v is None else f"{v:.1f}"
    sat = f"  SATURATED: {s.saturation_reason}" if s.saturated else ""
    note = f"  NOTE: {s.load_note}" if s.load_note else ""
    errors = "".join(f"  {kind}: {msg}" for kind, msg in s.error_messages.items())
    return (f"{_level_name(level)}: {s.completed}/{s.requests} ok, TTFT p50 {f(s.ttft_ms, 'p50')} "
            f"p99 {f(s.ttft_ms, 'p99')} ms, ITL p50 {f(s.itl_ms, 'p50')} p99 {f(s.itl_ms, 'p99')} ms, "
            f"{s.output_throughput_tps:.0f} tok/s{sat}{note}{errors}")


class _Progress:
    """A one-line progress display on stderr, redrawn twice a second."""

    def __init__(self, per_level: int | None, duration_s: float | None) -> None:
        self.per_level = per_level
        self.duration_s = duration_s
        self._task: asyncio.Task[None] | None = None

    def start(self, level: Level, sink: list[Sent]) -> None:
        t0 = _clock()
        name = _level_name(level)

        async def draw() -> None:
            while True:
                done = len(sink)
                errors = sum(1 for s in sink if s.raw.error)
                el = _clock() - t0
                total = f"/{self.per_level}" if self.per_level else f" ({el:.0f}/{self.duration_s:.0f}s)"
                sys.stderr.write(f"\r{name}: {done}{total} done, {errors} errors, {done / max(el, 1e-9):.1f} req/s   ")
                sys.stderr.flush()
                await asyncio.sleep(0.5)

        self._task = asyncio.create_task(draw())

    def stop(self) -> None:
        if self._task:
            self._task.cancel()
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
