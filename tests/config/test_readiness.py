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

import random

import boto3
import pytest
from botocore.stub import Stubber
from ruamel.yaml import YAML

from fleetcast.aws_session import AwsSession
from fleetcast.config import parse_config
from fleetcast.config.readiness import check_readiness, is_example_account, is_placeholder_id, offline_findings
from scripts import cli
from tests.cli import run_cli
from tests.ready_config import DEFAULT, PROVIDER, ready_doc as real_doc


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
    done = run_cli(*argv)
    return done.returncode, done.stdout, done.stderr


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
        [line] = [ln for ln in lines if ln.startswith(f"  - {path} (line ")]
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
    assert [i.dotted for i in found.warnings] == ["regions[1].ami.id", "models[0].revision"]  # render names model.revision


def test_plain_validate_stays_offline_and_quiet_about_readiness():
    code, out, _ = run("config", "validate", str(DEFAULT))
    assert code == 0 and "ready" not in out


# ---------------------------------------------------------------- AZ name -> AZ ID, with credentials


def zones_access(account: str, zones: dict[str, dict[str, str]],
                 images: dict[str, tuple[str, ...]] | None = None) -> tuple[AwsSession, list[Stubber]]:
    """Stubbed STS and per-region EC2: `zones` answers DescribeAvailabilityZones; `images` the pinned AMIs each
    region's DescribeImages knows (ready_doc's by default), "!ami-..." for one it answers NotFound."""
    if images is None:
        images = {r["region"]: (r["ami"]["id"],) for r in real_doc()["regions"] if r["region"] in zones}
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
        for ami in (images or {}).get(region, ()):
            if ami.startswith("!"):  # DescribeImages's answer for an id the region does not have
                stub.add_client_error("describe_images", "InvalidAMIID.NotFound", f"The image id '[{ami[1:]}]' does "
                                      "not exist", expected_params={"ImageIds": [ami[1:]]})
            else:
                stub.add_response("describe_images", {"Images": [{"ImageId": ami, "State": "available"}]},
                                  {"ImageIds": [ami]})
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
    code, out, err = run("deploy", "--config", str(DEFAULT), "--dry-run")
    # A pipeline gating on the dry run must not pass: exit 1, as the deploy itself would (issue 25, section 3).
    assert code == 1 and ran == [True] and "not ready to deploy" in out
    assert "a deploy would stop before its first step" in err and "Traceback" not in err


def test_deploy_dry_run_of_a_ready_config_exits_0(monkeypatch, tmp_path):
    import fleetcast.deploy

    target = tmp_path / "fleet.yaml"
    YAML().dump(real_doc(), target)
    monkeypatch.setattr(fleetcast.deploy, "execute", lambda steps, **k: None)
    code, out, _ = run("deploy", "--config", str(target), "--dry-run")
    assert code == 0 and "not ready" not in out


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
    # The deploy's own identity check (sts:GetCallerIdentity per profile) answers the provider account, offline;
    # a bootstrap would need each account's own credentials (tests/deploy/test_accounts.py), the providers step not.
    monkeypatch.setattr("fleetcast.accounts.caller_account_via_sts", lambda region: lambda profile: PROVIDER)
    monkeypatch.setattr("fleetcast.deployed.other_fleets", lambda access, cfg, region: [])  # no fleet beside it
    code, _, _ = run("deploy", "--config", str(target), "--step", "providers")
    assert code == 0 and ran == [False]


def test_accounts_are_read_from_account_fields_and_arns_only():
    # (A certificate ARN of an example account is refused by validate itself: a certificate of another account.)
    doc = real_doc()
    doc["regions"][0]["allowed_principals"].append("arn:aws:iam::111122223333:root")
    doc["engine"]["image_digest"] = "sha256:" + "ab" + "111122223333" + "c" * 50
    [issue] = offline_findings(parse_config(doc)).refusals
    assert issue.dotted.startswith("regions[0].allowed_principals[") and "111122223333" in issue.message


# ---------------------------------------------------------------- placeholders by rule (issue 25, section 3)


