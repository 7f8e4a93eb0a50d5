"""Roofline performance model for candidates nobody has benchmarked.

Ideal times (seconds) for a decoder-only model of P parameters, L layers and
KV width D (per layer, keys+values each D wide) on a GPU with memory bandwidth
B (bytes/s) and dense math rate F (FLOP/s at the precision's math type), with
prompt I and completion O tokens and c requests in flight:

    weight bytes    Wb = P * bytes_per_weight(precision)
    KV bytes/token  kv = 2 * L * D * 2                       (fp16 KV cache)
    decode step     t_dec(c) = max((Wb + c*kv*(I + O/2)) / B,  2*P*c / F)
    prefill         t_pre    = max(Wb / B,  2*P*I / F)
    ITL(c)          = t_dec(c) + (c/O) * t_pre                 (c/O prefills ride along per step)
    TTFT(c)         = t_pre + ITL(c)
    E2E(c)          = TTFT(c) + (O - 1) * ITL(c)

Calibration on every measured point: for each metric m (P99 TTFT, P99 ITL,
mean E2E), fit log(measured/ideal) = a_m + b_m * log(c) by least squares, so
estimate_m(c) = exp(a_m) * c**b_m * ideal_m(c) (b_m carries the queueing growth
the roofline leaves out). The model's error is reported as the mean absolute
percentage error in sample and leave-one-candidate-out (each measured candidate
predicted from a fit on the others). Estimates are always labelled as such.

A candidate whose GPU and precision were measured on another instance size
(g6e.2xlarge vs g6e.xlarge: same L40S), or at a precision of the same width
(bf16 for fp16), reuses that curve instead.

Co-located processes from solo curves (the packing search's estimators, one
rule for both ways a pool shares its GPU; docs/plan.md, "GPU sharing in the
plan"): a process at in-flight count c whose peers add P(c) ms of steps per
step of its own is stretched by F(c) = (s(c) + k * P(c)) / s(c), s its solo
mean step. Time slicing runs one context at a time, so every peer step lands
between two of its own: k = 1. Under MPS the processes' kernels run side by
side and only part of the peers' work delays it: k is calibrated on measured
pairs (data/gpu_sharing.yaml: the H200 sharing dataset's medians at 16 and 64
streams), the largest k any model, level and metric of those pairs implies, so
the estimate errs slow.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fleetcast.config import catalog
from fleetcast.config.architectures import MODEL_SHAPES, ModelShape
from fleetcast.config.model import ModelFamily, Precision
from fleetcast.contract import support
from fleetcast.contract.errors import UserError

from .curves import Candidate, Curve, LoadPoint, sources_text
from .sharing import MPS, TIME_SLICING

# Per metric, the calibration's (intercept, slope) of log(measured / ideal) against log(concurrency).
_Coef = dict[str, tuple[float, float]]

BYTES_PER_WEIGHT = {"fp16": 2.0, "bf16": 2.0, "int8_wo": 1.0, "int8_sq": 1.0, "fp8": 1.0, "int4_wo": 0.5, "nvfp4": 0.5}
EIGHT_BIT_MATH = {"int8_sq", "fp8", "nvfp4"}  # weight-only modes dequantize and do the math in fp16


METRICS = ("ttft_p99", "itl_p99", "e2e_mean")
# Precisions that run the same kernels at the same width (bf16 and fp16 tensor cores).
_SAME_SPEED = {"bf16": "fp16"}


def roofline_seconds(gpu: catalog.Gpu, precision: str, shape: ModelShape, c: float, i: float,
                     o: float) -> tuple[float, float]:
    """(t_pre: one request's prefill of `i` prompt tokens, t_dec: one decode step of `c` requests), in seconds
    (formulas in the module docstring). A stable entry point: fleetcast/usage/cost.py splits GPU time by it."""
    bw = gpu.bandwidth_gbps * 1e9
    flops = (gpu.int8_tops if precision in EIGHT_BIT_MATH else gpu.fp16_tflops) * 1e12
    wb = shape.params * BYTES_PER_WEIGHT[precision]
    kv = 2 * shape.layers * shape.kv_width * 2
    t_dec = max((wb + c * kv * (i + o / 2)) / bw, 2 * shape.params * c / flops)
    t_pre = max(wb / bw, 2 * shape.params * i / flops)
    return t_pre, t_dec


def ideal(gpu: catalog.Gpu, precision: str, shape: ModelShape, c: float, i: float, o: float) -> dict[str, float]:
    """Ideal milliseconds for each metric (formulas in the module docstring)."""
    t_pre, t_dec = roofline_seconds(gpu, precision, shape, c, i, o)
    itl = t_dec + (c / o) * t_pre
    ttft = t_pre + itl
    return {"ttft_p99": ttft * 1e3, "itl_p99": itl * 1e3, "e2e_mean": (ttft + (o - 1) * itl) * 1e3}


def _fit(rows: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = a + b*x; rows are (x, y)."""
    n = len(rows)
    mx = sum(x for x, _ in rows) / n
    my = sum(y for _, y in rows) / n
    sxx = sum((x - mx) ** 2 for x, _ in rows)
    b = sum((x - mx) * (y - my) for x, y in rows) / sxx if sxx > 0 else 0.0
    return my - b * mx, b


@dataclass
class Estimator:
    """The calibrated roofline: fit on measured candidates, report its own error."""

    shape: ModelShape
    measured: list[Candidate]
    input_tokens: float
    output_tokens: float
    coef: dict[str, tuple[float, float]] = field(default_factory=dict)
    error_in_sample: dict[str, float] = field(default_factory=dict)
    error_leave_one_out: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        usable = [c for c in self.measured if not c.estimated]
        if not usable:
            raise UserError("--estimate: the roofline model is calibrated on measured results; give at least one")
        self.coef = self._calibrate(usable)
        self.error_in_sample = self._error(usable, self.coef)
        if len(usable) >= 2:
            loo: dict[str, list[float]] = {m: [] for m in METRICS}
            for held in usable:
                coef = self._calibrate([c for c in usable if c is not held])
                for m, errs in self._errors([held], coef).items():
                    loo[m].extend(errs)
            self.error_leave_one_out = {m: sum(v) / len(v) for m, v in loo.items() if v}

    def _gpu(self, cand: Candidate) -> catalog.Gpu:
        return catalog.instance_catalog()[cand.instance_type].gpu

    def _lengths(self, cand: Candidate) -> tuple[float, float]:
        return (cand.input_mean or self.input_tokens, cand.output_mean or self.output_tokens)

    def _calibrate(self, cands: list[Candidate]) -> dict[str, tuple[float, float]]:
        rows: dict[str, list[tuple[float, float]]] = {m: [] for m in METRICS}
        for cand in cands:
            i, o = self._lengths(cand)
            for p in cand.curve.points:
                base = ideal(self._gpu(cand), cand.precision, self.shape, p.concurrency, i, o)
                for m in METRICS:
                    rows[m].append((math.log(p.concurrency), math.log(getattr(p, m) / base[m])))
        return {m: _fit(r) for m, r in rows.items()}

    def _predict(self, gpu: catalog.Gpu, precision: str, c: float, i: float, o: float, coef: _Coef) -> dict[str, float]:
        base = ideal(gpu, precision, self.shape, c, i, o)
        return {m: base[m] * math.exp(coef[m][0] + coef[m][1] * math.log(c)) for m in METRICS}

    def _errors(self, cands: list[Candidate], coef: _Coef) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {m: [] for m in METRICS}
        for cand in cands:
            i, o = self._lengths(cand)
            for p in cand.curve.points:
                pred = self._predict(self._gpu(cand), cand.precision, p.concurrency, i, o, coef)
                for m in METRICS:
                    out[m].append(abs(pred[m] - getattr(p, m)) / getattr(p, m))
        return out

    def _error(self, cands: list[Candidate], coef: _Coef) -> dict[str, float]:
        return {m: sum(v) / len(v) for m, v in self._errors(cands, coef).items()}

    def estimate(self, instance_type: str, precision: str, levels: list[float]) -> Candidate:
        gpu = catalog.instance_catalog()[instance_type].gpu
        # Same GPU, same precision, another instance size: the measured curve is the better estimate.
        for cand in self.measured:
            if not cand.estimated and _SAME_SPEED.get(cand.precision, cand.precision) == _SAME_SPEED.get(precision, precision) \
                    and self._gpu(cand).name == gpu.name:
                return Candidate(instance_type, precision, cand.curve, estimated=True, backend=cand.backend,
                                 model=cand.model,
                                 sources=(f"same {gpu.name} GPU and math width as {cand.source} {cand.label}",),
                                 input_mean=cand.input_mean, output_mean=cand.output_mean,
                                 provenance=cand.provenance)
        i, o = self.input_tokens, self.output_tokens
        points = []
        for c in levels:
            pred = self._predict(gpu, precision, c, i, o, self.coef)
            points.append(LoadPoint(concurrency=c, ttft_p99=pred["ttft_p99"], itl_p99=pred["itl_p99"],
                                    e2e_mean=pred["e2e_mean"], output_tps=c * o / (pred["e2e_mean"] / 1000)))
        calibration = {c.provenance for c in self.measured if not c.estimated}
        return Candidate(instance_type, precision, Curve(tuple(points), ("roofline estimate",)), estimated=True,
                         sources=("roofline model",), input_mean=i, output_mean=o,
                         provenance="synthetic" if "synthetic" in calibration else "measured")

    def describe(self) -> str:
        def pct(d: dict[str, float]) -> str:
            return ", ".join(f"{m} {v:.0%}" for m, v in d.items())
        basis = sources_text([c for c in self.measured if not c.estimated])
        text = f"roofline calibrated on {basis}; mean abs. error in sample: {pct(self.error_in_sample)}"
        if self.error_leave_one_out:
            text += f"; leave-one-candidate-out: {pct(self.error_leave_one_out)}"
        return text


def estimate_specs(specs: list[str], measured: list[Candidate], model_id: str, family: ModelFamily | None,
                   input_tokens: float, output_tokens: float) -> tuple[list[Candidate], Estimator]:
    """Estimated candidates for `--estimate` specs: INSTANCE[:PRECISION] or `all`."""
    shape = MODEL_SHAPES.get(model_id)
    if shape is None:
        raise UserError(f"--estimate: no architecture figures for model {model_id!r}; known: {', '.join(sorted(MODEL_SHAPES))}")
    est = Estimator(shape, measured, input_tokens, output_tokens)
    instances = catalog.instance_catalog()

    def runnable(arch: str) -> list[str]:
        # What the config validator would accept for this family on this GPU (fleetcast/contract/support.py).
        return sorted(p for p in support.PRECISIONS
                      if support.check(family.value if family else None, None, p, "auto", arch) is None)

    wanted: list[tuple[str, str]] = []
    for spec in specs:
        if spec == "all":
            for name, inst in sorted(instances.items()):
                wanted += [(name, p) for p in runnable(inst.gpu.arch)]
            continue
        name, _, precision = spec.partition(":")
        if name not in instances:
            raise UserError(f"--estimate: {name!r} is not in the instance catalog; allowed: {', '.join(sorted(instances))}, or 'all'")
        if precision:
            if precision not in BYTES_PER_WEIGHT:
                raise UserError(f"--estimate: precision {precision!r} is not one of {', '.join(p.value for p in Precision)}")
            wanted.append((name, precision))
        else:
            wanted += [(name, p) for p in runnable(instances[name].gpu.arch)]
    have = {(c.instance_type, c.precision) for c in measured}
    levels = sorted({p.concurrency for c in measured for p in c.curve.points})
    out, seen = [], set()
    for name, precision in wanted:
        if (name, precision) in have or (name, precision) in seen:
            continue
        seen.add((name, precision))
        out.append(est.estimate(name, precision, levels))
    return out, est


# ---------------------------------------------------------------- co-located processes from solo curves

# Time slicing: the GPU runs one CUDA context at a time, so every step of a busy peer delays this process whole.
TIME_SLICING_SERIALISED = 1.0
SHARING_DATA = catalog.DATA_DIR / "gpu_sharing.yaml"
SHARING_METRICS = ("output_tps", "itl_p99_ms", "ttft_p99_ms")
_METRIC_WORDS = {"output_tps": "throughput", "itl_p99_ms": "P99 ITL", "ttft_p99_ms": "P99 TTFT"}
# The ways a pair was measured that the calibration reads: each model alone (no MPS daemon), both busy time-sliced,
# both busy under MPS. (The file may hold more, e.g. mps_alone: a lone MPS client, recorded, not calibrated on.)
SHARING_WAYS = ("alone", TIME_SLICING, MPS)


def stretched(own: Curve, peer_step_ms: Callable[[float], float], serialised: float) -> Curve:
    """`own` on a GPU it shares with busy processes, from its solo curve: at in-flight count c each of its steps
    takes its solo mean step s(c) plus `serialised` x the peers' step time per step of its own, `peer_step_ms(c)`,
    so every latency (TTFT and ITL: mean, P99 and their intervals; E2E) is stretched by
    F(c) = (s(c) + serialised x peer_step_ms(c)) / s(c) and throughput divided by it."""
    points = []
    for p in own.points:
        own_step = p.itl_mean if p.itl_mean is not None else p.itl_p99
        f = (own_step + serialised * peer_step_ms(p.concurrency)) / own_step

        def s(v: float | None, f: float = f) -> float | None:
            return None if v is None else v * f

        def ci(v: tuple[float, float] | None, f: float = f) -> tuple[float, float] | None:
            return None if v is None else (v[0] * f, v[1] * f)

        points.append(replace(
            p, ttft_p99=p.ttft_p99 * f, itl_p99=p.itl_p99 * f, e2e_mean=p.e2e_mean * f, ttft_mean=s(p.ttft_mean),
            itl_mean=s(p.itl_mean), e2e_p99=s(p.e2e_p99), ttft_p99_ci=ci(p.ttft_p99_ci), itl_p99_ci=ci(p.itl_p99_ci),
            output_tps=None if p.output_tps is None else p.output_tps / f,
            request_rps=None if p.request_rps is None else p.request_rps / f, records=(), spread=None))
    return Curve(tuple(points), own.notes)


def time_sliced(own: Curve, peer_step_ms: Callable[[float], float]) -> Curve:
    """The interference rule of a time-sliced GPU (serialised share 1); checked against the H200 co-location
    dataset, where both were busy at the same concurrency (tests/plan/test_packing.py)."""
    return stretched(own, peer_step_ms, TIME_SLICING_SERIALISED)


def colocated(mode: str, own: Curve, peer_step_ms: float) -> Curve:
    """`own` among busy peers adding `peer_step_ms` per step, under the pool's GPU sharing `mode`."""
    share = TIME_SLICING_SERIALISED if mode == TIME_SLICING else mps_calibration().serialised
    return stretched(own, lambda _c: peer_step_ms, share)


@dataclass(frozen=True)
class SharedPair:
    """Two processes on one GPU at `concurrency` streams each: per model, per way ('alone', 'time_slicing',
    'mps'), its output tokens/s, P99 ITL and P99 TTFT (ms), each the median of its repeats; `repeats` per model and
    way how many there were (1 where the file does not say)."""

    concurrency: float
    figures: dict[str, dict[str, dict[str, float]]]
    repeats: dict[str, dict[str, int]] = field(default_factory=dict)

    def step_ms(self, model: str) -> float:
        """A model's solo mean step: its streams over its solo token rate (every stream gains one token a step)."""
        return self.concurrency / self.figures[model]["alone"]["output_tps"] * 1000.0

    def peer_of(self, model: str) -> str:
        return next(m for m in self.figures if m != model)

    def implied(self, model: str, mode: str, metric: str) -> float:
        """The serialised share k that makes the rule reproduce `metric` of `model` under `mode` exactly."""
        alone, shared = self.figures[model]["alone"][metric], self.figures[model][mode][metric]
        ratio = alone / shared if metric == "output_tps" else shared / alone
        return (ratio - 1.0) * self.step_ms(model) / self.step_ms(self.peer_of(model))

    def error(self, model: str, mode: str, metric: str, serialised: float) -> float:
        """(predicted - measured) / measured of `metric` under `mode` with serialised share `serialised`."""
        f = 1.0 + serialised * self.step_ms(self.peer_of(model)) / self.step_ms(model)
        alone, shared = self.figures[model]["alone"][metric], self.figures[model][mode][metric]
        predicted = alone / f if metric == "output_tps" else alone * f
        return (predicted - shared) / shared


@dataclass(frozen=True)
class SharingDataset:
    provenance: str
    gpu: str
    backend: str
    pairs: tuple[SharedPair, ...]

    def repeats_text(self) -> str:
        """How many repeats back the medians, e.g. '3-6 repeats each'."""
        counts = sorted({n for p in self.pairs for ways in p.repeats.values() for n in ways.values()} or {1})
        return f"{counts[0]}-{counts[-1]} repeats each" if len(counts) > 1 else f"{counts[0]} repeat(s) each"


def load_sharing_dataset(path: Path | None = None) -> SharingDataset:
    """The measured pairs (data/gpu_sharing.yaml, or `path`); a missing figure is one error naming it."""
    from ruamel.yaml import YAML

    where = path or SHARING_DATA
    raw: Any = YAML(typ="safe").load(where.read_text())
    pairs = []
    for i, pair in enumerate(raw.get("pairs", [])):
        figures: dict[str, dict[str, dict[str, float]]] = {}
        models = pair.get("models", {})
        if len(models) != 2:
            raise UserError(f"{where}: pairs[{i}].models: a pair is two models, found {len(models)}")
        repeats: dict[str, dict[str, int]] = {}
        for model, ways in models.items():
            for way in SHARING_WAYS:
                for metric in SHARING_METRICS:
                    value = (ways.get(way) or {}).get(metric)
                    if not isinstance(value, (int, float)) or value <= 0:
                        raise UserError(f"{where}: pairs[{i}].models.{model}.{way}.{metric}: a positive number is "
                                        f"required, found {value!r}")
                n = ways[way].get("repeats", 1)
                if not isinstance(n, int) or n < 1:
                    raise UserError(f"{where}: pairs[{i}].models.{model}.{way}.repeats: a whole number of at least 1 "
                                    f"is required, found {n!r}")
                _check_spread(where, f"pairs[{i}].models.{model}.{way}", ways[way])
            figures[str(model)] = {way: {m: float(ways[way][m]) for m in SHARING_METRICS} for way in SHARING_WAYS}
            repeats[str(model)] = {way: ways[way].get("repeats", 1) for way in SHARING_WAYS}
        pairs.append(SharedPair(float(pair["concurrency"]), figures, repeats))
    if not pairs:
        raise UserError(f"{where}: pairs: at least one measured pair is required")
    return SharingDataset(str(raw.get("provenance", "unknown")), str(raw.get("gpu", "unknown")),
                          str(raw.get("backend", "unknown")), tuple(pairs))


def _check_spread(where: Path, field_path: str, way: dict[str, Any]) -> None:
    """A way's `spread` (optional): per metric its lowest and highest repeat, around the median it states."""
    spread = way.get("spread")
    if spread is None:
        return
    for metric, bounds in (spread or {}).items():
        ok = (metric in SHARING_METRICS and isinstance(bounds, list) and len(bounds) == 2
              and all(isinstance(b, (int, float)) for b in bounds) and bounds[0] <= way[metric] <= bounds[1])
        if not ok:
            raise UserError(f"{where}: {field_path}.spread.{metric}: [lowest, highest] around the median "
                            f"{way.get(metric)!r} of one of {', '.join(SHARING_METRICS)} is required, found {bounds!r}")


def _error_ranges(rows: list[tuple[str, float]]) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    for metric, err in rows:
        lo, hi = out.get(metric, (err, err))
        out[metric] = (min(lo, err), max(hi, err))
    return out


def _serialised(points: list[tuple[SharedPair, str]]) -> float:
    """The largest serialised share any (pair, model) and metric implies, within [0, 1]: the slow side."""
    return min(1.0, max([0.0] + [pair.implied(model, MPS, metric) for pair, model in points
                                 for metric in SHARING_METRICS]))


@dataclass(frozen=True)
class MpsCalibration:
    """The MPS estimator's serialised share and its error on the measured pairs, stated as the time-slicing
    rule's is: signed (predicted - measured) / measured, lowest and highest, per metric."""

    serialised: float
    dataset: SharingDataset
    in_sample: dict[str, tuple[float, float]]
    leave_one_out: dict[str, tuple[float, float]]
    time_slicing: dict[str, tuple[float, float]]  # the time-slicing rule (k = 1) on the same pairs

    def describe(self) -> str:
        def ranges(d: dict[str, tuple[float, float]]) -> str:
            return ", ".join(f"{_METRIC_WORDS[m]} {lo:+.0%} to {hi:+.0%}" for m, (lo, hi) in d.items())
        d = self.dataset
        where = (f"{len(d.pairs)} measured pair(s) ({d.provenance}; {d.backend} backend on {d.gpu}, "
                 f"{' and '.join(f'{p.concurrency:g}' for p in d.pairs)} streams each, medians of "
                 f"{d.repeats_text()})")
        return (f"MPS estimator: solo curves stretched by 1 + {self.serialised:.3f} x the peers' step over its own "
                f"(calibrated on {where}, the largest share any model, level and metric implies); error against "
                f"those medians in sample: {ranges(self.in_sample)}; leave-one-model-out: "
                f"{ranges(self.leave_one_out)}; the time-slicing rule on the same pair(s): {ranges(self.time_slicing)}")


def calibrate_mps(dataset: SharingDataset) -> MpsCalibration:
    points = [(pair, model) for pair in dataset.pairs for model in pair.figures]
    k = _serialised(points)
    in_sample = _error_ranges([(m, pair.error(model, MPS, m, k)) for pair, model in points for m in SHARING_METRICS])
    loo = []
    for held in points:
        rest = [p for p in points if p[1] != held[1]]  # every pair's figures of the other model(s)
        if rest:
            kk = _serialised(rest)
            loo += [(m, held[0].error(held[1], MPS, m, kk)) for m in SHARING_METRICS]
    ts = _error_ranges([(m, pair.error(model, TIME_SLICING, m, TIME_SLICING_SERIALISED))
                        for pair, model in points for m in SHARING_METRICS])
    return MpsCalibration(k, dataset, in_sample, _error_ranges(loo), ts)


@functools.lru_cache(maxsize=1)
def mps_calibration() -> MpsCalibration:
    """The shipped calibration (data/gpu_sharing.yaml), read once."""
    return calibrate_mps(load_sharing_dataset())
