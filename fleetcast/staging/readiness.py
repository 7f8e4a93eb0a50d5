"""Is a provider region ready for instances: are the config's models, adapters and serving image staged there?

One check, used by `fleetcast stage status` and by `fleetcast deploy` (which holds a new region's
fleets at zero instances until it passes, fleetcast/contract/capacity_hold.py). "Staged" means exactly what an
instance will read: each model's and each LoRA adapter's manifest and every file it names, sha256-verified,
in the region bucket; and the image reference the launch template carries (the derived tag, or the pinned digest)
present in the region's ECR repository.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleetcast.config import FleetConfig
from fleetcast.contract.bucket import adapter_prefix, model_prefix
from fleetcast.contract.capacity_hold import HELD_OUTPUT
from fleetcast.contract.image import image_reference, instance_image_id
from fleetcast.contract.outputs import ProviderOutput, require_output

from .transfer import read_manifest, verify_prefix


def provider_outputs(cfn: Any, stack: str) -> dict[str, str] | None:
    """The stack's outputs, or None when it is not deployed."""
    from fleetcast.aws_session import is_aws_error, translate

    try:
        stacks = cfn.describe_stacks(StackName=stack)["Stacks"]
    except Exception as exc:
        if not is_aws_error(exc):
            raise
        if "does not exist" in str(getattr(exc, "response", {}).get("Error", {}).get("Message", "")):
            return None
        raise translate(exc, service="cloudformation", operation="DescribeStacks",
                        region=cfn.meta.region_name) from None
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}


def model_problems(cfg: FleetConfig, s3: Any, bucket: str) -> list[str]:
    """What is missing or damaged among the staged weights of every model of the config."""
    problems: list[str] = []
    for model in cfg.models:
        prefix = model_prefix(model.id, model.revision)
        manifest = read_manifest(s3, bucket, prefix)
        named = f" {model.id}" if len(cfg.models) > 1 else ""
        if manifest is None:
            problems.append(f"model{named} MISSING: s3://{bucket}/{prefix}manifest.json (run `fleetcast stage model"
                            f"{' --model ' + model.id if named else ''}`)")
        else:
            problems += [f"model {model.id}: {p}" if named else p for p in verify_prefix(s3, bucket, prefix, manifest)]
    return problems


def adapter_problems(cfg: FleetConfig, s3: Any, bucket: str) -> list[str]:
    """What is missing or damaged among the staged LoRA adapters of every model (each line starts
    `adapter <id> `)."""
    problems: list[str] = []
    for model in cfg.models:
        for adapter in model.adapters:
            prefix = adapter_prefix(model.id, model.revision, adapter.id, adapter.revision)
            manifest = read_manifest(s3, bucket, prefix)
            if manifest is None:
                problems.append(f"adapter {adapter.id} of {model.id} MISSING: s3://{bucket}/{prefix}manifest.json (run "
                                f"`fleetcast stage adapter --adapter {adapter.id}`)")
            else:
                problems += [f"adapter {adapter.id} of {model.id}: {p}" for p in verify_prefix(s3, bucket, prefix, manifest)]
    return problems


def image_problems(cfg: FleetConfig, ecr: Any, repository_uri: str) -> list[str]:
    image_id = instance_image_id(cfg)
    name = repository_uri.split("/", 1)[1]
    try:
        ecr.describe_images(repositoryName=name, imageIds=[image_id])
    except ecr.exceptions.ImageNotFoundException:
        return [f"image MISSING: {image_reference(repository_uri, image_id)} (run `fleetcast stage image`)"]
    except ecr.exceptions.RepositoryNotFoundException:
        return [f"image repository {name} not found (deploy the provider stack)"]
    return []


@dataclass(frozen=True)
class RegionReadiness:
    region: str
    deployed: bool  # the provider stack exists
    held: bool  # deployed with its fleets held at zero (the stack's CapacityHeld output)
    problems: tuple[str, ...] = ()

    @property
    def staged(self) -> bool:
        return self.deployed and not self.problems


def region_readiness(cfg: FleetConfig, region: str, clients: Callable[[str, str], Any], stack: str) -> RegionReadiness:
    outputs = provider_outputs(clients("cloudformation", region), stack)
    if outputs is None:
        return RegionReadiness(region, deployed=False, held=False, problems=(f"stack {stack} is not deployed",))
    bucket = require_output(outputs, ProviderOutput.MODEL_BUCKET, stack)
    repository = require_output(outputs, ProviderOutput.IMAGE_REPOSITORY, stack)
    s3 = clients("s3", region)
    problems = model_problems(cfg, s3, bucket) + adapter_problems(cfg, s3, bucket) + \
        image_problems(cfg, clients("ecr", region), repository)
    return RegionReadiness(region, deployed=True, held=outputs.get(HELD_OUTPUT) == "true", problems=tuple(problems))
