"""The benchmark results file, `fleetcast.bench/v1`: the contract between
`fleetcast bench` (writer) and `fleetcast plan` (reader).

Compatibility rule: fields may be ADDED in v1, never renamed or removed; a
reader ignores fields it does not know (extra="ignore"), so an older planner
still reads a newer results file. Anything else needs "fleetcast.bench/v2".
Each addition bumps `revision` (absent = 1), so a reader can tell "this file
predates the field" from "the field was empty": revision 2 added `provenance`,
`slo`, `request`, `Summary.load_note`, `Summary.error_messages` and
`Record.error_detail`; revision 3 added `packing` and `Run.peers`; revision 4
added `model_mix` and `Run.total`; revision 5 added `PackedModel.precision`;
revision 6 added `Summary.client_run_queue_wait_ms`,
`Summary.client_run_queue_share` and `Record.run_queue_wait_ms`; revision 7
added `Packing.gpu_sharing` and `Run.repeat`.

Co-location (revision 3). `packing` says what shared the GPU/instance while the
file's runs were measured: the models, each one's copies and KV budget per copy
(GiB, as a config's `kv_cache_gb`). Null: unknown, or one model alone as before.
`labels.model` names the model whose figures the file holds and, when both are
set, is one of the packing's models. A co-located measurement is ONE file per
model, each with the same `packing`, every run measured while the packing's
other models were loaded as well. At what load those peers ran is `Run.peers`:
{peer model: its mean concurrency over the run} (requests in flight, as the
client measured it; in rate mode too), 0 for a peer that was loaded and idle.
`Run.peers` null: not recorded. `fleetcast bench run --model-mix` writes such
files (one per model of the mix, each run's peers the other models' shares of
the same level); bench/data/h200-colocate-*-{alone,together}.json are such files.

Model mix (revision 4). A `--model-mix` run drives several models through one
endpoint at once and writes one file per model; each carries `model_mix` (the
mix as given and each model's share) and, per run, `total`: the load of the
whole mix at that level and the summary over every model's requests. A model's
own `load` is its part of the level: in concurrency mode its closed-loop workers
(the level split by the shares), in rate mode its arrival rate (the rate times
its share).

Precision per model (revision 5). Each packed model's `precision` is the
precision its processes ran at, so a co-located file says what its peers ran at
too; its own `labels.precision` is that of `labels.model`. Null: not recorded
(files before revision 5 label one precision for the whole run).

Client run-queue wait (revision 6). How long the OS kept the client runnable
but off a CPU (Linux schedstat, kernel Documentation/scheduler/sched-stats.rst).
`Record.run_queue_wait_ms`: the wait of the client's event-loop thread between
the request's send stamp and the read that carried its first token: time the
client may have added to that TTFT. `Summary.client_run_queue_wait_ms` is its
statistic over the completed requests; `Summary.client_run_queue_share` the wait
of all the client's threads over the run per second of wall time. Null: not
measured (no schedstat: not Linux, or /proc hidden), or a file before revision 6.

GPU sharing and repeats (revision 7). `packing.gpu_sharing` says how the
packing's processes shared the GPU while the runs were measured: time_slicing
(each its own CUDA context) or mps (clients of one MPS control daemon), the
config's pools[].gpu_sharing. Null: not recorded (a file before revision 7,
when every packing time-sliced). A co-located curve holds only for the mode it
was measured under. `Run.repeat` numbers the runs of one load level when a
level was measured several times (`bench run --repeats N`: 1..N, in the order
they ran); null: the level ran once. The planner keeps every repeat's figures,
sizes from the worst and reports the spread (docs/plan.md, "Noise").

Latency values are milliseconds, throughputs per second of wall time, times in
`start_s` are seconds since the run's first request was sent. A `Stat` with
count 0 (e.g. every request failed) carries null for every value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SCHEMA_ID: Final = "fleetcast.bench/v1"
# The additions within v1 this code writes (see the module docstring).
SCHEMA_REVISION = 7
# A server's error text kept per failed request: enough for the reason, bounded so a
# runaway body (an HTML error page, a stack trace) cannot bloat the file.
ERROR_DETAIL_MAX_CHARS = 300

Backend = Literal["tensorrt", "pytorch", "reference", "unknown"]
Api = Literal["completions", "chat"]
LoadMode = Literal["concurrency", "rate", "trace", "mix"]
Arrival = Literal["poisson", "constant"]
# Where the figures come from: a client against a server, or authored (scenario/test data).
# The planner adds a third, "estimated", for candidates its roofline model fills in.
Provenance = Literal["measured", "synthetic"]
# How a packing's processes shared the GPU (the config's GpuSharing values; revision 7).
GpuSharingMode = Literal["time_slicing", "mps"]


_SPEC = re.compile(r"input=(?P<input>\S+) output=(?P<output>\S+) prompts=(?P<prompts>.*?) force_output=(?P<force>\S+)")


class _Model(BaseModel):
    # Unknown keys are ignored on read so fields can be added within v1.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class Stat(_Model):
    """Distribution summary of one metric over a run's samples."""

    count: int = Field(description="number of samples behind the figures")
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    min: float | None = None
    max: float | None = None
    p99_ci: tuple[float, float] | None = Field(
        default=None, description="95% confidence interval of P99 (distribution-free, order statistics)"
    )
    tail_note: str | None = Field(default=None, description="set when the tail rests on too few samples")


