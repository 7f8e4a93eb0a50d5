"""Several models through one endpoint at once (`fleetcast bench run --model-mix`): co-located
measurements for the planner (results revision 4, fleetcast/bench/schema.py).

At every level of the sweep the mix splits the load by its shares and drives every model at the same
time, each with its own request shape (lengths, prompts) and the body's `model` set:
- concurrency N: N closed-loop workers, split by the shares (largest remainder, at least one each), one
  shared request count, so every model stops together and none runs its tail with its peers idle;
- rate R: one arrival process per model at R x its share, with R x duration (or the request count) split
  the same way, so the models' arrivals span the same time.
Each model's results go in a file of its own (its load is its part of the level, its `peers` the other
models' measured mean concurrency); every file also carries the whole mix's figures at that level
(`Run.total`), so a report shows each model and the total side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING

from fleetcast.bench.client import ConnectionPool, Endpoint
from fleetcast.bench.distributions import IntDistribution, parse_distribution
from fleetcast.bench.metrics import Sent, summarize, to_record
from fleetcast.bench.prompts import PromptFactory, tokenizer_file
from fleetcast.bench.runner import (
    Bench,
    BenchOptions,
    Level,
    LoopLagProbe,
    RunQueueMeter,
    _concurrency,
    _duration,
    _level_line,
    _level_name,
    _rate,
    client_info,
)
from fleetcast.bench.schema import (
    SCHEMA_REVISION,
    Labels,
    Lengths,
    Load,
    MixTotal,
    ModelMix,
    PackedModel,
    Packing,
    Record,
    RequestShape,
    Results,
    Run,
    SloSpec,
    Summary,
)
from fleetcast.contract.errors import UserError
from fleetcast.contract.model_ids import model_id_of, model_id_problem
from fleetcast.contract.serving import GIB

if TYPE_CHECKING:
    from fleetcast.config import FleetConfig

FLAG = "--model-mix"
# Shares are written with a few decimals ("0.7,0.2,0.1"); their sum is 1 within what such decimals can miss.
SHARE_SUM_TOLERANCE = 1e-6
# A closed loop's requests split by each model's speed times its workers, not by the shares: past this many
# points off a share, `bench run` warns (split_warnings).
REQUEST_SPLIT_NOTE_AT = 0.05
_clock = time.perf_counter


@dataclass(frozen=True)
class MixModel:
    """One model of a mix: its share of the load and its own request shape."""

    model: str
    share: float
    input_tokens: IntDistribution
    output_tokens: IntDistribution
    tokenizer_dir: str | None = None
    endpoint: str | None = None  # this model's own server (its engine process), instead of the common --endpoint
    precision: str | None = None  # what its processes run at (model_precisions); None: --label precision, if any


def parse_model_mix(spec: str) -> dict[str, float]:
    """'gpt2-xl:0.7,qwen2.5-1.5b:0.3' -> {model: share}; UserError naming --model-mix otherwise."""
    shares: dict[str, float] = {}
    for part in (p.strip() for p in spec.split(",")):
        model, sep, value = part.rpartition(":")
        if not sep or not model:
            raise UserError(f"{FLAG} {spec!r}: {part!r} is not MODEL:SHARE (e.g. gpt2-xl:0.7,qwen2.5-1.5b:0.3)")
        if model_id_problem(model):
            raise UserError(f"{FLAG}: {model_id_problem(model)}")
        try:
            share = float(value)
        except ValueError:
            raise UserError(f"{FLAG}: share {value!r} of {model} is not a number") from None
        if not 0 < share <= 1:
            raise UserError(f"{FLAG}: share {value} of {model} must be above 0 and at most 1")
        if model in shares:
            raise UserError(f"{FLAG}: {model} is named twice")
        shares[model] = share
    if len(shares) < 2:
        raise UserError(f"{FLAG} {spec!r}: name at least two models (one model: use --model)")
    total = sum(shares.values())
    if abs(total - 1) > SHARE_SUM_TOLERANCE:
        raise UserError(f"{FLAG} {spec!r}: the shares sum to {total:g}, not 1")
    return shares


def per_model_option(pairs: list[str], flag: str, mix: dict[str, float]) -> dict[str, str]:
    """`--model-input-tokens gpt2-xl=normal:512,64` (repeatable) -> {model: value}; each model must be in the mix."""
    out: dict[str, str] = {}
    for pair in pairs:
        model, sep, value = pair.partition("=")
        if not sep or not value:
            raise UserError(f"{flag} {pair!r}: use MODEL=VALUE, MODEL one of the {FLAG} models")
        if model not in mix:
            raise UserError(f"{flag} {pair!r}: {model} is not in {FLAG} ({', '.join(mix)})")
        if model in out:
            raise UserError(f"{flag}: {model} is given twice")
        out[model] = value
    return out


PRECISION_FLAG = "--model-precision"


def model_precisions(pairs: list[str], mix: dict[str, float], packing: Packing,
                     default: str | None) -> dict[str, str | None]:
    """Each mix model's precision: its `--model-precision MODEL=PREC`, else what the packing records for it (a
    --pool's engine), else `default` (--label precision, one for every model as before). A flag that contradicts
    the pool's engine is refused: the config says what the instance built."""
    from fleetcast.contract.support import PRECISIONS

    given = per_model_option(pairs, PRECISION_FLAG, mix)
    recorded = {s.model: s.precision for s in packing.serves if s.precision}
    for model, precision in given.items():
        if precision not in PRECISIONS:
            raise UserError(f"{PRECISION_FLAG} {model}={precision}: {precision!r} is not a precision; choose one of "
                            f"{', '.join(PRECISIONS)}")
        if recorded.get(model, precision) != precision:
            raise UserError(f"{PRECISION_FLAG} {model}={precision}: the --pool's engine builds {model} at "
                            f"{recorded[model]} (the config's engine precision); drop the flag or use --packing")
    for model in mix:
        if model not in given and default is not None and recorded.get(model, default) != default:
            raise UserError(f"--label precision={default}: the --pool's engine builds {model} at {recorded[model]} "
                            "(the config's engine precision); drop the label, each model's precision is the pool's")
    return {m: given.get(m) or recorded.get(m) or default for m in mix}


