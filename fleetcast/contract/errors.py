"""One error hierarchy for every entry point (CLI, `cdk synth`, the instance bootstrap).

- `UserError`: the user asked for something wrong (bad input, a refused action). One clear line, never a
  traceback; exit 1 for invalid input, 2 for a usage error, 3 for a refusal a command documents.
- `AwsError`: AWS could not be reached or refused (credentials, permissions, a service failure). It names
  what is missing: the credential source, the IAM action, the service. Exit 4 for access, 5 for a service.
- `InstanceFailure`: something failed on a GPU instance; the bootstrap logs it with its context and
  completes the launch hook with `decision` (ABANDON unless the failure says it can continue).
Entry points catch `FleetcastError` once and use `exit_code`.
"""

from __future__ import annotations

EXIT_INVALID = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_AWS_ACCESS = 4
EXIT_AWS_SERVICE = 5


class FleetcastError(Exception):
    """Base of every error Fleetcast reports as a message rather than a traceback."""

    exit_code = EXIT_INVALID

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UserError(FleetcastError):
    """Bad input or a refused action. `exit_code` 1 for invalid input, 2 for usage, others as documented."""


class AwsError(FleetcastError):
    """AWS refused or could not be reached; the message names the action, service or credential source."""

    exit_code = EXIT_AWS_ACCESS


class InstanceFailure(FleetcastError):
    """A failure on the instance that ends its launch; `decision` is what the launch hook is completed with."""

    def __init__(self, message: str, decision: str = "ABANDON"):
        super().__init__(message)
        self.decision = decision
