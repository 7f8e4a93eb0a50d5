"""Fixtures: dummy credentials, the default config, a stubbed AWS, and a CLI runner."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetcast.config import load_config
from tests.cli import one_parser

from .stubs import StubbedAws

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config" / "fleet.yaml"


@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch, tmp_path):
    """Dummy credentials and no shared config: nothing here can reach a real account."""
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def cfg():
    return load_config(CONFIG)


@pytest.fixture
def aws():
    stubbed = StubbedAws()
    yield stubbed
    stubbed.done()


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def audit(self) -> list[dict]:
        return [json.loads(line) for line in self.out.splitlines() if line.startswith("{")]


def run_cli(access, *argv: str, config: Path = CONFIG) -> Result:
    """Run `fleetcast connections ...` in-process against `access`; stdout/stderr captured."""
    from scripts import cli, connections_cmd

    out, err = io.StringIO(), io.StringIO()
    previous = connections_cmd.ACCESS_FACTORY
    connections_cmd.ACCESS_FACTORY = lambda args: access
    try:
        with one_parser(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(["connections", argv[0], "--config", str(config), *argv[1:]])
            except SystemExit as exc:  # argparse usage errors
                code = int(exc.code or 0)
    finally:
        connections_cmd.ACCESS_FACTORY = previous
    return Result(code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli(aws):
    return lambda *argv, **kw: run_cli(aws.access, *argv, **kw)