def with_precisions(packing: Packing, precisions: dict[str, str | None]) -> Packing:
    """The packing with each model's precision recorded where it is known (bench results revision 5)."""
    return packing.model_copy(update={"serves": [
        s.model_copy(update={"precision": precisions.get(s.model) or s.precision}) for s in packing.serves]})


def split_counts(total: int, shares: dict[str, float], at_least: int = 1) -> dict[str, int]:
    """`total` split by the shares, largest remainder first, each model at least `at_least` (when total allows)."""
    raw = {m: total * s for m, s in shares.items()}
    out = {m: max(at_least, int(v)) for m, v in raw.items()}
    by_remainder = sorted(shares, key=lambda m: (raw[m] - int(raw[m]), shares[m]), reverse=True)
    i = 0
    while sum(out.values()) < total:
        out[by_remainder[i % len(by_remainder)]] += 1
        i += 1
    # Taken back from the largest parts above their floor (raised by `at_least`).
    for m in sorted(shares, key=lambda m: out[m], reverse=True):
        while sum(out.values()) > total and out[m] > at_least:
            out[m] -= 1
    return out


def _percents(values: dict[str, float]) -> str:
    return "/".join(f"{v:.0%}" for v in values.values())


# A share written to a few decimals (0.333333 for a third) may fall short of a whole worker by that much.
WORKER_TOLERANCE = 1e-3


def smallest_concurrency(shares: dict[str, float]) -> int:
    """The lowest --concurrency whose split gives every model at least its share of one worker: below it the
    one worker each model needs outweighs the shares (3 workers for 0.7/0.2/0.1 would run 1/1/1)."""
    return math.ceil(1 / min(shares.values()) - WORKER_TOLERANCE)


