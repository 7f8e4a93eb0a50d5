"""`fleetcast deploy` on a fresh account: fleets stay at zero instances until their region is staged.

Against loopback AWS (moto): CloudFormation stacks, the region buckets and ECR repositories are real
API objects. The stand-in for `cdk deploy` does what CloudFormation does with the synthesized stack that
matters here: it creates or updates each named provider stack with its outputs, `CapacityHeld` among them
exactly when `-c hold_capacity` names the region (stacks/provider.py emits it only then).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from ruamel.yaml import YAML

from fleetcast.config import parse_config
from fleetcast.contract.bucket import model_prefix
from fleetcast.contract.capacity_hold import HELD_OUTPUT, HOLD_CONTEXT, parse_held_regions
from fleetcast.contract.errors import UserError
from fleetcast.contract.manifest import build_manifest
from fleetcast.contract.names import provider_stack_name
from fleetcast.deploy import execute, plan
from fleetcast.staging.image import image_tag
from fleetcast.staging.transfer import TreeUploader

CONFIG = Path(__file__).resolve().parents[2] / "config" / "fleet.yaml"
REGIONS = ("ap-northeast-2", "us-east-1")


@pytest.fixture
def cfg():
    """The shipped config under a fresh fleet name: stack, bucket and repository names of its own."""
    doc = YAML(typ="safe").load(CONFIG.read_text())
    doc["name"] = f"fc{uuid.uuid4().hex[:8]}"
    return parse_config(doc, "<first-deploy>")


class Account:
    """One loopback account: what `cdk deploy` and `fleetcast stage` leave behind, read through real clients."""

    def __init__(self, endpoint: str, cfg):
        self.endpoint, self.cfg = endpoint, cfg
        self.deploys: list[list[str]] = []

    def client(self, service: str, region: str):
        return boto3.client(service, region_name=region, endpoint_url=self.endpoint)

    def _bucket(self, region: str) -> str:
        return f"{self.cfg.name}-models-{region}"

    def _repository(self, region: str) -> str:
        ecr = self.client("ecr", region)
        name = f"{self.cfg.name}/tensorrt-llm"
        try:
            return ecr.create_repository(repositoryName=name)["repository"]["repositoryUri"]
        except ecr.exceptions.RepositoryAlreadyExistsException:
            return ecr.describe_repositories(repositoryNames=[name])["repositories"][0]["repositoryUri"]

    def cdk(self, command: list[str]) -> SimpleNamespace:
        """`npx cdk deploy ... STACKS [-c hold_capacity=...]`, as CloudFormation applies it."""
        assert "deploy" in command and command[command.index("deploy") - 1].endswith("cdk"), command
        self.deploys.append(command)
        held = set()
        for i, arg in enumerate(command):
            if arg == "-c" and command[i + 1].startswith(f"{HOLD_CONTEXT}="):
                held = parse_held_regions(command[i + 1].split("=", 1)[1])
        for region in REGIONS:
            stack = provider_stack_name(self.cfg.name, region)
            if stack not in command:
                continue
            s3 = self.client("s3", region)
            bucket = self._bucket(region)
            kwargs = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
            if bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
                s3.create_bucket(Bucket=bucket, **kwargs)
            outputs = {"ModelBucketName": {"Value": bucket}, "ImageRepositoryUri": {"Value": self._repository(region)}}
            if region in held:
                outputs[HELD_OUTPUT] = {"Value": "true"}
            body = json.dumps({"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
                               "Outputs": outputs})
            cfn = self.client("cloudformation", region)
            try:
                cfn.describe_stacks(StackName=stack)
                cfn.update_stack(StackName=stack, TemplateBody=body)
            except cfn.exceptions.ClientError as exc:
                if "does not exist" not in str(exc):
                    raise
                cfn.create_stack(StackName=stack, TemplateBody=body)
        return SimpleNamespace(returncode=0)

    def stage(self, region: str, tmp_path: Path, *, model: bool = True, image: bool = True) -> None:
        """What `fleetcast stage model` / `stage image` leave in a region: the manifest-verified model
        files, and the derived image under its tag."""
        if model:
            weights = tmp_path / "weights"
            weights.mkdir(exist_ok=True)
            (weights / "config.json").write_text('{"n_positions": 1024}')
            (weights / "model.safetensors").write_bytes(os.urandom(4096))
            manifest = build_manifest(weights, kind="model", name=self.cfg.model.id, revision=self.cfg.model.revision)
            TreeUploader(self.client("s3", region), self._bucket(region)).upload(
                weights, model_prefix(self.cfg.model.id, self.cfg.model.revision), manifest)
        if image:
            manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 7,
                                   "digest": "sha256:" + "2" * 64}, "layers": []}
            self._repository(region)
            self.client("ecr", region).put_image(repositoryName=f"{self.cfg.name}/tensorrt-llm",
                                                 imageManifest=json.dumps(manifest),
                                                 imageTag=image_tag(self.cfg, derived=True))

    def held(self, region: str) -> bool:
        outputs = self.client("cloudformation", region).describe_stacks(
            StackName=provider_stack_name(self.cfg.name, region))["Stacks"][0].get("Outputs", [])
        return any(o["OutputKey"] == HELD_OUTPUT and o["OutputValue"] == "true" for o in outputs)


@pytest.fixture
def account(aws_env, cfg):
    return Account(aws_env, cfg)


def deploy(cfg, account, steps, log=None):
    """Run `steps` of the deploy plan, previews skipped (they are other commands' business)."""
    lines = [] if log is None else log
    commands = plan(cfg, "config/fleet.yaml", account.client, steps=steps)
    for step in commands:
        step.preview = []
    execute(commands, dry_run=False, run=account.cdk, log=lines.append)
    return lines


def hold_of(command: list[str]) -> frozenset[str]:
    values = [command[i + 1].split("=", 1)[1] for i, a in enumerate(command)
              if a == "-c" and command[i + 1].startswith(f"{HOLD_CONTEXT}=")]
    return parse_held_regions(values[0]) if values else frozenset()


def test_first_deploy_holds_every_new_region_until_it_is_staged(cfg, account, tmp_path):
    log = deploy(cfg, account, ["providers"])
    assert hold_of(account.deploys[-1]) == set(REGIONS)
    assert all(account.held(r) for r in REGIONS)
    assert any("new stack, not staged yet" in line for line in log)

    # Nothing staged: capacity refuses and names what is missing in each region; nothing is deployed.
    before = len(account.deploys)
    with pytest.raises(UserError) as refused:
        deploy(cfg, account, ["capacity"])
    message = str(refused.value)
    assert "model MISSING" in message and "image MISSING" in message and all(r in message for r in REGIONS)
    assert "--step capacity" in message and len(account.deploys) == before

    # Seoul staged, Virginia has only its model: Seoul gets its capacity, Virginia stays held.
    account.stage("ap-northeast-2", tmp_path)
    account.stage("us-east-1", tmp_path, image=False)
    with pytest.raises(UserError, match=r"us-east-1: image MISSING: .*:" + image_tag(cfg, derived=True)):
        deploy(cfg, account, ["capacity"])
    released = account.deploys[-1]
    assert provider_stack_name(cfg.name, "ap-northeast-2") in released and provider_stack_name(cfg.name, "us-east-1") not in released
    assert hold_of(released) == frozenset()
    assert not account.held("ap-northeast-2") and account.held("us-east-1")

    # Virginia's image arrives: the next capacity run deploys Virginia alone.
    account.stage("us-east-1", tmp_path, model=False)
    deploy(cfg, account, ["capacity"])
    assert provider_stack_name(cfg.name, "us-east-1") in account.deploys[-1]
    assert provider_stack_name(cfg.name, "ap-northeast-2") not in account.deploys[-1]
    assert not any(account.held(r) for r in REGIONS)

    # Nothing held any more: capacity deploys nothing, providers deploys without a hold.
    count = len(account.deploys)
    deploy(cfg, account, ["capacity"])
    assert len(account.deploys) == count
    deploy(cfg, account, ["providers"])
    assert hold_of(account.deploys[-1]) == frozenset()


def test_a_serving_region_is_never_held_even_if_not_staged(cfg, account):
    account.cdk(["npx", "cdk", "deploy", *(provider_stack_name(cfg.name, r) for r in REGIONS)])  # released fleets, nothing staged
    log = deploy(cfg, account, ["providers"])
    assert hold_of(account.deploys[-1]) == frozenset()
    assert sum("WARNING: serving, but model MISSING" in line for line in log) == len(REGIONS)


def test_a_held_region_that_is_staged_by_the_next_providers_deploy_is_released_there(cfg, account, tmp_path):
    deploy(cfg, account, ["providers"])
    for region in REGIONS:
        account.stage(region, tmp_path)
    deploy(cfg, account, ["providers"])
    assert hold_of(account.deploys[-1]) == frozenset() and not any(account.held(r) for r in REGIONS)


def test_the_full_plan_stages_between_the_held_deploy_and_the_capacity_step(cfg):
    names = [s.name for s in plan(cfg, "c.yaml", clients=None, steps=["providers", "stage", "capacity", "publish"])]
    assert names == ["providers", "stage", "capacity", "publish"]
