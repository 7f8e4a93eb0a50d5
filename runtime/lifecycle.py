"""The instance's view of its Auto Scaling lifecycle: IMDSv2 and lifecycle-hook calls.

IMDSv2 (session token, PUT then GET) tells the instance who it is (instance id,
region), which group it belongs to (the `aws:autoscaling:groupName` instance
tag, readable because the launch template enables metadata tags) and what the
group wants from it (`autoscaling/target-lifecycle-state`: InService,
Warmed:Stopped, Warmed:Running, Warmed:Hibernated or Terminated).

The hook calls (CompleteLifecycleAction, RecordLifecycleActionHeartbeat) go
through boto3; `Heartbeat` keeps a long engine build inside the hook's
heartbeat window. SetInstanceHealth (Unhealthy) is how an instance whose model
server cannot be brought back asks its group to replace it.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("fleetcast.lifecycle")

IMDS_ENDPOINT = "http://169.254.169.254"
ASG_TAG = "aws:autoscaling:groupName"
CONTINUE = "CONTINUE"
ABANDON = "ABANDON"


class MetadataError(RuntimeError):
    """The instance metadata service did not answer as expected."""


class Imds:
    """Minimal IMDSv2 client (stdlib only): refreshes its session token before it expires."""

    def __init__(self, endpoint: str = IMDS_ENDPOINT, token_ttl_s: int = 21600, timeout_s: float = 2.0, attempts: int = 5):
        self.endpoint = endpoint.rstrip("/")
        self.token_ttl_s = token_ttl_s
        self.timeout_s = timeout_s
        self.attempts = attempts
        self._token: str | None = None
        self._token_expires = 0.0

    def _request(self, req: urllib.request.Request) -> tuple[int, str]:
        last: Exception | None = None
        for attempt in range(self.attempts):
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return resp.status, resp.read().decode()
            except urllib.error.HTTPError as exc:
                if exc.code in (404, 401, 403):
                    return exc.code, ""
                last = exc
            except (urllib.error.URLError, OSError) as exc:
                last = exc
            time.sleep(min(0.2 * 2**attempt, 2.0))
        raise MetadataError(f"instance metadata service at {self.endpoint} unreachable: {last}")

    def token(self) -> str:
        if self._token and time.monotonic() < self._token_expires - 60:
            return self._token
        req = urllib.request.Request(
            f"{self.endpoint}/latest/api/token", method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)},
        )
        status, body = self._request(req)
        if status != 200 or not body:
            raise MetadataError(f"IMDSv2 token request answered {status}")
        self._token, self._token_expires = body, time.monotonic() + self.token_ttl_s
        return body

    def get(self, path: str) -> str | None:
        """GET /latest/<path>; None when the item does not exist (404)."""
        for _ in range(2):
            req = urllib.request.Request(f"{self.endpoint}/latest/{path.lstrip('/')}",
                                         headers={"X-aws-ec2-metadata-token": self.token()})
            status, body = self._request(req)
            if status == 401:  # token expired under us: take a new one once
                self._token = None
                continue
            if status == 404:
                return None
            if status != 200:
                raise MetadataError(f"IMDS GET {path} answered {status}")
            return body
        raise MetadataError(f"IMDS GET {path}: token refused twice")

    def instance_id(self) -> str:
        value = self.get("meta-data/instance-id")
        if not value:
            raise MetadataError("IMDS has no instance-id")
        return value

    def region(self) -> str | None:
        return self.get("meta-data/placement/region")

    def tag(self, key: str) -> str | None:
        return self.get(f"meta-data/tags/instance/{key}")

    def asg_name(self) -> str:
        name = self.tag(ASG_TAG)
        if not name:
            raise MetadataError(
                f"instance tag {ASG_TAG} is not readable from IMDS; the launch template must enable "
                "instance metadata tags (InstanceMetadataTags: enabled)"
            )
        return name

    def target_lifecycle_state(self) -> str | None:
        """InService, Warmed:*, Terminated ... or None outside an Auto Scaling group."""
        value = self.get("meta-data/autoscaling/target-lifecycle-state")
        return value.strip() if value else None


@dataclass
class HookClient:
    """Completes and extends one lifecycle action of one instance."""

    autoscaling: Any  # boto3 autoscaling client
    group: str
    instance_id: str

    def complete(self, hook: str, result: str) -> None:
        if result not in (CONTINUE, ABANDON):
            raise ValueError(f"lifecycle result must be CONTINUE or ABANDON, got {result!r}")
        log.info("completing lifecycle hook %s with %s", hook, result)
        try:
            self.autoscaling.complete_lifecycle_action(
                LifecycleHookName=hook, AutoScalingGroupName=self.group,
                LifecycleActionResult=result, InstanceId=self.instance_id,
            )
        except Exception as exc:
            if _is_no_active_action(exc):
                log.warning("no active lifecycle action for %s (already completed or timed out): %s", hook, exc)
                return
            raise

    def set_unhealthy(self) -> None:
        """Ask the group to replace this instance now (SetInstanceHealth, Amazon EC2 Auto Scaling API
        Reference: "Set to Unhealthy to have the instance be out of service. Amazon EC2 Auto Scaling
        terminates and replaces the unhealthy instance"). The grace period is for instances still
        starting; this one was serving, so it is not respected."""
        log.error("marking instance %s unhealthy in %s", self.instance_id, self.group)
        self.autoscaling.set_instance_health(InstanceId=self.instance_id, HealthStatus="Unhealthy",
                                             ShouldRespectGracePeriod=False)

    def heartbeat(self, hook: str) -> None:
        self.autoscaling.record_lifecycle_action_heartbeat(
            LifecycleHookName=hook, AutoScalingGroupName=self.group, InstanceId=self.instance_id,
        )


def _is_no_active_action(exc: Exception) -> bool:
    response = getattr(exc, "response", None) or {}
    message = str(response.get("Error", {}).get("Message", ""))
    return "No active Lifecycle Action found" in message


class Heartbeat:
    """Background RecordLifecycleActionHeartbeat every `interval_s` until stopped.

    Heartbeat failures are logged, never fatal: the hook's own timeout (default
    ABANDON) is the backstop if this instance really is stuck.
    """

    def __init__(self, beat: Callable[[], None], interval_s: float):
        self._beat = beat
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lifecycle-heartbeat", daemon=True)
        self.count = 0

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._beat()
                self.count += 1
            except Exception as exc:  # noqa: BLE001
                log.warning("lifecycle heartbeat failed: %s", exc)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def heartbeat_interval(hook_timeout_s: int) -> float:
    """Beat well inside the window: a third of it, at most every 10 minutes, at least every 10 s."""
    return float(max(10, min(600, hook_timeout_s // 3)))
