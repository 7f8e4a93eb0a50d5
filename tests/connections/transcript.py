"""A transcript of `fleetcast connections list`, `approve --dry-run`, `sync` and a refused approval,
run against the stubbed AWS API (botocore Stubber; nothing reaches AWS).

    .venv/bin/python -m tests.connections.transcript

tests/connections/test_transcript.py runs it too, so it cannot rot.
"""

from __future__ import annotations

import os
import sys

from .conftest import run_cli
from .stubs import SEOUL, SVC, VIRGINIA, StubbedAws, connection

E1, E2, E3, E4, E5 = ("vpce-0aaaaaaaaaaaaaaa1", "vpce-0bbbbbbbbbbbbbbb2", "vpce-0ccccccccccccccc3",
                      "vpce-0ddddddddddddddd4", "vpce-0eeeeeeeeeeeeeee5")
ALLOWED_SEOUL, ALLOWED_VIRGINIA, STRANGER = "444455556666", "777788889999", "999988887777"


def _seoul() -> list[list[dict]]:
    return [[connection(E5, ALLOWED_SEOUL, "available", service_id=SVC[SEOUL], minute=1),
             connection(E1, ALLOWED_SEOUL, service_id=SVC[SEOUL], minute=12),
             connection(E2, STRANGER, service_id=SVC[SEOUL], minute=17)]]


def _virginia() -> list[list[dict]]:  # two pages, chained by NextToken
    return [[connection(E3, ALLOWED_VIRGINIA, "available", service_id=SVC[VIRGINIA], minute=3,
                        endpoint_region="us-west-2")],
            [connection(E4, ALLOWED_VIRGINIA, service_id=SVC[VIRGINIA], minute=21, endpoint_region="us-west-2")]]


def _both(aws: StubbedAws) -> None:
    aws.stack_output(SEOUL)
    aws.stack_output(VIRGINIA)
    aws.connections(SEOUL, _seoul())
    aws.connections(VIRGINIA, _virginia())


def scenario() -> list[tuple[list[str], StubbedAws]]:
    steps = []
    aws = StubbedAws()
    _both(aws)
    steps.append((["list"], aws))

    aws = StubbedAws()
    aws.stack_output(SEOUL)
    aws.connections(SEOUL, _seoul())
    aws.caller()
    aws.change("accept", SEOUL, [E1], dry_run=True)
    steps.append((["approve", E1, "--region", SEOUL, "--dry-run"], aws))

    aws = StubbedAws()
    _both(aws)
    aws.caller()
    aws.change("accept", SEOUL, [E1])
    aws.change("accept", VIRGINIA, [E4])
    steps.append((["sync", "--yes"], aws))

    aws = StubbedAws()
    aws.stack_output(SEOUL)
    aws.connections(SEOUL, _seoul())
    aws.caller()
    steps.append((["approve", E2, "--region", SEOUL, "--yes"], aws))
    return steps


def run(write=sys.stdout.write) -> list[int]:
    codes = []
    for argv, aws in scenario():
        result = run_cli(aws.access, *argv)
        aws.done()  # every queued call was made, and no other
        write(f"$ fleetcast connections {' '.join(argv)}\n")
        write(result.out)
        write("".join(f"[stderr] {line}\n" for line in result.err.splitlines()))
        write(f"[exit {result.code}]\n\n")
        codes.append(result.code)
    return codes


if __name__ == "__main__":
    for var, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_EC2_METADATA_DISABLED", "true")):
        os.environ.setdefault(var, value)
    run()
