"""`fleetcast stage image`: command construction, CodeBuild mirror through the real API model, digest pinning."""

import shutil
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from botocore.stub import Stubber

from fleetcast.config import load_config
from fleetcast.config.edit import apply_edits
from fleetcast.contract.errors import UserError
from fleetcast.staging.image import (
    ImageTarget,
    local_build_commands,
    local_push_commands,
    single_digest,
    stage_codebuild,
    stage_local,
)

CONFIG = Path(__file__).resolve().parents[2] / "config" / "fleet.yaml"
DIGEST = "sha256:" + "ab" * 32
SEOUL = ImageTarget("ap-northeast-2", "111122223333.dkr.ecr.ap-northeast-2.amazonaws.com/fleetcast/tensorrt-llm",
                    project="fleetcast-image-mirror")


@pytest.fixture
def cfg():
    return load_config(CONFIG)


def test_local_path_pulls_once_and_pushes_the_same_image_everywhere(cfg):
    build = local_build_commands(cfg, derived=False)
    assert build == [["docker", "pull", "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"],
                     ["docker", "tag", "nvcr.io/nvidia/tensorrt-llm/release:1.2.1", "fleetcast-serving:1.2.1"]]
    push = local_push_commands(cfg, SEOUL, derived=False)
    assert push[-1] == ["docker", "push", f"{SEOUL.repository_uri}:1.2.1"]


def test_derived_image_is_built_from_the_repo_dockerfile(cfg):
    build = local_build_commands(cfg, derived=True)
    assert build[1][:3] == ["docker", "build", "--file"] and "docker/Dockerfile" in build[1]
    assert "BASE=nvcr.io/nvidia/tensorrt-llm/release:1.2.1" in build[1]
    assert (Path(__file__).resolve().parents[2] / "docker" / "Dockerfile").is_file()


def test_local_dry_run_prints_and_runs_nothing(cfg):
    ran, lines = [], []
    digests = stage_local(cfg, [SEOUL], clients=None, derived=False, dry_run=True,
                          run=lambda *a, **k: ran.append(a), log=lines.append)
    assert digests == {} and ran == []
    assert any("docker push" in line for line in lines)


