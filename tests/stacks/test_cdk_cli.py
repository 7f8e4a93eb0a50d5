"""The real `cdk synth` of the project's app, offline: the pinned CLI runs app.py in processes of its own, as
`make synth` does.

Nothing here builds a CDK app in this process, so the test runs on any worker, beside the one that synthesizes in
process (tests/conftest.py): its CLI, its app's Python and that app's jsii kernel were 18 s of CPU on that serial
worker, where it used nothing that worker had loaded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from fleetcast.config import load_config
from fleetcast.node import cdk_command, path_with_node
from tests.jsii_banner import node_major

ROOT = Path(__file__).resolve().parents[2]
CDK = cdk_command()  # the pinned CLI on the venv's Node LTS, as `make synth` runs it (npx cdk without the wheel)


def offline_env() -> dict[str, str]:
    """No credentials, no profile, no metadata service: synthesis must not need AWS."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "CDK_DISABLE_CLI_TELEMETRY": "true",
        "PATH": path_with_node(env.get("PATH", "")),
        # CDK's built-in CloudFormation validation off (`cdk synth --no-validation`'s variable): it cannot fail a
        # synthesis, and its findings on this config are checked where the gates synthesize it with it on
        # (tests/stacks/test_gates.py, the default fleet's validation report); its engine was 8 of this test's
        # 20 s of CPU.
        "CDK_VALIDATION": "false",
    }
    env["JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"] = node_major(env["PATH"])
    return env


@pytest.mark.skipif(shutil.which(CDK[0]) is None or not (ROOT / "node_modules" / "aws-cdk").exists(),
                    reason="the pinned CDK CLI is installed by `make` (npm ci)")
def test_cdk_cli_synthesizes_the_default_config_offline(tmp_path):
    out = tmp_path / "cdk.out"
    started = time.monotonic()
    result = subprocess.run(
        [*CDK, "synth", "--no-lookups", "--no-notices", "--quiet", "-c", "config=config/fleet.yaml",
         "-o", str(out)],
        cwd=ROOT, env=offline_env(), capture_output=True, text=True, timeout=300,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    cfg = load_config(ROOT / "config" / "fleet.yaml")
    expected = {f"fleetcast-provider-{r.region}" for r in cfg.regions} | {
        f"fleetcast-consumer-{c.name}" for c in cfg.consumers if c.endpoint_service_name}
    assert {p.name.removesuffix(".template.json") for p in out.glob("*.template.json")} == expected
    manifest = json.loads((out / "manifest.json").read_text())
    assert not manifest.get("missing"), "synthesis asked for context lookups"
    assert "WARNING" not in result.stdout + result.stderr, "every construct warning is fixed or acknowledged"
    print(f"\ncdk synth (CLI, offline): {elapsed:.1f}s for {len(expected)} stacks")
