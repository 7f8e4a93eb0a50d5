"""Spot interruption handling on the instance: watch IMDSv2, then drain inside the two-minute notice.

What EC2 tells a Spot instance ("Spot Instance interruption notices", Amazon EC2 User Guide):
- `meta-data/spot/instance-action` answers 404 until EC2 decides to interrupt; then, about two minutes before
  the action, `{"action": "terminate" | "stop" | "hibernate", "time": "<UTC ISO 8601>"}`. AWS recommends
  checking every 5 seconds.
- `meta-data/events/recommendations/rebalance` answers 404 until EC2 sees an elevated risk of interruption;
  then `{"noticeTime": "<UTC ISO 8601>"}` ("EC2 instance rebalance recommendations"). There is no deadline:
  with `spot.drain_on_rebalance` the instance drains like a scale-in (operations.drain_timeout_s).
- `meta-data/instance-life-cycle` says `spot` on a Spot instance ("Instance metadata categories"); only
  those are watched, so On-Demand instances of the same launch template make no extra IMDS calls.

What the instance does with a notice (runtime/bootstrap.py calls in here):
- Serving: the same drain as a scale-in, with the deadline of the notice. The gateway answers /health 503 at
  once (the NLB routes no new flow to the target after its unhealthy threshold, about 20 s, and keeps the
  open connections: the target group turns unhealthy-connection termination off, fleetcast/contract/nlb.py),
  refuses new requests with a 503 the client retries, lets in-flight streams finish until `time` minus
  DRAIN_EXIT_RESERVE_S (what the gateway and server need to exit and the metrics to leave), and reports how
  many it had to cut. The deadline reaches the gateway through a small JSON file
  whose path is on its command line (`--drain-deadline-file`), so a SIGTERM without one is a plain scale-in.
- Building: an interrupted engine build stops with SpotInterrupted, a CacheError, so the engine cache records
  no build failure and releases its build lock on the way out (runtime/engine_cache.py, _build_locked):
  another instance takes over at once instead of waiting for the lock to go stale.
- Metrics (EMF, fleetcast.contract.telemetry): SpotInterruption (or SpotRebalanceRecommendation) when the notice is
  seen, then SpotDrainCompleted 1/0 and SpotDrainCutRequests after the drain.

Stdlib only: it runs on the GPU instance (in the runtime bundle through runtime.bootstrap and the gateway).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger("fleetcast.spot")

INSTANCE_ACTION = "meta-data/spot/instance-action"
REBALANCE = "meta-data/events/recommendations/rebalance"
LIFE_CYCLE = "meta-data/instance-life-cycle"
NOTICE_S = 120.0  # "two minutes before Amazon EC2 stops or terminates your Spot Instance"
POLL_S = 5.0  # AWS: "We recommend that you check for these interruption notices every 5 seconds."
# After the last stream: the gateway's close, the model server's stop and the final metrics flush.
DRAIN_EXIT_RESERVE_S = 10.0


class SpotInterrupted(Exception):
    """EC2 reclaims this instance; raised into an engine build (see `as_cache_error`)."""


def as_cache_error(base: type[Exception]) -> type[Exception]:
    """SpotInterrupted as a subclass of the engine cache's NotABuildFailure, so a build interrupted by it records
    no failure and releases its lock (imported lazily: the gateway loads this module without the cache)."""
    return type("SpotInterruptedBuild", (SpotInterrupted, base), {})


@dataclass(frozen=True)
class Notice:
    kind: str  # "instance-action" or "rebalance"
    action: str | None  # terminate / stop / hibernate (instance-action only)
    at_epoch: float | None  # when EC2 acts (instance-action) or when it noticed the risk (rebalance)
    seen_epoch: float

    @property
    def interruption(self) -> bool:
        return self.kind == "instance-action"

    def deadline_epoch(self, reserve_s: float = DRAIN_EXIT_RESERVE_S) -> float | None:
        """When the last stream must be done: the action time less the exit reserve; None for a rebalance."""
        if not self.interruption:
            return None
        at = self.at_epoch if self.at_epoch is not None else self.seen_epoch + NOTICE_S
        return at - reserve_s


def _epoch(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def _object(body: str) -> dict[str, Any]:
    """The notice's JSON object, or {} when it is not one: a body we cannot read is still a notice, since
    EC2 posts these items only when it will act."""
    try:
        doc = json.loads(body)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def parse_instance_action(body: str | None, now: float) -> Notice | None:
    if not body:
        return None
    doc = _object(body)
    return Notice("instance-action", str(doc.get("action") or "terminate"), _epoch(doc.get("time")), now)


def parse_rebalance(body: str | None, now: float) -> Notice | None:
    if not body:
        return None
    return Notice("rebalance", None, _epoch(_object(body).get("noticeTime")), now)


class SpotWatcher:
    """Polls IMDS for an interruption notice (and, when asked, the rebalance recommendation); reports once."""

    def __init__(self, imds: Any, on_notice: Callable[[Notice], None], *, poll_s: float = POLL_S,
                 drain_on_rebalance: bool = False, clock: Callable[[], float] = time.time):
        self.imds = imds
        self.on_notice = on_notice
        self.poll_s = poll_s
        self.drain_on_rebalance = drain_on_rebalance
        self.clock = clock
        self.notice: Notice | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> Notice | None:
        """One poll; the notice (also kept in `.notice`) or None."""
        now = self.clock()
        notice = parse_instance_action(self.imds.get(INSTANCE_ACTION), now)
        if notice is None and self.drain_on_rebalance:
            notice = parse_rebalance(self.imds.get(REBALANCE), now)
        return notice

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                notice = self.check()
            except Exception as exc:  # noqa: BLE001 - IMDS hiccups must not end the watch
                log.warning("spot notice poll failed: %s", exc)
                notice = None
            if notice is not None:
                self.notice = notice
                log.warning("spot %s notice: action %s at %s", notice.kind, notice.action, notice.at_epoch)
                self.on_notice(notice)
                return
            self._stop.wait(self.poll_s)

    def start(self) -> SpotWatcher:
        self._thread = threading.Thread(target=self._run, name="spot-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def is_spot_instance(imds: Any) -> bool:
    try:
        return (imds.get(LIFE_CYCLE) or "").strip() == "spot"
    except Exception as exc:  # noqa: BLE001 - without metadata there is nothing to watch
        log.warning("cannot read %s: %s", LIFE_CYCLE, exc)
        return False


# ---------------------------------------------------------------- the deadline, bootstrap -> gateway


def write_deadline(path: Path, notice: Notice, reserve_s: float = DRAIN_EXIT_RESERVE_S) -> None:
    """Tell the gateway (before its SIGTERM) when its drain must end."""
    body = {"deadline_epoch": notice.deadline_epoch(reserve_s), "kind": notice.kind, "action": notice.action}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


def drain_budget_s(path: str | os.PathLike[str] | None, default_s: float, now: float | None = None) -> float:
    """The gateway's drain timeout: the config's, or less when a spot deadline was written."""
    if not path:
        return default_s
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default_s
    deadline = doc.get("deadline_epoch") if isinstance(doc, dict) else None
    if not isinstance(deadline, (int, float)):
        return default_s
    return max(0.0, min(default_s, deadline - (time.time() if now is None else now)))


def outcome_path(deadline_file: str | os.PathLike[str]) -> Path:
    return Path(f"{deadline_file}.outcome")


def write_outcome(deadline_file: str | os.PathLike[str] | None, *, in_flight: int, cut: int, budget_s: float) -> None:
    """The gateway's report of its drain, read back by the bootstrap for the drain-outcome metrics."""
    if not deadline_file or not Path(deadline_file).exists():
        return
    outcome_path(deadline_file).write_text(json.dumps({"in_flight": in_flight, "cut": cut, "budget_s": budget_s}))


def read_outcome(deadline_file: str | os.PathLike[str]) -> dict[str, Any] | None:
    try:
        doc = json.loads(outcome_path(deadline_file).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def safe_request_seconds(notice_s: float = NOTICE_S, reserve_s: float = DRAIN_EXIT_RESERVE_S) -> float:
    """The drain budget the bench and the planner grant a request in flight at the notice: the notice less the
    exit reserve, which is the gateway's own deadline. The NLB does not shorten it: it stops routing new flows
    to the target (those get the draining gateway's 503 and are retried elsewhere) but keeps the open
    connections for the drain (fleetcast/contract/nlb.py)."""
    return max(0.0, notice_s - reserve_s)
