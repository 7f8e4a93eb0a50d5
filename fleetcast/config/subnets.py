"""The subnets a created VPC is carved into: one home for their sizes, shared by stacks/network.py and validate.

`plan_subnets` follows the allocator of CDK's `IpAddresses.cidr` (aws-ec2 NetworkBuilder.addSubnets):
subnets are taken in configuration order, one per AZ, each aligned to its own size, from the
start of the VPC; a subnet that does not fit is what synth would refuse ("1 of /20 exceeds
remaining space of ..."), so validate refuses it first, naming the smallest VPC that fits.
tests/config/test_network_rules.py checks the plan against CDK's own allocator.
"""

from __future__ import annotations

import ipaddress

FLEET_SUBNET_MASK = 20   # instances, NLB and endpoints: room for large pools and their ENIs
PUBLIC_SUBNET_MASK = 24  # NAT gateways only (egress `nat`)


def subnet_masks(az_count: int, nat: bool) -> list[int]:
    """The masks of the subnets the stack requests, in CDK's allocation order."""
    groups = ([PUBLIC_SUBNET_MASK] if nat else []) + [FLEET_SUBNET_MASK]
    return [mask for mask in groups for _ in range(az_count)]


def plan_subnets(cidr: str, az_count: int, nat: bool) -> list[str] | None:
    """The subnet CIDRs carved from `cidr`, or None when they do not fit."""
    network = ipaddress.IPv4Network(cidr)
    start, end = int(network.network_address), int(network.broadcast_address)
    out = []
    for mask in subnet_masks(az_count, nat):
        size = 2 ** (32 - mask)
        if start + size - 1 > end:
            return None
        first = (start + size - 1) // size * size  # CDK aligns the block that holds start+size-1
        if first + size - 1 > end:
            return None
        out.append(f"{ipaddress.IPv4Address(first)}/{mask}")
        start = first + size
    return out


def smallest_prefix(az_count: int, nat: bool) -> int:
    """The largest prefix length (smallest VPC) whose CIDR holds the plan, for the message."""
    for prefix in range(28, 15, -1):
        if plan_subnets(f"10.0.0.0/{prefix}", az_count, nat) is not None:
            return prefix
    return 16