def check_concurrency(level: int, shares: dict[str, float]) -> None:
    """Refuse a level the worker split cannot hold the shares at, saying what it would run instead."""
    least = smallest_concurrency(shares)
    if level >= least:
        return
    model = min(shares, key=lambda m: shares[m])
    split = split_counts(level, shares) if level >= len(shares) else None
    would = (f"the split would be {'/'.join(str(n) for n in split.values())} workers "
             f"({_percents({m: n / level for m, n in split.items()})} instead of {_percents(shares)})"
             if split else f"{len(shares)} models need at least {len(shares)} workers")
    raise UserError(f"--concurrency {level}: {model}'s share {shares[model]:g} is {level * shares[model]:.1f} of a "
                    f"worker and each model needs a whole one, so {would}; use --concurrency {least} or more, or "
                    f"--rate (its arrivals split by the shares at any rate)")


def request_split_note(requests: dict[str, int], shares: dict[str, float]) -> str | None:
    """What a concurrency level's requests split to, where it is over REQUEST_SPLIT_NOTE_AT off the shares."""
    total = sum(requests.values())
    if not total:
        return None
    split = {m: requests.get(m, 0) / total for m in shares}
    if max(abs(split[m] - shares[m]) for m in shares) <= REQUEST_SPLIT_NOTE_AT:
        return None
    return (f"requests split {_percents(split)} against the mix's {_percents(shares)} ({', '.join(shares)}): "
            "the shares split the closed-loop workers and each model's workers send as fast as it answers; "
            "--rate splits the requests by the shares")


def split_warnings(results: list[Results]) -> list[str]:
    """One line per concurrency level of a mix run whose requests split over REQUEST_SPLIT_NOTE_AT off the shares
    (from the files' own request counts, so what is warned is what the files hold)."""
    out: list[str] = []
    mix = results[0].model_mix
    assert mix is not None, "a model-mix run's files"
    for i, total in enumerate(r.total for r in results[0].runs):
        if total is None or total.load.mode != "concurrency":
            continue
        note = request_split_note({res.labels.model: res.runs[i].summary.requests for res in results
                                   if res.labels.model is not None}, mix.shares)
        if note:
            out.append(f"concurrency {total.load.concurrency}: {note}")
    return out


def parse_packing(spec: str, instance_type: str | None, gpu: str | None) -> Packing:
    """`--packing gpt2-xl:1:20,qwen2.5-1.5b:2` (MODEL:COPIES[:KV_GIB], comma-separated) -> Packing. A model id
    with `:` (ft:...) is written as its slug (ft!3a..., fleetcast/contract/model_ids.py), as the bench stack does."""
    serves = []
    for part in (p.strip() for p in spec.split(",")):
        bits = part.split(":")
        if len(bits) not in (2, 3) or not bits[0]:
            raise UserError(f"--packing {spec!r}: {part!r} is not MODEL:COPIES[:KV_GIB] "
                            "(e.g. gpt2-xl:1:20,qwen2.5-1.5b:2; a model id with ':' written as its slug, ft!3a...)")
        bits[0] = model_id_of(bits[0])
        if model_id_problem(bits[0]):
            raise UserError(f"--packing: {model_id_problem(bits[0])}")
        try:
            copies = int(bits[1])
            kv = float(bits[2]) if len(bits) == 3 else None
        except ValueError:
            raise UserError(f"--packing: {part!r}: COPIES is a whole number, KV_GIB a number of GiB") from None
        if copies < 1 or (kv is not None and not 0 < kv < math.inf):  # nan and inf fail this too
            raise UserError(f"--packing: {part!r}: COPIES must be at least 1 and KV_GIB above 0")
        serves.append(PackedModel(model=bits[0], copies=copies, kv_cache_gb=kv))
    try:
        return Packing(instance_type=instance_type, gpu=gpu, serves=serves)
    except ValueError as exc:
        raise UserError(f"--packing {spec!r}: {exc.errors()[0]['msg'] if hasattr(exc, 'errors') else exc}") from None


