"""AWS access for `fleetcast connections`: clients, retries, pagination, errors.

One `Access` per command. It builds clients the way every AWS tool does
(standard credential chain, optional named profile, one client per service and
region) and runs every call through `call`/`paginate`, which

- retry throttling: botocore's own retries (adaptive mode: exponential backoff
  plus a client-side rate limiter) go first; when a call is still throttled
  after those, `Access` waits longer and tries again a few times, because a
  bulk approval in a busy account should slow down, not stop half-way;
- turn a missing permission (EC2: `UnauthorizedOperation` with an encoded
  message; other services: `AccessDenied*`) into one clear line naming the IAM
  action the call needs;
- turn every other failure into a one-line error naming service, operation
  and region.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from botocore.config import Config
from botocore.paginate import TokenEncoder
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    PartialCredentialsError,
    ProfileNotFound,
)

from fleetcast.errors import UserError

# Exit codes of `fleetcast connections` (also in docs/connections.md).
EXIT_OK = 0
EXIT_INPUT = 1  # bad argument or config
EXIT_USAGE = 2  # argparse
EXIT_REFUSED = 3  # a safety rule stopped the command; nothing changed
EXIT_DENIED = 4  # AWS credentials missing or an IAM permission missing
EXIT_AWS = 5  # any other AWS failure (not found, throttled past retries, partial failure)

# Throttling codes, from botocore's standard retry mode plus EC2's own.
THROTTLING_CODES = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
    "TooManyRequestsException", "RequestLimitExceeded", "BandwidthLimitExceeded", "RequestThrottled",
    "SlowDown", "PriorRequestNotComplete", "EC2ThrottledException",
})
DENIED_CODES = frozenset({
    "UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "UnauthorizedAccess",
    "AuthorizationError",
})

# IAM action per API operation this package calls. For these services the
# action name equals the operation name, but spelling them out keeps the error
# message right even if a call is added whose action differs.
IAM_ACTIONS = {
    ("ec2", "DescribeVpcEndpointConnections"): "ec2:DescribeVpcEndpointConnections",
    ("ec2", "AcceptVpcEndpointConnections"): "ec2:AcceptVpcEndpointConnections",
    ("ec2", "RejectVpcEndpointConnections"): "ec2:RejectVpcEndpointConnections",
    ("ec2", "DescribeVpcEndpointServiceConfigurations"): "ec2:DescribeVpcEndpointServiceConfigurations",
    ("cloudformation", "DescribeStacks"): "cloudformation:DescribeStacks",
    ("sts", "GetCallerIdentity"): "sts:GetCallerIdentity",
}

_ENCODED = re.compile(r"Encoded authorization failure message:\s*(\S+)")


class AwsCallError(UserError):
    """An AWS call failed for a reason other than a missing permission."""

    def __init__(self, message: str, *, code: str, service: str, operation: str, region: str,
                 exit_code: int = EXIT_AWS):
        super().__init__(message, exit_code)
        self.code = code
        self.service = service
        self.operation = operation
        self.region = region


class PermissionDenied(AwsCallError):
    """The caller lacks the IAM action an AWS call needs."""

    def __init__(self, message: str, *, action: str, encoded: str | None, **kw: Any):
        super().__init__(message, exit_code=EXIT_DENIED, **kw)
        self.action = action
        self.encoded = encoded


def iam_action(service: str, operation: str) -> str:
    return IAM_ACTIONS.get((service, operation), f"{service}:{operation}")


def _client_config() -> Config:
    return Config(retries={"mode": "adaptive", "max_attempts": 5}, connect_timeout=10, read_timeout=30)


class Access:
    """Clients and guarded calls for one command run."""

    def __init__(self, session: Any, *, throttle_retries: int = 4, base_delay_s: float = 2.0,
                 sleep: Callable[[float], None] = time.sleep, jitter: Callable[[], float] = random.random):
        self._session = session
        self._clients: dict[tuple[str, str], Any] = {}
        self.throttle_retries = throttle_retries
        self.base_delay_s = base_delay_s
        self._sleep = sleep
        self._jitter = jitter

    @classmethod
    def from_profile(cls, profile: str | None) -> "Access":
        import boto3

        try:
            return cls(boto3.Session(profile_name=profile))
        except ProfileNotFound:
            raise UserError(
                f"--profile {profile!r}: no such profile in ~/.aws/config or ~/.aws/credentials "
                "(list them with `aws configure list-profiles`)", EXIT_INPUT) from None

    def client(self, service: str, region: str) -> Any:
        key = (service, region)
        if key not in self._clients:
            self._clients[key] = self._session.client(service, region_name=region, config=_client_config())
        return self._clients[key]

    def set_client(self, service: str, region: str, client: Any) -> None:
        """Use this client for (service, region): how tests put a stubbed client in."""
        self._clients[(service, region)] = client

    # -- guarded calls

    def call(self, service: str, region: str, operation: str, **params: Any) -> dict:
        """Run one API operation (PascalCase name) with throttling retries and error mapping."""
        client = self.client(service, region)
        method = getattr(client, _snake(operation))
        for attempt in range(self.throttle_retries + 1):
            try:
                return method(**params)
            except ClientError as exc:
                if self._throttled(exc) and attempt < self.throttle_retries:
                    self._backoff(attempt)
                    continue
                raise self._translate(exc, service, region, operation) from None
            except (NoCredentialsError, PartialCredentialsError, BotoCoreError) as exc:
                raise _local_failure(exc, service, region, operation) from None
        raise AssertionError("unreachable")  # the loop either returns or raises

    def paginate(self, service: str, region: str, operation: str, result_key: str, **params: Any) -> Iterator[dict]:
        """Every item of a paginated operation; a throttled page is retried from where it stopped.

        Only for operations paginated by NextToken (the EC2 Describe* calls used here): after a
        throttled page the paginator restarts from the last page's NextToken, so no item is
        listed twice and none is skipped.
        """
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
            except ClientError as exc:
                if self._throttled(exc) and attempt < self.throttle_retries:
                    self._backoff(attempt)
                    attempt += 1
                    continue
                raise self._translate(exc, service, region, operation) from None
            except (NoCredentialsError, PartialCredentialsError, BotoCoreError) as exc:
                raise _local_failure(exc, service, region, operation) from None

    # -- helpers

    @staticmethod
    def _throttled(exc: ClientError) -> bool:
        return exc.response.get("Error", {}).get("Code") in THROTTLING_CODES

    def _backoff(self, attempt: int) -> None:
        # Exponential with jitter, capped: concurrent callers spread out instead of retrying in lockstep.
        ceiling = min(self.base_delay_s * (2 ** attempt), 30.0)
        self._sleep(ceiling * (0.5 + 0.5 * self._jitter()))

    @staticmethod
    def _translate(exc: ClientError, service: str, region: str, operation: str) -> AwsCallError:
        error = exc.response.get("Error", {})
        code = error.get("Code", "Unknown")
        message = error.get("Message", "")
        common = dict(code=code, service=service, operation=operation, region=region)
        if code in DENIED_CODES:
            action = iam_action(service, operation)
            match = _ENCODED.search(message)
            encoded = match.group(1) if match else None
            text = f"not authorized to call {action} in {region}: grant your role that IAM action"
            if encoded:
                text += ("; AWS's encoded reason (which policy denied it) decodes with "
                         f"`aws sts decode-authorization-message --encoded-message {encoded}`")
            elif message:
                text += f" (AWS said: {message})"
            return PermissionDenied(text, action=action, encoded=encoded, **common)
        if code in THROTTLING_CODES:
            return AwsCallError(f"{service} {operation} in {region} is still throttled ({code}) after retries; "
                                "try again later or with fewer targets", **common)
        return AwsCallError(f"{service} {operation} in {region} failed: {code}: {message}", **common)


def _no_credentials(exc: Exception) -> UserError:
    return UserError(f"no AWS credentials: {exc}; set AWS_PROFILE or pass --profile, or run `aws sso login`",
                     EXIT_DENIED)


def _snake(operation: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", operation).lower()


def _local_failure(exc: BotoCoreError, service: str, region: str, operation: str) -> Exception:
    """A failure before AWS answered: missing credentials, or a botocore error (endpoint, connection)."""
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return _no_credentials(exc)
    return AwsCallError(f"{service} {operation} in {region} failed: {exc}", code=type(exc).__name__,
                        service=service, operation=operation, region=region)
