"""The wheelhouse of the consumer-side bench probe (stacks/consumer_probe.py).

The probe is a plain Amazon Linux 2023 instance in a consumer's VPC: Python 3.11
comes from the AL2023 repositories, the fleetcast code from the probe bundle,
and the few third-party packages the bench client and job import (pydantic,
boto3 and their dependencies) from wheels carried in the same bundle, so the
probe never needs PyPI. `fleetcast bench probe-wheels --out DIR` downloads them
(Linux x86_64, CPython 3.11, binary wheels only); synth checks the directory.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from fleetcast.contract.errors import UserError

# Same ranges as pyproject.toml's dependencies.
REQUIREMENTS = ("pydantic~=2.14.0", "boto3~=1.40")
# Every distribution those two pull in (normalized names): a wheelhouse missing one cannot run the job.
REQUIRED_DISTRIBUTIONS = (
    "pydantic", "pydantic_core", "typing_extensions", "annotated_types", "typing_inspection",
    "boto3", "botocore", "jmespath", "s3transfer", "python_dateutil", "six", "urllib3",
)
PLATFORM = "manylinux2014_x86_64"
PYTHON_VERSION = "3.11"
DEFAULT_DIR = "build/probe-wheels"


def download_argv(dest: Path) -> list[str]:
    """pip command that fills `dest` with wheels for the probe's platform (not this machine's)."""
    return [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(dest),
            "--only-binary=:all:", "--platform", PLATFORM, "--python-version", PYTHON_VERSION,
            "--implementation", "cp", *REQUIREMENTS]


def download(dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(download_argv(dest), capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"pip download failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()[-400:]}")
    return check_wheelhouse(dest)


def _dist_name(wheel: Path) -> str:
    return re.sub(r"[-_.]+", "_", wheel.name.split("-", 1)[0]).lower()


def check_wheelhouse(directory: Path) -> list[Path]:
    """The wheels in `directory`, or a UserError naming what is missing or built for another platform."""
    fix = f"run `fleetcast bench probe-wheels --out {directory}` (needs PyPI), or synth with -c bench_probe=false"
    if not directory.is_dir():
        raise UserError(f"bench probe wheelhouse {directory} does not exist: {fix}")
    wheels = sorted(directory.glob("*.whl"))
    found = {_dist_name(w) for w in wheels}
    missing = [d for d in REQUIRED_DISTRIBUTIONS if d not in found]
    if missing:
        raise UserError(f"bench probe wheelhouse {directory} lacks {', '.join(missing)}: {fix}")
    for wheel in wheels:
        # name-version(-build)?-python-abi-platform.whl
        python_tag, abi, platform = wheel.name[:-4].split("-")[-3:]
        if abi == "none" and platform == "any":
            continue
        wrong_python = "cp311" not in python_tag.split(".") and abi != "abi3"
        wrong_platform = "manylinux" not in platform or "x86_64" not in platform
        if wrong_python or wrong_platform:
            raise UserError(
                f"bench probe wheelhouse: {wheel.name} is not for CPython 3.11 on Linux x86_64 "
                f"(the probe's Python): {fix}"
            )
    return wheels
