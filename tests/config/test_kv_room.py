"""KV space against batch (issue 32, §2): validate and the synth summary warn, with the arithmetic, where a
process's KV share holds fewer full-length sequences than the batch its engine is built for."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from fleetcast.config import parse_config
from fleetcast.config.architectures import MODEL_SHAPES
from fleetcast.config.kv_room import kv_room_warnings, model_kv_bytes_per_token
from fleetcast.config.memory import GIB, plan_pool
from fleetcast.config.model import KvCacheDtype

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multi-model" / "fleet.yaml"


@pytest.fixture
def multi() -> dict:
    return YAML(typ="safe").load(EXAMPLE.read_text())


def test_the_architecture_figures_are_the_checkpoints():
    # openai-community/gpt2-xl config.json: n_layer 48, n_embd 1600 (one KV head per head); Qwen/Qwen2.5-0.5B:
    # num_hidden_layers 24, num_key_value_heads 2, hidden_size 896 / num_attention_heads 14; Qwen/Qwen2.5-3B:
    # 36 layers, 2 KV heads, 2048 / 16.
    assert (MODEL_SHAPES["gpt2-xl"].layers, MODEL_SHAPES["gpt2-xl"].kv_width) == (48, 1600)
    assert (MODEL_SHAPES["qwen2.5-0.5b"].layers, MODEL_SHAPES["qwen2.5-0.5b"].kv_width) == (24, 2 * 896 // 14)
    assert (MODEL_SHAPES["qwen2.5-3b"].layers, MODEL_SHAPES["qwen2.5-3b"].kv_width) == (36, 2 * 2048 // 16)


def l4_gpt2(cfg):
    """The L4 pool's gpt2-xl: its KV share from the memory plan, and the full sequences it holds."""
    l4 = cfg.regions[0].pools[1]
    share = next(p.kv_bytes for p in plan_pool(cfg, l4).processes if p.model_id == "gpt2-xl")  # the memory plan's
    per_token = 2 * 48 * 1600 * 2  # K and V, layers, width, fp16
    return l4, share, per_token, share / (per_token * (768 + 256))


def test_the_l4_pool_gets_a_warning_with_the_arithmetic(multi):
    cfg = parse_config(multi)
    l4, share, per_token, sequences = l4_gpt2(cfg)
    assert model_kv_bytes_per_token(cfg.models[0], cfg.engine_for(l4, "gpt2-xl")) == per_token
    assert sequences < 64  # the issue: "about 11 full sequences against a batch of 64" on the L4's share
    [warning] = [w for w in kv_room_warnings(cfg) if w.dotted == "regions[0].pools[1].serves[0]"]
    assert f"KV share of {share / GIB:.2f} GiB holds {sequences:.1f} full sequences, against max_batch_size 64" \
        in warning.message
    assert "307,200 bytes per token" in warning.message and "x 1024 tokens" in warning.message
    assert f"max_batch_size <= {int(sequences)}" in warning.message


def test_a_batch_the_share_holds_gives_no_warning(multi):
    multi["models"][0]["engine"]["max_batch_size"] = int(l4_gpt2(parse_config(multi))[3])  # the smallest share's
    assert not [w for w in kv_room_warnings(parse_config(multi)) if "gpt2-xl" in w.message]


def test_an_eight_bit_kv_cache_halves_each_token(multi):
    cfg = parse_config(multi)
    engine = cfg.engine_for(cfg.regions[0].pools[1], "gpt2-xl")
    fp16 = model_kv_bytes_per_token(cfg.models[0], engine)
    assert model_kv_bytes_per_token(cfg.models[0], engine.model_copy(update={"kv_cache_dtype": KvCacheDtype.INT8})) == fp16 // 2


def test_validate_prints_the_warning_and_still_passes(multi, capsys, tmp_path):
    from scripts.config_cmd import _validate

    path = tmp_path / "fleet.yaml"
    path.write_text(EXAMPLE.read_text())
    assert _validate(argparse.Namespace(file=str(path), deploy=False, profile=None)) == 0
    out = capsys.readouterr().out
    _, share, _, sequences = l4_gpt2(parse_config(multi))
    assert (f"warning: regions[0].pools[1].serves[0]: gpt2-xl's KV share of {share / GIB:.2f} GiB holds "
            f"{sequences:.1f} full sequences") in out


def test_a_model_without_published_figures_is_not_guessed(multi):
    doc = copy.deepcopy(multi)
    doc["models"][0]["source"] = "acme/private-gpt2"
    doc["models"][0]["id"] = "acme-gpt"
    for pool in doc["regions"][0]["pools"]:
        for serve in pool["serves"]:
            if serve["model"] == "gpt2-xl":
                serve["model"] = "acme-gpt"
    assert not [w for w in kv_room_warnings(parse_config(doc)) if "acme-gpt" in w.message]
