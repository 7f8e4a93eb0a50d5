"""The failover probe's handler (stacks/lambdas/endpoint_health/handler.py) on loopback: a fake gateway /health on
127.0.0.1 answers what each test scripts, and a botocore Stubber checks the one PutMetricData the handler sends.

The value is 1 when some attempt answers 200 and 0 when none does, published at standard resolution
(StorageResolution 60; CloudWatch API, MetricDatum.StorageResolution: "Setting this to 60 specifies this metric as a
regular-resolution metric"), because a Route 53 health check reads only alarms on standard-resolution metrics (Route
53 API, AlarmIdentifier.Name; both read from botocore's service models below).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import botocore.session
import pytest
from botocore.stub import ANY, Stubber

from fleetcast.contract import failover as f, telemetry
from fleetcast.contract.nlb import HEALTH_PATH
from stacks.lambdas.endpoint_health import handler as h


@contextmanager
def fake_gateway(statuses: list[int], hang: bool = False) -> Iterator[tuple[str, list[str]]]:
    """A /health that answers `statuses` in turn (the last one repeats), or never answers when `hang`."""
    seen: list[str] = []
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            if hang:
                release.wait(10)
                return
            status = statuses[min(len(seen), len(statuses)) - 1]
            body = b'{"status":"ok"}' if status == 200 else b"{}"
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{HEALTH_PATH}", seen
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def no_sleep(_: float) -> None:
    pass


def test_a_200_is_healthy_at_the_first_attempt():
    with fake_gateway([200]) as (url, seen):
        assert h.probe(url, attempts=3, timeout_s=5, pause_s=0, sleep=no_sleep) == (True, [])
    assert seen == [HEALTH_PATH]


def test_a_draining_instance_is_not_an_outage_when_a_retry_answers():
    with fake_gateway([503, 200]) as (url, seen):
        healthy, failures = h.probe(url, attempts=3, timeout_s=5, pause_s=0, sleep=no_sleep)
    assert healthy and failures == ["HTTP 503"] and len(seen) == 2


def test_every_attempt_failing_is_unhealthy_with_each_reason():
    pauses: list[float] = []
    with fake_gateway([503, 502, 504]) as (url, seen):
        healthy, failures = h.probe(url, attempts=3, timeout_s=5, pause_s=0.5, sleep=pauses.append)
    assert not healthy and failures == ["HTTP 503", "HTTP 502", "HTTP 504"] and len(seen) == 3
    assert pauses == [0.5, 0.5]  # between attempts, not after the last


def test_a_refused_connection_and_a_silent_server_are_unhealthy():
    healthy, failures = h.probe(f"http://127.0.0.1:{closed_port()}{HEALTH_PATH}", attempts=2, timeout_s=2,
                                pause_s=0, sleep=no_sleep)
    assert not healthy and len(failures) == 2 and all("Error" in r for r in failures)
    with fake_gateway([200], hang=True) as (url, _):
        healthy, failures = h.probe(url, attempts=1, timeout_s=0.3, pause_s=0, sleep=no_sleep)
    assert not healthy and "timed out" in failures[0].lower()


def test_a_2xx_other_than_200_is_not_healthy():
    with fake_gateway([204]) as (url, _):
        assert h.probe(url, attempts=1, timeout_s=5, pause_s=0, sleep=no_sleep) == (False, ["HTTP 204"])


@pytest.fixture
def stubbed(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = boto3.client("cloudwatch", aws_access_key_id="x", aws_secret_access_key="x")
    stubber = Stubber(client)
    monkeypatch.setitem(h._CLIENTS, "cloudwatch", client)
    dims = {telemetry.DIM_FLEET: "spillfleet", telemetry.DIM_CONSUMER: "checkout"}
    for key, value in {"NAMESPACE": telemetry.NAMESPACE, "METRIC": telemetry.HOME_ENDPOINT_HEALTHY,
                       "DIMENSIONS": json.dumps(dims), "ATTEMPTS": str(f.PROBE_ATTEMPTS), "TIMEOUT_S": "5",
                       "PAUSE_S": "0"}.items():
        monkeypatch.setenv(key, value)
    with stubber:
        yield stubber, dims
    stubber.assert_no_pending_responses()


def expect_put(stubber: Stubber, dims: dict, value: float) -> None:
    stubber.add_response("put_metric_data", {}, {
        "Namespace": telemetry.NAMESPACE,
        "MetricData": [{"MetricName": telemetry.HOME_ENDPOINT_HEALTHY,
                        "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
                        "Timestamp": ANY, "Value": value, "Unit": "Count", "StorageResolution": 60}]})


def test_the_handler_publishes_1_for_a_healthy_home_endpoint(stubbed, monkeypatch):
    stubber, dims = stubbed
    expect_put(stubber, dims, 1.0)
    with fake_gateway([200]) as (url, _):
        monkeypatch.setenv("HEALTH_URL", url)
        assert h.handler({}, None)["healthy"] is True


def test_the_handler_publishes_0_when_every_attempt_fails(stubbed, monkeypatch):
    stubber, dims = stubbed
    expect_put(stubber, dims, 0.0)
    monkeypatch.setattr(h.time, "sleep", no_sleep)
    with fake_gateway([503]) as (url, seen):
        monkeypatch.setenv("HEALTH_URL", url)
        result = h.handler({}, None)
    assert result["healthy"] is False and len(seen) == f.PROBE_ATTEMPTS


def test_the_client_calls_the_monitoring_endpoint_by_name(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    url = "https://vpce-0a1b2c3d4e5f60718-abcdefgh.monitoring.us-east-1.vpce.amazonaws.com"
    monkeypatch.setenv("MONITORING_URL", url)
    monkeypatch.setattr(h, "_CLIENTS", {})
    assert h._cloudwatch().meta.endpoint_url == url


def test_standard_resolution_is_what_route53_and_cloudwatch_document():
    session = botocore.session.get_session()
    resolution = session.get_service_model("cloudwatch").shape_for("MetricDatum").members["StorageResolution"]
    assert "Setting this to 60 specifies this metric as a regular-resolution metric" in resolution.documentation
    name = session.get_service_model("route53").shape_for("AlarmIdentifier").members["Name"]
    assert "Standard-resolution metrics. High-resolution metrics aren't supported" in name.documentation
    assert h.datum("M", {}, True, None)["StorageResolution"] == 60  # type: ignore[arg-type]
