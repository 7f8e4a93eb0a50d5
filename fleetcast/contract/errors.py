"""One error hierarchy for every entry point (CLI, `cdk synth`, the instance bootstrap), and one exit-code table.

- `UserError`: the user asked for something wrong (bad input, a refused action). One clear line, never a
  traceback; exit 1 for invalid input, 2 for a usage error, 3 for a refusal a command documents.
- `AwsError`: AWS could not be reached or refused (credentials, permissions, a service failure). It names
  what is missing: the credential source, the IAM action, the service. Exit 4 for access, 5 for a service.
- `InstanceFailure`: something failed on a GPU instance; the bootstrap logs it with its context and
  completes the launch hook with `decision` (ABANDON unless the failure says it can continue).
Entry points catch `FleetcastError` once and use `exit_code`.
"""

from __future__ import annotations

# The exit codes of every `fleetcast` command (docs/connections.md and README.md quote this table).
EXIT_OK = 0
EXIT_INVALID = 1  # bad input: an argument, a config, a file
EXIT_USAGE = 2  # the command line itself (argparse's own code)
EXIT_REFUSED = 3  # a safety rule stopped the command and nothing changed; `plan check`: the plan drifted
EXIT_AWS_ACCESS = 4  # AWS credentials, profile, region or an IAM permission missing
EXIT_AWS_SERVICE = 5  # any other AWS failure (not found, throttled past retries, unreachable)
# Ended by a signal, as the shell reports it (128 + the signal's number): Ctrl-C, a closed stdout pipe.
EXIT_INTERRUPTED = 128 + 2  # SIGINT
EXIT_BROKEN_PIPE = 128 + 13  # SIGPIPE


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
