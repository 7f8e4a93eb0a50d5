"""`make synth` and `make teardown`: what the Makefile does around the CLI.

Each run marks the setup targets as up to date (`make -o`), so it never reinstalls the venv or
node_modules (GNU make manual, "Avoiding Recompilation of Some Files": `-o FILE` / `--old-file`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")
SETUP_DONE = ["-o", ".venv/.synth-deps", "-o", "node_modules/.package-lock.json"]

pytestmark = pytest.mark.skipif(MAKE is None or not (ROOT / ".venv" / ".synth-deps").exists()
                                or not (ROOT / "node_modules" / "aws-cdk").exists(),
                                reason="needs make and the setup `make synth` does")


def make(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k not in ("MAKEFLAGS", "MFLAGS")}
    env |= {"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "HOME": str(tmp_path)}
    # A fresh HOME (no ~/.aws, no ~/.cdk.json), but jsii keeps the aws-cdk-lib it unpacks where the user's own
    # synth does, $HOME/.cache/aws/jsii/package-cache on Linux (the jsii kernel's defaultCacheRoot, embedded in
    # the jsii package's _embedded/jsii/lib__program.js); otherwise every run unpacks 200 MB again.
    env.setdefault("JSII_RUNTIME_PACKAGE_CACHE_ROOT", str(Path.home() / ".cache" / "aws" / "jsii" / "package-cache"))
    return subprocess.run([MAKE, "--no-print-directory", *SETUP_DONE, *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, timeout=600)


def test_a_failed_synth_keeps_the_previous_assembly(tmp_path):
    out = tmp_path / "cdk.out"
    out.mkdir()
    (out / "manifest.json").write_text('{"previous": true}')
    broken = tmp_path / "broken.yaml"
    broken.write_text((ROOT / "config" / "fleet.yaml").read_text().replace("instance_type: g6e.xlarge",
                                                                           "instance_type: g9.mega"))
    result = make("synth", f"CONFIG={broken}", f"OUT={out}", tmp_path=tmp_path)
    assert result.returncode != 0 and "'g9.mega' is not a supported GPU instance type" in result.stdout + result.stderr
    assert (out / "manifest.json").read_text() == '{"previous": true}'
    assert not (tmp_path / "cdk.out.new").exists()


def test_make_teardown_passes_yes_and_profile_only_when_asked(tmp_path):
    plain = make("-n", "teardown", tmp_path=tmp_path).stdout
    assert "fleetcast teardown --config config/fleet.yaml" in plain and "--yes" not in plain
    asked = make("-n", "teardown", "YES=1", "PROFILE=prod", "REGION=us-east-1", tmp_path=tmp_path).stdout
    assert "--profile prod" in asked and "--region us-east-1" in asked and asked.rstrip().endswith("--yes")


def test_make_teardown_without_a_terminal_refuses_before_deleting(tmp_path):
    result = make("teardown", tmp_path=tmp_path)
    assert result.returncode != 0
    assert "refusing to delete stacks without confirmation: stdin is not a terminal" in result.stderr
    assert "cdk" not in result.stdout  # no destroy command ran
