"""Deploy readiness (`fleetcast config validate --deploy`, and `fleetcast deploy` before any step).

A valid config can still hold values that cannot work in a real account: the example config's
accounts and resource ids are AWS documentation examples (accounts such as 111122223333 and
123456789012, as AWS's pages write them, e.g. the IAM User Guide's "IAM identifiers":
https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_identifiers.html) and made-up ids.
AZ names map to physical zones per account (EC2 User Guide, "AZ IDs": DescribeAvailabilityZones
returns ZoneName -> ZoneId for the calling account); the AWS stand-ins are real botocore clients
behind botocore's Stubber, so every request and answer is checked against the real API model.
"""

from __future__ import annotations

import contextlib
import copy
import io
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from ruamel.yaml import YAML

from fleetcast.config import parse_config
from fleetcast.config.readiness import check_readiness, is_example_account, offline_findings
from fleetcast.aws_session import AwsSession
from scripts import cli
from tests.ready_config import DEFAULT, PROVIDER
from tests.ready_config import ready_doc as real_doc



@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch, tmp_path):
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("account", ["111122223333", "444455556666", "777788889999", "123456789012", "555566667777",
                                     "000000000000"])
def test_documentation_example_accounts_are_recognized(account):
    assert is_example_account(account)


@pytest.mark.parametrize("account", [PROVIDER, "502118763940", "617245309881", "111122223334"])
def test_real_looking_accounts_are_not(account):
    assert not is_example_account(account)


def test_validate_deploy_lists_every_placeholder_of_the_example_config_and_exits_1():
    code, out, _ = run("config", "validate", "--deploy", str(DEFAULT))
    assert code == 1
    refused = out.split("warnings:")[0]
    expected = {
        "provider.account": "111122223333",
        "regions[0].allowed_principals[0]": "444455556666",
        "regions[1].allowed_principals[0]": "777788889999",
        "consumers[0].account": "444455556666",
        "consumers[1].account": "777788889999",
        "consumers[0].vpc_id": "vpc-0a1b2c3d4e5f60718",
        "consumers[0].subnets[0].id": "subnet-0a1b2c3d4e5f60711",
        "consumers[0].subnets[1].id": "subnet-0a1b2c3d4e5f60712",
        "consumers[0].endpoint_service_name": "vpce-svc-0a1b2c3d4e5f60718",
        "consumers[1].vpc_id": "vpc-0f1e2d3c4b5a69788",
        "consumers[1].subnets[0].id": "subnet-0f1e2d3c4b5a69781",
        "consumers[1].subnets[1].id": "subnet-0f1e2d3c4b5a69782",
        "consumers[1].endpoint_service_name": "vpce-svc-0f1e2d3c4b5a69788",
    }
    lines = [line for line in refused.splitlines() if line.startswith("  - ")]
    assert len(lines) == len(expected)
    for path, value in expected.items():
        [line] = [l for l in lines if l.startswith(f"  - {path} (line ")]
        assert value in line and "; " in line  # the value, then what to do instead
    warned = out.split("warnings:")[1]
    assert "regions[0].ami.id" in warned and "regions[1].ami.id" in warned and "model.revision" in warned
    assert "not checked: no AWS credentials" in out


def test_a_config_with_real_values_is_ready(tmp_path):
    target = tmp_path / "fleet.yaml"
    YAML().dump(real_doc(), target)
    code, out, _ = run("config", "validate", "--deploy", str(target))
    assert code == 0, out
    assert "ready to deploy" in out and "warning" not in out


def test_latest_ami_and_a_branch_revision_only_warn():
    doc = real_doc()
    doc["regions"][1]["ami"] = {"id": "latest"}
    doc["model"]["revision"] = "main"
    found = offline_findings(parse_config(doc))
    assert found.ready
    assert [i.dotted for i in found.warnings] == ["regions[1].ami.id", "model.revision"]


def test_plain_validate_stays_offline_and_quiet_about_readiness():
    code, out, _ = run("config", "validate", str(DEFAULT))
    assert code == 0 and "ready" not in out


# ---------------------------------------------------------------- AZ name -> AZ ID, with credentials


def zones_access(account: str, zones: dict[str, dict[str, str]]) -> tuple[AwsSession, list[Stubber]]:
    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", aws_session_token="testing")
    access = AwsSession(boto_session=session, sleep=lambda s: None)
    sts = session.client("sts", region_name="ap-northeast-2")
    stubs = [Stubber(sts)]
    stubs[0].add_response("get_caller_identity", {"UserId": "AIDAEXAMPLE", "Account": account,
                                                  "Arn": f"arn:aws:iam::{account}:user/deployer"}, {})
    access.set_client("sts", "ap-northeast-2", sts)
    for region, mapping in zones.items():
        ec2 = session.client("ec2", region_name=region)
        stub = Stubber(ec2)
        stub.add_response("describe_availability_zones", {"AvailabilityZones": [
            {"ZoneName": name, "ZoneId": zone_id, "RegionName": region, "State": "available", "ZoneType": "availability-zone"}
            for name, zone_id in mapping.items()]}, {})
        access.set_client("ec2", region, ec2)
        stubs.append(stub)
    for stub in stubs:
        stub.activate()
    return access, stubs


