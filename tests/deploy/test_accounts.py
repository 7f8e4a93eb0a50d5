"""A fleet spans accounts: each account is acted in with its own profile, `--account` narrows the run, and
`--trust` bootstraps every account for a CDK Pipelines account, as the CDK guide describes
(awsdocs/aws-cdk-guide v2/cdk_pipeline.md, "Bootstrap your AWS environments")."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetcast.accounts import AccountAccess, fleet_accounts
from fleetcast.config import load_config
from fleetcast.contract.errors import UserError
from fleetcast.deploy import STEPS, plan, teardown_plan
from fleetcast.node import cdk_command

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config" / "fleet.yaml"
CDK = cdk_command()
PROVIDER, VOICE, ANALYTICS = "111122223333", "444455556666", "777788889999"  # config/fleet.yaml's accounts
PIPELINE = "999988887777"
POLICY = "arn:aws:iam::aws:policy/PowerUserAccess"


@pytest.fixture
def cfg():
    return load_config(CONFIG)


def three_profiles(cfg, **kw) -> AccountAccess:
    return AccountAccess.from_args(cfg, profile="platform", profile_for=[f"{VOICE}=voice", f"{ANALYTICS}=analytics"],
                                   **kw)


def profile_of(command: list[str]) -> str | None:
    return command[command.index("--profile") + 1] if "--profile" in command else None


def test_every_cdk_command_runs_with_the_profile_of_the_account_it_acts_in(cfg):
    steps = {s.name: s for s in plan(cfg, "c.yaml", None, steps=STEPS, access=three_profiles(cfg, accounts=None))}
    bootstrap = {c[-3]: profile_of(c) for c in steps["bootstrap"].commands}  # aws://ACCOUNT/REGION, --profile P
    assert bootstrap == {f"aws://{PROVIDER}/ap-northeast-2": "platform", f"aws://{PROVIDER}/us-east-1": "platform",
                         f"aws://{VOICE}/ap-northeast-2": "voice", f"aws://{ANALYTICS}/us-west-2": "analytics"}
    consumers = {profile_of(c): [a for a in c if a.startswith("fleetcast-consumer-")]
                 for c in steps["consumers"].commands}
    assert consumers == {"voice": ["fleetcast-consumer-voice-app"], "analytics": ["fleetcast-consumer-analytics"]}
    for name in ("providers", "capacity", "stage", "approve"):
        assert {profile_of(c) for c in steps[name].commands} == {"platform"}, name


def test_account_narrows_the_run_to_that_accounts_stacks_and_steps(cfg):
    access = three_profiles(cfg, accounts=[VOICE])
    steps = plan(cfg, "c.yaml", None, steps=STEPS, access=access)
    assert [s.name for s in steps] == ["bootstrap", "consumers", "smoke"]  # the provider's steps are not this run's
    commands = [c for s in steps for c in s.commands]
    assert commands and all(profile_of(c) == "voice" for c in commands)
    assert VOICE in " ".join(commands[0]) and "fleetcast-consumer-voice-app" in commands[-1]
    [destroy] = teardown_plan(cfg, "c.yaml", access=access)
    assert destroy.name == "consumers" and [profile_of(c) for c in destroy.commands] == ["voice"]


def test_dry_run_says_which_profile_acts_in_each_account_and_the_trust_the_bootstrap_gives(cfg):
    lines = three_profiles(cfg, accounts=None).describe(cfg, trust=PIPELINE, policies=[POLICY], bootstrapping=True)
    text = "\n".join(lines)
    for account, profile in ((PROVIDER, "platform"), (VOICE, "voice"), (ANALYTICS, "analytics")):
        [line] = [ln for ln in lines if ln.strip().startswith(account)]
        assert line.endswith(f"profile {profile}")
    assert f"--trust {PIPELINE} --trust-for-lookup {PIPELINE} --cloudformation-execution-policies {POLICY}" in text
    assert "Warning" not in text


def test_one_profile_for_every_account_is_flagged_where_it_would_bootstrap_them(cfg):
    access = AccountAccess.from_args(cfg, profile="prod", profile_for=None, accounts=None)
    text = "\n".join(access.describe(cfg, bootstrapping=True))
    assert f"profile prod would bootstrap 3 accounts ({PROVIDER}, {VOICE}, {ANALYTICS})" in text
    assert "Warning" not in "\n".join(access.describe(cfg, bootstrapping=False))


def test_cli_dry_run_on_three_accounts_names_each_profile_and_the_bootstrap_trust(capsys):
    from scripts.cli import main

    code = main(["deploy", "--config", str(CONFIG), "--dry-run", "--profile", "platform",
                 "--profile-for", f"{VOICE}=voice", "--profile-for", f"{ANALYTICS}=analytics",
                 "--trust", PIPELINE, "--execution-policy", POLICY])
    out = capsys.readouterr().out
    assert code in (0, 1)  # not ready (example accounts) is the readiness check's verdict, not this test's
    assert f"{VOICE}  consumer voice-app" in out and "profile voice" in out
    assert f"aws://{ANALYTICS}/us-west-2 --profile analytics" in out
    assert f"--trust {PIPELINE}" in out


def test_trust_without_an_execution_policy_is_refused_as_the_cdk_cli_refuses_it(cfg):
    with pytest.raises(UserError, match="--trust needs --execution-policy") as refused:
        plan(cfg, "c.yaml", None, steps=["bootstrap"], trust_account=PIPELINE)
    assert refused.value.exit_code == 2


@pytest.mark.skipif(not (ROOT / "node_modules" / "aws-cdk").exists(), reason="the pinned CDK CLI comes from `make`")
def test_the_pinned_cdk_cli_itself_refuses_trust_without_execution_policies():
    # The source of the rule above: the CDK CLI's bootstrap (node_modules/aws-cdk/lib/index.js, pinned in
    # package-lock.json) throws MissingExecutionPoliciesForTrust when --trust comes without policies.
    source = (ROOT / "node_modules" / "aws-cdk" / "lib" / "index.js").read_text()
    assert "MissingExecutionPoliciesForTrust" in source
    assert "Please pass '--cloudformation-execution-policies' when using '--trust'" in source


def test_a_profile_of_another_account_cannot_bootstrap_it(cfg):
    access = AccountAccess.from_args(cfg, profile="platform", profile_for=[f"{VOICE}=voice"], accounts=None)
    where = {"platform": PROVIDER, "voice": VOICE}
    problems = access.check_identities(cfg, lambda profile: where[profile], bootstrapping=True)
    assert problems == [f"profile platform act(s) in account {PROVIDER}, not {ANALYTICS}: bootstrapping "
                        f"{ANALYTICS} needs that account's own credentials (--profile-for {ANALYTICS}=PROFILE)"]
    # A deploy from the provider's credentials reaches a consumer account through its bootstrap trust.
    assert access.check_identities(cfg, lambda profile: where[profile], bootstrapping=False) == []


def test_the_cli_refuses_the_bootstrap_before_any_step_runs(cfg, monkeypatch, tmp_path, capsys):
    from scripts.cli import main
    from tests.ready_config import write_ready_config

    ready = write_ready_config(tmp_path / "fleet.yaml")
    ready_cfg = load_config(ready)
    monkeypatch.setattr("fleetcast.config.readiness.access_with_credentials", lambda profile, **kw: None)
    monkeypatch.setattr("fleetcast.aws_session.AwsSession.require_credentials", lambda self: None)
    monkeypatch.setattr("fleetcast.accounts.caller_account_via_sts",
                        lambda region: lambda profile: ready_cfg.provider.account)
    ran = []
    monkeypatch.setattr("fleetcast.deploy.subprocess.run", lambda command, *a, **kw: ran.append(command))
    assert main(["deploy", "--config", str(ready), "--profile", "platform", "--step", "bootstrap"]) == 2
    assert ran == [] and "would be bootstrapped with another account's credentials" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--profile-for", "1234=voice"], "expected ACCOUNT=PROFILE with a 12-digit account id"),
    (["--profile-for", f"{VOICE}"], "expected ACCOUNT=PROFILE"),
    (["--profile-for", f"{VOICE}=a", "--profile-for", f"{VOICE}=b"], f"names account {VOICE} twice"),
    (["--profile-for", "123456789012=x"], "123456789012 is not an account of fleet fleetcast"),
    (["--account", "123456789012"], "--account 123456789012 is not an account of fleet fleetcast"),
])
def test_account_arguments_that_cannot_be_right_are_usage_errors_naming_the_argument(argv, message, capsys):
    from scripts.cli import main

    assert main(["deploy", "--config", str(CONFIG), "--dry-run", *argv]) == 2
    assert message in capsys.readouterr().err


def test_fleet_accounts_lists_the_provider_first_then_each_consumer_account(cfg):
    assert fleet_accounts(cfg) == {PROVIDER: "provider (ap-northeast-2, us-east-1)",
                                   VOICE: "consumer voice-app", ANALYTICS: "consumer analytics"}
