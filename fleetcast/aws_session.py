"""The one place every AWS-touching command gets its AWS access: session, clients, guarded calls, errors.

Every command that calls AWS takes `--profile` and `--region` (`add_aws_arguments`) and builds one
`AwsSession` from them (`AwsSession.from_args`). The session follows the AWS CLI: the standard
credential chain (environment, `AWS_PROFILE` / `--profile`, SSO, shared files, container and instance
roles), `--profile` naming a profile of the shared config/credentials files, `--region` the default
region for clients that no config region pins. `cli_args()` / `cdk_args()` hand the same choice to the
sub-steps a command runs (`fleetcast ...` and the CDK CLI, which takes `--profile` too).

Every failure of botocore becomes one line through `translate` and a documented exit code:

- 4 (`EXIT_AWS_ACCESS`): what the caller lacks: no credentials, an unknown profile, no region, an expired
  or rejected token, a missing IAM permission (named as its IAM action, with AWS's encoded reason
  when there is one);
- 5 (`EXIT_AWS_SERVICE`): anything else AWS or the network said, naming service, operation and region.

`call` / `paginate` add throttling retries on top of botocore's own (adaptive mode): a bulk
operation in a busy account slows down instead of stopping half-way. `scripts/cli.py` maps any
botocore error that still escapes a command the same way, so no AWS failure shows a traceback.
"""

from __future__ import annotations

import argparse
import random
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from fleetcast.contract.errors import EXIT_AWS_ACCESS, EXIT_AWS_SERVICE, AwsError, FleetcastError, UserError

# Throttling codes, from botocore's standard retry mode plus EC2's own.
THROTTLING_CODES = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
    "TooManyRequestsException", "RequestLimitExceeded", "BandwidthLimitExceeded", "RequestThrottled",
    "SlowDown", "PriorRequestNotComplete", "EC2ThrottledException",
})
# A permission the caller's identity lacks (EC2 says UnauthorizedOperation, most others AccessDenied*;
# AWS's "Common Errors" page lists AccessDeniedException and NotAuthorized for every service).
DENIED_CODES = frozenset({
    "UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "UnauthorizedAccess",
    "AuthorizationError", "NotAuthorized",
})
# The credentials themselves are not good: expired, unknown to AWS, or missing from the request
# ("Common Errors": ExpiredTokenException, InvalidClientTokenId, UnrecognizedClientException,
# MissingAuthenticationToken; STS and S3 spell some of them ExpiredToken, InvalidAccessKeyId).
BAD_CREDENTIAL_CODES = frozenset({
    "ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId", "UnrecognizedClientException",
    "MissingAuthenticationToken", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AuthFailure",
    "InvalidToken",
})

# IAM action per API operation where it differs from `service:Operation` (the rule for every call
# Fleetcast makes today); the table keeps a message right when one that differs is added.
IAM_ACTIONS: dict[tuple[str, str], str] = {}

_ENCODED = re.compile(r"Encoded authorization failure message:\s*(\S+)")
_CREDENTIAL_HINT = "set AWS_PROFILE or pass --profile, export AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or run `aws sso login`"


class AwsCallError(AwsError):
    """An AWS call failed for a reason other than missing access."""

    def __init__(self, message: str, *, code: str, service: str | None, operation: str | None,
                 region: str | None, exit_code: int = EXIT_AWS_SERVICE):
        super().__init__(message, exit_code)
        self.code = code
        self.service = service
        self.operation = operation
        self.region = region


class PermissionDenied(AwsCallError):
    """The caller lacks the IAM action an AWS call needs, or its credentials were refused."""

    def __init__(self, message: str, *, action: str | None, encoded: str | None, **kw: Any):
        super().__init__(message, exit_code=EXIT_AWS_ACCESS, **kw)
        self.action = action
        self.encoded = encoded


def iam_action(service: str, operation: str) -> str:
    return IAM_ACTIONS.get((service, operation), f"{service}:{operation}")


def add_aws_arguments(parser: argparse.ArgumentParser, *, region: str = "one", region_help: str | None = None) -> None:
    """`--profile` and `--region` with AWS CLI semantics.

    region="one": `--region R` is the region for this command's calls (a config-driven command: the only
    provider region to act on); "many": repeatable, each a provider region to act on.
    """
    parser.add_argument("--profile", metavar="NAME",
                        help="AWS named profile (default: AWS_PROFILE, then the standard credential chain)")
    if region == "many":
        parser.add_argument("--region", action="append", metavar="REGION",
                            help=region_help or "only this provider region (repeatable; default: every region in the config)")
    else:
        parser.add_argument("--region", metavar="REGION",
                            help=region_help or "AWS region (default: AWS_REGION / AWS_DEFAULT_REGION / the profile's)")


def _default_client_config() -> Any:
    from botocore.config import Config

    return Config(retries={"mode": "adaptive", "max_attempts": 5}, connect_timeout=10, read_timeout=30)


