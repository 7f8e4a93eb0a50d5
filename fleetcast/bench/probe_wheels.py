"""`fleetcast bench probe-wheels`: download the consumer-side probe's wheelhouse (what it must hold, and the
check synth runs on it: fleetcast/contract/probe_wheels.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fleetcast.contract.errors import UserError
from fleetcast.contract.probe_wheels import PLATFORM, PYTHON_VERSION, REQUIREMENTS, check_wheelhouse


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
