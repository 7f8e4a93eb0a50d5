"""Measured (or estimated) behaviour of one instance x precision across load levels.

A `Curve` is the list of load points of one candidate, sorted by per-instance
concurrency, with linear interpolation between measured levels. Below the
lowest measured level the lowest level's latencies are used (latency only falls
with load, so this overstates the time a request holds an instance: the
conservative side for sizing).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# Below this many samples the P99 rests on fewer than 10 values above it.
MIN_P99_SAMPLES = 1000


# Repeats of one level count as such when each has at least this share of the largest one's samples; a much
# shorter run's P99 rests on far fewer values and is left out (the curve's notes say so).
REPEAT_MIN_SAMPLE_SHARE = 0.5

# The figures a repeat can differ in, as (LoadPoint field, what the report calls it, True: higher is worse).
SPREAD_METRICS: tuple[tuple[str, str, bool], ...] = (
    ("ttft_p99", "P99 TTFT", True), ("itl_p99", "P99 ITL", True), ("e2e_mean", "mean E2E", True),
    ("output_tps", "throughput", False),
)


@dataclass(frozen=True)
class Spread:
    """What the repeats of one load level measured: per metric (SPREAD_METRICS) the lowest and highest figure."""

    repeats: int
    ranges: tuple[tuple[str, float, float], ...] = ()

    def width(self, metric: str) -> float | None:
        """(highest - lowest) / lowest of `metric`, or None when not measured."""
        for name, lo, hi in self.ranges:
            if name == metric:
                return (hi - lo) / lo if lo > 0 else None
        return None


@dataclass(frozen=True)
class LoadPoint:
    """One load level of one candidate (milliseconds, per second)."""

    concurrency: float
    ttft_p99: float
    itl_p99: float
    e2e_mean: float
    error_rate: float = 0.0
    ttft_mean: float | None = None
    itl_mean: float | None = None
    e2e_p99: float | None = None
    ttft_p99_ci: tuple[float, float] | None = None
    itl_p99_ci: tuple[float, float] | None = None
    samples: int = 0
    output_tps: float | None = None
    request_rps: float | None = None
    bench_rtt_ms: float | None = None
    # Per-request (ttft_ms, itl_ms, ok) when the results file carried records: goodput is computed from them.
    records: tuple[tuple[float | None, float | None, bool], ...] = ()
    tail_note: str | None = None
    # Several repeats of this level: their spread; the point's figures are the worst of them (worst_of).
    spread: Spread | None = None

    @property
    def throughput_rps(self) -> float:
        """Little's law: in-flight requests / mean time in system."""
        return self.concurrency / (self.e2e_mean / 1000.0)


@dataclass(frozen=True)
class Curve:
    points: tuple[LoadPoint, ...]
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a curve needs at least one load point")
        object.__setattr__(self, "points", tuple(sorted(self.points, key=lambda p: p.concurrency)))
        object.__setattr__(self, "notes", tuple(self.notes))

    @property
    def levels(self) -> list[float]:
        return [p.concurrency for p in self.points]

    def at(self, level: float) -> LoadPoint:
        """The point at `level`, interpolated linearly between measured neighbours."""
        pts = self.points
        if level <= pts[0].concurrency:
            return replace(pts[0], concurrency=level) if level != pts[0].concurrency else pts[0]
        for lo, hi in zip(pts, pts[1:]):
            if level == hi.concurrency:
                return hi
            if lo.concurrency < level < hi.concurrency:
                t = (level - lo.concurrency) / (hi.concurrency - lo.concurrency)
                return _lerp(lo, hi, t, level)
        raise ValueError(f"level {level} is above the highest measured level {pts[-1].concurrency}")

    def peak_output_tps(self) -> tuple[float, float] | None:
        measured = [(p.output_tps, p.concurrency) for p in self.points if p.output_tps is not None]
        return max(measured, key=lambda x: x[0]) if measured else None


def worst_of(points: list[LoadPoint]) -> LoadPoint:
    """Repeats of one load level as one point for sizing: each latency and the error rate at its highest repeat,
    throughput at its lowest (docs/plan.md, "Noise"), with the spread kept. A P99's interval, sample count and
    records come from the repeat with the highest P99 TTFT (the one whose tail the point keeps)."""
    if len(points) == 1:
        return points[0]

    def hi(name: str) -> float | None:
        vals = [v for v in (getattr(p, name) for p in points) if v is not None]
        return max(vals) if vals else None

    def lo(name: str) -> float | None:
        vals = [v for v in (getattr(p, name) for p in points) if v is not None]
        return min(vals) if vals else None

    tail = max(points, key=lambda p: p.ttft_p99)
    itl_tail = max(points, key=lambda p: p.itl_p99)
    ranges = []
    for name, _, _ in SPREAD_METRICS:
        vals = [v for v in (getattr(p, name) for p in points) if v is not None]
        if vals:
            ranges.append((name, min(vals), max(vals)))
    return replace(
        tail, ttft_p99=tail.ttft_p99, itl_p99=itl_tail.itl_p99, e2e_mean=max(p.e2e_mean for p in points),
        error_rate=max(p.error_rate for p in points), ttft_mean=hi("ttft_mean"), itl_mean=hi("itl_mean"),
        e2e_p99=hi("e2e_p99"), itl_p99_ci=itl_tail.itl_p99_ci, output_tps=lo("output_tps"),
        request_rps=lo("request_rps"), spread=Spread(len(points), tuple(ranges)))


