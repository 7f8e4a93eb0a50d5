"""The in-AWS image mirror: privileged Docker build, encrypted, pushing only to the region's repository."""

import os
from pathlib import Path

import pytest
from aws_cdk import App, Environment, Stack, aws_ecr as ecr, aws_logs as logs
from aws_cdk.assertions import Match, Template

from stacks import nag
from stacks.image_mirror import ImageMirror

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "1")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    app = App(outdir=str(tmp_path_factory.mktemp("mirror")))
    nag.enable(app)
    stack = Stack(app, "Mirror", env=Environment(account="111122223333", region="ap-northeast-2"))
    repo = ecr.Repository(stack, "Repo", image_scan_on_push=True, encryption=ecr.RepositoryEncryption.KMS)
    ImageMirror(stack, "ImageMirror", repository=repo, upstream_image="nvcr.io/nvidia/tensorrt-llm/release:1.2.1",
                image_tag="1.2.1", log_retention=logs.RetentionDays.ONE_MONTH)
    app.synth()  # cdk-nag findings would fail here
    return Template.from_stack(stack)


def test_builds_docker_in_a_privileged_large_encrypted_project(template):
    template.has_resource_properties("AWS::CodeBuild::Project", {
        "Environment": Match.object_like({"PrivilegedMode": True, "ComputeType": "BUILD_GENERAL1_LARGE",
                                          "EnvironmentVariables": Match.array_with([
                                              {"Name": "UPSTREAM_IMAGE", "Type": "PLAINTEXT",
                                               "Value": "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"}])}),
        "EncryptionKey": Match.any_value(),
        "VpcConfig": Match.absent(),  # its own network: the fleet VPC keeps no egress
    })


def test_pushes_only_to_the_regions_repository(template):
    policies = template.find_resources("AWS::IAM::Policy")
    statements = [s for p in policies.values() for s in p["Properties"]["PolicyDocument"]["Statement"]]
    push = next(s for s in statements if "ecr:PutImage" in s["Action"])
    logical_id, attribute = push["Resource"]["Fn::GetAtt"]
    assert logical_id.startswith("Repo") and attribute == "Arn"


def test_buildspec_is_idempotent_and_reports_the_digest(template):
    project = next(iter(template.find_resources("AWS::CodeBuild::Project").values()))
    spec = project["Properties"]["Source"]["BuildSpec"]
    assert "already mirrored" in spec and "imageDigest" in spec and "docker/Dockerfile" in spec


def test_output_names_the_project_for_stage_image(template):
    outputs = template.to_json()["Outputs"]
    assert any("ImageMirrorProject" in key for key in outputs)


def test_every_provider_region_gets_a_mirror_and_the_outputs_staging_reads():
    from .synthesized import default_fleet, nat_fleet

    fleet = default_fleet()
    for region in ("ap-northeast-2", "us-east-1"):
        name = f"fleetcast-provider-{region}"
        assert len(fleet.resources(name, "AWS::CodeBuild::Project")) == 1
        outputs = fleet.template_json(name)["Outputs"]
        for needle in ("bucket", "repository", "mirror", "servicename"):
            # `fleetcast stage`/`deploy` pick outputs by these needles: exactly one must match.
            assert sum(needle in key.lower() for key in outputs) == 1, (needle, sorted(outputs))
    # With NAT egress too: instances run the derived image, which the mirror builds (issue 12 item 9).
    assert len(nat_fleet().resources("fleetcast-provider-ap-northeast-2", "AWS::CodeBuild::Project")) == 1


def test_build_context_holds_only_the_recipe_the_image_tag_digests():
    """The context is the derived image's recipe (fleetcast/contract/image.py, DERIVED_RECIPE), file for file: the
    whole fleetcast/ and runtime/ trees it once held were uploaded and re-hashed for a build that reads none of them."""
    from fleetcast.contract.image import DERIVED_RECIPE

    from .synthesized import default_fleet

    outdir = default_fleet().outdir
    contexts = [d for d in outdir.glob("asset.*") if (d / "docker" / "Dockerfile").is_file()]
    assert contexts, "no asset carries docker/Dockerfile"
    for context in contexts:
        assert sorted(p.relative_to(context).as_posix() for p in context.rglob("*") if p.is_file()) == sorted(
            DERIVED_RECIPE)
        for rel in DERIVED_RECIPE:
            assert (context / rel).read_bytes() == (ROOT / rel).read_bytes()


def _context_sources(dockerfile: str) -> list[str]:
    """What a Dockerfile's COPY and ADD instructions take from the build context (Dockerfile reference, "COPY" and
    "ADD": `COPY [--option=value...] <src>... <dest>`; a `--from` stage's sources are not the context's)."""
    sources = []
    for line in dockerfile.splitlines():
        words = line.split()
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        options = [w for w in words[1:] if w.startswith("--")]
        paths = [w for w in words[1:] if not w.startswith("--")]
        assert not line.rstrip().endswith("\\") and not paths[0].startswith("["), f"read this form too: {line}"
        if not any(o.startswith("--from") for o in options):
            sources.extend(paths[:-1])
    return sources


def test_the_dockerfile_copies_in_only_what_the_context_and_the_image_tag_hold():
    """Everything the build takes from its context is in the recipe: nothing it reads is left out of the context
    (the build would fail in CodeBuild) or out of the tag's digest (a changed file would never reach a region)."""
    from fleetcast.contract.image import DERIVED_RECIPE, DOCKERFILE

    sources = _context_sources((ROOT / DOCKERFILE).read_text())
    assert sources and set(sources) <= set(DERIVED_RECIPE)
    assert _context_sources("COPY --chown=1:1 a.py b/c.py /dst/\nCOPY --from=build /x /y\nADD d.txt /e") == [
        "a.py", "b/c.py", "d.txt"]
