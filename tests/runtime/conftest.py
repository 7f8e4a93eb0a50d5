"""Loopback AWS for the runtime tests: moto (S3, SSM) plus the dev fakes (IMDSv2, hooks, EC2)."""

import itertools
import os

import pytest

from runtime.devtools.harness import LocalAws

_buckets = itertools.count()


@pytest.fixture(autouse=True)
def _dummy_aws_credentials(monkeypatch):
    # Never reach real AWS from a test, even by accident.
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def aws(moto_endpoint):
    """Each test its own bucket and config parameter on the session's moto server (one server start
    and stop per run, not per test); the IMDS, hook and EC2 fakes are the test's own."""
    with LocalAws(bucket=f"fleetcast-test-{os.getpid()}-{next(_buckets)}", moto_url=moto_endpoint) as local:
        yield local


@pytest.fixture
def tmp_path():
    """A private temporary directory. pytest's own basetemp is shared by every pytest run of this
    user and rotated (old runs deleted) when others start; runtime processes outlive that window."""
    import shutil
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(prefix="fleetcast-runtime-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake_mps(tmp_path, monkeypatch):
    """tests/runtime/fake_mps_control.py on PATH as nvidia-cuda-mps-control; yields the file its calls go to."""
    import pathlib
    import sys

    bin_dir = tmp_path / "mps-bin"
    bin_dir.mkdir()
    script = pathlib.Path(__file__).with_name("fake_mps_control.py")
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    exe.chmod(0o755)
    calls = tmp_path / "mps-calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_MPS_CALLS", str(calls))
    return calls

