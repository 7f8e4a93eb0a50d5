"""The wheel built from this checkout, and a virtual environment that has it, shared by the examples' tests."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 300


def shared_site_packages() -> list[str]:
    """The dependency directories of this interpreter (aws-cdk-lib, cdk-nag, pydantic, ...). A .pth line adds a
    directory without reading the .pth files in it (site.addpackage), so an editable install of this repository
    there stays out: what imports `fleetcast` is the wheel."""
    return [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]


def install_wheel(python: Path, wheel: Path) -> None:
    """The wheel into `python`'s environment, its dependencies reached through a .pth file instead of an index.
    Without compiling its 200-odd modules to bytecode at install (`--no-compile`): the few a test's processes
    import are compiled when imported, as Python does for any module without a cached one; the install was 3 s of
    CPU with it, 1.7 s without, and what is installed, and from where it imports, is the same."""
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    Path(site, "00_shared_deps.pth").write_text("\n".join(shared_site_packages()) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "--no-compile", "--disable-pip-version-check", "--quiet", str(wheel)],
                   check=True, timeout=BUILD_TIMEOUT_S, capture_output=True)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """`pip wheel --no-deps` of this checkout, built once per run: under pytest-xdist the workers share the run's
    temporary root (each worker's base is a directory of it), and the first to ask builds there while the others
    wait on a lock (the CodeBuild-like Synth step and the wheel's own tests run on different workers; a build is
    8 s of CPU, most of it pip's isolated build environment)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    base = tmp_path_factory.getbasetemp()
    out = (base.parent if worker else base) / "fleetcast-wheel"
    out.mkdir(exist_ok=True)
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process ends
        built = sorted(out.glob("fleetcast-*.whl"))
        if not built:
            _build_wheel(out)
            built = sorted(out.glob("fleetcast-*.whl"))
    (wheel,) = built
    return wheel


def _build_isolation() -> list[str]:
    """`--no-build-isolation` when this interpreter already has what pyproject.toml's build-system requires, else
    nothing (pip then installs those requirements into a fresh build environment: 6 of a build's 8 s of CPU, for
    the same wheel; built both ways from this checkout, its 266 files were byte for byte the same). `wheel` is met
    by setuptools' own bdist_wheel from 70.1 on (setuptools changelog, v70.1.0: "Adopted the bdist_wheel command
    from the wheel project")."""
    import importlib.metadata
    import tomllib

    from packaging.requirements import Requirement

    for text in tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]:
        requirement = Requirement(text)
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            if requirement.name == "wheel" and _setuptools_at_least("70.1"):
                continue
            return []
        if not requirement.specifier.contains(installed, prereleases=True):
            return []
    return ["--no-build-isolation"]


def _setuptools_at_least(release: str) -> bool:
    import importlib.metadata

    from packaging.version import Version

    try:
        return Version(importlib.metadata.version("setuptools")) >= Version(release)
    except importlib.metadata.PackageNotFoundError:
        return False


def _build_wheel(out: Path) -> None:
    leftover = not (ROOT / "build").exists()  # setuptools builds in the tree's build/ (ignored by git)
    staging = Path(tempfile.mkdtemp(dir=out))
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", *_build_isolation(),
                        "--wheel-dir", str(staging), str(ROOT)], check=True, timeout=BUILD_TIMEOUT_S,
                       capture_output=True)
        (built,) = staging.glob("fleetcast-*.whl")
        built.rename(out / built.name)  # whole, or not there: a failed build leaves nothing for the next to take
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if leftover:
            shutil.rmtree(ROOT / "build", ignore_errors=True)
