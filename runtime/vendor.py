"""Python packages the runtime needs that the TensorRT-LLM release image lacks.

The 1.2.x image already carries pydantic (>= 2.9), aiohttp, PyYAML, urllib3 and
python-dateutil (TensorRT-LLM's own requirements). It has no boto3, no
ruamel.yaml and no uvloop (its requirements name plain `uvicorn`, not
`uvicorn[standard]`): the gateway was measured on uvloop (docs/gateway.md), so
the image gets it here rather than silently running on the slower default loop. With egress `none` the instance cannot pip install, so docker/Dockerfile
installs these into /usr/local/lib/fleetcast-deps while `fleetcast stage image`
builds the serving image (where the build has internet); run-container.sh puts
that directory on PYTHONPATH after the runtime bundle. They are installed without
their dependencies on purpose: anything the image already has must not be
shadowed, because trtllm-serve and trtllm-build inherit the same PYTHONPATH.

    python -m runtime.vendor DEST    # needs PyPI; the Dockerfile runs it
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# Wheels for the image's interpreter (CPython 3.12, x86_64 manylinux).
VENDORED = ("boto3~=1.40", "botocore~=1.40", "s3transfer>=0.13,<0.15", "jmespath~=1.0",
            "ruamel.yaml~=0.19.1", "ruamel.yaml.clib~=0.2.12", "uvloop~=0.21.0")
TARGET = ("--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux2014_x86_64",
          "--only-binary=:all:")


def pip_command(dest: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(dest), *TARGET, *VENDORED]


def vendor(dest: Path) -> Path:
    """Install the vendored wheels into `dest` (the serving image's /usr/local/lib/fleetcast-deps)."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(pip_command(dest), check=True)
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m runtime.vendor DEST_DIR", file=sys.stderr)
        sys.exit(2)
    vendor(Path(sys.argv[1]))
