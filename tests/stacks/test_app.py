"""The CDK app as a whole: one stack per provider region and per consumer, each with an explicit env,
and `app.py` turning an invalid config into one clear message (exit 1, no traceback)."""

from __future__ import annotations

import json

import pytest

from fleetcast.staging.image import image_tag
from tests.config.test_input_bounds import BAD_INPUTS

from .synthesized import ROOT, default_doc, default_fleet, nat_doc, nat_fleet, run_app_entry_point, synthesize


def test_one_stack_per_provider_region_and_per_consumer_with_explicit_env():
    fleet = default_fleet()
    cfg = fleet.cfg
    expected = {f"fleetcast-provider-{r.region}": (cfg.provider.account, r.region) for r in cfg.regions}
    expected |= {f"fleetcast-consumer-{c.name}": (c.account, c.region) for c in cfg.consumers}
    assert {name: (s.account, s.region) for name, s in fleet.stacks.items()} == expected
    manifest = json.loads((fleet.outdir / "manifest.json").read_text())
    environments = {name: a["environment"] for name, a in manifest["artifacts"].items()
                    if a["type"] == "aws:cloudformation:stack"}
    assert environments == {name: f"aws://{acct}/{region}" for name, (acct, region) in expected.items()}


def test_config_tags_reach_the_resources():
    template = default_fleet().template_json("fleetcast-provider-ap-northeast-2")
    (vpc,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::EC2::VPC"]
    assert {"Key": "owner", "Value": "platform-team"} in vpc["Properties"]["Tags"]


def test_nat_egress_builds_public_subnets_and_nat_per_az_and_no_endpoints():
    fleet = nat_fleet()
    name = "fleetcast-provider-ap-northeast-2"
    assert len(fleet.resources(name, "AWS::EC2::NatGateway")) == 2
    assert len(fleet.resources(name, "AWS::EC2::InternetGateway")) == 1
    assert not fleet.resources(name, "AWS::EC2::VPCEndpoint")
    # Instances stay in private subnets: the launch template still assigns no public IP.
    (lt,) = fleet.resources(name, "AWS::EC2::LaunchTemplate").values()
    assert lt["Properties"]["LaunchTemplateData"]["NetworkInterfaces"][0]["AssociatePublicIpAddress"] is False
    # Even with NAT, instances run the derived image from the region's repository, and it has its mirror.
    (repository,) = fleet.resources(name, "AWS::ECR::Repository")
    assert image_line(lt) == f"<ref>.dkr.ecr.<ref>.<AWS::URLSuffix>/<{repository}>:{image_tag(fleet.cfg, derived=True)}"
    assert len(fleet.resources(name, "AWS::CodeBuild::Project")) == 1


def image_line(launch_template: dict) -> str:
    """The FLEETCAST_IMAGE value of a launch template's user data: a Ref as <logical id>, other intrinsics <ref>."""
    parts = launch_template["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
    text = "".join(p if isinstance(p, str) else f"<{p['Ref']}>" if "Ref" in p else "<ref>" for p in parts)
    return text.split("\nFLEETCAST_IMAGE=", 1)[1].split("\n", 1)[0]


@pytest.mark.parametrize("egress", ["none", "nat"])
def test_instances_always_run_the_derived_image(egress):
    """The public release has no boto3/ruamel.yaml (docker/Dockerfile adds them): runtime.bootstrap cannot start
    in it. Whatever the egress, every pool pulls the derived image from its region's repository: by the
    derived tag before staging pins a digest, by that digest after."""
    doc = nat_doc() if egress == "nat" else default_doc()
    doc["engine"]["image_digest"] = "sha256:" + "ab" * 32
    fleet = synthesize(doc, f"pinned-{egress}")
    tag = image_tag(fleet.cfg, derived=True)
    assert tag.startswith(fleet.cfg.engine.image.rsplit(":", 1)[1] + "-fleetcast-")
    for region in fleet.cfg.regions:
        name = f"fleetcast-provider-{region.region}"
        (repository,) = fleet.resources(name, "AWS::ECR::Repository")
        templates = list(fleet.resources(name, "AWS::EC2::LaunchTemplate").values())
        assert templates
        for lt in templates:
            assert image_line(lt) == (f"<ref>.dkr.ecr.<ref>.<AWS::URLSuffix>/<{repository}>"
                                      f"@{doc['engine']['image_digest']}")
    unpinned = nat_fleet() if egress == "nat" else default_fleet()
    for region in unpinned.cfg.regions:
        name = f"fleetcast-provider-{region.region}"
        (repository,) = unpinned.resources(name, "AWS::ECR::Repository")
        for lt in unpinned.resources(name, "AWS::EC2::LaunchTemplate").values():
            assert image_line(lt) == f"<ref>.dkr.ecr.<ref>.<AWS::URLSuffix>/<{repository}>:{tag}"


@pytest.mark.parametrize("mutation, field", [
    (lambda text: text.replace("instance_type: g6e.xlarge", "instance_type: g5.xlarge", 1)
     .replace("engine: {precision: int8_wo}", "engine: {precision: fp8}", 1),
     "regions[0].pools[0].engine.precision"),
    (lambda text: text.replace("- arn:aws:iam::444455556666:root", "- '*'"), "regions[0].allowed_principals"),
])
def test_app_rejects_an_invalid_config_with_one_clear_message(tmp_path, mutation, field):
    broken = tmp_path / "fleet.yaml"
    broken.write_text(mutation((ROOT / "config" / "fleet.yaml").read_text()))
    code, stderr = run_app_entry_point(broken, tmp_path / "out")
    assert code == 1
    assert "Traceback" not in stderr
    assert field in stderr, stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("name", ["latin1_comment", "huge_integer", "deep_flow_lists"])
def test_make_synth_entry_point_reports_an_unreadable_file_too(tmp_path, name):
    """app.py (what `make synth` runs through cdk) prints the loader's one error for a file it cannot read
    (tests/config/test_input_bounds.py, where `config validate` is checked on the same files) and exits 1."""
    data, expected = BAD_INPUTS[name]
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(data)
    code, stderr = run_app_entry_point(path, tmp_path / "out")
    assert code == 1, stderr
    assert expected in stderr and "Traceback" not in stderr
