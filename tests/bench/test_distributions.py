"""Length and concurrency distribution specs."""

import random
from collections import Counter

import pytest

from fleetcast.bench.distributions import parse_distribution, parse_int_list
from fleetcast.contract.errors import UserError


def test_fixed_normal_and_buckets_parse_and_sample():
    rng = random.Random(0)
    assert parse_distribution("128", "--input-tokens").sample(rng) == 128
    normal = parse_distribution("normal:200,20", "--input-tokens")
    draws = [normal.sample(rng) for _ in range(4000)]
    assert abs(sum(draws) / len(draws) - 200) < 2 and normal.expected() == 200
    mix = parse_distribution("1-16:0.8,32:0.15,64:0.05", "--mix")
    counts = Counter("low" if v <= 16 else v for v in (mix.sample(rng) for _ in range(20000)))
    assert counts["low"] / 20000 == pytest.approx(0.8, abs=0.02)
    assert counts[32] / 20000 == pytest.approx(0.15, abs=0.02)
    assert counts[64] / 20000 == pytest.approx(0.05, abs=0.01)
    assert mix.max_value() == 64


def test_same_seed_same_draws():
    d = parse_distribution("64:0.5,128-256:0.5", "--output-tokens")
    a = [d.sample(random.Random(42)) for _ in range(3)]
    b = [d.sample(random.Random(42)) for _ in range(3)]
    assert a == b


@pytest.mark.parametrize("spec, words", [
    ("abc", "not an integer"),
    ("0", "must be >= 1"),
    ("normal:10", "normal:MEAN,STD"),
    ("64:x", "not a number"),
    ("64", None),
    ("64-32:1", "reversed"),
    ("64:0,128:0", "sum to zero"),
    ("64,128", "has no weight"),
])
def test_bad_specs_name_the_argument(spec, words):
    if words is None:
        parse_distribution(spec, "--input-tokens")
        return
    with pytest.raises(UserError) as err:
        parse_distribution(spec, "--input-tokens")
    assert "--input-tokens" in str(err.value) and words in str(err.value)


def test_int_lists():
    assert parse_int_list("1,2,4,8", "--concurrency") == [1, 2, 4, 8]
    with pytest.raises(UserError, match="--concurrency"):
        parse_int_list("1,0", "--concurrency")
