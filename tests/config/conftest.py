import copy
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from fleetcast.config import ConfigError, parse_config

DEFAULT = Path(__file__).resolve().parents[2] / "config" / "fleet.yaml"


@pytest.fixture(scope="session")
def base_doc() -> dict:
    return YAML(typ="safe").load(DEFAULT.read_text())


@pytest.fixture
def doc(base_doc) -> dict:
    """A fresh, mutable copy of the default config for one test to break."""
    return copy.deepcopy(base_doc)


def problems(data: dict) -> list[str]:
    """Every problem reported for `data`, as 'dotted.path: message' strings."""
    try:
        parse_config(data)
    except ConfigError as exc:
        return [f"{i.dotted}: {i.message}" for i in exc.issues]
    return []
