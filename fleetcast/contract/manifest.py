"""The staged manifest format: what files a bucket prefix must hold, their sizes and sha256.

A manifest is written LAST, after every file it names is in the bucket, so a
reader that finds a manifest finds a complete artifact; a reader verifies each
file against it before use. `fleetcast stage` writes it, the runtime's engine
cache writes and reads it (where prefixes are: fleetcast/contract/bucket.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"
SCHEMA = "fleetcast.manifest/v1"
_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class ManifestFile:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    kind: str  # "model", "calibration", "engine"
    name: str
    revision: str
    files: tuple[ManifestFile, ...]
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    schema: str = SCHEMA

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> str:
        data = asdict(self)
        data["files"] = [asdict(f) for f in self.files]
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        data = json.loads(text)
        if data.get("schema") != SCHEMA:
            raise ValueError(f"unsupported manifest schema {data.get('schema')!r}; expected {SCHEMA}")
        files = tuple(ManifestFile(**f) for f in data.pop("files"))
        for f in files:
            if f.path.startswith("/") or ".." in Path(f.path).parts:
                raise ValueError(f"manifest path {f.path!r} escapes its prefix")
        return cls(files=files, **data)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def build_manifest(root: Path, *, kind: str, name: str, revision: str, source: str = "", extra: dict[str, Any] | None = None,
                   include: Callable[[str], bool] | None = None) -> Manifest:
    """Hash every regular file under `root` (hidden files and the manifest itself excluded; with `include`,
    only the relative paths it accepts)."""
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if not path.is_file() or rel == MANIFEST_NAME or any(p.startswith(".") for p in Path(rel).parts):
            continue
        if include is not None and not include(rel):
            continue
        files.append(ManifestFile(path=rel, size=path.stat().st_size, sha256=sha256_file(path)))
    if not files:
        raise ValueError(f"{root} holds no files to stage")
    return Manifest(kind=kind, name=name, revision=revision, files=tuple(files), source=source, extra=extra or {})


def verify_tree(root: Path, manifest: Manifest) -> list[str]:
    """Problems found comparing a local directory with its manifest (empty list: intact)."""
    problems = []
    for f in manifest.files:
        path = root / f.path
        if not path.is_file():
            problems.append(f"{f.path}: missing")
        elif path.stat().st_size != f.size:
            problems.append(f"{f.path}: size {path.stat().st_size} != {f.size}")
        elif sha256_file(path) != f.sha256:
            problems.append(f"{f.path}: sha256 mismatch")
    return problems