def spread_text(curve: Curve) -> str | None:
    """How wide the repeats of a curve's levels spread, e.g. '3 repeats per level at 3 levels; widest spread:
    P99 TTFT 31% (at 64), P99 ITL 12% (at 16), ...'; None when no level was repeated."""
    repeated = [p for p in curve.points if p.spread is not None]
    if not repeated:
        return None
    counts = sorted({p.spread.repeats for p in repeated if p.spread is not None})
    parts = []
    for name, words, _ in SPREAD_METRICS:
        widths = [(w, p.concurrency) for p in repeated if p.spread is not None
                  and (w := p.spread.width(name)) is not None]
        if widths:
            w, level = max(widths)
            parts.append(f"{words} {w:.0%} (at {level:g})")
    reps = f"{counts[0]}-{counts[-1]}" if len(counts) > 1 else str(counts[0])
    return (f"{reps} repeats at {len(repeated)} of {len(curve.points)} level(s), sized from the worst; widest "
            f"spread (highest over lowest - 1): {', '.join(parts)}")


def _mix(a: float | None, b: float | None, t: float) -> float | None:
    if a is None or b is None:
        return None
    return a + (b - a) * t


def _mix_pair(a: tuple[float, float] | None, b: tuple[float, float] | None, t: float) -> tuple[float, float] | None:
    if a is None or b is None:
        return None
    return (a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t)


def _mix_value(a: float, b: float, t: float) -> float:
    return a + (b - a) * t


def _lerp(lo: LoadPoint, hi: LoadPoint, t: float, level: float) -> LoadPoint:
    return LoadPoint(
        concurrency=level,
        ttft_p99=_mix_value(lo.ttft_p99, hi.ttft_p99, t),
        itl_p99=_mix_value(lo.itl_p99, hi.itl_p99, t),
        e2e_mean=_mix_value(lo.e2e_mean, hi.e2e_mean, t),
        error_rate=_mix_value(lo.error_rate, hi.error_rate, t),
        ttft_mean=_mix(lo.ttft_mean, hi.ttft_mean, t),
        itl_mean=_mix(lo.itl_mean, hi.itl_mean, t),
        e2e_p99=_mix(lo.e2e_p99, hi.e2e_p99, t),
        ttft_p99_ci=_mix_pair(lo.ttft_p99_ci, hi.ttft_p99_ci, t),
        itl_p99_ci=_mix_pair(lo.itl_p99_ci, hi.itl_p99_ci, t),
        samples=min(lo.samples, hi.samples),
        output_tps=_mix(lo.output_tps, hi.output_tps, t),
        request_rps=_mix(lo.request_rps, hi.request_rps, t),
        bench_rtt_ms=_mix(lo.bench_rtt_ms, hi.bench_rtt_ms, t),
    )


# What each source means, said once for every output (terminal, plan.md, plan.html, plan.json).
SOURCE_MEANING = {
    "measured": "",
    "synthetic": "authored data, not measured",
    "estimated": "by the roofline model, not measured",
}


def sources_text(candidates: list[Candidate]) -> str:
    """How many candidates each source backs, e.g. '7 synthetic candidate(s) (authored data, not measured)'."""
    counts: dict[str, int] = {}
    for c in candidates:
        counts[c.source] = counts.get(c.source, 0) + 1
    return ", ".join(f"{counts[s]} {s} candidate(s)" + (f" ({SOURCE_MEANING[s]})" if SOURCE_MEANING[s] else "")
                     for s in SOURCE_MEANING if s in counts) or "no candidates"


@dataclass(frozen=True)
class Candidate:
    """One instance type x precision with its curve; `estimated` when no measurement backs it."""

    instance_type: str
    precision: str
    curve: Curve
    estimated: bool = False
    backend: str = "unknown"
    model: str | None = None
    sources: tuple[str, ...] = ()
    input_mean: float | None = None  # lengths the curve was measured at
    output_mean: float | None = None
    # Where the results came from (fleetcast.bench results `provenance`): "measured" or
    # "synthetic" (authored scenario data). Estimates keep their calibration's provenance here.
    provenance: str = "measured"

    @property
    def source(self) -> str:
        """What backs the figures, as every plan output says it: measured, synthetic or estimated."""
        return "estimated" if self.estimated else self.provenance

    @property
    def family(self) -> str:
        return self.instance_type.split(".", 1)[0]

    @property
    def label(self) -> str:
        return f"{self.instance_type} {self.precision}"