class Labels(_Model):
    """What was measured: the planner groups and filters results by these."""

    instance_type: str | None = None
    gpu: str | None = None
    precision: str | None = None
    region: str | None = None
    backend: Backend = "unknown"
    model: str | None = None
    notes: str | None = None
    # Added in v1: where the client ran, to split the network share (`fleetcast bench network-share`).
    path: str | None = Field(default=None, description="client path: 'instance' (on the server's host) or 'privatelink'")
    consumer: str | None = Field(default=None, description="consumer whose VPC the client ran in (path privatelink)")


class ClientInfo(_Model):
    """The machine that ran the benchmark client."""

    host: str
    cpus: int
    python: str
    fleetcast_version: str


class Load(_Model):
    mode: LoadMode
    concurrency: int | None = None
    rate_rps: float | None = None
    arrival: Arrival | None = None


class Lengths(_Model):
    """Requested token lengths (the records hold what the server reported)."""

    input_mean: float
    output_mean: float
    spec: str = Field(description="the length spec as given, e.g. 'input=128 output=128'")


class Summary(_Model):
    requests: int
    completed: int
    errors: int
    errors_by_type: dict[str, int] = Field(default_factory=dict)
    duration_s: float
    ttft_ms: Stat
    itl_ms: Stat
    e2e_ms: Stat
    chunk_gap_ms: Stat
    output_throughput_tps: float
    total_throughput_tps: float
    request_throughput_rps: float
    goodput_rps: float | None = None
    error_rate: float
    mean_concurrency: float
    saturated: bool
    saturation_reason: str | None = None
    schedule_lag_ms: Stat
    event_loop_lag_ms: Stat
    network_rtt_ms: float | None = None
    # Added in v1 (readers must tolerate their absence):
    client_cpu_util: float | None = Field(default=None, description="client process CPU time / wall time over the run")
    ttft_merged_share: float | None = Field(
        default=None, description="share of completed requests whose first token was read late, merged with later tokens"
    )
    rx_timestamps: Literal["kernel", "clock"] | None = Field(
        default=None, description="kernel: reads stamped with the kernel receive time (SO_TIMESTAMPNS); clock: on arrival in the loop"
    )
    # Revision 2:
    load_note: str | None = Field(
        default=None, description="set when the run cannot have had the load its label says (fewer requests than concurrency)"
    )
    error_messages: dict[str, str] = Field(
        default_factory=dict, description="per error type, the server's message for its first occurrence (bounded)"
    )
    # Revision 6:
    client_run_queue_wait_ms: Stat | None = Field(
        default=None, description="per completed request, the client's run-queue wait between send and first token (schedstat)"
    )
    client_run_queue_share: float | None = Field(
        default=None, description="run-queue wait of all client threads over the run / wall time (schedstat)"
    )


