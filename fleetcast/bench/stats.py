"""Percentiles, confidence intervals and `Stat` summaries, in plain Python (the
client must not need numpy).

Percentiles interpolate linearly between order statistics (numpy's default,
"type 7"), so figures match what an analyst gets from `numpy.percentile` on the
raw records. The P99 confidence interval is distribution-free: the pair of
order statistics whose ranks bracket the 99th percentile with ~95% coverage
(normal approximation to the binomial), so it needs no assumption about the
latency distribution and widens honestly when samples are few.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from fleetcast.bench.schema import Stat

# Below this many samples a P99 is mostly the one or two largest values.
MIN_TAIL_SAMPLES = 100
_Z95 = 1.959964


def percentile(sorted_values: list[float], q: float) -> float:
    """q in [0, 100]; `sorted_values` must be sorted and non-empty."""
    n = len(sorted_values)
    if n == 1:
        return float(sorted_values[0])
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def quantile_ci(sorted_values: list[float], q: float, z: float = _Z95) -> tuple[float, float]:
    """Order-statistic confidence interval for the q-th percentile (q in [0, 100])."""
    n = len(sorted_values)
    p = q / 100.0
    half = z * math.sqrt(n * p * (1.0 - p))
    # 1-based ranks, converted to 0-based indexes and clamped to the sample.
    lo_rank = math.floor(n * p - half)
    hi_rank = math.ceil(n * p + half) + 1
    lo_i = min(max(lo_rank - 1, 0), n - 1)
    hi_i = min(max(hi_rank - 1, 0), n - 1)
    return float(sorted_values[lo_i]), float(sorted_values[hi_i])


def make_stat(values: Iterable[float | None]) -> Stat:
    data = sorted(float(v) for v in values if v is not None and not math.isnan(v))
    n = len(data)
    if n == 0:
        return Stat(count=0, tail_note="no samples")
    note = None
    if n < MIN_TAIL_SAMPLES:
        note = f"P99 rests on {n} samples"
    return Stat(
        count=n,
        mean=math.fsum(data) / n,
        p50=percentile(data, 50),
        p90=percentile(data, 90),
        p95=percentile(data, 95),
        p99=percentile(data, 99),
        min=data[0],
        max=data[-1],
        p99_ci=quantile_ci(data, 99),
        tail_note=note,
    )
