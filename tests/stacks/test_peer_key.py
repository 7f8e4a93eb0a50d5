"""Where the peer key lives (issue 36, section 1 and 2): every region whose gateways forward requests signs the
caller's identity with a key only the fleet's instances can read (runtime/gateway/peer.py), and no other region
gets one. A region that spills or is spilled to holds the replicated spill key (tests/stacks/test_spill_stacks.py);
a region that only balances between its own pools gets a key of its own, replicated nowhere; a region of one pool
that neither spills nor is spilled to gets no secret, no read grant and no discovery grant.

Sources:
- Secrets Manager API Reference, CreateSecret, KmsKeyId (https://docs.aws.amazon.com/secretsmanager/latest/
  apireference/API_CreateSecret.html): "If you don't specify this value, then Secrets Manager uses the key
  aws/secretsmanager": the key is encrypted at rest with the region's AWS managed key.
- CloudFormation, AWS::SecretsManager::Secret (https://docs.aws.amazon.com/AWSCloudFormation/latest/
  TemplateReference/aws-resource-secretsmanager-secret.html): ReplicaRegions, "A custom type that specifies a
  Region and the KmsKeyId for a replica secret"; left out, the secret exists in its own region only.
- Secrets Manager API Reference, CreateSecret, ForceOverwriteReplicaSecret (the CreateSecret page): "Specifies whether to
  overwrite a secret with the same name in the destination Region. By default, secrets aren't overwritten": why
  the balancing key has a name of its own (a region that joins spill later gets the spill key's replica while its
  balancing key still exists).
- Secrets Manager User Guide, "Permissions reference for AWS Secrets Manager"
  (https://docs.aws.amazon.com/secretsmanager/latest/userguide/reference_iam-permissions.html): GetSecretValue
  takes the resource type Secret, so the grant names the one secret, in the instance's own region; the ARN ends in
  "the final hyphen and six random characters that Secrets Manager adds at the end of the ARN when you created the
  secret" (Secrets Manager API Reference, GetResourcePolicy, SecretId), hence the name followed by "-??????".
"""

from __future__ import annotations

import json

import pytest

from fleetcast.config import parse_config
from fleetcast.contract.spill import (
    balance_secret_name,
    balanced_regions,
    creates_peer_key,
    keyed_regions,
    peer_regions,
    peer_secret_name,
    peer_secret_of,
)

from .synthesized import default_fleet, spill_fleet, variant_fleet

SEOUL, VIRGINIA = "ap-northeast-2", "us-east-1"


def secrets(fleet, stack: str) -> dict[str, dict]:
    return {r["Properties"]["Name"]: r["Properties"] for r in fleet.resources(stack, "AWS::SecretsManager::Secret").values()}


def statements(fleet, stack: str, sid: str) -> list[dict]:
    return [s for policy in fleet.resources(stack, "AWS::IAM::Policy").values()
            for s in policy["Properties"]["PolicyDocument"]["Statement"] if s.get("Sid") == sid]


def roles(fleet, stack: str) -> set[str]:
    return set(fleet.resources(stack, "AWS::IAM::Role"))


@pytest.fixture(scope="module")
def variant():
    """Seoul with two pools of different GPUs (L40S and A10G) and no spill; us-east-1 with one pool, no spill."""
    return variant_fleet()


def test_a_region_with_several_pools_and_no_spill_gets_its_own_unreplicated_encrypted_key(variant):
    assert balanced_regions(variant.cfg) == (SEOUL,) and not peer_regions(variant.cfg)
    stack = f"{variant.cfg.name}-provider-{SEOUL}"
    name = balance_secret_name(variant.cfg.name)
    found = secrets(variant, stack)
    assert list(found) == [name]  # the key only: the consumers' API keys are not the stack's
    key = found[name]
    assert "ReplicaRegions" not in key  # no claim signed here crosses a region
    assert "KmsKeyId" not in key  # aws/secretsmanager, the region's AWS managed key (CreateSecret, KmsKeyId)
    assert "SecretString" not in key and key["GenerateSecretString"]["PasswordLength"] >= 32


