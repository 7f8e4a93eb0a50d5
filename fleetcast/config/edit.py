"""Write values back into a fleet config file, keeping its comments and layout.

Used by `fleetcast stage image` (pins the image digest), `fleetcast deploy`
(publishes endpoint service names) and `fleetcast plan --write-config`. The
edited text is validated with the same loader before it replaces the file; an
edit that would make the config invalid leaves the file untouched.
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

from ruamel.yaml import YAML

from .loader import ConfigError, load_config
from .model import FleetConfig

Edit = tuple[tuple[str | int, ...], Any]


def round_trip_yaml() -> YAML:
    """The loader/dumper every config writer uses, so edits keep comments, quotes and layout alike."""
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    return yaml


def write_validated(path: str | Path, yaml: YAML, doc: Any) -> FleetConfig:
    """Dump `doc`, validate the text with the config loader, and only then replace `path` atomically.

    Raises ConfigError (its source says the file was left unchanged) when the edited config is invalid."""
    path = Path(path)
    buffer = io.StringIO()
    yaml.dump(doc, buffer)
    fd, tmp = tempfile.mkstemp(prefix=".fleet-", suffix=path.suffix or ".yaml", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(buffer.getvalue())
        try:
            cfg = load_config(tmp)
        except ConfigError as exc:
            exc.source = f"{path} (after edit; file left unchanged)"
            raise
        os.replace(tmp, path)
        return cfg
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def apply_edits(path: str | Path, edits: Iterable[Edit]) -> FleetConfig:
    """Set each (path, value) in the YAML document, validate, then atomically replace the file."""
    yaml = round_trip_yaml()
    doc = yaml.load(Path(path).read_text())
    for keys, value in edits:
        node = doc
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    return write_validated(path, yaml, doc)
