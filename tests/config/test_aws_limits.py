"""One test per cross-field / AWS-limit rule (issue 14 item 9): each names the path and what is allowed.

The limits are checked against their primary sources where a copy ships with the project's
dependencies: the AWS API models in botocore (the AWS API Reference text) and CDK's own VPC
allocator (aws-cdk-lib aws-ec2 NetworkBuilder, through jsii).
"""

import re

import botocore.loaders
import pytest

from fleetcast.config import model as config_model, rules
from fleetcast.config.subnets import plan_subnets

from .conftest import problems


def the_one(data) -> str:
    found = problems(data)
    assert len(found) == 1, found
    return found[0]


def _aws_doc(service: str, shape: str, member: str | None = None) -> str:
    model = botocore.loaders.Loader().load_service_model(service, "service-2")
    node = model["shapes"][shape]
    if member:
        node = node["members"][member]
    return re.sub(r"<[^>]+>", "", node["documentation"])


# ---------------------------------------------------------------- accounts and networks


def test_provider_account_cannot_be_a_consumer(doc):
    doc["consumers"][0]["account"] = doc["provider"]["account"]
    doc["regions"][0]["allowed_principals"].append(f"arn:aws:iam::{doc['provider']['account']}:root")
    msg = the_one(doc)
    assert msg.startswith("consumers[0].account:") and "is the provider account" in msg


def test_provider_vpcs_may_not_overlap(doc):
    doc["regions"][1]["vpc"]["cidr"] = "10.40.128.0/17"
    msg = the_one(doc)
    assert msg.startswith("regions[1].vpc.cidr:") and "overlaps ap-northeast-2's VPC 10.40.0.0/16" in msg


def test_consumer_cidr_may_not_overlap_its_provider_vpc(doc):
    doc["consumers"][0]["cidrs"] = ["10.60.0.0/16", "10.40.16.0/20"]
    msg = the_one(doc)
    assert msg.startswith("consumers[0].cidrs[1]:") and "overlaps the ap-northeast-2 fleet VPC 10.40.0.0/16" in msg


@pytest.mark.parametrize("cidr", ["10.40.0.0/15", "10.40.0.0/29"])
def test_vpc_cidr_between_16_and_28(doc, cidr):
    # Amazon VPC User Guide, "VPC CIDR blocks": "The allowed block size is between a /16 netmask
    # (65,536 IP addresses) and /28 netmask (16 IP addresses)."
    doc["regions"][0]["vpc"]["cidr"] = cidr
    msg = the_one(doc)
    assert msg.startswith("regions[0].vpc.cidr:") and "between /16 and /28" in msg


def test_created_vpc_must_hold_the_carved_subnets(doc):
    doc["regions"][0]["vpc"]["cidr"] = "10.40.0.0/20"  # validated, then failed synth with a traceback
    msg = the_one(doc)
    assert msg.startswith("regions[0].vpc.cidr:")
    assert "too small for the subnets the stack carves (one /20 per AZ, 2 AZs)" in msg and "/19 or larger" in msg


def test_nat_egress_needs_room_for_the_public_subnets_too(doc):
    doc["network"]["egress"] = "nat"
    doc["regions"][0]["vpc"]["cidr"] = "10.40.0.0/19"  # two /24s first, then the /20s aligned: needs a /18
    msg = the_one(doc)
    assert "public /24 per AZ (egress nat)" in msg and "/18 or larger" in msg


@pytest.mark.parametrize("cidr,azs,nat", [
    ("10.40.0.0/16", 2, False), ("10.40.0.0/19", 2, False), ("10.40.0.0/20", 2, False), ("10.40.0.0/18", 3, False),
    ("10.40.0.0/18", 2, True), ("10.40.0.0/19", 2, True), ("10.40.0.0/17", 3, True), ("10.40.0.0/18", 3, True),
])
def test_subnet_plan_matches_cdks_allocator(cidr, azs, nat):
    """The same subnets (or the same refusal) as CDK's IpAddresses.cidr for the stack's subnet configuration."""
    from aws_cdk import aws_ec2 as ec2

    from fleetcast.config.subnets import subnet_masks

    requested = [ec2.RequestedSubnet(subnet_construct_id=f"S{i}", availability_zone=f"az{i}", configuration=ec2.SubnetConfiguration(
        name=f"g{mask}", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED, cidr_mask=mask))
        for i, mask in enumerate(subnet_masks(azs, nat))]
    try:
        allocated = ec2.IpAddresses.cidr(cidr).allocate_subnets_cidr(
            vpc_cidr=cidr, requested_subnets=requested).allocated_subnets
        cdk = [s.cidr for s in allocated]
    except Exception as exc:  # noqa: BLE001 - jsii raises a plain Exception: "1 of /20 exceeds remaining space of ..."
        assert "exceeds remaining space" in str(exc)
        cdk = None
    assert plan_subnets(cidr, azs, nat) == cdk


