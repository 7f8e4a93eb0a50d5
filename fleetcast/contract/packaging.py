"""What the repository's directories are called once installed from the wheel.

The repository keeps `stacks/`, `runtime/` and `scripts/` at its root (tests, `cdk synth` of app.py and the
instance bundle use those names), but a wheel that installed them as top-level packages would take names that
a team's own CDK app commonly has (its own `stacks/` package made `stacks.fleet` unimportable). The wheel
installs each under a name that carries the product's (setup.py maps the directories); `fleetcast/` is
`fleetcast` in both. The instance bundle still ships the runtime as `runtime` (stacks/runtime_bundle.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path, PurePath

# repository directory -> the package it is in an installed wheel
WHEEL_PACKAGES = {"stacks": "fleetcast_cdk", "runtime": "fleetcast_runtime", "scripts": "fleetcast_cli"}
# Data the wheel carries that lies outside the packages in the repository: the serving image's Dockerfile
# (the image mirror's build context, stacks/image_mirror.py), shipped as a data directory of the CDK package.
WHEEL_DATA_DIRS = {"docker": "fleetcast_cdk._docker"}
CONSOLE_SCRIPT = "fleetcast"


def installed_path(root: Path, rel: str | PurePath) -> Path:
    """`rel`, a path as the repository names it (`runtime/vendor.py`), under `root`: the repository, or the
    site-packages directory of an installed wheel, where it lies under its package (`fleetcast_runtime/vendor.py`)."""
    top, *rest = PurePath(rel).parts
    renamed = root.joinpath(*{**WHEEL_PACKAGES, **WHEEL_DATA_DIRS}.get(top, top).split("."), *rest)
    return renamed if renamed.exists() else root.joinpath(top, *rest)


def cli_module() -> str:
    """The module `python -m` runs the `fleetcast` CLI as: its installed name, or in a checkout without an install
    (PYTHONPATH=., as the tests run it) the repository's `scripts.cli`."""
    installed = WHEEL_PACKAGES["scripts"]
    return f"{installed}.cli" if importlib.util.find_spec(installed) is not None else "scripts.cli"
