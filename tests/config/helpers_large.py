"""Large but valid configs: many consumers, many provider regions (issue 14 item 11)."""

import copy
import hashlib

from fleetcast.config.rules import az_id_prefix

G6E_REGIONS = ["ap-northeast-2", "us-east-1", "us-east-2", "us-west-2", "ap-northeast-1", "eu-central-1",
               "eu-north-1", "eu-west-2"]


def _hex(seed: str, n: int) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:n]


def with_consumers(doc: dict, count: int) -> dict:
    """`count` Seoul consumers, each its own account, VPC, two subnets and CIDR (ids not repetitive)."""
    doc = copy.deepcopy(doc)
    seoul = doc["regions"][0]
    doc["consumers"] = [c for c in doc["consumers"] if c["service_region"] != "ap-northeast-2"]
    for i in range(count):
        account = f"{500000000000 + i * 7919:012d}"
        seoul["allowed_principals"].append(f"arn:aws:iam::{account}:root")
        doc["consumers"].append({
            "name": f"team-{_hex(f'n{i}', 6)}",
            "account": account,
            "region": "ap-northeast-2",
            "service_region": "ap-northeast-2",
            "vpc_id": f"vpc-{_hex(f'v{i}', 17)}",
            "subnets": [{"id": f"subnet-{_hex(f's{i}a', 17)}", "az_id": "apne2-az1"},
                        {"id": f"subnet-{_hex(f's{i}b', 17)}", "az_id": "apne2-az3"}],
            "cidrs": [f"10.{100 + i // 250}.{i % 250}.0/24"],
            "endpoint_service_name": "com.amazonaws.vpce.ap-northeast-2.vpce-svc-0a1b2c3d4e5f60718",
            "limits": {"max_concurrency": 1 + i % 64, "requests_per_minute": 100 + i},
        })
    return doc


def with_regions(doc: dict, count: int) -> dict:
    """`count` provider regions (every region g6e is offered in), each with its own VPC range."""
    doc = copy.deepcopy(doc)
    template = doc["regions"][1]
    doc["regions"] = []
    for i, name in enumerate(G6E_REGIONS[:count]):
        region = copy.deepcopy(template)
        region.update(region=name, allowed_regions=[], vpc={"cidr": f"10.{40 + i}.0.0/16"},
                      availability_zones=[{"name": f"{name}a", "id": f"{az_id_prefix(name)}-az1"},
                                          {"name": f"{name}b", "id": f"{az_id_prefix(name)}-az2"}])
        region["allowed_principals"] = ["arn:aws:iam::444455556666:root", "arn:aws:iam::777788889999:root"]
        doc["regions"].append(region)
    for consumer in doc["consumers"]:
        if consumer["cidrs"][0].startswith("10.4"):
            consumer["cidrs"] = ["172.16.0.0/16"]
    doc["consumers"] = [c for c in doc["consumers"] if c["region"] == c["service_region"]]
    return doc
