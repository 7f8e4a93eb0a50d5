"""The consumer's in-VPC probe of its home endpoint (runs in AWS Lambda; boto3 + stdlib only).

Route 53's health checkers run outside the VPC and cannot reach an interface endpoint's private addresses, so this
function, in the consumer's own subnets, calls the gateway's /health through the home endpoint once a minute and
publishes HomeEndpointHealthy = 1 (some attempt answered 200) or 0 (none did) to CloudWatch through the stack's
`monitoring` interface endpoint (MONITORING_URL: its endpoint-specific DNS name, so it needs no private DNS and
cannot clash with an endpoint the consumer already has). The alarm on that metric feeds a Route 53 health check
of type CLOUDWATCH_METRIC, which decides the failover record pair (stacks/consumer_failover.py).

Every setting comes from the environment, written by the stack from fleetcast/contract (the metric's name, its
dimensions, the attempts and their timeout), so the rules have one home and this file bundles alone.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime

_CLIENTS: dict = {}


def _cloudwatch():
    if "cloudwatch" not in _CLIENTS:
        import boto3

        _CLIENTS["cloudwatch"] = boto3.client("cloudwatch", endpoint_url=os.environ.get("MONITORING_URL") or None)
    return _CLIENTS["cloudwatch"]


def attempt(url: str, timeout_s: float) -> str | None:
    """None when `url` answered 200; otherwise why not (the status, or the connection's error)."""
    request = urllib.request.Request(url, method="GET", headers={"User-Agent": "fleetcast-failover-probe"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read(4096)
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:  # 503 from a draining gateway, 502/504 from nothing behind the NLB
        return f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:  # refused, reset, timed out, no such name
        return f"{type(exc).__name__}: {exc}"


def probe(url: str, *, attempts: int, timeout_s: float, pause_s: float,
          sleep: Callable[[float], None] = time.sleep) -> tuple[bool, list[str]]:
    """Healthy when any of `attempts` tries answers 200; each try is a new connection, which the NLB may send to
    another instance. Returns the verdict and each failed try's reason."""
    failures: list[str] = []
    for n in range(attempts):
        reason = attempt(url, timeout_s)
        if reason is None:
            return True, failures
        failures.append(reason)
        if n + 1 < attempts:
            sleep(pause_s)
    return False, failures


def datum(name: str, dimensions: dict[str, str], healthy: bool, at: datetime) -> dict:
    """One standard-resolution value (StorageResolution 60): a Route 53 health check reads only alarms on
    standard-resolution metrics."""
    return {"MetricName": name, "Dimensions": [{"Name": k, "Value": v} for k, v in dimensions.items()],
            "Timestamp": at, "Value": 1.0 if healthy else 0.0, "Unit": "Count", "StorageResolution": 60}


def handler(event, context) -> dict:
    started = datetime.now(UTC)  # the value belongs to the minute the probe began in
    url = os.environ["HEALTH_URL"]
    healthy, failures = probe(url, attempts=int(os.environ["ATTEMPTS"]), timeout_s=float(os.environ["TIMEOUT_S"]),
                              pause_s=float(os.environ["PAUSE_S"]))
    _cloudwatch().put_metric_data(
        Namespace=os.environ["NAMESPACE"],
        MetricData=[datum(os.environ["METRIC"], json.loads(os.environ["DIMENSIONS"]), healthy, started)])
    result = {"url": url, "healthy": healthy, "failures": failures}
    print(json.dumps(result))
    return result
