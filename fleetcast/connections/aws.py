"""AWS access for `fleetcast connections`: the shared session of every AWS-touching command.

`Access` is `fleetcast.aws_session.AwsSession` (standard credential chain, `--profile`/`--region`,
throttling retries, one-line errors); exit codes are the shared table of fleetcast.contract.errors.
"""

from __future__ import annotations

from fleetcast.aws_session import (
    DENIED_CODES,
    THROTTLING_CODES,
    AwsCallError,
    AwsSession as Access,
    PermissionDenied,
    iam_action,
)

__all__ = [
    "Access", "AwsCallError", "DENIED_CODES", "PermissionDenied", "THROTTLING_CODES", "iam_action",
]
