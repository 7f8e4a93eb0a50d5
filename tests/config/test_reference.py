"""docs/config.md is the generated config reference: complete, and never stale."""

from __future__ import annotations

import re
from pathlib import Path

from fleetcast.config import FleetConfig
from fleetcast.config.reference import GENERATE_COMMAND, render
from scripts.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "config.md"


def _models(model=FleetConfig, seen=None):
    """Every pydantic model reachable from FleetConfig."""
    from pydantic import BaseModel

    seen = {} if seen is None else seen
    seen[model.__name__] = model
    for field in model.model_fields.values():
        for arg in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", str(field.annotation)):
            candidate = model.__module__ and __import__(model.__module__, fromlist=[arg]).__dict__.get(arg)
            if isinstance(candidate, type) and issubclass(candidate, BaseModel) and candidate.__name__ not in seen:
                _models(candidate, seen)
    return seen


def test_docs_config_md_is_up_to_date_with_the_schema():
    assert DOC.read_text() == render(), f"docs/config.md is stale: regenerate it with `{GENERATE_COMMAND}`"


def test_every_field_of_every_model_is_documented_in_its_section():
    text = render()
    sections = dict(re.findall(r"^## (\w+)\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M))
    models = _models()
    assert len(models) > 15
    for name, model in models.items():
        assert name in sections, f"no section for {name}"
        for field in model.model_fields:
            assert f"| `{field}` |" in sections[name], f"{name}.{field} is not documented"


def test_allowed_values_and_defaults_are_shown():
    text = render()
    assert "one of `fp16`, `bf16`, `int8_wo`, `int8_sq`, `fp8`, `int4_wo`, `nvfp4`" in text
    assert "| `port` | integer | default `8000` | >= 1024; <= 65535 |" in text
    assert "YAML path: `regions[].pools[].capacity`" in text


def test_cli_prints_the_same_reference(capsys):
    assert main(["config", "docs"]) == 0
    assert capsys.readouterr().out == render()


def test_rolls_instances_column_follows_the_instance_digest(doc):
    """The reference's column is read from NOT_IN_INSTANCE_DIGEST; spot-check it against digests."""
    import copy

    from fleetcast.config import parse_config
    from fleetcast.config.reference import rolls_instances

    assert rolls_instances("", "consumers") == "no" and rolls_instances("", "slo") == "no"
    assert rolls_instances("", "engine") == "yes" and rolls_instances("", "operations") == "partly"
    assert rolls_instances("operations", "drain_timeout_s") == "yes"
    assert rolls_instances("operations", "alarm_email") == "no"
    assert rolls_instances("regions[].pools[]", "capacity") == "no"
    assert rolls_instances("regions[].pools[].capacity", "min") == "no"
    assert rolls_instances("regions[].pools[]", "instance_type") == "yes"
    base = parse_config(doc).instance_digest("ap-northeast-2", "l40s")
    for path, value, rolls in ((("operations", "drain_timeout_s"), 120, True),
                               (("operations", "alarm_email"), "oncall@example.com", False),
                               (("slo", "ttft_p99_ms"), 450, False)):
        changed = copy.deepcopy(doc)
        changed.setdefault(path[0], {})[path[1]] = value
        assert (parse_config(changed).instance_digest("ap-northeast-2", "l40s") != base) is rolls, path
        assert rolls_instances(path[0], path[1]) == ("yes" if rolls else "no")
