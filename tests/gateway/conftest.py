"""Shared fixtures: a two-consumer fleet config, a stubbed EC2 endpoint directory, a running gateway."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from fleetcast.config import load_config, parse_config
from fleetcast.contract import telemetry as t
from runtime.gateway.identity import ApiKeyStore, EndpointDirectory, Identity
from runtime.gateway.limits import ConsumerLimiter
from runtime.gateway.metrics import MetricsSink
from runtime.gateway.routing import Router
from runtime.gateway.server import Gateway

from .fakes import FakeModelServer

ROOT = Path(__file__).resolve().parents[2]
REGION = "ap-northeast-2"
SERVICE_ID = "vpce-svc-0a1b2c3d4e5f60718"
VOICE_VPCE = "vpce-0aaaaaaaaaaaaaaa1"  # owned by 444455556666 -> voice-app
ANALYTICS_VPCE = "vpce-0bbbbbbbbbbbbbbb2"  # owned by 777788889999 -> analytics
STRANGER_VPCE = "vpce-0ccccccccccccccc3"  # accepted, but its account is no consumer of this fleet
MODEL_ID = "gpt2-xl"  # config/fleet.yaml's model: what the tests' requests name


@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def fleet_config(voice_limits: dict | None = None, analytics_limits: dict | None = None,
                 analytics_api_keys: bool = False):
    """The shipped config with both consumers served from Seoul (two accounts, one region)."""
    data = load_config(ROOT / "config" / "fleet.yaml").model_dump(mode="json")
    data = copy.deepcopy(data)
    seoul = next(r for r in data["regions"] if r["region"] == REGION)
    seoul["allowed_principals"] = ["arn:aws:iam::444455556666:root", "arn:aws:iam::777788889999:root"]
    voice, analytics = data["consumers"]
    analytics.update(region=REGION, service_region=REGION,
                     subnets=[{"id": "subnet-0f1e2d3c4b5a69781", "az_id": "apne2-az1"}],
                     endpoint_service_name="com.amazonaws.vpce.ap-northeast-2.vpce-svc-0a1b2c3d4e5f60718",
                     api_keys=analytics_api_keys)
    if voice_limits:
        voice["limits"] = voice_limits
    if analytics_limits:
        analytics["limits"] = analytics_limits
    return parse_config(data, "<test config>")


def connections(*pairs: tuple[str, str, str]) -> dict[str, Any]:
    return {"VpcEndpointConnections": [
        {"ServiceId": SERVICE_ID, "VpcEndpointId": vpce, "VpcEndpointOwner": owner, "VpcEndpointState": state}
        for vpce, owner, state in pairs]}


DEFAULT_CONNECTIONS = (
    (VOICE_VPCE, "444455556666", "available"),
    (ANALYTICS_VPCE, "777788889999", "available"),
    (STRANGER_VPCE, "999988887777", "available"),
)
DEFAULT_EC2_RESPONSES = (connections(*DEFAULT_CONNECTIONS),)


def stubbed_ec2(*responses: dict[str, Any]):
    """An EC2 client whose DescribeVpcEndpointConnections answers come from `responses`, in order.

    Stubber checks each call against the real AWS API model and that it filters by this service id.
    """
    ec2 = boto3.client("ec2", region_name=REGION)
    stub = Stubber(ec2)
    for response in responses:
        stub.add_response("describe_vpc_endpoint_connections", response,
                          {"Filters": [{"Name": "service-id", "Values": [SERVICE_ID]}]})
    stub.activate()
    return ec2, stub


@dataclass
class Harness:
    """A gateway on loopback in front of a fake model server, with its metric records captured."""

    gateway: Gateway
    upstream: FakeModelServer
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.gateway.port

    def metric_sum(self, name: str, consumer: str | None = None) -> float:
        return sum(r.get(name, 0) for r in self.records if consumer is None or r.get("Consumer") == consumer)

    def records_with(self, name: str) -> list[dict[str, Any]]:
        return [r for r in self.records if name in r]


async def start_harness(cfg=None, *, ec2_responses=DEFAULT_EC2_RESPONSES, keys: ApiKeyStore | None = None,
                        proxy_protocol: bool = True, drain_timeout_s: float = 10.0, miss_refresh_s: float = 3600.0,
                        token_delay_s: float = 0.0, upstream: FakeModelServer | None = None, router: Router | None = None,
                        **gateway_kw) -> Harness:
    cfg = cfg or fleet_config()
    consumers = cfg.consumers_of(REGION)
    upstream = upstream or await FakeModelServer(token_delay_s).start()
    ec2, _ = stubbed_ec2(*ec2_responses)
    endpoints = EndpointDirectory(ec2, SERVICE_ID, refresh_s=3600, miss_refresh_s=miss_refresh_s)
    await endpoints.refresh()
    records: list[dict[str, Any]] = []

    class _Null:
        def write(self, _): pass
        def flush(self): pass

    metrics = MetricsSink(cfg.name, "l40s", stream=_Null(), on_record=records.append,
                          by_model=t.metered_per_model(len(cfg.models)))
    router = router or Router.single(MODEL_ID, ("127.0.0.1", upstream.port))
    gateway = Gateway(router=router, identity=Identity(consumers, endpoints, keys),
                      limiters={c.name: ConsumerLimiter(c.limits) for c in consumers}, metrics=metrics,
                      proxy_protocol=proxy_protocol, drain_timeout_s=drain_timeout_s, **gateway_kw)
    await gateway.start("127.0.0.1", 0)
    return Harness(gateway, upstream, records)


async def stop_harness(h: Harness) -> None:
    if h.upstream.gate is not None:
        h.upstream.gate.set()  # never leave a held stream behind a failed assertion
    await h.gateway.close()
    h.gateway.metrics.close()
    await h.upstream.stop()


def run(coro, timeout: float = 30.0):
    """Run one async test body with a hard bound, so a hang fails instead of stalling CI."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def until(condition, timeout: float = 15.0) -> None:
    """Wait for `condition()`; the generous deadline only bounds a broken run."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def gateway_process(config: Path, port: int, upstream_port: int, endpoints: list[tuple[str, str]],
                          *extra: str, stdout: int = asyncio.subprocess.PIPE):
    """`python -m runtime.gateway` as the supervisor starts it, identity from a loopback EC2 fake answering
    `endpoints` ((vpce id, owner account) pairs); returns (the process, the fake)."""
    import os
    import sys

    from scripts.bench_gateway import FakeEc2Endpoints

    ec2 = FakeEc2Endpoints(endpoints)
    env = {**os.environ, "AWS_ENDPOINT_URL_EC2": f"http://127.0.0.1:{await ec2.start()}",
           "AWS_MAX_ATTEMPTS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("FLEETCAST_CONFIG_PARAM", None)  # the file is the source, as the supervisor's --config-json
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtime.gateway", "--listen", f"127.0.0.1:{port}",
        "--upstream", f"127.0.0.1:{upstream_port}", "--config-json", str(config),
        "--region", REGION, "--pool", "l40s", "--service-id", SERVICE_ID, *extra,
        cwd=str(ROOT), env=env, stdout=stdout, stderr=asyncio.subprocess.PIPE)
    return proc, ec2
