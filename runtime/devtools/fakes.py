"""DEV TOOL, never used on an instance: loopback stand-ins for what moto does not emulate.

- FakeImds: the EC2 instance metadata service, IMDSv2 only (PUT token first; GETs
  without a valid token get 401), with instance id, region, instance tags
  (aws:autoscaling:groupName) and autoscaling/target-lifecycle-state.
- FakeAutoScaling: the lifecycle-hook actions of the Auto Scaling Query API
  (CompleteLifecycleAction, RecordLifecycleActionHeartbeat) and SetInstanceHealth, answering the XML
  boto3 expects, with the "No active Lifecycle Action found" error when the action
  is not pending. Point boto3 at it with AWS_ENDPOINT_URL_AUTO_SCALING.
- FaultyS3: a proxy in front of moto S3 that answers 503, truncates or stalls chosen
  requests, so boto3's transfer layer fails in tests exactly as it does on an instance.

All bind 127.0.0.1 and record every call so demos and tests can assert on them.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

ASG_NS = "http://autoscaling.amazonaws.com/doc/2011-01-01/"


class _Server:
    def __init__(self, handler_cls: type[BaseHTTPRequestHandler]):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_cls)
        self.httpd.daemon_threads = True
        self.httpd.owner = self  # type: ignore[attr-defined]
        # A short poll: shutdown() waits for serve_forever to notice, 0.5 s by default per fake per test.
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       name=type(self).__name__, daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Quiet(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # keep test and demo output readable
        pass

    def _send(self, status: int, body: str, ctype: str = "text/plain") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _ImdsHandler(_Quiet):
    def do_PUT(self) -> None:
        owner: FakeImds = self.server.owner  # type: ignore[attr-defined]
        if self.path != "/latest/api/token" or "X-aws-ec2-metadata-token-ttl-seconds" not in self.headers:
            self._send(400, "bad token request")
            return
        token = uuid.uuid4().hex
        with owner.lock:
            owner.tokens.add(token)
            owner.token_requests += 1
        self._send(200, token)

    def do_GET(self) -> None:
        owner: FakeImds = self.server.owner  # type: ignore[attr-defined]
        if self.headers.get("X-aws-ec2-metadata-token") not in owner.tokens:
            self._send(401, "")  # IMDSv1 is disabled: no token, no answer
            return
        value = owner.lookup(self.path)
        if value is None:
            self._send(404, "")
        else:
            self._send(200, value)


class FakeImds(_Server):
    """IMDSv2 for one instance; change `target_lifecycle_state` to drive warm pool / terminate flows."""

    def __init__(self, instance_id: str = "i-0123456789abcdef0", region: str = "us-east-1",
                 asg_name: str | None = "fleetcast-asg", target_lifecycle_state: str | None = "InService"):
        super().__init__(_ImdsHandler)
        self.lock = threading.Lock()
        self.tokens: set[str] = set()
        self.token_requests = 0
        self.instance_id = instance_id
        self.region = region
        self.tags: dict[str, str] = {"aws:autoscaling:groupName": asg_name} if asg_name else {}
        self.target_lifecycle_state = target_lifecycle_state
        # Spot: "on-demand" or "spot"; the interruption and rebalance items are absent (404) until set.
        self.instance_life_cycle = "on-demand"
        self.spot_instance_action: dict[str, Any] | None = None
        self.rebalance_recommendation: dict[str, Any] | None = None
        self.spot_polls = 0

    def interrupt(self, action: str = "terminate", in_s: float = 120.0, now: float | None = None) -> dict[str, Any]:
        """Post the Spot interruption notice EC2 posts two minutes before it acts (action at now + in_s)."""
        import datetime as _dt

        at = _dt.datetime.fromtimestamp((time.time() if now is None else now) + in_s, tz=_dt.UTC)
        self.spot_instance_action = {"action": action, "time": at.strftime("%Y-%m-%dT%H:%M:%SZ")}
        return self.spot_instance_action

    def lookup(self, path: str) -> str | None:
        if path == "/latest/meta-data/spot/instance-action":
            with self.lock:
                self.spot_polls += 1
        items = {
            "/latest/meta-data/instance-id": self.instance_id,
            "/latest/meta-data/placement/region": self.region,
            "/latest/meta-data/autoscaling/target-lifecycle-state": self.target_lifecycle_state,
            "/latest/meta-data/instance-life-cycle": self.instance_life_cycle,
            "/latest/meta-data/spot/instance-action":
                json.dumps(self.spot_instance_action) if self.spot_instance_action else None,
            "/latest/meta-data/events/recommendations/rebalance":
                json.dumps(self.rebalance_recommendation) if self.rebalance_recommendation else None,
        }
        if path in items:
            return items[path]
        prefix = "/latest/meta-data/tags/instance/"
        if path.startswith(prefix):
            return self.tags.get(urllib.parse.unquote(path[len(prefix):]))
        if path == prefix.rstrip("/"):
            return "\n".join(self.tags)
        return None


@dataclass
class HookCall:
    action: str
    group: str
    hook: str
    instance_id: str
    result: str | None


class _AsgHandler(_Quiet):
    def do_POST(self) -> None:
        owner: FakeAutoScaling = self.server.owner  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length", "0"))
        params = {k: v[0] for k, v in urllib.parse.parse_qs(self.rfile.read(length).decode()).items()}
        action = params.get("Action", "")
        if action == "SetInstanceHealth":
            if params.get("HealthStatus") not in ("Healthy", "Unhealthy") or not params.get("InstanceId"):
                self._error(400, "ValidationError", "HealthStatus must be Healthy or Unhealthy, with an InstanceId")
                return
            with owner.lock:
                owner.health.append((params["InstanceId"], params["HealthStatus"],
                                     params.get("ShouldRespectGracePeriod")))
            self._send(200, f'<SetInstanceHealthResponse xmlns="{ASG_NS}"><ResponseMetadata><RequestId>'
                            f"{uuid.uuid4()}</RequestId></ResponseMetadata></SetInstanceHealthResponse>", "text/xml")
            return
        if action not in ("CompleteLifecycleAction", "RecordLifecycleActionHeartbeat"):
            self._error(400, "InvalidAction", f"{action} is not emulated by this fake")
            return
        call = HookCall(action, params.get("AutoScalingGroupName", ""), params.get("LifecycleHookName", ""),
                        params.get("InstanceId", ""), params.get("LifecycleActionResult"))
        with owner.lock:
            owner.calls.append(call)
            key = (call.group, call.hook, call.instance_id)
            if key not in owner.pending:
                self._error(400, "ValidationError", f"No active Lifecycle Action found with instance ID {call.instance_id}")
                return
            if action == "CompleteLifecycleAction":
                owner.pending.discard(key)
                owner.completed.append(call)
            else:
                owner.heartbeats.append(call)
        rid = uuid.uuid4()
        self._send(200, f'<{action}Response xmlns="{ASG_NS}"><{action}Result/>'
                        f"<ResponseMetadata><RequestId>{rid}</RequestId></ResponseMetadata></{action}Response>",
                   "text/xml")

    def _error(self, status: int, code: str, message: str) -> None:
        self._send(status, f'<ErrorResponse xmlns="{ASG_NS}"><Error><Type>Sender</Type><Code>{code}</Code>'
                           f"<Message>{message}</Message></Error><RequestId>{uuid.uuid4()}</RequestId></ErrorResponse>",
                   "text/xml")


class FakeAutoScaling(_Server):
    """Lifecycle actions that are pending (`begin`) and what the instance did with them."""

    def __init__(self) -> None:
        super().__init__(_AsgHandler)
        self.lock = threading.Lock()
        self.pending: set[tuple[str, str, str]] = set()
        self.calls: list[HookCall] = []
        self.completed: list[HookCall] = []
        self.heartbeats: list[HookCall] = []
        self.health: list[tuple[str, str, str | None]] = []  # SetInstanceHealth: (instance, status, grace)

    def begin(self, group: str, hook: str, instance_id: str) -> None:
        with self.lock:
            self.pending.add((group, hook, instance_id))

    def results(self, hook: str | None = None) -> list[str]:
        with self.lock:
            return [c.result or "" for c in self.completed if hook is None or c.hook == hook]


class _Ec2Handler(_Quiet):
    def do_POST(self) -> None:
        owner: FakeEc2 = self.server.owner  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length", "0"))
        params = {k: v[0] for k, v in urllib.parse.parse_qs(self.rfile.read(length).decode()).items()}
        ns = "http://ec2.amazonaws.com/doc/2016-11-15/"
        if params.get("Action") != "DescribeVpcEndpointConnections":
            self._send(400, f'<Response><Errors><Error><Code>InvalidAction</Code><Message>{params.get("Action")} '
                            f"is not emulated</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>",
                       "text/xml")
            return
        items = "".join(
            f"<item><serviceId>{c['service_id']}</serviceId><vpcEndpointId>{c['vpce_id']}</vpcEndpointId>"
            f"<vpcEndpointOwner>{c['account']}</vpcEndpointOwner><vpcEndpointState>available</vpcEndpointState>"
            + (f"<vpcEndpointRegion>{c['region']}</vpcEndpointRegion>" if c.get("region") else "")
            + "</item>"
            for c in owner.connections
        )
        self._send(200, f'<DescribeVpcEndpointConnectionsResponse xmlns="{ns}"><requestId>{uuid.uuid4()}</requestId>'
                        f"<vpcEndpointConnectionSet>{items}</vpcEndpointConnectionSet>"
                        f"</DescribeVpcEndpointConnectionsResponse>", "text/xml")


class FakeEc2(_Server):
    """DescribeVpcEndpointConnections only (moto lacks it): which consumer endpoint belongs to which account."""

    def __init__(self, connections: list[dict[str, Any]] | None = None) -> None:
        super().__init__(_Ec2Handler)
        self.connections: list[dict[str, Any]] = list(connections or [])


@dataclass
class S3Fault:
    """One fault of FaultyS3: requests with `method` whose object key contains `key_part` get
    `action` (at most `times` of them; None: all). Actions, each a way real S3 or the network fails:
      "503"      answer 503 SlowDown (S3's throttling error) without forwarding;
      "503-unavailable"  answer 503 ServiceUnavailable (S3's other 503) without forwarding. botocore
                 retries both as often (standard mode: any 503), but backs off from a 1 s base on a
                 throttling code and from 50 ms on this one (botocore/retries/standard.py
                 ExponentialBackoff), so a test of what comes after botocore's retries need not
                 wait seconds per request;
      "truncate" forward, then send the response head and half the body, and close;
      "stall"    forward, then send the head and half the body, and send nothing more until
                 FaultyS3.stop() (or `stall_s`), as a dead connection does.
    """

    method: str
    key_part: str
    action: str
    times: int | None = None
    hits: int = 0


_503 = {"503": ("SlowDown", "Please reduce your request rate."),
        "503-unavailable": ("ServiceUnavailable", "Service is unable to handle request.")}


class _FaultyS3Handler(_Quiet):
    def _fault(self) -> S3Fault | None:
        owner: FaultyS3 = self.server.owner  # type: ignore[attr-defined]
        key = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        with owner.lock:
            for fault in owner.faults:
                if fault.method == self.command and fault.key_part in key and (
                        fault.times is None or fault.hits < fault.times):
                    fault.hits += 1
                    owner.injected.append((self.command, key, fault.action))
                    return fault
        return None

    def _relay(self) -> None:
        import http.client

        owner: FaultyS3 = self.server.owner  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        fault = self._fault()
        if fault is not None and fault.action in _503:
            code, message = _503[fault.action]
            self.close_connection = True
            self._send(503, f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                            f"<Message>{message}</Message><RequestId>{uuid.uuid4().hex}"
                            "</RequestId></Error>", "application/xml")
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "expect", "keep-alive")}
        upstream = http.client.HTTPConnection(owner.upstream_host, owner.upstream_port, timeout=30)
        try:
            upstream.request(self.command, self.path, body=body or None, headers=headers)
            resp = upstream.getresponse()
            data = resp.read()
            out_headers = [(k, v) for k, v in resp.getheaders()
                           if k.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server")]
        finally:
            upstream.close()
        self.send_response(resp.status)
        for k, v in out_headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        if fault is not None:
            self.send_header("Connection", "close")
        self.end_headers()
        if fault is None or self.command == "HEAD":
            self.wfile.write(data)
            return
        self.close_connection = True
        self.wfile.write(data[: len(data) // 2])
        self.wfile.flush()
        if fault.action == "stall":
            owner.released.wait(owner.stall_s)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay  # noqa: N815


class FaultyS3(_Server):
    """A loopback proxy in front of moto's S3 that injects S3Faults, so the real boto3 client
    and its transfer layer (s3transfer) meet real HTTP failures and raise what they raise on
    an instance: botocore retries the 503s, then upload_file wraps the ClientError in
    S3UploadFailedError; broken and stalled bodies surface from download_file as
    RetriesExceededError (boto3/s3/transfer.py, s3transfer/download.py)."""

    def __init__(self, upstream_url: str, stall_s: float = 120.0) -> None:
        super().__init__(_FaultyS3Handler)
        parts = urllib.parse.urlsplit(upstream_url)
        self.upstream_host, self.upstream_port = parts.hostname or "127.0.0.1", parts.port or 80
        self.lock = threading.Lock()
        self.faults: list[S3Fault] = []
        self.injected: list[tuple[str, str, str]] = []
        self.stall_s = stall_s
        self.released = threading.Event()

    def add(self, method: str, key_part: str, action: str, times: int | None = None) -> S3Fault:
        fault = S3Fault(method, key_part, action, times)
        with self.lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        with self.lock:
            self.faults.clear()

    def stop(self) -> None:
        self.released.set()
        super().stop()
