"""The wheelhouse of the consumer-side bench probe (stacks/consumer_probe.py): what it must hold.

The probe is a plain Amazon Linux 2023 instance in a consumer's VPC: Python 3.11
comes from the AL2023 repositories, the fleetcast code from the probe bundle,
and the few third-party packages the bench client and job import (pydantic,
boto3 and their dependencies) from wheels carried in the same bundle, so the
probe never needs PyPI. `fleetcast bench probe-wheels --out DIR` downloads them
(fleetcast/bench/probe_wheels.py: Linux x86_64, CPython 3.11, binary wheels only);
synth checks the directory (`check_wheelhouse`).
"""

from __future__ import annotations

import re
from pathlib import Path

from .bench import PROBE_WHEELS_DIR
from .context import Context
from .errors import UserError

# Same ranges as pyproject.toml's dependencies.
REQUIREMENTS = ("pydantic~=2.14.0", "boto3~=1.40")
# Every distribution those two pull in (normalized names): a wheelhouse missing one cannot run the job.
REQUIRED_DISTRIBUTIONS = (
    "pydantic", "pydantic_core", "typing_extensions", "annotated_types", "typing_inspection",
    "boto3", "botocore", "jmespath", "s3transfer", "python_dateutil", "six", "urllib3",
)
PLATFORM = "manylinux2014_x86_64"
PYTHON_VERSION = "3.11"
DEFAULT_DIR = PROBE_WHEELS_DIR


def _dist_name(wheel: Path) -> str:
    return re.sub(r"[-_.]+", "_", wheel.name.split("-", 1)[0]).lower()


def check_wheelhouse(directory: Path) -> list[Path]:
    """The wheels in `directory`, or a UserError naming what is missing or built for another platform."""
    fix = (f"run `fleetcast bench probe-wheels --out {directory}` (needs PyPI), "
           f"or synth with -c {Context.BENCH_PROBE.value}=false")
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
