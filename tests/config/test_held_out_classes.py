"""Configs that validated although AWS, the gateway or staging would fail on them (issue 32, §3): each is
refused at `config validate` with its field path and what is allowed, citing the outside fact it rests on."""

from __future__ import annotations

import copy

import pytest

from fleetcast.config import parse_config
from fleetcast.config.rules import PRIVATE_NETWORKS, VPC_FORBIDDEN_NETWORKS, cidr_range_problem

from .conftest import problems

# ---------------------------------------------------------------- private ranges
# Amazon VPC User Guide, "VPC CIDR blocks" (https://docs.aws.amazon.com/vpc/latest/userguide/vpc-cidr-blocks.html):
# "You can't specify the following CIDR blocks for your VPCs: 0.0.0.0/8, 127.0.0.0/8 ..., 169.254.0.0/16 ...,
# 224.0.0.0/4"; it recommends RFC 1918 and its association table permits 100.64.0.0/10 and 198.19.0.0/16.
# Publicly routable ranges AWS permits but warns about; Fleetcast refuses them (a private fleet by design).


def test_the_ranges_are_the_vpc_guides():
    assert [str(n) for n in VPC_FORBIDDEN_NETWORKS] == ["0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4"]
    assert [str(n) for n in PRIVATE_NETWORKS] == ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                                                 "198.19.0.0/16"]


@pytest.mark.parametrize("cidr", ["10.60.0.0/16", "172.31.0.0/16", "192.168.10.0/24", "100.64.0.0/16",
                                  "198.19.0.0/20", "192.0.2.0/24"])
def test_private_and_documentation_ranges_pass(cidr):
    assert cidr_range_problem(cidr) is None


def test_a_public_consumer_cidr_is_refused_naming_its_index(doc):
    doc["consumers"][0]["cidrs"] = ["10.60.0.0/16", "8.8.8.0/24"]
    (msg,) = problems(doc)
    assert msg.startswith("consumers[0].cidrs[1]:") and "8.8.8.0/24 is a publicly routable range" in msg
    assert "allowed: a private range, within 10.0.0.0/8" in msg


@pytest.mark.parametrize("cidr,expected", [("52.10.0.0/16", "publicly routable"),
                                           ("169.254.0.0/16", "which Amazon VPC refuses for any VPC")])
def test_a_provider_vpc_outside_the_private_ranges_is_refused(doc, cidr, expected):
    doc["regions"][0]["vpc"]["cidr"] = cidr
    (msg,) = problems(doc)
    assert msg.startswith("regions[0].vpc.cidr:") and expected in msg


# ---------------------------------------------------------------- certificates
# "Certificates in ACM are regional resources ... You cannot copy a certificate between regions" (AWS
# Certificate Manager User Guide, acm-regions.html); the provider account's load balancer uses its own.

CERT = "arn:aws:acm:ap-northeast-2:{account}:certificate/0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"


def test_a_certificate_of_another_account_is_refused(doc):
    doc["network"]["tls_certificate_arns"] = {"ap-northeast-2": CERT.format(account="999988887777")}
    (msg,) = problems(doc)
    assert msg.startswith("network.tls_certificate_arns.ap-northeast-2:")
    assert "belongs to account 999988887777, not provider.account 111122223333" in msg
    doc["network"]["tls_certificate_arns"] = {"ap-northeast-2": CERT.format(account="111122223333")}
    assert problems(doc) == []


def test_a_certificate_of_another_region_is_refused_naming_the_region_key(doc):
    doc["network"]["tls_certificate_arns"] = {"us-east-1": CERT.format(account="111122223333")}
    (msg,) = problems(doc)
    assert msg.startswith("network.tls_certificate_arns.us-east-1:")
    assert "is a certificate in ap-northeast-2, not us-east-1" in msg


# ---------------------------------------------------------------- consumers the gateway could not tell apart


def test_two_consumers_with_one_account_and_region_are_refused_unless_keyed(doc):
    twin = copy.deepcopy(doc["consumers"][0])
    twin.update(name="voice-batch", vpc_id="vpc-0b1c2d3e4f5a60719", cidrs=["10.61.0.0/16"])
    twin.pop("endpoint_service_name")
    doc["consumers"].append(twin)
    (msg,) = problems(doc)
    assert msg.startswith("consumers[2].account:")
    assert "has the account 444455556666 and region ap-northeast-2 of voice-app" in msg
    # runtime/gateway/identity.py tells keyed consumers of one account apart by their API key.
    for consumer in (doc["consumers"][0], twin):
        consumer["api_keys"] = True
    assert problems(doc) == []


# ---------------------------------------------------------------- allowed_regions, scale-in, stage patterns


def test_a_region_listed_twice_in_allowed_regions_is_refused(doc):
    # cfn-lint E3037 (list items unique) on the endpoint service's SupportedRegions.
    doc["regions"][1]["allowed_regions"] = ["us-west-2", "us-west-2"]
    (msg,) = problems(doc)
    assert msg.startswith("regions[1].allowed_regions[1]:") and "us-west-2 is listed twice" in msg


def test_a_scale_in_ratio_above_one_is_refused(doc):
    doc["regions"][0]["pools"][0]["scaling"].update(slo_scale_in_ratio=1.2, slo_scale_out_ratio=1.5)
    (msg,) = problems(doc)
    assert msg.startswith("regions[0].pools[0].scaling.slo_scale_in_ratio:") and "at most 1" in msg


@pytest.mark.parametrize("pattern", [r".*\.bin$", "^original/", "(model|weights).bin", "pytorch_model-[0-9]+.bin"])
def test_a_regular_expression_in_stage_patterns_is_refused(doc, pattern):
    doc["model"]["stage_patterns"] = ["*.json", pattern]
    (msg,) = problems(doc)
    assert msg.startswith("model.stage_patterns[1]:") and "looks like a regular expression" in msg


@pytest.mark.parametrize("pattern", ["*.bin", "original/*.safetensors", "tokenizer.*", "model-0000[1-2]-*", "[!_]*.pt"])
def test_globs_in_stage_patterns_pass(doc, pattern):
    doc["model"]["stage_patterns"] = [pattern]
    assert problems(doc) == []


# ---------------------------------------------------------------- AMI ids are regional
# "AMIs are a regional resource ... To make an AMI available in a different Region, copy the AMI to the Region"
# (Amazon EC2 User Guide, "Share an AMI with specific AWS accounts"); the copy gets its own id.


def test_one_ami_id_pinned_in_two_regions_is_refused_at_validate(doc):
    for region in doc["regions"]:
        region["ami"]["id"] = "ami-0c9d8e7f6a5b43210"
    (msg,) = problems(doc)
    assert msg.startswith("regions[1].ami.id:") and "also pinned in ap-northeast-2" in msg
    doc["regions"][1]["ami"]["id"] = "ami-05e4d3c2b1a0f9e87"
    assert parse_config(doc).regions[1].ami.id == "ami-05e4d3c2b1a0f9e87"
