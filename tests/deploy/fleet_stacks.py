"""Provider stacks as CloudFormation lists them, created in moto (tests/conftest.py aws_env): only what
fleetcast.deployed.other_fleets reads, the stack's name and its outputs."""

from __future__ import annotations

import json

import boto3

from fleetcast.contract.names import provider_stack_name
from fleetcast.contract.outputs import ProviderOutput


def create_stack(name: str, region: str, outputs: dict[str, str]) -> None:
    template = {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
                "Outputs": {key: {"Value": value} for key, value in outputs.items()}}
    boto3.client("cloudformation", region_name=region).create_stack(StackName=name, TemplateBody=json.dumps(template))


def create_provider_stack(fleet: str, region: str) -> str:
    name = provider_stack_name(fleet, region)
    create_stack(name, region, {ProviderOutput.ENDPOINT_SERVICE_NAME.value:
                                f"com.amazonaws.vpce.{region}.vpce-svc-0a1b2c3d4e5f60718"})
    return name
