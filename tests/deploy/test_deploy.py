"""The deploy path: AWS's order, each step alone, service names published into the config."""

import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from botocore.stub import Stubber

from fleetcast.config import load_config
from fleetcast.contract.errors import UserError
from fleetcast.contract.outputs import ProviderOutput
from fleetcast.contract.packaging import cli_module
from fleetcast.deploy import STEPS, execute, plan, publish_service_names, teardown_plan
from fleetcast.node import cdk_command
from tests.ready_config import write_ready_config

CDK = cdk_command()

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
    policy = "arn:aws:iam::111122223333:policy/FleetcastDeploy"
    [step] = plan(cfg, "c.yaml", clients=None, steps=["bootstrap"], trust_account="111122223333",
                  execution_policies=[policy])
    assert all("--trust" in c and "111122223333" in c for c in step.commands)
    assert all(c[c.index("--cloudformation-execution-policies") + 1] == policy for c in step.commands)


def test_teardown_deletes_consumers_before_providers(cfg):
    steps = teardown_plan(cfg, "c.yaml")
    assert [s.name for s in steps] == ["consumers", "providers"]
    assert "fleetcast-consumer-analytics" in " ".join(c for command in steps[0].commands for c in command)
    assert "retained" in steps[1].summary


def test_a_plan_built_without_aws_access_refuses_to_publish_rather_than_failing_on_a_missing_client(cfg):
    [step] = plan(cfg, "c.yaml", clients=None, steps=["publish"])
    with pytest.raises(UserError, match="publish step .* needs AWS access"):
        step.action()


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
    assert [c[3:6] for c in ran[:1]] == [["config", "diff", "--deployed"]] and ran[1][:len(CDK)] == CDK
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
            "Outputs": [{"OutputKey": ProviderOutput.ENDPOINT_SERVICE_NAME.value, "OutputValue": name},
                        {"OutputKey": ProviderOutput.ENDPOINT_SERVICE_ID.value,
                         "OutputValue": "vpce-svc-0123456789abcdef0"}]}]},
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

    # The example config is not ready (documentation accounts): the guide is printed, and the exit says so.
    assert main(["deploy", "--config", str(CONFIG), "--dry-run"]) == 1
    out = capsys.readouterr().out
    assert "== bootstrap" in out and "== smoke" in out
    assert main(["teardown", "--config", str(CONFIG), "--dry-run"]) == 0


def test_cli_dry_run_prints_the_readmes_command_forms_not_this_machines_paths(capsys):
    from scripts.cli import main

    main(["deploy", "--config", str(CONFIG), "--dry-run"])
    commands = [line.split("$ ", 1)[1].removesuffix("   (preview)") for line in capsys.readouterr().out.splitlines()
                if line.startswith("   $ ")]
    assert commands and all(c.startswith(("fleetcast ", "npx cdk ")) for c in commands), commands
    assert not any(sys.executable in c or "node_modules" in c for c in commands)
    # The forms README.md's deployment table gives, word for word.
    assert "npx cdk deploy -c config=" + str(CONFIG) + " --require-approval broadening " \
        "fleetcast-provider-ap-northeast-2 fleetcast-provider-us-east-1" in commands
    assert f"fleetcast config diff --deployed {CONFIG}" in commands


# -- --profile / --region reach every sub-step