def test_existing_vpc_subnet_listed_twice(doc):
    doc["regions"][0]["vpc"] = {"vpc_id": "vpc-0123456789abcdef0", "cidr": "10.40.0.0/16",
                                "subnet_ids": ["subnet-0123456789abcdef1", "subnet-0123456789abcdef1"],
                                "route_table_ids": ["rtb-0123456789abcdef1"]}
    msg = the_one(doc)
    assert msg.startswith("regions[0].vpc.subnet_ids[1]:") and "listed twice" in msg


def test_consumer_subnet_listed_twice(doc):
    doc["consumers"][0]["subnets"][1] = dict(doc["consumers"][0]["subnets"][0])
    msg = the_one(doc)
    assert msg.startswith("consumers[0].subnets[1].id:") and "listed twice" in msg


def test_consumer_endpoint_takes_one_subnet_per_az(doc):
    doc["consumers"][0]["subnets"][1]["az_id"] = "apne2-az1"
    msg = the_one(doc)
    assert msg.startswith("consumers[0].subnets[1].az_id:") and "at most one subnet per AZ ID" in msg


def test_endpoint_service_name_of_another_region(doc):
    doc["consumers"][0]["endpoint_service_name"] = "com.amazonaws.vpce.us-east-1.vpce-svc-0a1b2c3d4e5f60718"
    msg = the_one(doc)
    assert msg.startswith("consumers[0].endpoint_service_name:")
    assert "in us-east-1, but service_region is ap-northeast-2" in msg and "com.amazonaws.vpce.ap-northeast-2." in msg


# ---------------------------------------------------------------- pools


def test_warm_pool_larger_than_capacity_max(doc):
    doc["regions"][0]["pools"][0]["warm_pool"] = {"size": 7}
    msg = the_one(doc)
    assert msg.startswith("regions[0].pools[0].warm_pool.size:") and "allowed: 0..6" in msg


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_scaling_target_must_be_finite(doc, value):
    from ruamel.yaml import YAML
    doc["regions"][0]["pools"][0]["scaling"]["target"] = YAML(typ="safe").load(value)
    msg = the_one(doc)
    assert msg.startswith("regions[0].pools[0].scaling.target:") and "finite number" in msg


def test_kv_cache_target_is_a_percentage(doc):
    doc["regions"][0]["pools"][0]["scaling"] = {"metric": "kv_cache_utilization", "target": 150}
    msg = the_one(doc)
    assert msg.startswith("regions[0].pools[0].scaling.target:") and "above 100" in msg


def test_kv_cache_target_given_as_a_fraction(doc):
    doc["regions"][0]["pools"][0]["scaling"] = {"metric": "kv_cache_utilization", "target": 0.7}
    msg = the_one(doc)
    assert "looks like a fraction: write 70 for 70%" in msg


def test_load_target_above_max_batch_size(doc):
    doc["regions"][0]["pools"][0]["scaling"]["target"] = 500
    msg = the_one(doc)
    assert msg.startswith("regions[0].pools[0].scaling.target:") and "max_batch_size 64" in msg
    assert "allowed: up to 64" in msg


# ---------------------------------------------------------------- tags


