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
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from .loader import ConfigError, parse_config, read_document
from .model import FleetConfig

Edit = tuple[tuple[str | int, ...], Any]


def round_trip_yaml() -> YAML:
    """The loader/dumper every config writer uses, so edits keep comments, quotes and layout alike."""
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    return yaml


def validated_text(path: str | Path, yaml: YAML, doc: Any) -> tuple[str, FleetConfig]:
    """Dump `doc` and validate the text with the config loader, writing nothing: (text, validated config).

    Raises ConfigError (its source says the file was left unchanged) when the edited config is invalid."""
    path = Path(path)
    buffer = io.StringIO()
    yaml.dump(doc, buffer)
    text = buffer.getvalue()
    try:
        data, lines = read_document(path, text.encode())
        cfg = parse_config(data, str(path), lines)
    except ConfigError as exc:
        exc.source = f"{path} (after edit; file left unchanged)"
        raise
    return text, cfg


def replace_files(contents: Iterable[tuple[str | Path, str]]) -> None:
    """Replace each file with its text atomically, all or none: every new text is written to a temporary file
    beside its target first, then each is renamed over its target; if a rename fails, the files already
    replaced get their old text back (a file that did not exist is removed), so a failure leaves every
    file as it was."""
    staged: list[tuple[Path, str]] = []
    try:
        for target, text in contents:
            target = Path(target)
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            staged.append((target, tmp))
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
        done: list[tuple[Path, bytes | None]] = []
        try:
            for target, tmp in staged:
                before = target.read_bytes() if target.is_file() else None
                os.replace(tmp, target)
                done.append((target, before))
        except OSError:
            for target, before in reversed(done):
                if before is None:
                    target.unlink(missing_ok=True)
                else:
                    _restore(target, before)
            raise
    finally:
        for _, tmp in staged:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _restore(target: Path, content: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)
    os.replace(tmp, target)


def write_validated(path: str | Path, yaml: YAML, doc: Any) -> FleetConfig:
    """Dump `doc`, validate the text with the config loader, and only then replace `path` atomically.

    Raises ConfigError (its source says the file was left unchanged) when the edited config is invalid."""
    text, cfg = validated_text(path, yaml, doc)
    replace_files([(path, text)])
    return cfg


def edited_text(path: str | Path, edits: Iterable[Edit]) -> tuple[str, FleetConfig]:
    """The file with each (path, value) set (a missing mapping on the way is added), validated; writes nothing."""
    from ruamel.yaml.comments import CommentedMap

    yaml = round_trip_yaml()
    doc = yaml.load(Path(path).read_text())
    for keys, value in edits:
        node = doc
        for key in keys[:-1]:
            if isinstance(key, str) and node.get(key) is None:
                node[key] = CommentedMap()
            node = node[key]
        node[keys[-1]] = value
    return validated_text(path, yaml, doc)


def apply_edits(path: str | Path, edits: Iterable[Edit]) -> FleetConfig:
    """Set each (path, value) in the YAML document, validate, then atomically replace the file."""
    text, cfg = edited_text(path, edits)
    replace_files([(path, text)])
    return cfg
