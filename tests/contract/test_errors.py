"""One error hierarchy (fleetcast/contract/errors.py): user input, AWS, instance failures; each entry point
catches its base once and exits with the error's code."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetcast.aws_session import AwsCallError, PermissionDenied, translate
from fleetcast.config import ConfigError
from fleetcast.contract.errors import AwsError, FleetcastError, InstanceFailure, UserError

ROOT = Path(__file__).resolve().parents[2]


def test_config_errors_are_user_errors_and_aws_failures_are_aws_errors():
    assert issubclass(ConfigError, UserError) and ConfigError("f.yaml", []).exit_code == 1
    assert issubclass(AwsCallError, AwsError) and issubclass(PermissionDenied, AwsError)
    assert not issubclass(AwsError, UserError) and not issubclass(UserError, AwsError)
    assert issubclass(InstanceFailure, FleetcastError) and InstanceFailure("x").decision == "ABANDON"


@pytest.mark.parametrize("make, code", [
    (lambda bx: bx.NoCredentialsError(), 4),
    (lambda bx: bx.ProfileNotFound(profile="typo"), 4),
    (lambda bx: bx.NoRegionError(), 4),
    (lambda bx: bx.EndpointConnectionError(endpoint_url="https://s3.amazonaws.com"), 5),
])
def test_every_botocore_failure_becomes_an_aws_error_with_its_exit_code(make, code):
    from botocore import exceptions as bx

    error = translate(make(bx), service="s3", region="us-east-1", operation="ListBuckets")
    assert isinstance(error, AwsError) and error.exit_code == code


@pytest.mark.parametrize("entry", ["app.py", "scripts/cli.py"])
def test_entry_points_catch_the_one_base(entry):
    text = (ROOT / entry).read_text()
    assert "except FleetcastError" in text and "except UserError" not in text
