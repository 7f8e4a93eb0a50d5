"""The deploy path: AWS's order, each step alone, service names published into the config."""

import shutil
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from botocore.stub import Stubber

from fleetcast.config import load_config
from fleetcast.deploy import STEPS, execute, plan, publish_service_names, teardown_plan
from fleetcast.errors import UserError

CONFIG = Path(__file__).resolve().parents[2] / "config" / "fleet.yaml"


@pytest.fixture
def cfg():
    return load_config(CONFIG)


def flat(steps):
    return [line for s in steps for line in s.describe()]


def test_full_plan_runs_in_the_order_aws_requires(cfg):
    steps = plan(cfg, "config/fleet.yaml", clients=None, steps=STEPS)
    assert [s.name for s in steps] == ["bootstrap", "providers", "stage", "capacity", "publish", "consumers", "approve",
                                      "smoke"]
    text = "\n".join(flat(steps))
    assert text.index("fleetcast-provider-ap-northeast-2") < text.index("stage model") < text.index("fleetcast-consumer-voice-app")
    assert "aws://444455556666/ap-northeast-2" in text and "aws://777788889999/us-west-2" in text


def test_bootstrap_trusts_the_deploying_account(cfg):
    [step] = plan(cfg, "c.yaml", clients=None, steps=["bootstrap"], trust_account="111122223333")
    assert all("--trust" in c and "111122223333" in c for c in step.commands)


def test_teardown_deletes_consumers_before_providers(cfg):
    steps = teardown_plan(cfg, "c.yaml")
    assert [s.name for s in steps] == ["consumers", "providers"]
    assert "fleetcast-consumer-analytics" in " ".join(steps[0].commands[0])
    assert "retained" in steps[1].summary


def test_dry_run_runs_nothing(cfg):
    ran = []
    execute(plan(cfg, "c.yaml", clients=None, steps=STEPS), dry_run=True, run=lambda c: ran.append(c), log=lambda m: None)
    assert ran == []


def test_a_failed_step_stops_the_rest_and_says_how_to_resume(cfg):
    ran = []

    def run(command):
        ran.append(command)
        return SimpleNamespace(returncode=1)

    logged = []
    with pytest.raises(UserError, match="--step providers"):
        execute(plan(cfg, "c.yaml", clients=None, steps=["providers", "stage"]), dry_run=False, run=run,
                log=logged.append)
    # The preview (config diff --deployed) failing does not stop the step; the deploy failing does.
    assert [c[3:6] for c in ran[:1]] == [["config", "diff", "--deployed"]] and ran[1][:2] == ["npx", "cdk"]
    assert len(ran) == 2 and any("preview" in line and "continuing" in line for line in logged)


def test_publish_writes_service_names_into_the_consumers(tmp_path, cfg):
    target = tmp_path / "fleet.yaml"
    shutil.copy(CONFIG, target)
    seoul = "com.amazonaws.vpce.ap-northeast-2.vpce-svc-0123456789abcdef0"
    virginia = "com.amazonaws.vpce.us-east-1.vpce-svc-0fedcba9876543210"
    stubs = {}
    for region, name in (("ap-northeast-2", seoul), ("us-east-1", virginia)):
        client = boto3.client("cloudformation", region_name=region, aws_access_key_id="x", aws_secret_access_key="x")
        stub = Stubber(client)
        stub.add_response("describe_stacks", {"Stacks": [{
            "StackName": f"fleetcast-provider-{region}", "CreationTime": "2026-01-01T00:00:00Z",
            "StackStatus": "CREATE_COMPLETE",
            "Outputs": [{"OutputKey": "ServiceServiceNameA1B2C3", "OutputValue": name},
                        {"OutputKey": "ServiceServiceIdD4E5F6", "OutputValue": "vpce-svc-0123456789abcdef0"}]}]},
            {"StackName": f"fleetcast-provider-{region}"})
        stub.activate()
        stubs[region] = client
    lines = publish_service_names(cfg, str(target), lambda service, region: stubs[region])
    updated = load_config(target)
    assert {c.name: c.endpoint_service_name for c in updated.consumers} == {"voice-app": seoul, "analytics": virginia}
    assert "# cross-region PrivateLink" in target.read_text()  # comments kept
    assert lines == [f"voice-app: {seoul}", f"analytics: {virginia}"]


def test_cli_dry_run_prints_the_guide(capsys):
    from scripts.cli import main

    assert main(["deploy", "--config", str(CONFIG), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "== bootstrap" in out and "== smoke" in out
    assert main(["teardown", "--config", str(CONFIG), "--dry-run"]) == 0
