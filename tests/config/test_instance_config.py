"""What an instance receives is what synth validated: the instance checks the config's shape and its own
pool (on its own GPU), never the fleet-level rules, whose tables and operator overrides it cannot see."""

from __future__ import annotations

import pytest
from ruamel.yaml import YAML

from fleetcast.config import ConfigError, catalog, config_from_json, parse_config
from fleetcast.config.parameter import config_parameter
from tests.ready_config import DEFAULT


def _g7e_in_seoul() -> dict:
    doc = YAML(typ="safe").load(DEFAULT.read_text())
    doc["regions"][0]["pools"][0]["instance_type"] = "g7e.2xlarge"
    doc["regions"][0]["pools"][0]["engine"] = {"precision": "fp16"}
    # A PyTorch-backend model: the engine flow (GPT-2) is refused on g7e's sm120 (fleetcast/contract/support.py).
    doc["model"].update(family="llama", id="llama-3.2-1b", source="meta-llama/Llama-3.2-1B-Instruct", context_length=8192)
    doc["engine"].update(backend="pytorch", precision="fp16")
    for region in doc["regions"]:  # drop the engine-flow precision overrides
        for pool in region["pools"][1 if region is doc["regions"][0] else 0:]:
            pool.get("engine", {}).pop("precision", None)
    return doc


@pytest.fixture
def availability_override(tmp_path, monkeypatch):
    """An operator's FLEETCAST_AVAILABILITY at synth time: g7e offered in ap-northeast-2 (the shipped table
    has g7e only in three US regions)."""
    table = tmp_path / "availability.yaml"
    table.write_text('as_of: "2026-12-01"\nfamilies:\n  g5: [us-east-1, ap-northeast-2]\n  g6e: [us-east-1, ap-northeast-2]\n'
                     "  g7e: [us-east-1, ap-northeast-2]\n")
    monkeypatch.setenv("FLEETCAST_AVAILABILITY", str(table))
    catalog.availability.cache_clear()
    yield
    catalog.availability.cache_clear()


def test_without_the_override_validate_refuses_g7e_in_seoul():
    with pytest.raises(ConfigError, match="g7e"):
        parse_config(_g7e_in_seoul())


def test_a_config_synth_accepted_under_an_override_is_accepted_by_every_instance(availability_override,
                                                                                   monkeypatch):
    cfg = parse_config(_g7e_in_seoul())  # synth: the operator's table
    value, _tier = config_parameter(cfg)
    monkeypatch.delenv("FLEETCAST_AVAILABILITY")  # the instance: only the shipped table
    catalog.availability.cache_clear()
    assert config_from_json(value) == cfg


def test_the_instance_still_refuses_a_malformed_parameter_with_the_field():
    cfg = parse_config(YAML(typ="safe").load(DEFAULT.read_text()))
    value, _tier = config_parameter(cfg)
    with pytest.raises(ConfigError, match=r"engine\.max_batch_size"):
        config_from_json(value.replace('"max_batch_size":64', '"max_batch_size":"sixty-four"', 1))
    with pytest.raises(ConfigError, match="not the JSON"):
        config_from_json(value[:-10])