class Record(_Model):
    """One request, raw: enough to recompute every summary figure."""

    start_s: float
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    itl_ms: float | None = None
    input_tokens: int
    output_tokens: int
    ok: bool
    error: str | None = None
    chunk_gaps_ms: list[float] = Field(default_factory=list)
    # Added in v1: the concurrency level the request ran at (closed-loop modes).
    concurrency: int | None = None
    # Added in v1: the first token was read late together with later tokens, so
    # its TTFT may be overstated by up to the merged gaps.
    ttft_merged: bool = False
    # Revision 2: what the server said about a failure (its error message, bounded).
    error_detail: str | None = None
    # Revision 6: the client's run-queue wait between send and first token (null: not measured).
    run_queue_wait_ms: float | None = None


class SloSpec(_Model):
    """The SLOs goodput was counted against (`--slo-*`); all null when none was given."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None


class RequestShape(_Model):
    """What every request of the file looked like: series of different shapes are not comparable."""

    input_tokens: str = Field(description="--input-tokens as given, e.g. '128' or 'normal:128,32'")
    output_tokens: str = Field(description="--output-tokens as given")
    input_mean: float
    output_mean: float
    prompts: str = Field(description="how prompt lengths were met: 'tokenizer' (exact) or the word calibration used")
    force_output: bool = Field(description="ignore_eos/min_tokens sent, so outputs have the requested length")

    def key(self) -> tuple[str, str, bool, bool]:
        """What must match for two series to be compared: lengths, exact prompts or not, forced outputs or not."""
        return (self.input_tokens, self.output_tokens, self.prompts == "tokenizer", self.force_output)

    def text(self) -> str:
        exact = "exact (tokenizer)" if self.prompts == "tokenizer" else f"approximate ({self.prompts})"
        return (f"input {self.input_tokens} tokens, output {self.output_tokens} tokens, prompts {exact}, "
                f"output length {'forced' if self.force_output else 'not forced'}")


class PackedModel(_Model):
    """One model of a packing: how many engine processes of it shared the instance, each one's KV budget."""

    model: str
    copies: int = Field(default=1, ge=1)
    kv_cache_gb: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                      description="KV budget of each copy in GiB (2^30 bytes); "
                                      "null: not budgeted (the engine's free-memory fraction)")
    precision: str | None = Field(default=None, description="the precision its processes ran at (revision 5); null: not "
                                  "recorded")


class Packing(_Model):
    """What shared the GPU/instance while a file's runs were measured (revision 3)."""

    instance_type: str | None = None
    gpu: str | None = None
    serves: list[PackedModel] = Field(min_length=1)
    gpu_sharing: GpuSharingMode | None = Field(
        default=None, description="how the processes shared the GPU: time_slicing or mps (revision 7); null: not recorded "
        "(before revision 7 every packing time-sliced)")

    @model_validator(mode="after")
    def _unique_models(self) -> Packing:
        names = [s.model for s in self.serves]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"packing.serves names {', '.join(twice)} more than once (one entry per model)")
        return self

    def models(self) -> list[str]:
        return [s.model for s in self.serves]

    def peers_of(self, model: str | None) -> list[str]:
        """The packing's models other than `model`."""
        return [m for m in self.models() if m != model]

    def text(self) -> str:
        parts = [f"{s.model}{f' {s.precision}' if s.precision else ''} x{s.copies}" + ("" if s.kv_cache_gb is None else f" (KV {s.kv_cache_gb:g} GiB each)")
                 for s in self.serves]
        where = " on ".join(x for x in (self.instance_type, self.gpu) if x)
        sharing = f" ({self.gpu_sharing.replace('_', ' ')})" if self.gpu_sharing else ""
        return ", ".join(parts) + (f" on {where}" if where else "") + sharing

    def sharing(self) -> GpuSharingMode:
        """The mode the processes shared the GPU by; a file before revision 7 time-sliced (MPS came later)."""
        return self.gpu_sharing or "time_slicing"