def test_tag_limits_are_awss():
    """AWS API Reference, Tag (the same restriction text in every service's model; ECS's is read here)."""
    text = _aws_doc("ecs", "Tag")
    assert f"Maximum number of tags per resource - {rules.MAX_TAGS_PER_RESOURCE}" in text
    assert "Maximum key length - 128 Unicode characters" in text
    assert "Maximum value length - 256 Unicode characters" in text
    assert "the following characters: " + " ".join(rules.TAG_PUNCTUATION) + "." in text
    assert "Do not use aws:, AWS:, or any upper or lowercase combination" in text
    field = config_model.FleetConfig.model_fields["tags"]
    schema = config_model.FleetConfig.model_json_schema()["properties"]["tags"]
    assert schema["propertyNames"]["maxLength"] == 128 and schema["additionalProperties"]["maxLength"] == 256, field


def test_too_many_tags(doc):
    doc["tags"] = {f"k{i}": "v" for i in range(49)}
    msg = the_one(doc)
    assert msg.startswith("tags:") and "AWS allows 50 per resource" in msg and "at most 48" in msg
    doc["tags"] = {f"k{i}": "v" for i in range(48)}
    assert problems(doc) == []


@pytest.mark.parametrize("tags", [{"aws:owner": "me"}, {"AWS:owner": "me"}, {"owner": "aws:me"}])
def test_reserved_aws_prefix(doc, tags):
    doc["tags"] = tags
    msg = the_one(doc)
    assert "starts with 'aws:', which AWS reserves" in msg


def test_tag_characters_aws_refuses(doc):
    doc["tags"] = {"cost center": "R&D #1", "équipe": "données"}  # letters of any script and spaces are fine
    msg = the_one(doc)
    assert msg.startswith("tags.cost center:") and "'#&'" in msg and "+ - = . _ : / @" in msg


def test_tag_key_the_stacks_set_themselves(doc):
    doc["tags"] = {"Name": "x"}
    assert "set by the stacks themselves" in the_one(doc)


# ---------------------------------------------------------------- keys that become S3 paths


@pytest.mark.parametrize("revision", ["../../engines", "main/../x", "/abs", "a b"])
def test_revision_cannot_leave_its_s3_prefix(doc, revision):
    doc["model"]["revision"] = revision
    msg = the_one(doc)
    assert msg.startswith("model.revision:") and "models/<id>/<revision>/" in msg


def test_s3_model_source_with_dot_dot(doc):
    doc["model"]["source"] = "s3://staged-bucket/models/../engines/"
    msg = the_one(doc)
    assert msg.startswith("model.source:") and "'..' segment" in msg


def test_calibration_dataset_with_dot_dot(doc):
    doc["calibration"] = {"dataset": "s3://staged-bucket/calibration/../../x/"}
    msg = the_one(doc)
    assert msg.startswith("calibration.dataset:") and "'..' segment" in msg


def test_bucket_name_with_adjacent_periods(doc):
    doc["calibration"] = {"dataset": "s3://staged..bucket/calibration/"}
    assert "two adjacent periods" in the_one(doc)


def test_hub_token_secret_is_a_secrets_manager_name(doc):
    doc["model"]["hub_token_secret"] = "my token!"
    msg = the_one(doc)
    assert msg.startswith("model.hub_token_secret:") and "must match" in msg


# ---------------------------------------------------------------- what the instance would refuse


@pytest.mark.parametrize("image", ["nvcr.io/nvidia/TensorRT-LLM/release:1.2.1", "nvcr.io/nvidia/tensorrt-llm/release:-1",
                                   "nvcr.io/nvidia//release:1.2.1", "nvcr.io/nvidia/tensorrt llm:1.2.1"])
def test_engine_image_must_be_a_reference_docker_parses(doc, image):
    # Grammar of github.com/distribution/reference, reference.go (path components lower-case,
    # tag [\w][\w.-]{0,127}); the tag still has to match tensorrt_llm_version (a separate rule).
    doc["engine"]["image"] = image
    msg = the_one(doc)
    assert msg.startswith("engine.image:") and "not an image reference docker can pull" in msg


@pytest.mark.parametrize("image", ["nvcr.io/nvidia/tensorrt-llm/release:1.2.1", "localhost:5000/trt_llm/release:1.2.1",
                                   "nvcr.io/nvidia/tensorrt-llm/release@sha256:" + "a" * 64])
def test_engine_image_references_docker_accepts(doc, image):
    doc["engine"]["image"] = image
    assert problems(doc) == []
