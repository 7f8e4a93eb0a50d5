"""`fleetcast smoke` against the real reference backend on loopback."""

import json
import socket

import pytest

from tests.cli import run_cli
from tests.runtime.reference_helpers import ONE_FORK_SERVER, ServerProcess

pytestmark = ONE_FORK_SERVER


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def reference_server(tmp_path_factory):
    pytest.importorskip("torch")
    from runtime.reference.build import build_artifact

    artifact = tmp_path_factory.mktemp("artifact") / "artifact"
    build_artifact(artifact, size="tiny")  # in this worker, which has PyTorch for the group's other modules
    server = ServerProcess(artifact, "--device", "cpu")  # forked with PyTorch imported (tests/runtime/zygote.py)
    try:
        server.wait_healthy(60)
    except (RuntimeError, TimeoutError) as exc:
        server.stop()
        pytest.fail(f"reference server did not become healthy: {exc}")
    yield server.base
    server.stop()


def cli(*args):
    """`fleetcast smoke` in this process (tests/cli.py); the server is the process here."""
    return run_cli("smoke", *args)


def test_smoke_prints_ttft_and_tokens(reference_server):
    out = cli("--endpoint", reference_server, "--max-tokens", "8", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["completion_tokens"] == 8
    assert 0 < result["ttft_ms"] <= result["e2e_ms"]
    human = cli("--endpoint", reference_server + "/v1", "--max-tokens", "4")
    assert "TTFT:" in human.stdout and "completion 4" in human.stdout


def test_unreachable_endpoint_is_a_clear_error():
    out = cli("--endpoint", f"http://127.0.0.1:{_port()}", "--timeout", "5")
    assert out.returncode == 1 and "cannot reach" in out.stderr and "Traceback" not in out.stderr


def test_bad_arguments():
    out = cli("--endpoint", "vpce-123.example:8000")
    assert out.returncode == 2 and "must be an http:// or https:// URL" in out.stderr
