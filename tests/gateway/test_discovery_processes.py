"""Two gateway processes of one region find each other through the fleet's Auto Scaling group (moto on loopback)
and one forwards to the other, with no `--peer` list (issue 36, section 1: "Peers discover each other without a
new control plane").

The two instances are 127.0.0.1 and 127.0.0.2 in a moto subnet 127.0.0.0/24, members of the pool's group
(FleetConfig.asg_name_of), each gateway on its own address and the same port, as every instance of a fleet
listens on one. A connection from 127.0.0.1 to 127.0.0.2 leaves from 127.0.0.1 (Linux's loopback route), so the
receiving gateway sees its discovered peer's address, as an instance sees a peer's private IP in the VPC.
EC2 calls go to a loopback stand-in that answers DescribeVpcEndpointConnections for the consumers' endpoints
(scripts/bench_gateway.py FakeEc2Endpoints) and passes every other call (DescribeInstances) to moto.

Bounded and load-independent as test_spill_processes.py is: the first instance's engine holds one request at a
time and a long stream occupies it, so its predicted wait is far above a free peer's whatever the machine load.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import boto3
import pytest

from runtime.devtools.harness import free_port
from runtime.gateway import ppv2
from scripts.bench_gateway import FakeEc2Endpoints

from .fakes import Client
from .test_discovery import an_image
from .test_spill_processes import CHECKOUT, CHECKOUT_VPCE, MODEL, REPORTS, REPORTS_VPCE, Proc, engine, run, spill_config

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
# With the other discovery module, on one worker: moto's EC2 is imported and made once (2-3 s of CPU a worker). The
# gateways and fake engines are forks of this worker's fork server for them (tests/conftest.py, forked_gateways).
pytestmark = [pytest.mark.xdist_group("moto-ec2"), pytest.mark.usefixtures("forked_gateways")]
GROUP = "spillfleet-us-east-1-l40s"


class Ec2StandIn(FakeEc2Endpoints):
    """The consumers' endpoint connections here; every other EC2 call relayed to moto."""

    def __init__(self, connections: list[tuple[str, str]], moto: str):
        super().__init__(connections)
        url = urlparse(moto)
        self.moto = (url.hostname or "127.0.0.1", url.port or 80)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head, body = await self.read_request(reader)
            if b"Action=DescribeVpcEndpointConnections" in body:
                payload = self.xml()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nContent-Length: "
                             + str(len(payload)).encode() + b"\r\nConnection: close\r\n\r\n" + payload)
            else:
                up_reader, up_writer = await asyncio.open_connection(*self.moto)
                lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
                up_writer.write(b"\r\n".join(lines[:-2]) + b"\r\nConnection: close\r\n\r\n" + body)
                writer.write(await up_reader.read())
                up_writer.close()
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def fleet_in_moto() -> dict[str, str]:
    """The pool's group with two InService instances at 127.0.0.1 and 127.0.0.2; their ids by address."""
    ec2 = boto3.client("ec2", region_name=REGION)
    autoscaling = boto3.client("autoscaling", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="127.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="127.0.0.0/24")["Subnet"]["SubnetId"]
    ami = an_image(ec2)
    ec2.create_launch_template(LaunchTemplateName="fleet-lt", LaunchTemplateData={"ImageId": ami,
                                                                                 "InstanceType": "g6e.xlarge"})
    autoscaling.create_auto_scaling_group(AutoScalingGroupName=GROUP, LaunchTemplate={"LaunchTemplateName": "fleet-lt"},
                                          MinSize=0, MaxSize=4, VPCZoneIdentifier=subnet)
    ids = {}
    for address in ("127.0.0.1", "127.0.0.2"):
        instance = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, SubnetId=subnet, PrivateIpAddress=address,
                                     InstanceType="g6e.xlarge")["Instances"][0]
        ids[address] = instance["InstanceId"]
    autoscaling.attach_instances(InstanceIds=list(ids.values()), AutoScalingGroupName=GROUP)
    return ids


