"""Every AWS-touching command, found from the CLI parser itself, takes --profile and --region and,
without any AWS credentials, ends with one line and exit 4 (never a traceback).

A new subcommand fails `test_every_subcommand_is_classified` until it is listed here as offline or
as AWS-touching (with the arguments that make it call AWS), so none slips through.

Credential chain facts relied on (boto3 "Credentials" guide,
https://boto3.amazonaws.com/v1/documentation/api/latest/guide/credentials.html): boto3 looks in the
environment (AWS_ACCESS_KEY_ID ...), the shared credentials file (AWS_SHARED_CREDENTIALS_FILE), the
config file (AWS_CONFIG_FILE), container credentials (AWS_CONTAINER_CREDENTIALS_*), then the
instance metadata service (off with AWS_EC2_METADATA_DISABLED=true). The environment below empties
every one of them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from scripts.cli import build_parser, main
from tests.ready_config import write_ready_config

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "config/fleet.yaml"
PLAN_INPUTS = ["--results", "examples/plan/seed/results", "--traffic", "examples/plan/seed/traffic-seoul.yaml"]

# Leaf subcommands that never call AWS.
OFFLINE = {
    ("config", "validate"), ("config", "schema"), ("config", "docs"), ("config", "show"), ("config", "init"),
    ("synth", "summary"), ("smoke",),
    ("bench", "run"), ("bench", "report"), ("bench", "network-share"), ("bench", "probe-wheels"),
}

# AWS-touching leaves (or modes of a leaf): the arguments after the subcommand that make it call AWS.
# `{tmp}` is a fresh directory. Destructive ones carry --yes so they reach AWS instead of asking.
AWS_RUNS = {
    ("config", "diff"): [["--deployed", CONFIG]],
    ("ami", "pin"): [[]],
    ("stage", "model"): [[]],
    ("stage", "adapter"): [[]],
    ("stage", "calibration"): [["--dir", "{tmp}/calib", "--name", "calib"]],  # a valid set: local input is checked first
    ("stage", "image"): [[], ["--method", "local"]],
    ("stage", "status"): [[]],
    ("stage", "plan-baseline"): [["--file", "{tmp}/baseline.json"]],
    ("traffic", "export"): [["--since", "1h", "--out", "{tmp}/traffic.yaml"]],
    ("deploy",): [[], ["--step", "publish"]],
    ("teardown",): [["--yes"]],
    ("connections", "list"): [[]],
    ("connections", "approve"): [["--account", "444455556666", "--yes"]],
    ("connections", "reject"): [["--account", "444455556666", "--yes"]],
    ("connections", "sync"): [["--yes"]],
    ("usage",): [["--since", "1h"]],
    ("bench", "collect"): [["--bucket", "bench-results", "--out", "{tmp}"]],
    ("plan",): [[*PLAN_INPUTS, "--live-availability"], [*PLAN_INPUTS, "--refresh-prices"],
                [PLAN_INPUTS[0], PLAN_INPUTS[1], "--check", "--traffic-from", "cloudwatch", "--since", "1h",
                 "--config", CONFIG]],
}
# Every AWS-touching command takes --region (plan's selects the provider region --traffic-from reads; its
# Pricing API and offering calls go to fixed regions).
NO_REGION_FLAG: set[tuple[str, ...]] = set()

# Dry runs that need no credentials: exit 0 and say what they could not check.
DRY_RUNS = {
    ("deploy",): ["--dry-run"],
    ("teardown",): ["--dry-run"],
    ("stage", "image"): ["--dry-run"],
}


def leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, child in subs[0].choices.items():
        yield from leaves(child, path + (name,))


LEAVES = dict(leaves(build_parser()))


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def test_every_subcommand_is_classified():
    unclassified = sorted(set(LEAVES) - OFFLINE - set(AWS_RUNS))
    assert not unclassified, f"classify these subcommands here (offline, or the argv that makes them call AWS): {unclassified}"
    assert not (OFFLINE & set(AWS_RUNS))
    assert set(AWS_RUNS) <= set(LEAVES), "a listed command no longer exists"


@pytest.mark.parametrize("path", sorted(AWS_RUNS), ids=" ".join)
def test_aws_commands_take_profile_and_region(path):
    opts = options(LEAVES[path])
    assert "--profile" in opts
    assert ("--region" in opts) is (path not in NO_REGION_FLAG)


def no_aws_env(home: Path) -> tuple[dict[str, str], Path]:
    """An environment with no AWS credentials anywhere, and an `npx` that records instead of deploying."""
    home.mkdir()
    empty = home / "empty"
    empty.write_text("")
    bin_dir = home / "bin"
    bin_dir.mkdir()
    calls = home / "npx-calls"
    npx = bin_dir / "npx"
    npx.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\nexit 1\n")
    npx.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=str(empty), AWS_SHARED_CREDENTIALS_FILE=str(empty), AWS_EC2_METADATA_DISABLED="true",
               PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", HOME=str(home), PYTHONPATH=str(ROOT),
               HF_HUB_OFFLINE="1")
    return env, calls


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def no_aws(tmp_path, monkeypatch, capsys):
    """`run(argv)`: the CLI in this process, as `python -m scripts.cli` runs it (cwd at the repository root),
    under `no_aws_env`. In-process because a subprocess per case cost a second of CPU each; the entry point
    itself runs as a subprocess in `test_an_unknown_profile_is_one_line_and_exit_4_even_for_a_dry_run_deploy`."""
    env, calls = no_aws_env(tmp_path / "home")
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(ROOT)

    def run(argv: list[str]) -> Run:
        capsys.readouterr()
        try:
            code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 2
        out, err = capsys.readouterr()
        return Run(code, out, err)

    return run, calls


def run_cli(argv, env, tmp_path):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    return subprocess.run([sys.executable, "-m", "scripts.cli", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=300)


AWS_CASES = [(path, extra) for path, runs in sorted(AWS_RUNS.items()) for extra in runs]


@pytest.mark.parametrize("path,extra", AWS_CASES, ids=[" ".join(p + tuple(e)) for p, e in AWS_CASES])
def test_without_credentials_every_aws_command_exits_4_in_one_line(path, extra, no_aws, tmp_path):
    run, calls = no_aws
    needs_config = "--config" in options(LEAVES[path]) and path not in {("plan",)}
    # deploy refuses the example config's placeholders before it looks for credentials
    config = str(write_ready_config(tmp_path / "fleet.yaml")) if path == ("deploy",) else CONFIG
    if path == ("stage", "calibration"):  # the set itself is checked offline, before credentials are looked for
        (tmp_path / "calib").mkdir()
        (tmp_path / "calib" / "set.jsonl").write_text("".join(f'{{"text": "sample {i}"}}\n' for i in range(512)))
    argv = [*path, *(["--config", config] if needs_config else []), *extra]
    result = run(argv)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 4, (result.returncode, result.stdout, result.stderr)
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"fleetcast {path[0]}: ") and "credentials" in last
    assert not calls.exists(), "a cdk command ran without credentials"


@pytest.mark.parametrize("path", sorted(DRY_RUNS), ids=" ".join)
def test_dry_runs_need_no_credentials_and_say_what_they_did_not_check(path, no_aws, tmp_path):
    run, calls = no_aws
    # A deploy dry run of a config that is not ready exits 1 (tests/config/test_readiness.py): give it a ready one.
    config = str(write_ready_config(tmp_path / "fleet.yaml")) if path == ("deploy",) else CONFIG
    result = run([*path, "--config", config, *DRY_RUNS[path]])
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "not checked" in result.stdout and "no AWS credentials" in result.stdout
    assert not calls.exists()


def test_an_unknown_profile_is_one_line_and_exit_4_even_for_a_dry_run_deploy(tmp_path):
    """Through the real entry point, `python -m scripts.cli`, in a process of its own."""
    env, _ = no_aws_env(tmp_path / "home")
    result = run_cli(["stage", "status", "--config", CONFIG, "--profile", "prod-typo"], env, tmp_path)
    assert result.returncode == 4 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and "'prod-typo'" in result.stderr
    ready = str(write_ready_config(tmp_path / "fleet.yaml"))
    dry = run_cli(["deploy", "--config", ready, "--profile", "prod-typo", "--dry-run"], env, tmp_path)
    assert dry.returncode == 0 and "Traceback" not in dry.stderr
    assert "--profile prod-typo" in dry.stdout and "'prod-typo'" in dry.stdout.splitlines()[-1]