class AwsSession:
    """One command run's AWS access: lazily built boto3 session, cached clients, guarded calls.

    Building it never touches AWS or the credential files, so a dry run can hold one; the first client
    (or `credentials_problem`) resolves the profile and credentials.
    """

    def __init__(self, profile: str | None = None, region: str | None = None, *, boto_session: Any = None,
                 client_config: Any = None, throttle_retries: int = 4, base_delay_s: float = 2.0,
                 sleep: Callable[[float], None] = time.sleep, jitter: Callable[[], float] = random.random):
        self.profile = profile
        self.region = region
        self._boto = boto_session
        self._client_config = client_config
        # (service, region), or (service, region, endpoint_url) for a client of another endpoint.
        self._clients: dict[tuple[str | None, ...], Any] = {}
        self.throttle_retries = throttle_retries
        self.base_delay_s = base_delay_s
        self._sleep = sleep
        self._jitter = jitter

    @classmethod
    def from_args(cls, args: argparse.Namespace, **kw: Any) -> AwsSession:
        """From `--profile` / `--region` (a repeatable `--region` selects config regions; it sets no default)."""
        region = getattr(args, "region", None)
        return cls(getattr(args, "profile", None), region if isinstance(region, str) else None, **kw)

    # -- session and clients

    @property
    def boto(self) -> Any:
        if self._boto is None:
            import boto3

            try:
                self._boto = boto3.Session(profile_name=self.profile, region_name=self.region)
            except Exception as exc:  # ProfileNotFound from --profile or AWS_PROFILE
                if not is_aws_error(exc):
                    raise
                raise translate(exc) from None
        return self._boto

    def client(self, service: str, region: str | None = None, *, endpoint_url: str | None = None) -> Any:
        region = region or self.region
        key: tuple[str | None, ...] = (service, region) if endpoint_url is None else (service, region, endpoint_url)
        if key not in self._clients:
            try:
                self._clients[key] = self.boto.client(service, region_name=region, endpoint_url=endpoint_url,
                                                      config=self._client_config or _default_client_config())
            except Exception as exc:  # NoRegionError, or a profile whose settings do not parse
                if not is_aws_error(exc):
                    raise
                raise translate(exc, service=service, region=region) from None
        return self._clients[key]

    def set_client(self, service: str, region: str | None, client: Any) -> None:
        """Use this client for (service, region): how tests put a stubbed client in."""
        self._clients[(service, region)] = client

    def credentials_problem(self) -> str | None:
        """What is missing to call AWS (one line), or None: resolves the chain locally, calls nothing."""
        try:
            credentials = self.boto.get_credentials()
        except FleetcastError as exc:
            return str(exc)
        except Exception as exc:
            if not is_aws_error(exc):
                raise
            return str(translate(exc))
        if credentials is None:
            return f"no AWS credentials found ({_CREDENTIAL_HINT})"
        return None

    def require_credentials(self) -> None:
        """Fail now (exit 4, one line) rather than after a long local step when the chain finds nothing."""
        problem = self.credentials_problem()
        if problem:
            raise AwsError(problem, EXIT_AWS_ACCESS)

    # -- the same choice for sub-steps

    def cli_args(self, *, region: bool = True) -> list[str]:
        """`--profile P [--region R]` for a `fleetcast` sub-command."""
        out = ["--profile", self.profile] if self.profile else []
        if region and self.region:
            out += ["--region", self.region]
        return out

    def cdk_args(self) -> list[str]:
        """For the CDK CLI: `--profile P` (each stack's account and region come from the app)."""
        return ["--profile", self.profile] if self.profile else []

    # -- guarded calls

    def call(self, service: str, region: str | None, operation: str, **params: Any) -> dict[str, Any]:
        """Run one API operation (PascalCase name) with throttling retries and error mapping."""
        client = self.client(service, region)
        method = getattr(client, _snake(operation))
        for attempt in range(self.throttle_retries + 1):
            try:
                response: dict[str, Any] = method(**params)  # boto3 responses carry no types
                return response
            except Exception as exc:
                if not is_aws_error(exc):
                    raise
                if _throttled(exc) and attempt < self.throttle_retries:
                    self._backoff(attempt)
                    continue
                raise translate(exc, service=service, region=region or self.region, operation=operation) from None
        raise AssertionError("unreachable")  # the loop either returns or raises

    def paginate(self, service: str, region: str | None, operation: str, result_key: str,
                 **params: Any) -> Iterator[dict[str, Any]]:
        """Every item of a paginated operation; a throttled page is retried from where it stopped.

        Only for operations paginated by NextToken (the EC2 Describe* calls): after a throttled page the
        paginator restarts from the last page's NextToken, so no item is listed twice and none is skipped.
        """
        from botocore.paginate import TokenEncoder

        client = self.client(service, region)
        paginator = client.get_paginator(_snake(operation))
        resume: str | None = None
        attempt = 0
        while True:
            config = {"StartingToken": TokenEncoder().encode({"NextToken": resume})} if resume else {}
            try:
                for page in paginator.paginate(**params, PaginationConfig=config):
                    yield from page.get(result_key, [])
                    resume = page.get("NextToken")
                    attempt = 0
                return
            except Exception as exc:
                if not is_aws_error(exc):
                    raise
                if _throttled(exc) and attempt < self.throttle_retries:
                    self._backoff(attempt)
                    attempt += 1
                    continue
                raise translate(exc, service=service, region=region or self.region, operation=operation) from None

    def _backoff(self, attempt: int) -> None:
        # Exponential with jitter, capped: concurrent callers spread out instead of retrying in lockstep.
        ceiling = min(self.base_delay_s * (2 ** attempt), 30.0)
        self._sleep(ceiling * (0.5 + 0.5 * self._jitter()))