def test_each_pools_role_may_read_exactly_that_key_in_its_own_region_and_discover_its_peers(variant):
    stack = f"{variant.cfg.name}-provider-{SEOUL}"
    name = balance_secret_name(variant.cfg.name)
    grants = statements(variant, stack, "ReadPeerKey")
    assert len(grants) == len(variant.cfg.region(SEOUL).pools)  # one per pool's role
    for grant in grants:
        assert grant["Effect"] == "Allow" and grant["Action"] == "secretsmanager:GetSecretValue"
        account = variant.cfg.provider.account
        assert grant["Resource"] == f"arn:aws:secretsmanager:{SEOUL}:{account}:secret:{name}-??????"
    discovery = statements(variant, stack, "DiscoverPeerInstances")
    assert len(discovery) == len(grants)
    assert all(d["Condition"] == {"StringEquals": {"aws:RequestedRegion": SEOUL}} for d in discovery)


def test_a_region_of_one_pool_without_spill_gets_no_secret_and_no_grant(variant):
    for fleet, region in ((variant, VIRGINIA), *((default_fleet(), r.region) for r in default_fleet().cfg.regions)):
        assert peer_secret_of(fleet.cfg, region) is None and region not in keyed_regions(fleet.cfg)
        stack = f"{fleet.cfg.name}-provider-{region}"
        assert not secrets(fleet, stack)
        assert not statements(fleet, stack, "ReadPeerKey") and not statements(fleet, stack, "DiscoverPeerInstances")


def test_spill_regions_keep_the_one_replicated_key_and_no_balancing_key():
    spill = spill_fleet()
    for region in peer_regions(spill.cfg):
        assert peer_secret_of(spill.cfg, region) == peer_secret_name(spill.cfg.name)
        assert balance_secret_name(spill.cfg.name) not in secrets(spill, f"spillfleet-provider-{region}")


def test_a_spill_region_with_several_pools_balances_with_the_spill_key_and_a_third_region_keeps_its_own():
    """Config level (the stacks build what peer_secret_of and creates_peer_key say: the tests above): us-west-2 is
    spilled to and has two pools, so its gateways balance with the spill key's replica; eu-west-2 only balances."""
    from ruamel.yaml import YAML

    from tests.stacks.synthesized import SPILL_CONFIG

    doc = YAML(typ="safe").load(SPILL_CONFIG.read_text())
    west = next(r for r in doc["regions"] if r["region"] == "us-west-2")
    second = {**west["pools"][0], "name": "a10g", "instance_type": "g5.2xlarge"}
    west["pools"].append(second)
    london = {**json.loads(json.dumps(west)), "region": "eu-west-2", "vpc": {"cidr": "10.43.0.0/16"},
               "availability_zones": [{"name": "eu-west-2a", "id": "euw2-az1"}, {"name": "eu-west-2b", "id": "euw2-az2"}],
               "allowed_principals": ["arn:aws:iam::444455556666:root"]}
    for field in ("endpoint_service_name", "allowed_regions"):
        london.pop(field, None)
    doc["regions"].append(london)
    cfg = parse_config(doc, "<spill plus balancing>")
    assert peer_regions(cfg) == ("us-east-1", "us-west-2")
    assert balanced_regions(cfg) == ("us-west-2", "eu-west-2")
    assert keyed_regions(cfg) == ("us-east-1", "us-west-2", "eu-west-2")
    assert peer_secret_of(cfg, "us-west-2") == peer_secret_name(cfg.name)
    assert peer_secret_of(cfg, "eu-west-2") == balance_secret_name(cfg.name) != peer_secret_name(cfg.name)
    assert [r for r in keyed_regions(cfg) if creates_peer_key(cfg, r)] == ["us-east-1", "eu-west-2"]
