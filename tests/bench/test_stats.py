"""Percentiles, confidence intervals and Stat summaries."""

import random

import pytest

from fleetcast.bench.stats import make_stat, percentile, quantile_ci


def test_percentiles_interpolate_like_numpy_default():
    np = pytest.importorskip("numpy")
    rng = random.Random(7)
    data = sorted(rng.expovariate(1 / 20) for _ in range(537))
    for q in (0, 1, 50, 90, 95, 99, 100):
        assert percentile(data, q) == pytest.approx(float(np.percentile(data, q)), rel=1e-12)


def test_p99_ci_brackets_the_p99_and_narrows_with_samples():
    rng = random.Random(1)
    small = sorted(rng.gauss(100, 10) for _ in range(200))
    big = sorted(rng.gauss(100, 10) for _ in range(20000))
    for data in (small, big):
        lo, hi = quantile_ci(data, 99)
        assert lo <= percentile(data, 99) <= hi
    assert (quantile_ci(big, 99)[1] - quantile_ci(big, 99)[0]) < (quantile_ci(small, 99)[1] - quantile_ci(small, 99)[0])


def test_p99_ci_covers_the_true_quantile_about_95_percent_of_the_time():
    # Uniform(0, 1): the true P99 is 0.99.
    rng = random.Random(5)
    hits = 0
    trials = 400
    for _ in range(trials):
        lo, hi = quantile_ci(sorted(rng.random() for _ in range(500)), 99)
        hits += lo <= 0.99 <= hi
    assert 0.90 <= hits / trials <= 0.995


def test_stat_says_when_the_tail_rests_on_few_samples():
    few = make_stat([5.0] * 40)
    assert few.count == 40 and few.tail_note == "P99 rests on 40 samples"
    many = make_stat(range(1, 1001))
    assert many.tail_note is None
    assert (many.min, many.max, many.p50, many.mean) == (1, 1000, 500.5, 500.5)


def test_empty_stat_has_count_zero_and_no_values():
    s = make_stat([None, None])
    assert s.count == 0 and s.p50 is None and s.p99_ci is None