def _throttled(exc: Exception) -> bool:
    from botocore.exceptions import ClientError

    return isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in THROTTLING_CODES


def _snake(operation: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", operation).lower()


def _where(service: str | None, operation: str | None, region: str | None) -> str:
    what = " ".join(p for p in (service, operation) if p) or "AWS"
    return f"{what} in {region}" if region else what


def is_aws_error(exc: BaseException) -> bool:
    """A botocore failure (anything `translate` knows how to say in one line)."""
    from botocore.exceptions import BotoCoreError, ClientError

    return isinstance(exc, (BotoCoreError, ClientError))


def translate(exc: BaseException, *, service: str | None = None, region: str | None = None,
              operation: str | None = None, other_exit: int = EXIT_AWS_SERVICE) -> FleetcastError:
    """One line and an exit code for a botocore failure: EXIT_AWS_ACCESS for missing access, `other_exit` (a
    command that documents no 5 passes 1) for the rest; anything else becomes a UserError of its text."""
    error = _translate(exc, service=service, region=region, operation=operation)
    if error.exit_code == EXIT_AWS_SERVICE:
        error.exit_code = other_exit
    return error


def _translate(exc: BaseException, *, service: str | None, region: str | None,
               operation: str | None) -> FleetcastError:
    from botocore import exceptions as bx

    if isinstance(exc, FleetcastError):
        return exc
    if isinstance(exc, bx.ProfileNotFound):
        profile = getattr(exc, "kwargs", {}).get("profile", "?")
        return AwsError(f"AWS profile {profile!r} (from --profile or AWS_PROFILE) is not in the AWS config or "
                         "credentials files (~/.aws/config, ~/.aws/credentials, or AWS_CONFIG_FILE / "
                         "AWS_SHARED_CREDENTIALS_FILE); list them with `aws configure list-profiles`", EXIT_AWS_ACCESS)
    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        where = f" for {_where(service, operation, region)}" if service or operation else ""
        return AwsError(f"no AWS credentials{where} ({exc}): {_CREDENTIAL_HINT}", EXIT_AWS_ACCESS)
    if isinstance(exc, bx.NoRegionError):
        return AwsError(f"no AWS region for {service or 'the AWS client'}: pass --region, set AWS_REGION, or set "
                         "`region` in the profile", EXIT_AWS_ACCESS)
    sso_errors = tuple(getattr(bx, n) for n in ("SSOTokenLoadError", "UnauthorizedSSOTokenError",
                                                 "TokenRetrievalError", "SSOError") if hasattr(bx, n))
    if isinstance(exc, sso_errors):
        return AwsError(f"AWS SSO credentials unavailable ({exc}): run `aws sso login` (with --profile NAME)",
                         EXIT_AWS_ACCESS)
    if isinstance(exc, bx.ClientError):
        error = exc.response.get("Error", {})
        code = error.get("Code", "Unknown")
        message = error.get("Message", "")
        operation = operation or getattr(exc, "operation_name", None)
        common = dict(code=code, service=service, operation=operation, region=region)
        if code in DENIED_CODES:
            action = iam_action(service, operation) if service and operation else operation or "the call"
            where = f" in {region}" if region else ""
            text = f"not authorized to call {action}{where}: grant your role that IAM action"
            match = _ENCODED.search(message)
            encoded = match.group(1) if match else None
            if encoded:
                text += ("; AWS's encoded reason (which policy denied it) decodes with "
                         f"`aws sts decode-authorization-message --encoded-message {encoded}`")
            elif message:
                text += f" (AWS said: {message})"
            return PermissionDenied(text, action=action, encoded=encoded, **common)
        if code in BAD_CREDENTIAL_CODES:
            return PermissionDenied(f"AWS refused the credentials for {_where(service, operation, region)} ({code}: "
                                    f"{message}): they are expired or not valid; refresh them ({_CREDENTIAL_HINT})",
                                    action=None, encoded=None, **common)
        if code in THROTTLING_CODES:
            return AwsCallError(f"{_where(service, operation, region)} is still throttled ({code}) after retries; "
                                "try again later or with fewer targets", **common)
        return AwsCallError(f"{_where(service, operation, region)} failed: {code}: {message}", **common)
    if isinstance(exc, bx.BotoCoreError):
        return AwsCallError(f"{_where(service, operation, region)} failed: {exc}", code=type(exc).__name__,
                            service=service, operation=operation, region=region)
    return UserError(str(exc))