def packing_of_pool(cfg: FleetConfig, pool_name: str) -> Packing:
    """What one instance of the config's pool `pool_name` serves: models, copies, each one's engine precision, the
    configured KV budgets (a serve without kv_cache_gb: null, since the instance plans that share from the memory
    it finds free)."""
    from fleetcast.config import catalog

    pools = [p for r in cfg.regions for p in r.pools if p.name == pool_name]
    if not pools:
        names = sorted({p.name for r in cfg.regions for p in r.pools})
        raise UserError(f"--pool {pool_name!r}: no such pool in the config (pools: {', '.join(names)})")
    shapes = {(p.instance_type, cfg.served_by(p)) for p in pools}
    if len(shapes) > 1:
        raise UserError(f"--pool {pool_name!r}: the regions' pools of that name differ in instance type or serves; "
                        "give --packing instead")
    pool = pools[0]
    instance = catalog.instance_catalog().get(pool.instance_type)
    return Packing(
        instance_type=pool.instance_type, gpu=instance.gpu.name if instance else None,
        gpu_sharing=pool.gpu_sharing.value,
        serves=[PackedModel(model=s.model.id, copies=s.copies,
                            kv_cache_gb=None if s.kv_cache_bytes is None else s.kv_cache_bytes / GIB,
                            precision=s.engine.precision.value)
                for s in cfg.served_by(pool)])


def check_mix_against(packing: Packing, mix: dict[str, float], where: str, flag: str = FLAG) -> None:
    """Every model of the mix must be one the packing serves."""
    outside = [m for m in mix if m not in packing.models()]
    if outside:
        raise UserError(f"{flag}: {', '.join(outside)} {'is' if len(outside) == 1 else 'are'} not served by {where} "
                        f"(it serves {', '.join(packing.models())})")


@dataclass
class _Part:
    """One model's state during a mix run."""

    spec: MixModel
    ep: Endpoint
    prompts: PromptFactory | None = None
    runs: list[Run] = field(default_factory=list)

    def shape(self, rng: random.Random) -> tuple[int, int]:
        return self.spec.input_tokens.sample(rng), self.spec.output_tokens.sample(rng)

    @property
    def factory(self) -> PromptFactory:
        assert self.prompts is not None, "each part's prompt factory is made in MixBench._discover"
        return self.prompts


def _endpoint(m: MixModel) -> Endpoint:
    assert m.endpoint is not None, "a model with its own --model-endpoint"
    try:
        return Endpoint.parse(m.endpoint)
    except UserError:
        raise UserError(f"--model-endpoint {m.model}={m.endpoint}: use an http:// or https:// URL, e.g. "
                        "http://127.0.0.1:8001") from None


def packing_from_args(args: argparse.Namespace, cfg: FleetConfig | None, labels: Labels) -> tuple[Packing | None, str]:
    """The packing `--pool` (with --config) or `--packing` names, and where it came from in words; None when
    neither is given."""
    if args.pool and args.packing:
        raise UserError("--pool and --packing exclude each other (the pool's serves are the packing)")
    sharing = getattr(args, "gpu_sharing", None)
    if args.pool:
        if cfg is None:
            raise UserError("--pool needs --config (the pool's serves are read from it)")
        packing = packing_of_pool(cfg, args.pool)
        if sharing and sharing != packing.gpu_sharing:
            raise UserError(f"--gpu-sharing {sharing}: pool {args.pool} shares its GPU by {packing.gpu_sharing}; the "
                            "file records how the pool ran, so drop the flag or change the pool's gpu_sharing")
        return packing, f"pool {args.pool}"
    if args.packing:
        packing = parse_packing(args.packing, labels.instance_type, labels.gpu)
        return packing.model_copy(update={"gpu_sharing": sharing or "time_slicing"}), "--packing"
    return None, ""