class MixTotal(_Model):
    """A model-mix run's level as a whole: every model's requests together (revision 4)."""

    load: Load = Field(description="the level of the whole mix (all models' workers, or the total rate)")
    summary: Summary


class ModelMix(_Model):
    """The `--model-mix` a file's runs were part of (revision 4)."""

    spec: str = Field(description="--model-mix as given, e.g. 'gpt2-xl:0.7,qwen2.5-1.5b:0.3'")
    shares: dict[str, float] = Field(description="{model: share of the load}, summing to 1")


class Run(_Model):
    load: Load
    lengths: Lengths
    summary: Summary
    records: list[Record] = Field(default_factory=list)
    # Revision 3: the packing's other models' mean concurrency during this run (module docstring).
    peers: dict[str, float] | None = Field(
        default=None, description="{peer model: mean concurrency during this run}; 0: loaded and idle; null: not recorded")

    # Revision 4: the whole mix at this level (model-mix runs only).
    total: MixTotal | None = None
    # Revision 7: which repeat of its load level this run was (module docstring).
    repeat: int | None = Field(default=None, ge=1, description="1..N when the level was measured N times (--repeats); "
                               "null: once")

    def peers_text(self) -> str:
        """'gpt2-medium at 16.0 in flight' / 'gpt2-medium idle'; '' when not recorded."""
        if not self.peers:
            return ""
        return ", ".join(f"{m} idle" if c == 0 else f"{m} at {c:.1f} in flight" for m, c in self.peers.items())


class Results(_Model):
    schema_id: Literal["fleetcast.bench/v1"] = Field(default=SCHEMA_ID, alias="schema")
    labels: Labels = Field(default_factory=Labels)
    endpoint: str
    api: Api
    config_hash: str | None = None
    client: ClientInfo
    started_at: datetime
    finished_at: datetime
    seed: int
    runs: list[Run] = Field(default_factory=list)
    # Revision 2 (absent in older files; see request_shape() for their shape):
    revision: int = 1
    provenance: Provenance = Field(default="measured", description="synthetic: authored data, not a measurement")
    slo: SloSpec | None = None
    request: RequestShape | None = None
    interrupted: str | None = Field(
        default=None, description="set when the run was stopped before every level ran (Ctrl-C): the runs are the levels "
        "that finished; this says which level was cut and which never ran")
    # Revision 3: what shared the instance while these runs were measured (module docstring).
    packing: Packing | None = None
    # Revision 4: the model mix these runs were part of (module docstring).
    model_mix: ModelMix | None = None

    @model_validator(mode="after")
    def _packing_names_this_model(self) -> Results:
        if self.packing is None:
            if any(r.peers for r in self.runs):
                raise ValueError("runs[].peers is set but packing is not (peers are the packing's other models)")
            return self
        models = self.packing.models()
        if self.labels.model is not None and self.labels.model not in models:
            raise ValueError(f"labels.model {self.labels.model!r} is not one of packing.serves "
                             f"({', '.join(models)}): a packed file holds one of the packing's models")
        peers = set(self.packing.peers_of(self.labels.model))
        for i, run in enumerate(self.runs):
            unknown = sorted(set(run.peers or {}) - peers)
            if unknown:
                raise ValueError(f"runs[{i}].peers names {', '.join(unknown)}, not a peer in packing.serves "
                                 f"(peers: {', '.join(sorted(peers)) or 'none'})")
        if self.model_mix is not None:
            outside = sorted(set(self.model_mix.shares) - set(models))
            if outside:
                raise ValueError(f"model_mix names {', '.join(outside)}, not in packing.serves ({', '.join(models)}): "
                                 "every model a mix drove shared the instance")
        return self

    def request_shape(self) -> RequestShape | None:
        """The file's request shape; for files older than revision 2, read back from the runs' length specs."""
        if self.request is not None:
            return self.request
        if not self.runs:
            return None
        first = self.runs[0].lengths
        # The runner's spec: "input=A output=B prompts=WHAT force_output=BOOL[ mix=...]" (WHAT may hold spaces).
        m = _SPEC.match(first.spec)
        return RequestShape(
            input_tokens=m["input"] if m else f"{first.input_mean:g}",
            output_tokens=m["output"] if m else f"{first.output_mean:g}",
            input_mean=first.input_mean, output_mean=first.output_mean,
            prompts=m["prompts"] if m else "unknown", force_output=(m["force"] != "False") if m else True,
        )

    def to_json(self, indent: int | None = None) -> str:
        return self.model_dump_json(by_alias=True, indent=indent)