@pytest.fixture
def prod_profile(tmp_path, monkeypatch):
    """A named profile `prod` with static (fake) keys, and no other credentials anywhere."""
    for var in [v for v in __import__("os").environ if v.startswith("AWS_")]:
        monkeypatch.delenv(var)
    (tmp_path / "config").write_text("[profile prod]\nregion = us-east-1\n")
    (tmp_path / "credentials").write_text("[prod]\naws_access_key_id = AKIAFAKEFAKEFAKE\naws_secret_access_key = fake\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def runner(monkeypatch):
    """Replaces the subprocess runner of fleetcast.deploy: records each command, succeeds or fails."""
    ran, result = [], {"rc": 0}

    def run(command, *a, **kw):
        ran.append(command)
        return SimpleNamespace(returncode=result["rc"])

    monkeypatch.setattr("fleetcast.deploy.subprocess.run", run)
    monkeypatch.setenv("PATH", __import__("os").environ["PATH"])  # execute() puts the venv's node first; undo it
    return SimpleNamespace(ran=ran, result=result)


def test_profile_reaches_the_cdk_command_line_and_every_fleetcast_sub_step(prod_profile, runner, capsys, tmp_path,
                                                                           monkeypatch):
    from scripts.cli import main

    ready = write_ready_config(tmp_path / "fleet.yaml")
    monkeypatch.setattr("fleetcast.config.readiness.access_with_credentials", lambda profile, **kw: None)  # no AZ call
    from fleetcast.staging.readiness import RegionReadiness

    # Both regions deployed and staged (tests/deploy/test_first_deploy_order.py covers the hold itself).
    monkeypatch.setattr("fleetcast.first_deploy.region_readiness",
                        lambda cfg, region, clients, stack: RegionReadiness(region, deployed=True, held=False))
    monkeypatch.setattr("fleetcast.deployed.other_fleets", lambda access, cfg, region: [])  # no other fleet around
    # One profile per account (bootstrapping needs each account's own credentials), resolved without AWS.
    from fleetcast.config import load_config as load

    accounts = sorted({c.account for c in load(ready).consumers} - {load(ready).provider.account})
    profile_for = [a for acct in accounts for a in ("--profile-for", f"{acct}=prod")]
    monkeypatch.setattr("fleetcast.accounts.caller_account_via_sts",
                        lambda region: lambda profile: {"prod": load(ready).provider.account}[profile])
    steps = [a for s in ("providers", "stage", "consumers", "approve") for a in ("--step", s)]
    assert main(["deploy", "--config", str(ready), "--profile", "prod", *profile_for, *steps]) == 0
    cdk = [c[len(CDK):] for c in runner.ran if c[:len(CDK)] == CDK]
    subs = [c for c in runner.ran if c[1:3] == ["-m", cli_module()]]
    assert {c[0] for c in cdk} == {"deploy"} and len(subs) == 4  # diff, stage x2, connections sync
    for command in cdk + subs:
        assert command[command.index("--profile") + 1] == "prod", command
    assert main(["teardown", "--config", str(CONFIG), "--profile", "prod", "--yes"]) == 0
    destroys = [c for c in runner.ran if c[:len(CDK) + 1] == [*CDK, "destroy"]]
    # One destroy per consumer account, then the providers.
    assert len(destroys) == 3 and all(c[c.index("--profile") + 1] == "prod" for c in destroys)


def test_region_narrows_every_step_to_that_provider_region_and_its_consumers(cfg):
    from fleetcast.aws_session import AwsSession

    steps = plan(cfg, "c.yaml", None, steps=STEPS, aws=AwsSession("prod"), regions=["us-east-1"])
    text = "\n".join(flat(steps))
    assert "fleetcast-provider-us-east-1" in text and "fleetcast-consumer-analytics" in text
    assert "ap-northeast-2" not in text and "voice-app" not in text
    by_name = {s.name: s for s in steps}
    assert all(c[-2:] == ["--region", "us-east-1"] for c in by_name["stage"].commands)
    assert by_name["providers"].preview[0][-2:] == ["--region", "us-east-1"]
    with pytest.raises(UserError, match="--region eu-west-1 is not a provider region"):
        plan(cfg, "c.yaml", None, steps=STEPS, regions=["eu-west-1"])


# -- teardown asks first


def test_teardown_dry_run_lists_each_stack_with_account_and_region_in_order(cfg):
    lines = flat(teardown_plan(cfg, "c.yaml"))
    deletes = [line.strip() for line in lines if line.strip().startswith("- delete")]
    assert deletes == [
        "- delete fleetcast-consumer-voice-app  (account 444455556666, ap-northeast-2)",
        "- delete fleetcast-consumer-analytics  (account 777788889999, us-west-2)",
        "- delete fleetcast-provider-ap-northeast-2  (account 111122223333, ap-northeast-2)",
        "- delete fleetcast-provider-us-east-1  (account 111122223333, us-east-1)",
    ]


def test_teardown_without_a_terminal_and_without_yes_refuses_and_deletes_nothing(prod_profile, runner, capsys,
                                                                                  monkeypatch):
    import io

    from scripts.cli import main

    monkeypatch.setattr("sys.stdin", io.StringIO("fleetcast\n"))  # piped input is not a terminal
    assert main(["teardown", "--config", str(CONFIG)]) == 2
    err = capsys.readouterr().err
    assert "stdin is not a terminal" in err and "--yes" in err and "fleetcast-provider-us-east-1" in err
    assert runner.ran == []


class Tty:
    def __init__(self, answer):
        self.answer = answer

    def isatty(self):
        return True

    def readline(self):
        return self.answer


def test_teardown_on_a_terminal_deletes_only_after_the_fleet_name_is_typed(cfg):
    import io

    from fleetcast.deploy import confirm_teardown

    steps = teardown_plan(cfg, "c.yaml")
    err = io.StringIO()
    confirm_teardown(cfg, steps, yes=False, stdin=Tty("fleetcast\n"), err=err)
    assert "deletes these 4 stack(s)" in err.getvalue() and "Type the fleet name (fleetcast)" in err.getvalue()
    with pytest.raises(UserError, match="not confirmed; nothing deleted") as refused:
        confirm_teardown(cfg, steps, yes=False, stdin=Tty("y\n"), err=io.StringIO())
    assert refused.value.exit_code == 3


def test_a_failed_teardown_step_says_how_to_resume_the_teardown_not_the_deploy(prod_profile, runner, capsys):
    from scripts.cli import main

    runner.result["rc"] = 1
    assert main(["teardown", "--config", str(CONFIG), "--profile", "prod", "--region", "us-east-1", "--yes"]) == 1
    err = capsys.readouterr().err
    assert "fleetcast deploy" not in err
    assert (f"rerun `fleetcast teardown --config {CONFIG} --profile prod --region us-east-1 --yes --step consumers`"
            in err)
    assert len(runner.ran) == 1  # the providers step did not run


def test_teardown_skips_consumers_the_app_builds_no_stack_for(tmp_path):
    text = CONFIG.read_text()
    target = tmp_path / "fleet.yaml"
    line = next(ln for ln in text.splitlines() if "endpoint_service_name: com.amazonaws.vpce.us-east-1" in ln)
    target.write_text(text.replace(line + "\n", ""))  # analytics: not published yet, so no stack
    steps = teardown_plan(load_config(target), str(target))
    assert "fleetcast-consumer-analytics" not in "\n".join(flat(steps))
    assert "fleetcast-consumer-voice-app" in steps[0].commands[0]


def test_deploying_consumers_names_only_stacks_the_app_builds(tmp_path):
    """A consumer without endpoint_service_name gets no stack (fleetcast/contract/names.py skip_reason): the consumers
    step asks cdk for it only when this run's publish step writes the name first."""
    text = CONFIG.read_text()
    target = tmp_path / "fleet.yaml"
    line = next(ln for ln in text.splitlines() if "endpoint_service_name: com.amazonaws.vpce.us-east-1" in ln)
    target.write_text(text.replace(line + "\n", ""))
    cfg = load_config(target)
    alone = "\n".join(flat(plan(cfg, str(target), None, steps=["consumers"])))
    assert "fleetcast-consumer-voice-app" in alone and "fleetcast-consumer-analytics" not in alone
    published = "\n".join(flat(plan(cfg, str(target), None, steps=["publish", "consumers"])))
    assert "fleetcast-consumer-analytics" in published


# -- a renamed config: a second fleet beside the old one, asked for first


@pytest.fixture
def renamed_ready(tmp_path, monkeypatch, fresh_aws):
    """The ready config under a new fleet name, deploying its providers in moto where the old fleet runs."""
    from ruamel.yaml import YAML

    from tests.ready_config import ready_doc

    doc = ready_doc()
    doc["name"] = "voice"
    path = tmp_path / "fleet.yaml"
    YAML().dump(doc, path)
    monkeypatch.setattr("fleetcast.config.readiness.access_with_credentials", lambda profile, **kw: None)
    from fleetcast.staging.readiness import RegionReadiness

    monkeypatch.setattr("fleetcast.first_deploy.region_readiness",
                        lambda cfg, region, clients, stack: RegionReadiness(region, deployed=False, held=False,
                                                                            problems=(f"stack {stack} is not deployed",)))
    monkeypatch.setattr("fleetcast.accounts.caller_account_via_sts",
                        lambda region: lambda profile: doc["provider"]["account"])
    return path


def test_a_fleet_new_where_another_fleet_runs_is_not_deployed_unasked(renamed_ready, runner, capsys):
    from scripts.cli import main
    from tests.deploy.fleet_stacks import create_provider_stack, create_stack

    old = create_provider_stack("fleetcast", "ap-northeast-2")
    create_stack("tools-provider-ap-northeast-2", "ap-northeast-2", {"Other": "x"})  # not a Fleetcast stack
    # No terminal to ask, no --yes: refused before any command.
    assert main(["deploy", "--config", str(renamed_ready), "--step", "providers"]) == 2
    err = capsys.readouterr().err
    assert runner.ran == []
    assert f"ap-northeast-2: {old} (this deploy creates voice-provider-ap-northeast-2 beside it)" in err
    assert "second, parallel fleet" in err and "tools-provider" not in err and "us-east-1" not in err
    assert "--yes" in err
    # --yes: deployed as asked.
    assert main(["deploy", "--config", str(renamed_ready), "--step", "providers", "--yes"]) == 0
    assert any(c[:len(CDK) + 1] == [*CDK, "deploy"] and "voice-provider-ap-northeast-2" in c for c in runner.ran)


def test_a_fleet_whose_own_stacks_exist_deploys_without_asking(renamed_ready, runner, capsys):
    from scripts.cli import main
    from tests.deploy.fleet_stacks import create_provider_stack

    create_provider_stack("fleetcast", "ap-northeast-2")
    create_provider_stack("voice", "ap-northeast-2")  # two fleets side by side, this one already deployed
    assert main(["deploy", "--config", str(renamed_ready), "--step", "providers"]) == 0
    assert runner.ran


def test_on_a_terminal_the_second_fleet_is_created_only_after_its_name_is_typed(cfg):
    import io

    from fleetcast.deploy import confirm_parallel_fleet

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    others = {"ap-northeast-2": ["old-provider-ap-northeast-2"], "us-east-1": []}
    with pytest.raises(UserError, match="nothing deployed") as declined:
        confirm_parallel_fleet(cfg, others, yes=False, stdin=Terminal("old\n"), err=io.StringIO())
    assert declined.value.exit_code == 3
    confirm_parallel_fleet(cfg, others, yes=False, stdin=Terminal(f"{cfg.name}\n"), err=io.StringIO())
    confirm_parallel_fleet(cfg, {"us-east-1": []}, yes=False, stdin=None, err=io.StringIO())  # nothing beside: no ask


def test_publish_writes_the_service_name_of_a_region_spilled_or_failed_over_to_into_its_entry(tmp_path):
    """examples/spill: us-west-2 is checkout's spill and failover region, so its own entry gets the name the
    home region's spill endpoint and checkout's failover endpoint connect by (fleetcast/contract/spill.py)."""
    source = CONFIG.parent.parent / "examples" / "spill" / "fleet.yaml"
    target = tmp_path / "fleet.yaml"
    text = source.read_text()
    published = "    endpoint_service_name: com.amazonaws.vpce.us-west-2.vpce-svc-0a1b2c3d4e5f60719\n"
    assert text.count(published) == 1
    target.write_text(text.replace(published, ""))
    cfg = load_config(target)
    assert cfg.region("us-west-2").endpoint_service_name is None
    names = {"us-east-1": "com.amazonaws.vpce.us-east-1.vpce-svc-0f1e2d3c4b5a69788",
             "us-west-2": "com.amazonaws.vpce.us-west-2.vpce-svc-0123456789abcdef0"}
    stubs = {}
    for region, name in names.items():
        client = boto3.client("cloudformation", region_name=region, aws_access_key_id="x", aws_secret_access_key="x")
        stub = Stubber(client)
        stub.add_response("describe_stacks", {"Stacks": [{
            "StackName": f"spillfleet-provider-{region}", "CreationTime": "2026-01-01T00:00:00Z",
            "StackStatus": "CREATE_COMPLETE",
            "Outputs": [{"OutputKey": ProviderOutput.ENDPOINT_SERVICE_NAME.value, "OutputValue": name}]}]},
            {"StackName": f"spillfleet-provider-{region}"})
        stub.activate()
        stubs[region] = client
    lines = publish_service_names(cfg, str(target), lambda service, region: stubs[region])
    updated = load_config(target)
    assert updated.region("us-west-2").endpoint_service_name == names["us-west-2"]
    assert f"regions[us-west-2]: {names['us-west-2']}" in lines
    # No endpoint connects to us-east-1 from another region: its entry is not the publish step's business.
    assert not [line for line in lines if line.startswith("regions[us-east-1]")]
