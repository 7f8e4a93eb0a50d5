"""consumers[].spill_regions and consumers[].failover_region (issue 36, section 2): strict residency by default,
and a region a consumer's requests may be served in is refused at validate unless it exists, is another region,
serves every model the consumer may call at home, and allows the connection (allowed_principals,
allowed_regions: the endpoint service's SupportedRegions).

Sources: AWS PrivateLink Guide, "Share your services through AWS PrivateLink", section "Cross-Region access"
(https://docs.aws.amazon.com/vpc/latest/privatelink/privatelink-share-your-services.html#endpoint-service-cross-region):
the service provider lists the Regions consumers may connect from (SupportedRegions) and grants the principals
that may connect; CloudFormation, AWS::EC2::VPCEndpoint ServiceRegion (the interface endpoint's service Region).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ruamel.yaml import YAML

from fleetcast.config import parse_config
from fleetcast.contract.spill import (
    built_spill_targets,
    failover_consumers,
    pending_spill_reason,
    spill_endpoint_parameter,
    spill_sources,
    spill_targets,
)

from .conftest import problems

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spill" / "fleet.yaml"


@pytest.fixture
def spill() -> dict:
    """examples/spill/fleet.yaml: checkout (home us-east-1) spills to and fails over to us-west-2."""
    return YAML(typ="safe").load(EXAMPLE.read_text())


def checkout(doc: dict) -> dict:
    return doc["consumers"][0]


def test_the_example_validates_and_a_consumer_without_spill_keeps_strict_residency(spill):
    cfg = parse_config(spill)
    assert cfg.consumers[0].spill_regions == ("us-west-2",)
    assert cfg.consumers[1].spill_regions == () and cfg.consumers[1].failover_region is None


def test_the_pairs_the_stacks_build_follow_the_consumers(spill):
    cfg = parse_config(spill)
    assert spill_targets(cfg, "us-east-1") == ("us-west-2",) and spill_targets(cfg, "us-west-2") == ()
    assert spill_sources(cfg, "us-west-2") == ("us-east-1",) and spill_sources(cfg, "us-east-1") == ()
    assert [c.name for c in failover_consumers(cfg, "us-west-2")] == ["checkout"]
    assert built_spill_targets(cfg, "us-east-1") == ("us-west-2",)
    assert spill_endpoint_parameter("spillfleet", "us-west-2") == "/spillfleet/spill/us-west-2"


def test_an_unpublished_remote_service_leaves_the_spill_endpoint_pending_with_the_reason(spill):
    del spill["regions"][1]["endpoint_service_name"]
    cfg = parse_config(spill)
    assert built_spill_targets(cfg, "us-east-1") == ()
    reason = pending_spill_reason(cfg, "us-east-1", "us-west-2")
    assert reason is not None and "regions[us-west-2].endpoint_service_name" in reason


def test_defaults_dump_as_before_the_fields_existed(doc):
    """The config parameter (and so the digest) of a config without spill stays byte-identical."""
    dumped = parse_config(doc).model_dump(mode="json")
    assert all("spill_regions" not in c and "failover_region" not in c for c in dumped["consumers"])
    assert all("endpoint_service_name" not in r for r in dumped["regions"])


def test_the_home_region_is_refused(spill):
    checkout(spill)["spill_regions"] = ["us-east-1"]
    (msg,) = problems(spill)
    assert msg.startswith("consumers[0].spill_regions[0]:")
    assert "is the consumer's service_region" in msg and "allowed: us-west-2" in msg


def test_a_region_without_a_provider_entry_is_refused_naming_what_is_allowed(spill):
    checkout(spill)["spill_regions"] = ["us-east-2"]
    (msg,) = problems(spill)
    assert msg.startswith("consumers[0].spill_regions[0]:")
    assert "us-east-2 is not a provider region of this fleet; allowed: us-west-2" in msg


def test_a_duplicate_is_refused(spill):
    checkout(spill)["spill_regions"] = ["us-west-2", "us-west-2"]
    (msg,) = problems(spill)
    assert msg.startswith("consumers[0].spill_regions[1]:") and "listed 2 times" in msg


def test_a_region_that_lacks_a_model_the_consumer_may_call_is_refused(spill):
    """Spill and failover carry every model the consumer may call at home: a region lacking one is refused."""
    doc = spill
    base = doc.pop("model")
    doc["models"] = [base, {**base, "id": "gpt2-medium", "source": "openai-community/gpt2-medium"}]
    doc["regions"][0]["pools"][0]["serves"] = [{"model": "gpt2-xl"}, {"model": "gpt2-medium"}]
    doc["regions"][1]["pools"][0]["serves"] = [{"model": "gpt2-xl"}]
    msgs = problems(doc)
    assert any(m.startswith("consumers[0].spill_regions[0]:") and "us-west-2 serves none of gpt2-medium" in m
               for m in msgs), msgs
    assert any(m.startswith("consumers[0].failover_region:") and "gpt2-medium" in m for m in msgs), msgs
    # A consumer not entitled to the missing model may spill there.
    doc["models"][1]["consumers"] = ["reports"]
    assert [m for m in problems(doc) if "spill_regions" in m or "failover_region" in m] == []


def test_the_remote_service_must_allow_the_providers_own_account_from_home(spill):
    spill["regions"][1]["allowed_principals"] = ["arn:aws:iam::444455556666:root"]
    spill["regions"][1]["allowed_regions"] = []
    msgs = problems(spill)
    assert any(m.startswith("consumers[0].spill_regions[0]:")
               and "add arn:aws:iam::111122223333:root there" in m for m in msgs), msgs
    assert any(m.startswith("consumers[0].spill_regions[0]:")
               and "allowed_regions (SupportedRegions) does not list" in m for m in msgs), msgs


def test_a_pair_off_the_cross_region_table_is_refused(spill):
    """ap-northeast-2 is not on the shipped cross-region PrivateLink table (fleetcast/config/data)."""
    west = spill["regions"][1]
    west.update(region="ap-northeast-2", availability_zones=[{"name": "ap-northeast-2a", "id": "apne2-az1"},
                                    {"name": "ap-northeast-2c", "id": "apne2-az3"}])
    west.pop("endpoint_service_name")
    checkout(spill)["spill_regions"] = ["ap-northeast-2"]
    del checkout(spill)["failover_region"]
    msgs = problems(spill)
    assert any(m.startswith("consumers[0].spill_regions[0]:") and "not in the supported table" in m
               for m in msgs), msgs


def test_failover_to_home_or_without_the_consumers_principal_is_refused(spill):
    checkout(spill)["failover_region"] = "us-east-1"
    (msg,) = problems(spill)
    assert msg.startswith("consumers[0].failover_region:") and "is the consumer's service_region" in msg
    checkout(spill)["failover_region"] = "us-west-2"
    spill["regions"][1]["allowed_principals"] = ["arn:aws:iam::111122223333:root"]
    (msg,) = problems(spill)
    assert msg.startswith("consumers[0].failover_region:") and "account 444455556666" in msg


def test_a_region_service_name_of_another_region_or_disagreeing_with_a_consumers_is_refused(spill):
    spill["regions"][1]["endpoint_service_name"] = "com.amazonaws.vpce.us-east-1.vpce-svc-0a1b2c3d4e5f60719"
    (msg,) = problems(spill)
    assert msg.startswith("regions[1].endpoint_service_name:") and "not us-west-2" in msg
    spill = YAML(typ="safe").load(EXAMPLE.read_text())
    checkout(spill)["endpoint_service_name"] = "com.amazonaws.vpce.us-east-1.vpce-svc-0a1b2c3d4e5f60700"
    (msg,) = problems(spill)
    assert msg.startswith("consumers[0].endpoint_service_name:") and "not us-east-1's endpoint service" in msg


def test_publishing_a_service_name_or_allowing_spill_rolls_no_instance(spill):
    """Instances find the spill endpoint in its parameter at run time: neither regions[].endpoint_service_name
    nor a consumer's spill_regions or failover_region is an instance input (NOT_IN_INSTANCE_DIGEST)."""
    before = parse_config(spill)
    del spill["regions"][1]["endpoint_service_name"]
    del checkout(spill)["spill_regions"], checkout(spill)["failover_region"]
    after = parse_config(spill)
    assert after.digest() != before.digest()
    for region in before.regions:
        for pool in region.pools:
            assert after.instance_digest(region.region, pool.name) == before.instance_digest(region.region, pool.name)
