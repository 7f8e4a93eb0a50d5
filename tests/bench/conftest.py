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
