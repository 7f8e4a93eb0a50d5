"""The audit trail: one JSON line per decision about an endpoint connection.

A decision is anything the command concluded about one connection, including
"no change" outcomes (already accepted, refused, left pending), so the log
answers "who looked at this endpoint, when, and what happened" on its own.
Lines go to stdout, or are appended to a file (opened in append mode per run,
so several runs and several people can share one log file).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from fleetcast.contract.errors import UserError

DECISIONS = (
    "accepted",  # AcceptVpcEndpointConnections succeeded (or would, with dry_run)
    "rejected",  # RejectVpcEndpointConnections succeeded (or would, with dry_run)
    "already-accepted",  # available already: no call made
    "already-rejected",  # rejected already: no call made
    "refused",  # a safety rule stopped it (account not allowed, no --force/--reason)
    "left-pending",  # sync: pending from an account the config does not allow
    "left-available",  # sync: available although the config no longer allows the account
    "not-actionable",  # state in which EC2 cannot accept/reject (deleted, failed, ...)
    "failed",  # EC2 listed it as unsuccessful
)


@dataclass(frozen=True)
class AuditRecord:
    time: str
    caller: str
    command: str
    region: str
    service_id: str
    endpoint_id: str
    account: str
    state: str
    allowed: bool
    decision: str
    reason: str | None
    forced: bool
    dry_run: bool
    error: str | None = None


class AuditLog:
    """Writes AuditRecords as JSON lines to a stream or appends them to a file."""

    def __init__(self, stream: IO[str] | None = None, path: str | Path | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)):
        self._path = Path(path) if path else None
        # Unused while a path is given: write() appends to the file instead.
        self._stream: IO[str] = stream if stream is not None else sys.stdout
        self._clock = clock
        self.records: list[AuditRecord] = []
        if self._path is not None:
            try:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                with self._path.open("a"):
                    pass
            except OSError as exc:
                raise UserError(f"--audit-log {str(path)!r}: cannot append to it: {exc.strerror}") from None

    def now(self) -> str:
        return self._clock().astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")

    def write(self, record: AuditRecord) -> None:
        if record.decision not in DECISIONS:
            raise ValueError(f"unknown decision {record.decision!r}")
        self.records.append(record)
        line = json.dumps(asdict(record), sort_keys=True) + "\n"
        if self._path is not None:
            with self._path.open("a") as fh:
                fh.write(line)
        else:
            self._stream.write(line)
            self._stream.flush()
