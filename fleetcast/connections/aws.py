"""AWS access for `fleetcast connections`: the shared session of every AWS-touching command.

`Access` is `fleetcast.aws_session.AwsSession` (standard credential chain, `--profile`/`--region`,
throttling retries, one-line errors); this module adds the exit codes `fleetcast connections`
documents (docs/connections.md) on top of the shared 4 and 5.
"""

from __future__ import annotations

from fleetcast.aws_session import (
    DENIED_CODES,
    EXIT_AWS,
    EXIT_DENIED,
    THROTTLING_CODES,
    AwsCallError,
    AwsSession as Access,
    PermissionDenied,
    iam_action,
)

EXIT_OK = 0
EXIT_INPUT = 1  # bad argument or config
EXIT_USAGE = 2  # argparse
EXIT_REFUSED = 3  # a safety rule stopped the command; nothing changed

__all__ = [
    "Access", "AwsCallError", "DENIED_CODES", "EXIT_AWS", "EXIT_DENIED", "EXIT_INPUT", "EXIT_OK", "EXIT_REFUSED",
    "EXIT_USAGE", "PermissionDenied", "THROTTLING_CODES", "iam_action",
]
