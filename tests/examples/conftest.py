"""The wheel built from this checkout, and a virtual environment that has it, shared by the examples' tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
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
    """The wheel into `python`'s environment, its dependencies reached through a .pth file instead of an index."""
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    Path(site, "00_shared_deps.pth").write_text("\n".join(shared_site_packages()) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "--quiet", str(wheel)], check=True, timeout=BUILD_TIMEOUT_S, capture_output=True)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """`pip wheel --no-deps` of this checkout."""
    out = tmp_path_factory.mktemp("wheel")
    leftover = not (ROOT / "build").exists()  # setuptools builds in the tree's build/ (ignored by git)
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(out),
                        str(ROOT)], check=True, timeout=BUILD_TIMEOUT_S, capture_output=True)
    finally:
        if leftover:
            shutil.rmtree(ROOT / "build", ignore_errors=True)
    (built,) = out.glob("fleetcast-*.whl")
    return built