SEOUL = {"ap-northeast-2a": "apne2-az1", "ap-northeast-2b": "apne2-az2", "ap-northeast-2c": "apne2-az3",
         "ap-northeast-2d": "apne2-az4"}
VIRGINIA = {"us-east-1a": "use1-az1", "us-east-1b": "use1-az2", "us-east-1c": "use1-az4"}


def test_az_pairs_that_match_the_account_pass():
    access, stubs = zones_access(PROVIDER, {"ap-northeast-2": SEOUL, "us-east-1": VIRGINIA})
    result = check_readiness(parse_config(real_doc()), access)
    assert result.ready and not result.notes
    for stub in stubs:
        stub.assert_no_pending_responses()


def test_an_az_name_that_is_another_zone_in_this_account_is_refused_with_the_right_id():
    # In this account us-east-1b is use1-az6: the configured use1-az2 would not match the consumers' subnets.
    access, _ = zones_access(PROVIDER, {"ap-northeast-2": SEOUL, "us-east-1": {**VIRGINIA, "us-east-1b": "use1-az6"}})
    result = check_readiness(parse_config(real_doc()), access)
    [issue] = result.refusals
    assert issue.dotted == "regions[1].availability_zones[1].id"
    assert "use1-az6" in issue.message and "use1-az2" in issue.message


def test_an_az_name_the_account_lacks_is_refused():
    access, _ = zones_access(PROVIDER, {"ap-northeast-2": {k: v for k, v in SEOUL.items() if k != "ap-northeast-2c"},
                                        "us-east-1": VIRGINIA})
    [issue] = check_readiness(parse_config(real_doc()), access).refusals
    assert issue.dotted == "regions[0].availability_zones[1].name" and "ap-northeast-2c" in issue.message


def test_credentials_of_another_account_prove_nothing_and_say_so():
    access, _ = zones_access("502118763940", {})
    result = check_readiness(parse_config(real_doc()), access)
    assert result.ready and "502118763940" in result.notes[0] and PROVIDER in result.notes[0]


# ---------------------------------------------------------------- fleetcast deploy


def test_deploy_refuses_the_example_config_before_any_step(monkeypatch):
    import fleetcast.deploy

    ran = []
    monkeypatch.setattr(fleetcast.deploy, "execute", lambda *a, **k: ran.append(a))
    code, out, err = run("deploy", "--config", str(DEFAULT))
    assert code == 1 and ran == []
    assert "provider.account" in out and "not deploying" in err and "Traceback" not in err


def test_deploy_dry_run_shows_the_problems_and_still_prints_the_plan(monkeypatch):
    import fleetcast.deploy

    ran = []
    monkeypatch.setattr(fleetcast.deploy, "execute", lambda steps, **k: ran.append(k["dry_run"]))
    code, out, _ = run("deploy", "--config", str(DEFAULT), "--dry-run")
    assert code == 0 and ran == [True] and "not ready to deploy" in out


def test_deploy_of_a_ready_config_proceeds(monkeypatch, tmp_path):
    import fleetcast.deploy

    target = tmp_path / "fleet.yaml"
    YAML().dump(real_doc(), target)
    ran = []
    monkeypatch.setattr(fleetcast.deploy, "execute", lambda steps, **k: ran.append(k["dry_run"]))
    # Credentials present (a static fake pair), the account's AZ check stubbed out: no call leaves the machine.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKEFAKEFAKE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake")
    monkeypatch.setattr("fleetcast.config.readiness.access_with_credentials", lambda profile, **kw: None)
    code, _, _ = run("deploy", "--config", str(target), "--step", "bootstrap")
    assert code == 0 and ran == [False]


def test_accounts_are_read_from_account_fields_and_arns_only():
    doc = real_doc()
    doc["network"]["tls_certificate_arns"] = {
        "ap-northeast-2": "arn:aws:acm:ap-northeast-2:111122223333:certificate/0a9b8c7d-6e5f-4a3b-9c2d-1e0f9a8b7c6d"}
    doc["engine"]["image_digest"] = "sha256:" + "ab" + "111122223333" + "c" * 50
    [issue] = offline_findings(parse_config(doc)).refusals
    assert issue.dotted == "network.tls_certificate_arns.ap-northeast-2" and "111122223333" in issue.message
