"""Fixtures: loopback test servers with known timings (fleetcast.bench.testserver)."""

from __future__ import annotations

import socket

import pytest

from fleetcast.bench.accuracy import TestServerProcess
from fleetcast.bench.testserver import Timings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def fast_server():
    """Short timings: TTFT 10 ms, ITL 2 ms, so load-mode tests run in a second or two."""
    with TestServerProcess(free_port(), Timings(ttft_ms=10, itl_ms=2)) as server:
        yield server


@pytest.fixture(scope="session")
def flaky_server():
    """Answers a third of streamed requests with HTTP 500."""
    with TestServerProcess(free_port(), Timings(ttft_ms=5, itl_ms=1, fail_prob=0.34, seed=3)) as server:
        yield server


# ---------------------------------------------------------------- bench-mode synthesis

WHEEL_NAMES = (
    "pydantic-2.14.4-py3-none-any.whl", "pydantic_core-2.50.5-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    "typing_extensions-4.16.0-py3-none-any.whl", "annotated_types-0.8.0-py3-none-any.whl",
    "typing_inspection-0.4.5-py3-none-any.whl", "boto3-1.44.8-py3-none-any.whl", "botocore-1.44.8-py3-none-any.whl",
    "jmespath-1.1.0-py3-none-any.whl", "s3transfer-0.19.3-py3-none-any.whl",
    "python_dateutil-2.9.0.post0-py2.py3-none-any.whl", "six-1.17.0-py2.py3-none-any.whl",
    "urllib3-2.8.0-py3-none-any.whl",
)


def fake_wheelhouse(directory):
    """Empty zip files under the real wheel names: synth only checks names and platform tags."""
    import zipfile

    directory.mkdir(parents=True, exist_ok=True)
    for name in WHEEL_NAMES:
        with zipfile.ZipFile(directory / name, "w"):
            pass
    return directory