class MixBench(Bench):
    """A benchmark of several models through one endpoint at once; `run()` returns one Results per model."""

    def __init__(self, opts: BenchOptions, mix: list[MixModel], packing: Packing, spec: str,
                 log: Callable[[str], None] | None = None) -> None:
        super().__init__(opts, log=log)
        if any(level.mode not in ("concurrency", "rate") for level in opts.levels):
            raise UserError(f"{FLAG} takes --concurrency or --rate levels (a trace or a --mix of levels has no "
                            "per-model split)")
        self.parts = [_Part(m, _endpoint(m) if m.endpoint else self.ep) for m in mix]
        self.packing = packing
        self.spec = spec
        self.shares = {m.model: m.share for m in mix}
        self.totals: list[MixTotal] = []
        check_mix_against(packing, self.shares, "the --packing/--pool given")
        for level in opts.levels:
            if level.mode == "concurrency":
                check_concurrency(_concurrency(level), self.shares)

    async def _discover(self) -> None:
        listed: dict[str, list[str]] = {}
        for part in self.parts:
            if part.ep.url not in listed:
                listed[part.ep.url] = await self._served_models(part.ep)
            there = listed[part.ep.url]
            if there and part.spec.model not in there:
                flag = "--model-endpoint" if part.spec.endpoint else "--endpoint"
                raise UserError(f"{FLAG}: {flag} {part.ep.url} does not serve {part.spec.model} to this caller "
                                f"(GET /v1/models lists {', '.join(there)})")
        for part in self.parts:
            part.prompts = await self._calibrate(part.spec.model, part.spec.tokenizer_dir, part.ep)
        self.model = self.parts[0].spec.model
        self.prompts = self.parts[0].prompts

    def _builder(self, part: _Part) -> Callable[[int, int], bytes]:
        import json

        from fleetcast.bench.client import build_http_request

        def build(n_in: int, n_out: int) -> bytes:
            body = self._body(part.factory.prompt(n_in, self.rng), n_out, part.spec.model)
            return build_http_request(part.ep, self.path, json.dumps(body, separators=(",", ":")).encode(),
                                      self._headers)
        return build

    async def _warmup(self) -> None:
        if self.opts.warmup <= 0:
            return
        for part in self.parts:
            pool = ConnectionPool(part.ep, ca_bundle=self.opts.ca_bundle)
            sink: list[Sent] = []
            try:
                await self._closed_loop(pool, 1, self.opts.warmup, None, sink, [0],
                                        partial(part.shape, self.rng), self._builder(part))
            finally:
                pool.close()
            records = [to_record(s, self.opts.api, 0.0) for s in sink]
            if not any(r.ok for r in records):
                said = f": {records[0].error_detail}" if records[0].error_detail else ""
                raise UserError(f"{FLAG}: every warm-up request to {part.spec.model} failed "
                                f"(first error: {records[0].error}{said})")

    def split(self, level: Level) -> dict[str, Level]:
        """Each model's part of `level`."""
        if level.mode == "concurrency":
            workers = split_counts(_concurrency(level), self.shares)
            return {m: Level("concurrency", concurrency=n) for m, n in workers.items()}
        return {m: Level("rate", rate_rps=_rate(level) * s, arrival=level.arrival) for m, s in self.shares.items()}

    async def _run_mix_level(self, level: Level
                             ) -> tuple[dict[str, list[Sent]], list[float], float, bool, float | None]:
        opts = self.opts
        meter = RunQueueMeter(self.log)
        pools = {p.ep.url: ConnectionPool(p.ep, ca_bundle=opts.ca_bundle, rq_wait=meter.rq_wait) for p in self.parts}
        sinks: dict[str, list[Sent]] = {p.spec.model: [] for p in self.parts}
        probe = LoopLagProbe(asyncio.get_running_loop())
        probe.start()
        cpu0, wall0 = time.process_time(), _clock()
        deadline = wall0 + opts.duration_s if opts.duration_s else None
        parts = self.split(level)
        try:
            if level.mode == "concurrency":
                counter = [0]  # shared: the level stops for every model together
                await asyncio.gather(*(
                    self._closed_loop(pools[p.ep.url], _concurrency(parts[p.spec.model]), opts.requests_per_level,
                                      deadline,
                                      sinks[p.spec.model], counter, partial(p.shape, self.rng), self._builder(p))
                    for p in self.parts))
            else:
                count = opts.requests_per_level or int(_rate(level) * _duration(opts)) + 1
                counts = split_counts(count, self.shares)
                plans = {p.spec.model: self._rate_plan(level, counts[p.spec.model], partial(p.shape, self.rng),
                                                       parts[p.spec.model].rate_rps) for p in self.parts}
                await asyncio.gather(*(self._open_loop(pools[p.ep.url], plans[p.spec.model], sinks[p.spec.model],
                                                       deadline, self._builder(p)) for p in self.parts))
        finally:
            cpu = (time.process_time() - cpu0) / max(_clock() - wall0, 1e-9)
            rq_share = meter.stop()
            lags = probe.stop()
            for pool in pools.values():
                pool.close()
        return sinks, lags, cpu, all(pool.kernel_stamps for pool in pools.values()), rq_share

    _LOAD_FLAGS = "--concurrency or --rate"

    async def run_async(self) -> list[Results]:  # type: ignore[override]
        opts = self.opts
        rtt = await self._start()
        for level in opts.levels:
            sinks, lags, cpu, kstamps, rq_share = await self._run_mix_level(level)
            everything = [s for sink in sinks.values() for s in sink]
            t0 = min((s.raw.t_send for s in everything), default=0.0)
            parts = self.split(level)
            summaries: dict[str, tuple[Summary, list[Record]]] = {}
            for part in self.parts:
                sink = sorted(sinks[part.spec.model], key=lambda s: s.raw.t_send)
                records = [to_record(s, opts.api, t0) for s in sink]
                summary = summarize(sink, records, opts.slo, lags, cpu, rtt, kstamps, rq_share)
                own = parts[part.spec.model]
                if own.mode == "concurrency" and own.concurrency and summary.requests < own.concurrency:
                    summary = summary.model_copy(update={"load_note": (
                        f"only {summary.requests} request(s) ran on {own.concurrency} worker(s): the load never "
                        f"reached its label (mean concurrency {summary.mean_concurrency:.1f})")})
                summaries[part.spec.model] = (summary, records)
            everything.sort(key=lambda s: s.raw.t_send)
            total = summarize(everything, [to_record(s, opts.api, t0) for s in everything], opts.slo, lags, cpu, rtt,
                              kstamps, rq_share)
            mix_total = MixTotal(load=Load(mode=level.mode, concurrency=level.concurrency, rate_rps=level.rate_rps,
                                           arrival=level.arrival), summary=total)
            self.log(f"{_level_line(level, total)} (total)")
            for part in self.parts:
                m = part.spec.model
                summary, records = summaries[m]
                self.log(f"  {m}: {_level_line(parts[m], summary)}")
                own = parts[m]
                peers = {p: (summaries[p][0].mean_concurrency if p in summaries else 0.0)
                         for p in self.packing.peers_of(m)}
                part.runs.append(Run(
                    load=Load(mode=own.mode, concurrency=own.concurrency, rate_rps=own.rate_rps, arrival=own.arrival),
                    lengths=Lengths(input_mean=part.spec.input_tokens.expected(),
                                    output_mean=part.spec.output_tokens.expected(),
                                    spec=f"input={part.spec.input_tokens.spec} output={part.spec.output_tokens.spec} "
                                         f"prompts={part.factory.describe()} force_output={opts.force_output} "
                                         f"model_mix={self.spec}"),
                    summary=summary, records=records if opts.keep_records else [], peers=peers, total=mix_total))
            self.totals.append(mix_total)
        return self.mix_results()

    def mix_results(self, interrupted: str | None = None) -> list[Results]:
        opts = self.opts
        assert self._started is not None, "results are made after _start"
        out = []
        for part in self.parts:
            m = part.spec.model
            out.append(Results(
                labels=opts.labels.model_copy(update={"model": m, "precision": part.spec.precision or
                                                      opts.labels.precision}), endpoint=opts.endpoint, api=opts.api,
                config_hash=opts.config_hash, client=client_info(), started_at=self._started,
                finished_at=datetime.now(UTC), seed=opts.seed, runs=list(part.runs), revision=SCHEMA_REVISION,
                provenance="measured",
                slo=SloSpec(ttft_ms=opts.slo.ttft_ms, itl_ms=opts.slo.itl_ms, e2e_ms=opts.slo.e2e_ms),
                request=RequestShape(
                    input_tokens=part.spec.input_tokens.spec, output_tokens=part.spec.output_tokens.spec,
                    input_mean=part.spec.input_tokens.expected(), output_mean=part.spec.output_tokens.expected(),
                    prompts=part.prompts.describe() if part.prompts else "unknown", force_output=opts.force_output),
                interrupted=interrupted, packing=self.packing,
                model_mix=ModelMix(spec=self.spec, shares=dict(self.shares)),
            ))
        return out

    def run(self) -> list[Results]:  # type: ignore[override]
        """One Results per model; Ctrl-C after some levels finished keeps those (as Bench.run does)."""
        try:
            return asyncio.run(self.run_async())
        except KeyboardInterrupt:
            done = min(len(p.runs) for p in self.parts)
            if not done:
                raise
            for p in self.parts:
                del p.runs[done:]
            if done == len(self.opts.levels):
                return self.mix_results()
            cut, never = self.opts.levels[done], self.opts.levels[done + 1:]
            return self.mix_results(interrupted=(
                f"Ctrl-C during {_level_name(cut)}: {done} of {len(self.opts.levels)} level(s) finished; "
                f"{_level_name(cut)} dropped" + (f", not run: {', '.join(_level_name(x) for x in never)}"
                                                 if never else "")))