async def gateway(config: Path, host: str, port: int, engine_port: int, instance_id: str, key: Path, ec2_port: int,
                  moto: str, log: Path) -> Proc:
    env = {**os.environ, "AWS_ENDPOINT_URL": moto, "AWS_ENDPOINT_URL_EC2": f"http://127.0.0.1:{ec2_port}",
           "AWS_MAX_ATTEMPTS": "1", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "PYTHONPATH": str(ROOT)}
    env.pop("FLEETCAST_CONFIG_PARAM", None)
    proc = Proc(await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtime.gateway", "--listen", f"{host}:{port}", "--upstream", f"127.0.0.1:{engine_port}",
        "--config-json", str(config), "--region", REGION, "--pool", "l40s", "--peer-key-file", str(key),
        "--upstream-warm", "0", "--peer-discovery", "asg", "--peer-discovery-s", "0.5", "--instance-id", instance_id,
        cwd=str(ROOT), env=env, stdout=asyncio.subprocess.PIPE, stderr=log.open("wb")))
    for _ in range(300):  # up to 30 s to start on a loaded machine
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(ppv2.LOCAL_HEADER + b"GET /health HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n")
            answer = await reader.read()
            writer.close()
            if answer.startswith(b"HTTP/1.1 200"):
                return proc
        except OSError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"the gateway on {host}:{port} did not become healthy: {log.read_text()[-2000:]}")


def events(log: Path, name: str) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == name:
                found.append(record)
    return found


def test_two_gateways_find_each_other_in_the_auto_scaling_group_and_a_full_one_forwards_to_the_other(
        tmp_path, fresh_aws):
    ids = fleet_in_moto()
    config, key = spill_config(tmp_path), tmp_path / "peer.key"
    key.write_bytes(b"k" * 48)
    port = free_port()
    logs = {h: tmp_path / f"gateway-{h}.log" for h in ids}

    async def body() -> None:
        ec2 = Ec2StandIn([(CHECKOUT_VPCE, CHECKOUT), (REPORTS_VPCE, REPORTS)], fresh_aws)
        ec2_port = await ec2.start()
        full, free = await engine(0.05), await engine(0.0)  # a 10-token stream holds the first engine 0.5 s
        first = second = None
        try:
            first = await gateway(config, "127.0.0.1", port, int(full.first.result()), ids["127.0.0.1"], key,
                                  ec2_port, fresh_aws, logs["127.0.0.1"])
            second = await gateway(config, "127.0.0.2", port, int(free.first.result()), ids["127.0.0.2"], key,
                                   ec2_port, fresh_aws, logs["127.0.0.2"])
            for _ in range(300):  # each has read the group once (its period is 0.5 s)
                if all(events(log, "peer_discovery") for log in logs.values()):
                    break
                await asyncio.sleep(0.1)
            # Each found the other, and not itself.
            assert events(logs["127.0.0.1"], "peer_discovery")[-1]["peers"] == [f"127.0.0.2:{port}=l40s"]
            assert events(logs["127.0.0.2"], "peer_discovery")[-1]["peers"] == [f"127.0.0.1:{port}=l40s"]

            forwarded = None
            for _ in range(40):
                hold = await Client(port, REPORTS_VPCE).connect()
                await hold.send("POST", "/v1/completions", {"model": MODEL, "prompt": "hold", "max_tokens": 10,
                                                           "stream": True})
                status, head = await asyncio.wait_for(hold.read_head(), 30)
                assert status == 200
                holding = asyncio.ensure_future(hold.read_body(head))
                reply = await asyncio.wait_for(Client(port, CHECKOUT_VPCE).request(
                    "POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 3}), 60)
                # The holder has done its part: the request either came back from the peer while it held the engine,
                # or waited at home for its end (the peer's headroom not read yet, or the machine so slow that the
                # request came after the holder's 0.5 s: the next try holds the engine again). Let it go.
                holding.cancel()
                await hold.close()
                assert reply.status == 200
                await asyncio.sleep(0.3)  # records are flushed every 0.2 s
                forwarded = [r for r in first.records() if r.get("PeerForwardedRequests") == 1]
                if forwarded:
                    break
            assert forwarded, "the full gateway never forwarded to the peer it discovered"
            assert forwarded[0]["serving_peer"] == f"127.0.0.2:{port}" and forwarded[0]["status"] == 200
            # The peer served it under the caller's identity, carried in the claim it accepted from its peer.
            served = [r for r in second.records() if r.get("Requests") == 1 and r.get("origin_region") == REGION]
            assert [r["Consumer"] for r in served] == ["checkout"]  # metered once, where it ran
        finally:
            for proc in (first, second, full, free):
                if proc is not None:
                    await proc.stop()

    run(body())
