"""The linter and the type checker are gates of `make test`: ruff over the whole repository and mypy over
the packages pyproject.toml names, each as configured there, each failing with its own report."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# A cold mypy run (no .mypy_cache: a fresh clone) reads aws-cdk-lib's stubs, minutes on a loaded 2-core machine.
MYPY_TIMEOUT_S = 1200


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    # The repository root first on the path: the checked tree, not an installed copy, is what gets imported.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_ruff_finds_nothing_in_the_repository():
    proc = _run("ruff", "check", "--output-format", "concise", ".", timeout=300)
    assert proc.returncode == 0, f"ruff check . found:\n{proc.stdout}{proc.stderr}"


@pytest.mark.timeout(MYPY_TIMEOUT_S + 60)
def test_mypy_finds_nothing_in_the_configured_packages():
    proc = _run("mypy", timeout=MYPY_TIMEOUT_S)
    assert proc.returncode == 0, f"mypy found:\n{proc.stdout}{proc.stderr}"


def _overrides_for(module: str) -> dict:
    [section] = [s for s in PYPROJECT["tool"]["mypy"]["overrides"] if module in s["module"]]
    return section


@pytest.mark.parametrize("package", ["fleetcast", "runtime"])
def test_fleetcast_and_the_runtime_get_every_flag_of_mypy_strict(package):
    """mypy takes `strict` only for all modules at once, so the per-module section spells out its flags: here
    checked against the list mypy itself applies for --strict (mypy/main.py define_options), so a mypy
    upgrade that adds a strict flag fails this test instead of silently checking less."""
    from mypy.main import define_options
    from mypy.options import PER_MODULE_OPTIONS

    _, _, strict_assignments = define_options()
    per_module = {dest: value for dest, value in strict_assignments if dest in PER_MODULE_OPTIONS}
    assert per_module, "mypy's strict flags moved: read mypy/main.py define_options again"
    section = _overrides_for(package)
    assert package + ".*" in section["module"], f"{package}'s submodules are not in the strict section"
    assert {dest: section.get(dest) for dest in per_module} == per_module
    # The rest of --strict is global-only in mypy; the global section sets it for every module.
    global_only = {dest: value for dest, value in strict_assignments if dest not in PER_MODULE_OPTIONS}
    assert {dest: PYPROJECT["tool"]["mypy"].get(dest) for dest in global_only} == global_only


def test_the_type_checked_paths_exist():
    """A renamed or moved package must not drop out of the check unnoticed (mypy would check what remains)."""
    missing = [p for p in PYPROJECT["tool"]["mypy"]["files"] if not (ROOT / p).exists()]
    assert not missing, f"pyproject.toml [tool.mypy] files names paths that do not exist: {missing}"