def test_local_push_logs_in_with_password_on_stdin_and_reads_the_digest(cfg):
    ecr = boto3.client("ecr", region_name="ap-northeast-2", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(ecr) as stub:
        import base64
        stub.add_response("get_authorization_token", {"authorizationData": [
            {"authorizationToken": base64.b64encode(b"AWS:secret-password").decode()}]})
        stub.add_response("describe_images", {"imageDetails": [{"imageDigest": DIGEST}]},
                          {"repositoryName": "fleetcast/tensorrt-llm", "imageIds": [{"imageTag": "1.2.1"}]})
        calls = []

        def run(command, **kwargs):
            calls.append((command, kwargs.get("input")))
            return SimpleNamespace(returncode=0, stderr=b"")

        digests = stage_local(cfg, [SEOUL], lambda service, region: ecr, derived=False, dry_run=False,
                              run=run, log=lambda m: None)
    assert digests == {"ap-northeast-2": DIGEST}
    login = next(c for c in calls if c[0][:2] == ["docker", "login"])
    assert login[1] == b"secret-password" and "secret-password" not in " ".join(login[0])


def test_codebuild_mirror_starts_the_project_and_waits(cfg):
    cb = boto3.client("codebuild", region_name="ap-northeast-2", aws_access_key_id="x", aws_secret_access_key="x")
    ecr = boto3.client("ecr", region_name="ap-northeast-2", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(cb) as cb_stub, Stubber(ecr) as ecr_stub:
        cb_stub.add_response("start_build", {"build": {"id": "fleetcast-image-mirror:1"}},
                             {"projectName": "fleetcast-image-mirror", "environmentVariablesOverride": [
                                 {"name": "UPSTREAM_IMAGE", "value": "nvcr.io/nvidia/tensorrt-llm/release:1.2.1", "type": "PLAINTEXT"},
                                 {"name": "IMAGE_TAG", "value": "1.2.1", "type": "PLAINTEXT"},
                                 {"name": "DERIVED", "value": "0", "type": "PLAINTEXT"}]})
        cb_stub.add_response("batch_get_builds", {"builds": [{"buildStatus": "IN_PROGRESS"}]}, {"ids": ["fleetcast-image-mirror:1"]})
        cb_stub.add_response("batch_get_builds", {"builds": [{"buildStatus": "SUCCEEDED"}]}, {"ids": ["fleetcast-image-mirror:1"]})
        ecr_stub.add_response("describe_images", {"imageDetails": [{"imageDigest": DIGEST}]},
                              {"repositoryName": "fleetcast/tensorrt-llm", "imageIds": [{"imageTag": "1.2.1"}]})
        sleeps = []
        def clients(service: str, region: str):
            return {"codebuild": cb, "ecr": ecr}[service]
        digests = stage_codebuild(cfg, [SEOUL], clients, derived=False, dry_run=False, sleep=sleeps.append,
                                  log=lambda m: None)
    assert digests == {"ap-northeast-2": DIGEST} and len(sleeps) == 1


def test_failed_mirror_build_is_reported(cfg):
    cb = boto3.client("codebuild", region_name="ap-northeast-2", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(cb) as stub:
        stub.add_response("start_build", {"build": {"id": "b:1"}})
        stub.add_response("batch_get_builds", {"builds": [{"buildStatus": "FAILED"}]})
        with pytest.raises(UserError, match="ended FAILED"):
            stage_codebuild(cfg, [SEOUL], lambda s, r: cb, derived=False, dry_run=False, sleep=lambda s: None,
                            log=lambda m: None)


def test_differing_digests_are_refused():
    assert single_digest({"a": DIGEST, "b": DIGEST}) == DIGEST
    with pytest.raises(UserError, match="different digests"):
        single_digest({"a": DIGEST, "b": "sha256:" + "cd" * 32})


def test_digest_is_pinned_in_the_config_keeping_comments(tmp_path):
    target = tmp_path / "fleet.yaml"
    shutil.copy(CONFIG, target)
    cfg = apply_edits(target, [(("engine", "image_digest"), DIGEST)])
    assert cfg.engine.image_digest == DIGEST
    text = target.read_text()
    assert "# last line with the trtllm-build engine flow GPT-2 needs" in text
    assert f"image_digest: {DIGEST}" in text


def test_an_edit_that_breaks_the_config_leaves_the_file_alone(tmp_path):
    from fleetcast.config import ConfigError

    target = tmp_path / "fleet.yaml"
    shutil.copy(CONFIG, target)
    before = target.read_text()
    with pytest.raises(ConfigError):
        apply_edits(target, [(("engine", "image_digest"), "latest")])
    assert target.read_text() == before


def test_derived_image_carries_the_runtime_dependencies_where_the_container_looks():
    root = Path(__file__).resolve().parents[2]
    dockerfile = (root / "docker" / "Dockerfile").read_text()
    run_container = (root / "runtime" / "host" / "run-container.sh").read_text()
    assert "runtime/vendor.py" in dockerfile and "/usr/local/lib/fleetcast-deps" in dockerfile
    assert "PYTHONPATH=/opt/fleetcast:/usr/local/lib/fleetcast-deps" in run_container
    from runtime.vendor import VENDORED
    assert any(p.startswith("boto3") for p in VENDORED) and any(p.startswith("ruamel.yaml") for p in VENDORED)
    assert any(p.startswith("uvloop") for p in VENDORED)  # the event loop the gateway was measured on


def test_derived_tag_changes_with_the_recipe(cfg, tmp_path):
    """ECR tags are immutable and staging skips a tag already there: a changed recipe must get a
    new tag, or the new layer would never reach a region that staged the old one."""
    import re
    import shutil

    from fleetcast.contract.image import DERIVED_RECIPE, REPO_ROOT, image_tag
    assert re.fullmatch(r"1\.2\.1-fleetcast-[0-9a-f]{10}", image_tag(cfg, derived=True))
    assert image_tag(cfg, derived=False) == "1.2.1"
    for rel in DERIVED_RECIPE:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / rel, tmp_path / rel)
    assert image_tag(cfg, derived=True, root=tmp_path) == image_tag(cfg, derived=True)
    vendor = tmp_path / "runtime" / "vendor.py"
    vendor.write_text(vendor.read_text().replace('"uvloop": ("0.21.0"', '"uvloop": ("0.22.1"'))
    assert image_tag(cfg, derived=True, root=tmp_path) != image_tag(cfg, derived=True)
    (tmp_path / "docker" / "Dockerfile").unlink()
    with pytest.raises(UserError, match="docker/Dockerfile: cannot read the derived image's recipe"):
        image_tag(cfg, derived=True, root=tmp_path)


def test_stage_image_defaults_to_the_derived_image(cfg):
    lines = []
    stage_local(cfg, [SEOUL], clients=None, derived=True, dry_run=True, run=None, log=lines.append)
    assert any("docker build --file docker/Dockerfile" in line for line in lines)
