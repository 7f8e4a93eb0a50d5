"""Python packages the runtime needs that the TensorRT-LLM release image lacks.

The 1.2.x image already carries pydantic (>= 2.9), aiohttp, PyYAML, urllib3 and
python-dateutil (TensorRT-LLM's own requirements). It has no boto3, no
ruamel.yaml and no uvloop (its requirements name plain `uvicorn`, not
`uvicorn[standard]`): the gateway was measured on uvloop (docs/gateway.md), so
the image gets it here rather than silently running on the slower default loop.
With egress `none` the instance cannot pip install, so docker/Dockerfile installs
these into VENDOR_DIR while `fleetcast stage image` builds the serving image
(where the build has internet); run-container.sh puts that directory on
PYTHONPATH after the runtime bundle, for the runtime's own processes only:
runtime/trtllm.py::tool_env takes it off the PYTHONPATH of TensorRT-LLM's
processes (trtllm-build, trtllm-serve, the convert scripts), which must import
what they were released with.

The pins are exact and mutually consistent: each wheel's declared requirements
(its METADATA, recorded in tests/runtime/vendored_wheels.py) are met by the other
pins or by the image (python-dateutil, urllib3). They are the versions the test
suite runs the runtime with. Installed with `--no-deps` (nothing of the image is
replaced) and `--require-hashes` (the wheels are the ones checked).

    python -m runtime.vendor DEST    # needs PyPI; the Dockerfile runs it

Standard library only: the Dockerfile runs this file on its own.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

VENDOR_DIR = "/usr/local/lib/fleetcast-deps"  # docker/Dockerfile, runtime/host/run-container.sh
VENDOR_DIR_ENV = "FLEETCAST_DEPS"  # set by docker/Dockerfile to VENDOR_DIR

# name -> (version, sha256 of the wheel for the image's interpreter: CPython 3.12, x86_64 manylinux)
PINS: dict[str, tuple[str, str]] = {
    "boto3": ("1.44.8", "099caf21553bbbfef118904aa02fadb8776a534704cf00bede0ed9f29a4da88e"),
    "botocore": ("1.44.8", "76342a76c338701db80dcb8afe1c9bd079283d6fffbb9d881442abb02a215043"),
    "s3transfer": ("0.19.3", "24eb7535804306355e31c952a90022bf5b2f9d760f9a11062c7493a217c08553"),
    "jmespath": ("1.1.0", "a5663118de4908c91729bea0acadca56526eb2698e83de10cd116ae0f4e97c64"),
    "ruamel.yaml": ("0.19.1", "27592957fedf6e0b62f281e96effd28043345e0e66001f97683aa9a40c667c93"),
    "uvloop": ("0.21.0", "86975dca1c773a2c9864f4c52c5a55631038e387b47eaf56210f873887b6c8dc"),
}
VENDORED = tuple(f"{name}=={version}" for name, (version, _) in PINS.items())
TARGET = ("--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux2014_x86_64",
          "--only-binary=:all:")


def requirements() -> str:
    """A requirements file with every pin and its hash."""
    return "".join(f"{name}=={version} --hash=sha256:{digest}\n" for name, (version, digest) in PINS.items())


def pip_command(dest: Path, requirements_file: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--require-hashes", "--target", str(dest),
            *TARGET, "-r", str(requirements_file)]


def vendor(dest: Path) -> Path:
    """Install the vendored wheels into `dest` (the serving image's VENDOR_DIR)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(requirements())
        subprocess.run(pip_command(dest, req), check=True)
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m runtime.vendor DEST_DIR", file=sys.stderr)
        sys.exit(2)
    vendor(Path(sys.argv[1]))
