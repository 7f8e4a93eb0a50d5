"""The example config made deployable: every placeholder replaced by what a real account would have.

Tests that run `fleetcast deploy` past its readiness check (fleetcast/config/readiness.py) use it."""

from __future__ import annotations

from pathlib import Path

from ruamel.yaml import YAML

DEFAULT = Path(__file__).resolve().parents[1] / "config" / "fleet.yaml"
PROVIDER = "350093174826"


def ready_doc() -> dict:
    doc = YAML(typ="safe").load(DEFAULT.read_text())
    doc["provider"]["account"] = PROVIDER
    doc["model"]["revision"] = "ef4c64bbd5b9b8cbc1b0b6dfe8b72c9e6e4f5c3a"
    doc["regions"][0]["ami"] = {"id": "ami-0c9e2b71f4d8a3056"}
    doc["regions"][1]["ami"] = {"id": "ami-07d5e1c3b9a2f4861"}
    doc["regions"][0]["allowed_principals"] = ["arn:aws:iam::502118763940:root"]
    doc["regions"][1]["allowed_principals"] = ["arn:aws:iam::617245309881:root"]
    for consumer, account, vpc, subnets in (
            (doc["consumers"][0], "502118763940", "vpc-0d93f1a7c2e4b6085", ("subnet-05c8e2f19a7d3b640", "subnet-0b71d4e9c3a2f5086")),
            (doc["consumers"][1], "617245309881", "vpc-0e2a9c7f5b1d38064", ("subnet-0a94f1c7e3b5d2086", "subnet-09d3b7e1f5c2a4068"))):
        consumer["account"] = account
        consumer["vpc_id"] = vpc
        for entry, subnet in zip(consumer["subnets"], subnets):
            entry["id"] = subnet
        consumer.pop("endpoint_service_name")
    return doc


def write_ready_config(path: Path) -> Path:
    YAML().dump(ready_doc(), path)
    return path