def test_config_init_output_is_not_ready_until_every_placeholder_is_replaced(tmp_path):
    """init's own ids (vpc-000..., subnet-000...) and consumer CIDRs (RFC 5737 blocks) are recognized, even with
    real-looking accounts: before, `--deploy` called init's output ready."""
    out = tmp_path / "fleet.yaml"
    assert cli.main(["config", "init", "--account", PROVIDER, "--regions", "ap-northeast-2,us-east-1",
                     "--consumer", "voice-app=502118763940", "--consumer", "analytics=617245309881@us-west-2",
                     "--out", str(out)]) == 0
    text = out.read_text()
    code, report, _ = run("config", "validate", "--deploy", str(out))
    assert code == 1 and "not ready to deploy" in report
    flagged = {line.split(" (line")[0].strip("- ").strip() for line in report.splitlines() if line.startswith("  - ")}
    replace_lines = [line for line in text.splitlines() if "REPLACE:" in line]
    assert len(replace_lines) == 2 * 3  # vpc_id, subnets, cidrs per consumer
    for i in range(2):
        assert {f"consumers[{i}].vpc_id", f"consumers[{i}].subnets[0].id", f"consumers[{i}].subnets[1].id",
                f"consumers[{i}].cidrs[0]"} <= flagged, report


@pytest.mark.parametrize("hex_part", ["00000000000000000", "00000001000000000", "0abcdef1234567890",
                                      "1234567890abcdef0", "1a2b3c4d", "0f1e2d3c", "12345678", "fedcba9876543210f"])
def test_documentation_and_init_resource_ids_are_placeholders(hex_part):
    # ami-0abcdef1234567890 and ami-1234567890abcdef0: the EC2 User Guide's and API Reference's example ids.
    assert is_placeholder_id(hex_part)


def test_random_ids_are_almost_never_taken_for_placeholders():
    """The rule's cost: how many real (random) 17-digit ids it would refuse; the comment in readiness.py states it."""
    rng = random.Random(25)
    # 4e-6 measured over 10^6 (0.16 expected here). A run of 6 instead of 7 flags 2 of these 40,000 and fails:
    # they tell the rule from a looser one at a fifth of the CPU of 200,000 (30 s).
    ids = ["".join(rng.choice("0123456789abcdef") for _ in range(17)) for _ in range(40_000)]
    flagged = sum(map(is_placeholder_id, ids))
    assert flagged <= 1, flagged
    for value in ("0c9e2b71f4d8a3056", "07d5e1c3b9a2f4861", "0d93f1a7c2e4b6085", "a01106c2"):
        assert not is_placeholder_id(value)


@pytest.mark.parametrize("account", ["012345678901", "210987654321", "098765432109", "999999999999"])
def test_counting_and_repeated_digit_accounts_are_examples_by_rule(account):
    assert is_example_account(account)


@pytest.mark.parametrize("field,value,expected", [
    (("model", "source"), "s3://amzn-s3-demo-bucket/models/gpt2-xl/", "bucket name of AWS's documentation"),
    (("model", "source"), "s3://doc-example-bucket/models/", "bucket name of AWS's documentation"),
    (("operations", "alarm_email"), "oncall@example.com", "reserved for documentation"),
    (("operations", "alarm_email"), "ops@alerts.example.org", "reserved for documentation"),
    (("operations", "alarm_email"), "ops@fleet.test", "reserved for documentation"),
])
def test_documentation_buckets_and_mail_domains_are_refused(field, value, expected):
    doc = real_doc()
    doc.setdefault(field[0], {})[field[1]] = value
    [issue] = offline_findings(parse_config(doc)).refusals
    assert issue.dotted == ".".join(field) and expected in issue.message


def test_documentation_cidrs_are_refused_and_private_ranges_are_not():
    doc = real_doc()
    doc["consumers"][0]["cidrs"] = ["10.60.0.0/16", "198.51.100.128/25"]
    [issue] = offline_findings(parse_config(doc)).refusals
    assert issue.dotted == "consumers[0].cidrs[1]" and "RFC 5737" in issue.message


# ---------------------------------------------------------------- pinned AMIs are regional


def test_a_pinned_ami_the_region_does_not_have_is_refused_with_credentials():
    # us-east-1 pins an id it does not have: DescribeImages in us-east-1 answers InvalidAMIID.NotFound. (One id
    # pinned in two regions is refused by validate itself: tests/config/test_held_out_classes.py.)
    doc = real_doc()
    seoul_ami = doc["regions"][0]["ami"]["id"]
    other = "ami-07c3f9a1e5b2d4860"
    doc["regions"][1]["ami"]["id"] = other
    access, stubs = zones_access(PROVIDER, {"ap-northeast-2": SEOUL, "us-east-1": VIRGINIA},
                                 images={"ap-northeast-2": (seoul_ami,), "us-east-1": ("!" + other,)})
    result = check_readiness(parse_config(doc), access)
    [issue] = result.refusals
    assert issue.dotted == "regions[1].ami.id" and "regional" in issue.message and "us-east-1" in issue.message
    for stub in stubs:
        stub.assert_no_pending_responses()
