"""`fleetcast ami pin`: the DLAMI's public SSM parameter, read per region, written into the config.

Sources:
- AWS Deep Learning AMIs developer guide, "Finding the ID of a DLAMI"
  (https://docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html): the parameter is
  /aws/service/deeplearning/ami/$architecture/$ami_type/latest/ami-id, ami_type being the DLAMI
  name without "deep", "learning" and "ami"; reading it needs ssm:GetParameter.
- Release notes "AWS Deep Learning Base OSS Nvidia Driver GPU AMI (Amazon Linux 2023)": the
  name of the DLAMI the fleets run (G5, G6, G6e, G7e among its supported instances).
The SSM client is a real botocore client behind botocore's Stubber, so every request is
checked against the real SSM API model.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from fleetcast.ami import pin
from fleetcast.aws_session import AwsSession
from fleetcast.config import load_config
from fleetcast.contract.ami import DLAMI_NAME, DLAMI_SSM_PARAMETER
from tests.cli import run_cli

REPO = Path(__file__).resolve().parents[2]
SEOUL_AMI = "ami-0abcdef1234567890"
VIRGINIA_AMI = "ami-0fedcba9876543210"


@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch, tmp_path):
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def config(tmp_path) -> Path:
    target = tmp_path / "fleet.yaml"
    shutil.copy(REPO / "config" / "fleet.yaml", target)
    return target


def stubbed_access(answers: dict[str, str | Exception]) -> tuple[AwsSession, list[Stubber]]:
    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", aws_session_token="testing")
    access = AwsSession(boto_session=session, sleep=lambda s: None)
    stubs = []
    for region, answer in answers.items():
        client = session.client("ssm", region_name=region)
        stub = Stubber(client)
        if isinstance(answer, Exception):
            stub.add_client_error("get_parameter", service_error_code=answer.args[0], service_message=answer.args[1],
                                  expected_params={"Name": DLAMI_SSM_PARAMETER})
        else:
            stub.add_response("get_parameter", {"Parameter": {"Name": DLAMI_SSM_PARAMETER, "Type": "String",
                                                              "Value": answer, "Version": 7}},
                              expected_params={"Name": DLAMI_SSM_PARAMETER})
        stub.activate()
        access.set_client("ssm", region, client)
        stubs.append(stub)
    return access, stubs


def test_the_parameter_name_follows_awss_rule_for_the_dlami_we_run():
    ami_type = " ".join(w for w in re.sub(r"[()]", " ", DLAMI_NAME).split() if w.lower() not in ("deep", "learning", "ami"))
    expected = f"/aws/service/deeplearning/ami/x86_64/{'-'.join(ami_type.lower().split())}/latest/ami-id"
    assert DLAMI_SSM_PARAMETER == expected
    assert DLAMI_SSM_PARAMETER == "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id"


def test_the_shipped_config_follows_the_parameter_instead_of_invented_ids():
    cfg = load_config(REPO / "config" / "fleet.yaml")
    assert [r.ami.id for r in cfg.regions] == ["latest"] * len(cfg.regions)
    text = (REPO / "config" / "fleet.yaml").read_text()
    assert "ami-0a1b2c3d4e5f60718" not in text and "ami-0f1e2d3c4b5a69788" not in text


def test_pin_reads_each_region_and_writes_its_id_keeping_comments(config):
    access, stubs = stubbed_access({"ap-northeast-2": SEOUL_AMI, "us-east-1": VIRGINIA_AMI})
    before = config.read_text()
    changes = pin(config, access)
    assert changes == [("ap-northeast-2", "latest", SEOUL_AMI), ("us-east-1", "latest", VIRGINIA_AMI)]
    for stub in stubs:
        stub.assert_no_pending_responses()
    cfg = load_config(config)
    assert [r.ami.id for r in cfg.regions] == [SEOUL_AMI, VIRGINIA_AMI]
    after = config.read_text()
    comments = [line.split("#", 1)[1] for line in before.splitlines() if "#" in line and "ami" not in line.split("#", 1)[0]]
    assert comments and all(c in after for c in comments)
    # Only the two ids changed: the rest of the file is byte for byte what it was.
    assert len(before.splitlines()) == len(after.splitlines())
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
    assert len(changed) == 2 and all("id: latest" in a and "id: ami-" in b for a, b in changed)


def test_pin_one_region_leaves_the_others(config):
    access, _ = stubbed_access({"us-east-1": VIRGINIA_AMI})
    pin(config, access, ["us-east-1"])
    assert [r.ami.id for r in load_config(config).regions] == ["latest", VIRGINIA_AMI]


def test_a_failing_region_leaves_the_file_untouched(config):
    access, _ = stubbed_access({"ap-northeast-2": SEOUL_AMI,
                                "us-east-1": Exception("AccessDeniedException", "User is not authorized")})
    before = config.read_text()
    with pytest.raises(Exception) as raised:
        pin(config, access)
    assert raised.value.exit_code == 4 and "ssm:GetParameter" in str(raised.value)
    assert config.read_text() == before


def run(*argv: str) -> tuple[int, str, str]:
    done = run_cli(*argv)
    return done.returncode, done.stdout, done.stderr


def test_without_credentials_one_line_exit_4_and_no_change(config):
    before = config.read_text()
    code, out, err = run("ami", "pin", "--config", str(config))
    assert code == 4
    assert err.strip().count("\n") == 0 and "no AWS credentials" in err and "Traceback" not in err
    assert config.read_text() == before


def test_unknown_region_is_a_usage_error(config):
    code, _, err = run("ami", "pin", "--config", str(config), "--region", "eu-west-1")
    assert code == 2 and "eu-west-1" in err and "ap-northeast-2" in err