# A load level: mode, concurrency, rate and arrival.
_LevelKey = tuple[LoadMode, int | None, float | None, Arrival | None]


def number_repeats(runs: list[Run]) -> list[Run]:
    """The runs with `repeat` set where a load level ran more than once (1..N in run order); a level that ran once
    keeps null, so a file without repeats reads as before."""
    def key(run: Run) -> _LevelKey:
        return (run.load.mode, run.load.concurrency, run.load.rate_rps, run.load.arrival)

    counts: dict[_LevelKey, int] = {}
    for run in runs:
        counts[key(run)] = counts.get(key(run), 0) + 1
    seen: dict[_LevelKey, int] = {}
    out = []
    for run in runs:
        k = key(run)
        if counts[k] > 1:
            seen[k] = seen.get(k, 0) + 1
            run = run.model_copy(update={"repeat": seen[k]})
        out.append(run)
    return out


def mixed_shapes(named: list[tuple[str, Results]]) -> str | None:
    """None when every file has one request shape; else a sentence naming each shape and its files.
    Latencies of different shapes are not comparable (a 64/64 run is faster than a 128/128 one)."""
    groups: dict[tuple[str | bool, ...], list[str]] = {}
    texts: dict[tuple[str | bool, ...], str] = {}
    for name, res in named:
        shape = res.request_shape()
        key = shape.key() if shape else ("unknown",)
        groups.setdefault(key, []).append(name)
        texts[key] = shape.text() if shape else "no runs"
    if len(groups) < 2:
        return None
    return "; ".join(f"{', '.join(names)}: {texts[key]}" for key, names in groups.items())


def dump_results(results: Results, path: str | Path) -> None:
    Path(path).write_text(results.to_json() + "\n")


def results_reader() -> Callable[[str | Path], Results]:
    """load_results, each file read and validated once per reader: a plan reads its results files where it needs
    them (the model they name, their grouping into curves, each group's curve), three times each before, and
    a results file is up to a few MB of JSON. Only within one plan: a file rewritten after is read again by the next."""
    read: dict[Path, Results] = {}

    def reader(path: str | Path) -> Results:
        key = Path(path)
        if key not in read:
            read[key] = load_results(path)
        return read[key]

    return reader


def load_results(path: str | Path) -> Results:
    """Read and validate a results file; bad files raise UserError naming the problem."""
    from fleetcast.contract.errors import UserError

    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise UserError(f"results file {p} does not exist") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"results file {p} is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA_ID:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise UserError(f"results file {p}: schema is {found!r}, expected {SCHEMA_ID!r}")
    try:
        return Results.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "file"
        raise UserError(f"results file {p}: {loc}: {first['msg']} ({exc.error_count()} problem(s))") from None
