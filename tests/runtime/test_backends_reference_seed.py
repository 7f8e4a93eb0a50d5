"""The reference backend's weights per model: each model of a fleet of several gets a seed of its own (so each
engine process writes its own text, as `make demo` shows), a one-model fleet keeps FLEETCAST_REFERENCE_SEED.
tests/runtime/test_bootstrap_multi_model.py checks the texts of two real engine processes differ."""

from __future__ import annotations

from runtime.backends import ReferenceBackend
from runtime.demo import which_answered
from runtime.devtools.harness import ADAPTER_ID, adapter_config, tiny_config, two_model_config


def test_each_model_of_a_fleet_of_several_builds_weights_of_its_own():
    cfg = two_model_config()
    backends = [ReferenceBackend(cfg, cfg.engine, seed=7, model=m) for m in cfg.models]
    assert len({b.seed for b in backends}) == len(cfg.models)
    # The seed is in the cache key's version: another seed is another engine, never a cached one's.
    assert len({b.version for b in backends}) == len(cfg.models)
    # Drawn from the seed and the id: the same on every instance, and another seed moves them all.
    assert [ReferenceBackend(cfg, cfg.engine, seed=7, model=m).seed for m in cfg.models] == [b.seed for b in backends]
    assert not {ReferenceBackend(cfg, cfg.engine, seed=8, model=m).seed for m in cfg.models} & {b.seed for b in backends}


def test_a_one_model_fleet_keeps_the_configured_seed():
    cfg = tiny_config()
    assert ReferenceBackend(cfg, cfg.engine, seed=7).seed == 7


def test_the_demo_says_what_the_texts_show():
    cfg = adapter_config()
    models = [m.id for m in cfg.models]
    base = next(m.id for m in cfg.models if m.adapters)
    texts = {m: f"noise of {m}" for m in models}
    line = which_answered({**texts, ADAPTER_ID: texts[base]}, models, base, ADAPTER_ID)
    assert line == (f"each of the {len(models)} models wrote its own text: {len(models)} engine processes, each with "
                    f"its own weights; {ADAPTER_ID} wrote {base}'s text: {base}'s process answered it")
    same = dict.fromkeys([*models, ADAPTER_ID], "the same noise")
    assert which_answered(same, models, base, ADAPTER_ID).startswith("WARNING: two models wrote the same text")
