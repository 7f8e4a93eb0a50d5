"""The instance role's grant for peer discovery (runtime/gateway/discovery.py): exactly the two read actions the
gateway calls, in the regions whose gateways hold the peer key, limited to the instance's own region.

Service Authorization Reference (the primary source for what a policy can scope):
- Amazon EC2 Auto Scaling (https://docs.aws.amazon.com/service-authorization/latest/reference/
  list_amazonec2autoscaling.html): DescribeAutoScalingGroups, "Grants permission to describe one or more Auto
  Scaling groups", access level List, no resource type and no condition key: Resource must be "*".
- Amazon EC2 (https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2.html):
  DescribeInstances, access level List, no resource type and no condition key: Resource must be "*".
- What is left to narrow it is a global key: aws:RequestedRegion, "the AWS Region that was called in the request"
  (IAM User Guide, "AWS global condition context keys", https://docs.aws.amazon.com/IAM/latest/UserGuide/
  reference_policies_condition-keys.html#condition-keys-requestedregion), type String.
"""

from __future__ import annotations

from fleetcast.contract.spill import PEER_DISCOVERY_ACTIONS, peer_regions

from .synthesized import default_fleet, spill_fleet

# The actions the gateway's discovery calls, as boto3 operation names (runtime/gateway/discovery.py): the grant
# must hold each and nothing else.
CALLED = {"describe_auto_scaling_groups": "autoscaling:DescribeAutoScalingGroups",
          "describe_instances": "ec2:DescribeInstances"}


def discovery_grants(fleet, stack: str) -> list[dict]:
    return [statement for policy in fleet.resources(stack, "AWS::IAM::Policy").values()
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]
            if statement.get("Sid") == "DiscoverPeerInstances"]


def test_the_grant_is_exactly_the_calls_discovery_makes():
    import inspect

    from runtime.gateway import discovery

    source = inspect.getsource(discovery.AsgPeerSource)
    called = {CALLED[name] for name in CALLED if f'"{name}"' in source}
    assert called == set(PEER_DISCOVERY_ACTIONS) == set(CALLED.values())


def test_each_peer_regions_instance_roles_may_discover_peers_only_in_their_own_region():
    fleet = spill_fleet()
    regions = peer_regions(fleet.cfg)
    assert regions == ("us-east-1", "us-west-2")
    for region in regions:
        grants = discovery_grants(fleet, f"spillfleet-provider-{region}")
        assert grants, region  # one per pool's role
        for grant in grants:
            assert sorted(grant["Action"]) == sorted(PEER_DISCOVERY_ACTIONS)
            assert grant["Resource"] == "*" and grant["Effect"] == "Allow"
            assert grant["Condition"] == {"StringEquals": {"aws:RequestedRegion": region}}


def test_a_fleet_that_never_spills_grants_no_discovery():
    """No peer key there, so the gateway does not discover (runtime/gateway/__main__.py `discovers`)."""
    fleet = default_fleet()
    assert not peer_regions(fleet.cfg)
    for region in fleet.cfg.regions:
        assert not discovery_grants(fleet, f"fleetcast-provider-{region.region}")