def mix_models(shares: dict[str, float], input_tokens: str, output_tokens: str, input_by_model: dict[str, str],
               output_by_model: dict[str, str], tokenizer_by_model: dict[str, str],
               tokenizer: str | None, cfg: FleetConfig | None = None, endpoint_by_model: dict[str, str] | None = None) -> list[MixModel]:
    """Each model's request shape: its own --model-input-tokens/--model-output-tokens, else the common
    --input-tokens/--output-tokens; with a config, each must fit the model's max_input_len/max_output_len."""
    out = []
    for model, share in shares.items():
        flag_in = "--model-input-tokens" if model in input_by_model else "--input-tokens"
        flag_out = "--model-output-tokens" if model in output_by_model else "--output-tokens"
        dist_in = parse_distribution(input_by_model.get(model, input_tokens), flag_in)
        dist_out = parse_distribution(output_by_model.get(model, output_tokens), flag_out)
        if cfg is not None:
            spec = {m.id: m for m in cfg.models}.get(model)
            if spec is None:
                raise UserError(f"{FLAG}: {model} is not a model of the config (models: "
                                f"{', '.join(m.id for m in cfg.models)})")
            for flag, dist, limit, name in ((flag_in, dist_in, spec.max_input_len, "max_input_len"),
                                            (flag_out, dist_out, spec.max_output_len, "max_output_len")):
                if dist.max_value() > limit:
                    raise UserError(f"{flag} for {model}: up to {dist.max_value()} tokens, above the model's "
                                    f"{name} {limit} (models[{model}] in the config)")
        if model in tokenizer_by_model:  # checked before any load runs, naming the flag that gave it
            tokenizer_file(tokenizer_by_model[model], f"--model-tokenizer {model}={tokenizer_by_model[model]}")
        out.append(MixModel(model, share, dist_in, dist_out, tokenizer_by_model.get(model, tokenizer),
                            (endpoint_by_model or {}).get(model)))
    return out
