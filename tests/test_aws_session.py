"""The shared AWS session: what each botocore failure says, and the exit code it ends with.

Error codes come from AWS's "Common Errors" page, errors common to the API actions of all services
(https://docs.aws.amazon.com/awsconsolehelpdocs/latest/gsg/common-errors.html: AccessDeniedException,
ExpiredTokenException, InvalidClientTokenId, UnrecognizedClientException, NotAuthorized), and the EC2
API "Error codes" page (UnauthorizedOperation, whose message carries the encoded authorization
failure that `aws sts decode-authorization-message` decodes).
"""

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, NoRegionError, ProfileNotFound

from fleetcast.aws_session import AwsSession, PermissionDenied, translate
from fleetcast.contract.errors import EXIT_AWS_ACCESS, EXIT_AWS_SERVICE


def client_error(code, message="", operation="DescribeStacks"):
    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


@pytest.mark.parametrize("exc,needle", [
    (ProfileNotFound(profile="prod"), "profile 'prod'"),
    (NoCredentialsError(), "no AWS credentials"),
    (NoRegionError(), "--region"),
    (client_error("ExpiredTokenException", "The security token included in the request is expired"), "expired"),
    (client_error("InvalidClientTokenId"), "not valid"),
    (client_error("AccessDeniedException", "User is not authorized"), "cloudformation:DescribeStacks"),
])
def test_missing_access_is_one_line_and_exit_4(exc, needle):
    error = translate(exc, service="cloudformation", region="us-east-1", operation="DescribeStacks")
    assert error.exit_code == EXIT_AWS_ACCESS and needle in str(error) and "\n" not in str(error)


def test_a_missing_permission_names_the_iam_action_and_the_encoded_reason():
    error = translate(client_error("UnauthorizedOperation", "You are not authorized. Encoded authorization failure "
                                   "message: abc123", "AcceptVpcEndpointConnections"),
                      service="ec2", region="ap-northeast-2", operation="AcceptVpcEndpointConnections")
    assert isinstance(error, PermissionDenied) and error.exit_code == EXIT_AWS_ACCESS
    assert "ec2:AcceptVpcEndpointConnections in ap-northeast-2" in str(error)
    assert "aws sts decode-authorization-message --encoded-message abc123" in str(error)


def test_other_failures_are_exit_5_or_what_the_command_documents():
    assert translate(client_error("ValidationError", "Stack x does not exist")).exit_code == EXIT_AWS_SERVICE
    error = translate(EndpointConnectionError(endpoint_url="https://s3"), service="s3", other_exit=1)
    assert error.exit_code == 1 and "s3" in str(error)


def test_building_a_session_touches_nothing_until_a_client_is_asked_for(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    session = AwsSession("prod", "us-east-1")  # an unknown profile: no error yet (dry runs hold one)
    assert session.cdk_args() == ["--profile", "prod"]
    assert session.cli_args() == ["--profile", "prod", "--region", "us-east-1"]
    assert "profile 'prod'" in session.credentials_problem()
    with pytest.raises(Exception) as failed:
        session.client("s3")
    assert getattr(failed.value, "exit_code", None) == EXIT_AWS_ACCESS
