"""Prompt lengths: exact with a tokenizer, calibrated on server usage without one."""

import random

import pytest

from fleetcast.bench.accuracy import build_tiny_tokenizer
from fleetcast.bench.prompts import Calibration, PromptFactory, calibrate_from_usage
from fleetcast.contract.errors import UserError


@pytest.fixture(scope="module")
def byte_level_dir(tmp_path_factory):
    """The reference backend's byte-level tokenizer (one token per byte)."""
    from runtime.reference.tokenizer import write_tokenizer

    d = tmp_path_factory.mktemp("bytetok")
    write_tokenizer(d, 1024)
    return d


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    return build_tiny_tokenizer(tmp_path_factory.mktemp("bpe"))


@pytest.mark.parametrize("which", ["byte_level_dir", "bpe_dir"])
def test_tokenizer_prompts_are_exact(which, request):
    factory = PromptFactory(tokenizer_dir=str(request.getfixturevalue(which)))
    rng = random.Random(0)
    for n in (1, 5, 127, 128, 500):
        assert factory.count(factory.prompt(n, rng)) == n


@pytest.mark.parametrize("which", ["byte_level_dir", "bpe_dir"])
def test_calibrated_word_prompts_land_on_the_length(which, request):
    """What the server would report (its tokenizer's count) calibrates the word prompts."""
    server = PromptFactory(tokenizer_dir=str(request.getfixturevalue(which)))
    probe = PromptFactory()
    samples = [(w, server.count(probe.prompt(w, random.Random(w)))) for w in (4, 16)]
    cal = calibrate_from_usage(samples)
    assert cal.source.startswith("calibrated")
    factory = PromptFactory(calibration=cal)
    rng = random.Random(1)
    for n in (32, 128, 512):  # multiples of the tokens per word: exact
        assert server.count(factory.prompt(n, rng)) == n
    assert abs(server.count(factory.prompt(130, rng)) - 130) <= cal.tokens_per_word / 2


def test_without_usage_one_word_is_one_token():
    cal = calibrate_from_usage([(4, None), (16, None)])
    assert cal == Calibration() and "assumed" in PromptFactory(calibration=cal).describe()


def test_prompts_differ_between_requests():
    factory = PromptFactory()
    rng = random.Random(2)
    assert factory.prompt(64, rng) != factory.prompt(64, rng)


def test_tokenizer_dir_without_tokenizer_json_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="--tokenizer"):
        PromptFactory(tokenizer_dir=str(tmp_path))
