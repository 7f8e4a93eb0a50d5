"""Peer discovery (runtime/gateway/discovery.py): the region's peer gateways from the fleet's Auto Scaling groups.

AWS behaviour these tests rely on, from its documentation (moto on loopback plays the services):
- DescribeAutoScalingGroups (EC2 Auto Scaling API Reference, https://docs.aws.amazon.com/autoscaling/ec2/
  APIReference/API_DescribeAutoScalingGroups.html): with AutoScalingGroupNames only those groups are described,
  "By default, you can only specify up to 50 names"; each group lists its instances with LifecycleState
  (InService, Standby, Pending:Wait, Terminating:Wait, ...) and HealthStatus; "To retrieve information about the
  instances in a warm pool, you must call the DescribeWarmPool API".
- DescribeInstances (Amazon EC2 API Reference, https://docs.aws.amazon.com/AWSEC2/latest/APIReference/
  API_DescribeInstances.html): "If you specify an instance ID that is not valid, an error is returned"; with the
  instance-id filter a missing instance is only left out; InstanceLifecycle is "spot" for a Spot Instance.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import boto3
import pytest
import yaml
from botocore.exceptions import ClientError, EndpointConnectionError
from botocore.stub import Stubber

from runtime.gateway import discovery
from runtime.gateway.discovery import JITTER, STALE_AFTER, AsgPeerSource, Peer, PeerDiscovery, fleet_groups, price_of

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
# With the other discovery module, on one worker: moto's EC2 is imported and made once (2-3 s of CPU a worker).
pytestmark = pytest.mark.xdist_group("moto-ec2")


def spill_config(spot: bool = False):
    from fleetcast.config import parse_config

    data = yaml.safe_load((ROOT / "examples" / "spill" / "fleet.yaml").read_text())
    if spot:
        data["regions"][0]["pools"][0]["spot"] = {"instance_types": ["g6e.xlarge", "g6e.2xlarge"]}
    return parse_config(data, "<discovery test>")


def an_image(ec2) -> str:
    """An image of the test's own to launch from (RegisterImage; moto requires the image of RunInstances to exist).
    The suite's moto loads none of its 1,366 built-in images (tests/conftest.py): listing them took 3-6 s of CPU
    per test worker, and loading them again at every reset of moto 0.5 s."""
    return str(ec2.register_image(Name="fleet-test-image")["ImageId"])


class Region:
    """A VPC, a launch template and the instances of some groups in moto."""

    def __init__(self) -> None:
        self.ec2 = boto3.client("ec2", region_name=REGION)
        self.asg = boto3.client("autoscaling", region_name=REGION)
        vpc = self.ec2.create_vpc(CidrBlock="10.41.0.0/16")["Vpc"]["VpcId"]
        self.subnet = self.ec2.create_subnet(VpcId=vpc, CidrBlock="10.41.0.0/24")["Subnet"]["SubnetId"]
        self.ami = an_image(self.ec2)
        self.ec2.create_launch_template(LaunchTemplateName="fleet-lt",
                                        LaunchTemplateData={"ImageId": self.ami, "InstanceType": "g6e.xlarge"})
        self.groups: set[str] = set()

    def launch(self, group: str, ip: str, instance_type: str = "g6e.xlarge", spot: bool = False) -> str:
        if group not in self.groups:
            self.asg.create_auto_scaling_group(AutoScalingGroupName=group, LaunchTemplate={
                "LaunchTemplateName": "fleet-lt"}, MinSize=0, MaxSize=20, VPCZoneIdentifier=self.subnet)
            self.groups.add(group)
        extra = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
        instance = self.ec2.run_instances(ImageId=self.ami, MinCount=1, MaxCount=1, SubnetId=self.subnet,
                                          PrivateIpAddress=ip, InstanceType=instance_type, **extra)["Instances"][0]
        self.asg.attach_instances(InstanceIds=[instance["InstanceId"]], AutoScalingGroupName=group)
        return str(instance["InstanceId"])


@pytest.fixture
def region(fresh_aws):
    return Region()


def test_the_fleet_groups_are_each_pools_group_and_its_spot_tier():
    cfg = spill_config(spot=True)
    assert fleet_groups(cfg, REGION) == {"spillfleet-us-east-1-l40s": "l40s", "spillfleet-us-east-1-l40s-spot": "l40s"}
    assert fleet_groups(cfg, "us-west-2") == {"spillfleet-us-west-2-l40s": "l40s"}


def test_peers_are_the_in_service_healthy_instances_of_the_fleets_groups_labelled_with_pool_and_price(region):
    cfg = spill_config(spot=True)
    groups = fleet_groups(cfg, REGION)
    me = region.launch("spillfleet-us-east-1-l40s", "10.41.0.10")
    on_demand = region.launch("spillfleet-us-east-1-l40s", "10.41.0.11")
    spot = region.launch("spillfleet-us-east-1-l40s-spot", "10.41.0.12", "g6e.2xlarge", spot=True)
    sick = region.launch("spillfleet-us-east-1-l40s", "10.41.0.13")
    region.asg.set_instance_health(InstanceId=sick, HealthStatus="Unhealthy")
    parked = region.launch("spillfleet-us-east-1-l40s", "10.41.0.14")
    region.asg.enter_standby(InstanceIds=[parked], AutoScalingGroupName="spillfleet-us-east-1-l40s",
                             ShouldDecrementDesiredCapacity=True)
    region.launch("someone-elses-group", "10.41.0.15")  # not one of the fleet's groups

    peers = AsgPeerSource(region.asg, region.ec2, groups, REGION, 8000, me)()

    assert [(p.instance_id, p.address, p.pool, p.instance_type, p.spot) for p in peers] == sorted([
        (on_demand, ("10.41.0.11", 8000), "l40s", "g6e.xlarge", False),
        (spot, ("10.41.0.12", 8000), "l40s", "g6e.2xlarge", True)])
    by_id = {p.instance_id: p for p in peers}
    # Priced from the shipped tables: the On-Demand one, and the Spot one from the Spot snapshot (cheaper).
    from fleetcast.config.catalog import instance_catalog, spot_price

    assert by_id[on_demand].price == instance_catalog()["g6e.xlarge"].price_per_hour[REGION]
    assert by_id[spot].price == spot_price("g6e.2xlarge", REGION) < instance_catalog()["g6e.2xlarge"].price_per_hour[REGION]


def test_an_instance_gone_between_the_two_reads_is_left_out_not_an_error(region):
    keep = region.launch("spillfleet-us-east-1-l40s", "10.41.0.20")
    # The group still lists one that EC2 no longer knows (ended, or not visible yet): with InstanceIds, the
    # whole DescribeInstances call would fail; the instance-id filter leaves it out.
    listed = boto3.client("autoscaling", region_name=REGION)
    stub = Stubber(listed)
    stub.add_response("describe_auto_scaling_groups", {"AutoScalingGroups": [{
        "AutoScalingGroupName": "spillfleet-us-east-1-l40s", "MinSize": 0, "MaxSize": 4, "DesiredCapacity": 2,
        "DefaultCooldown": 300, "AvailabilityZones": ["us-east-1a"], "HealthCheckType": "ELB",
        "CreatedTime": "2026-01-01T00:00:00Z", "Instances": [
            {"InstanceId": iid, "AvailabilityZone": "us-east-1a", "LifecycleState": "InService",
             "HealthStatus": "Healthy", "ProtectedFromScaleIn": False}
            for iid in (keep, "i-0123456789abcdef0")]}]})
    stub.activate()
    peers = AsgPeerSource(listed, region.ec2, {"spillfleet-us-east-1-l40s": "l40s"}, REGION, 8000, None)()
    assert [p.instance_id for p in peers] == [keep]
    with pytest.raises(ClientError, match="InvalidInstanceID"):  # what the InstanceIds form would have done
        region.ec2.describe_instances(InstanceIds=[keep, "i-0123456789abcdef0"])


def test_discovery_reads_at_most_max_peers(region, monkeypatch):
    monkeypatch.setattr(discovery, "MAX_PEERS", 2)
    for i in range(4):
        region.launch("spillfleet-us-east-1-l40s", f"10.41.0.{30 + i}")
    peers = AsgPeerSource(region.asg, region.ec2, {"spillfleet-us-east-1-l40s": "l40s"}, REGION, 8000, None)()
    assert len(peers) == 2


def test_no_group_yet_means_no_peers(region):
    assert AsgPeerSource(region.asg, region.ec2, {"spillfleet-us-east-1-l40s": "l40s"}, REGION, 8000, None)() == []


def test_a_spot_peer_without_a_spot_price_is_priced_on_demand_and_an_unknown_type_at_zero():
    from fleetcast.config.catalog import instance_catalog

    assert price_of("g6e.xlarge", "eu-west-1", spot=True) == instance_catalog()["g6e.xlarge"].price_per_hour.get(
        "eu-west-1", 0.0)
    assert price_of("x9.nothing", REGION, spot=False) == 0.0


# ------------------------------------------------------------ the refresh loop: jitter, failing safe

class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def stubbed_source() -> tuple[AsgPeerSource, Stubber]:
    """A source whose Auto Scaling client answers what the test queues (botocore's Stubber: real exceptions)."""
    client = boto3.client("autoscaling", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    ec2 = boto3.client("ec2", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    stub.activate()
    return AsgPeerSource(client, ec2, {"g": "l40s"}, REGION, 8000, None), stub


PEER = Peer("i-1", ("10.41.0.11", 8000), "l40s", "g6e.xlarge", False, 1.0)


def test_a_failing_source_keeps_the_last_peers_a_while_then_serves_at_home(monkeypatch):
    source, stub = stubbed_source()
    answers: list[object] = [[PEER]]

    def read() -> list[Peer]:
        answer = answers.pop(0)
        if isinstance(answer, list):
            return answer
        return source()  # the stubbed client raises what was queued

    applied: list[list[Peer]] = []
    clock = Clock()
    loop = PeerDiscovery(read, applied.append, period_s=30.0, clock=clock)

    async def body() -> None:
        assert await loop.refresh() == [PEER]
        stub.add_client_error("describe_auto_scaling_groups", "Throttling", "Rate exceeded", 400)
        answers.append("throttled")
        clock.now = STALE_AFTER * 30.0  # still within the window: the last list stands
        assert await loop.refresh() == [PEER]
        stub.add_client_error("describe_auto_scaling_groups", "AccessDenied", "not authorized", 403)
        answers.append("denied")
        clock.now = STALE_AFTER * 30.0 + 1  # past it: no peers, every request is served at home
        assert await loop.refresh() == []

    asyncio.run(body())
    assert applied == [[PEER], []] and loop.failures == 2


def test_a_source_that_never_answered_means_no_peers():
    def unreachable() -> list[Peer]:
        raise EndpointConnectionError(endpoint_url="https://autoscaling.us-east-1.amazonaws.com")

    applied: list[list[Peer]] = []
    loop = PeerDiscovery(unreachable, applied.append, period_s=30.0, clock=Clock())
    assert asyncio.run(loop.refresh()) == [] and applied == []


def test_a_throttled_call_raises_botocores_client_error_through_the_source():
    source, stub = stubbed_source()
    stub.add_client_error("describe_auto_scaling_groups", "Throttling", "Rate exceeded", 400)
    with pytest.raises(ClientError):
        source()


def test_the_period_is_jittered_within_bounds_so_a_fleet_started_together_does_not_call_in_step():
    import random

    rng = random.Random(7)
    loop = PeerDiscovery(list, lambda peers: None, period_s=30.0, rand=rng.uniform)
    waits = [loop.next_wait_s() for _ in range(500)]
    assert min(waits) >= 30.0 * (1 - JITTER) and max(waits) <= 30.0 * (1 + JITTER)
    assert max(waits) - min(waits) > 30.0 * JITTER  # spread, not one value


def test_the_loop_refreshes_every_period_and_applies_each_answer():
    answers = [[PEER], [], [PEER]]
    applied: list[list[Peer]] = []
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if not answers:
            raise asyncio.CancelledError

    loop = PeerDiscovery(lambda: answers.pop(0), applied.append, period_s=10.0, rand=lambda a, b: 1.0, sleep=sleep)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(loop.run())
    assert applied == [[PEER], [], [PEER]] and waits == [10.0, 10.0, 10.0]


# ------------------------------------------------------------ the gateway's side: Gateway.set_peers

def test_a_refreshed_peer_list_keeps_a_known_peers_state_drops_a_gone_one_and_accepts_claims_only_from_the_list():
    from runtime.gateway.discovery import links_of
    from runtime.gateway.shared import SharedState
    from runtime.gateway.spill import SpillSetup

    from .conftest import run, start_harness, stop_harness

    a = Peer("i-a", ("10.41.0.11", 8000), "l40s", "g6e.xlarge", False, 1.0)
    b = Peer("i-b", ("10.41.0.12", 8000), "l40s", "g6e.xlarge", True, 0.5)
    c = Peer("i-c", ("10.41.0.13", 8000), "l40s", "g6e.xlarge", False, 1.0)

    async def body() -> None:
        shared = SharedState()
        h = await start_harness(shared=shared)
        try:
            gateway = h.gateway
            gateway.set_peers(links_of([a], None))  # before spill is on (no key yet): nothing to keep
            assert gateway.spill is None
            gateway.enable_spill(SpillSetup(REGION, b"k" * 48, "111122223333", {}, {}))
            assert gateway.verifier is not None and gateway.verifier._first_use == shared.first_use  # one table
            gateway.set_peers(links_of([a, b], None))
            assert gateway.spill is not None and gateway.spill.peers == {"10.41.0.11", "10.41.0.12"}
            known = gateway.spill.peer_links[a.name]
            known.breaker.failure()
            gateway.set_peers(links_of([a, c], None))
            assert gateway.spill.peer_links[a.name] is known and known.breaker.failures == 1  # kept, not reset
            assert set(gateway.spill.peer_links) == {a.name, c.name} and set(gateway._spill_pools) == {a.name, c.name}
            assert gateway.spill.peers == {"10.41.0.11", "10.41.0.13"}  # b's claims are no longer accepted
            assert await gateway._from_peer(None, ("10.41.0.13", 5555))
            assert not await gateway._from_peer(None, ("10.41.0.12", 5555))
            gateway.set_peers({})  # discovery failed for long: no peers, everything served at home
            assert not gateway.spill.peer_links and not gateway.spill.peers
        finally:
            await stop_harness(h)

    run(body())
