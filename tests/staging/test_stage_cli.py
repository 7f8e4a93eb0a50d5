"""`fleetcast stage model|calibration|status` end to end against loopback S3, as an operator runs them."""

import json
import os
from pathlib import Path

import boto3
import pytest

from fleetcast.config import load_config
from fleetcast.staging.image import image_tag
from tests.cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config" / "fleet.yaml"


def fleetcast(*args, env):
    return run_cli(*args, env=env)


@pytest.fixture
def env(aws_env):
    return {"AWS_ENDPOINT_URL": aws_env, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def test_stage_model_to_two_regions_then_status(tmp_path, env, make_bucket, aws_env):
    weights = tmp_path / "gpt2"
    weights.mkdir()
    (weights / "config.json").write_text('{"n_positions": 1024}')
    (weights / "model.safetensors").write_bytes(os.urandom(6 * 1024 * 1024))
    seoul, virginia = make_bucket("ap-northeast-2"), make_bucket("us-east-1")
    buckets = ["--bucket", f"ap-northeast-2={seoul}", "--bucket", f"us-east-1={virginia}"]

    status = fleetcast("stage", "status", "--config", str(CONFIG), *buckets, env=env)
    assert status.returncode == 1 and "model MISSING" in status.stdout

    first = fleetcast("stage", "model", "--config", str(CONFIG), "--local-dir", str(weights),
                      "--part-size-mib", "5", *buckets, env=env)
    assert first.returncode == 0, first.stderr
    print(first.stdout)
    assert "ap-northeast-2: 2 file(s) uploaded" in first.stdout
    assert "us-east-1: 2 file(s) copied server-side" in first.stdout and "nothing re-sent" in first.stdout

    again = fleetcast("stage", "model", "--config", str(CONFIG), "--local-dir", str(weights),
                      "--part-size-mib", "5", *buckets, env=env)
    assert "0 file(s) uploaded, 2 already there and verified" in again.stdout

    # The model alone is not enough: instances also pull the derived image from the region's ECR.
    repositories = [arg for region in ("ap-northeast-2", "us-east-1")
                    for arg in ("--repository", f"{region}={ecr_repository(aws_env, region)}")]
    status = fleetcast("stage", "status", "--config", str(CONFIG), *buckets, *repositories, env=env)
    assert status.returncode == 1 and status.stdout.count("image MISSING") == 2
    for region in ("ap-northeast-2", "us-east-1"):
        push_derived_image(aws_env, region)
    status = fleetcast("stage", "status", "--config", str(CONFIG), *buckets, *repositories, env=env)
    print(status.stdout)
    assert status.returncode == 0 and status.stdout.count(": ok") == 4
    assert f"fleetcast/tensorrt-llm:{image_tag(load_config(CONFIG), derived=True)}: ok" in status.stdout


def ecr_repository(endpoint, region) -> str:
    ecr = boto3.client("ecr", region_name=region, endpoint_url=endpoint)
    try:
        return ecr.create_repository(repositoryName="fleetcast/tensorrt-llm")["repository"]["repositoryUri"]
    except ecr.exceptions.RepositoryAlreadyExistsException:
        return ecr.describe_repositories(repositoryNames=["fleetcast/tensorrt-llm"])["repositories"][0]["repositoryUri"]


def push_derived_image(endpoint, region) -> None:
    """What `fleetcast stage image` leaves in ECR: the derived image under its immutable tag."""
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 7,
                           "digest": "sha256:" + "1" * 64}, "layers": []}
    boto3.client("ecr", region_name=region, endpoint_url=endpoint).put_image(
        repositoryName="fleetcast/tensorrt-llm", imageManifest=json.dumps(manifest),
        imageTag=image_tag(load_config(CONFIG), derived=True))


def test_bad_arguments_are_named(env):
    out = fleetcast("stage", "model", "--config", str(CONFIG), "--bucket", "nonsense", env=env)
    assert out.returncode == 2 and "--bucket takes REGION=VALUE" in out.stderr and "Traceback" not in out.stderr
    out = fleetcast("stage", "model", "--config", str(CONFIG), "--region", "eu-west-3", env=env)
    assert out.returncode == 2 and "--region eu-west-3 is not a provider region" in out.stderr
    out = fleetcast("stage", "model", "--config", str(CONFIG), "--bucket", "ap-northeast-2=b",
                    "--bucket", "us-east1=c", env=env)
    assert out.returncode == 2 and "--bucket us-east1=c: us-east1 is not a provider region" in out.stderr
    out = fleetcast("stage", "model", "--config", str(CONFIG), "--part-size-mib", "1",
                    "--bucket", "ap-northeast-2=b", "--bucket", "us-east-1=c", env=env)
    assert out.returncode == 2 and "--part-size-mib" in out.stderr


def test_missing_provider_stack_says_what_to_do(env):
    out = fleetcast("stage", "status", "--config", str(CONFIG), "--region", "us-east-1", env=env)
    assert out.returncode == 1
    assert "fleetcast-provider-us-east-1 is not deployed" in out.stderr


@pytest.mark.parametrize("setup, args, expected", [
    (lambda d: None, ["--name", "traffic"], "holds no *.jsonl file"),
    (lambda d: (d / "rows.jsonl").write_text('{"text": "one row"}\n'), ["--name", "traffic"], "1 calibration row(s)"),
    (lambda d: (d / "rows.jsonl").write_text('{"text": "x"}\n' * 600), ["--name", "../other"], "--name '../other'"),
    (lambda d: (d / "rows.jsonl").write_text('{"text": "x"}\n' * 600), ["--name", "traffic", "--part-size-mib", "1"],
     "--part-size-mib"),
], ids=["no-jsonl", "too-few-rows", "bad-name", "part-size"])
def test_stage_calibration_checks_local_input_first_without_credentials(tmp_path, monkeypatch, setup, args, expected):
    """No credentials anywhere (no keys, no profile, no instance metadata): a problem with the local set, its
    name or the flags is reported as such, not as missing credentials (exit 4)."""
    setup(tmp_path)
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    bare = {"AWS_EC2_METADATA_DISABLED": "true", "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
            "AWS_CONFIG_FILE": str(tmp_path / "none")}
    out = run_cli("stage", "calibration", "--config", str(CONFIG), "--dir", str(tmp_path), *args, env=bare)
    assert out.returncode in (1, 2) and expected in out.stderr, out.stderr
    assert "credentials" not in out.stderr.lower() and "Traceback" not in out.stderr


def test_stage_calibration_names_the_staged_set_in_the_config(tmp_path, env, make_bucket):
    """The set a calibrated pick needs (`fleetcast plan --write-config` refuses one without it) is named in the
    config by the command that staged it, as `stage image` pins the image digest."""
    rows = tmp_path / "rows"
    rows.mkdir()
    (rows / "traffic.jsonl").write_text("".join(json.dumps({"text": f"prompt {i}"}) + "\n" for i in range(520)))
    config = tmp_path / "fleet.yaml"
    config.write_text(CONFIG.read_text())
    seoul, virginia = make_bucket("ap-northeast-2"), make_bucket("us-east-1")
    buckets = ["--bucket", f"ap-northeast-2={seoul}", "--bucket", f"us-east-1={virginia}"]

    kept = fleetcast("stage", "calibration", "--config", str(config), "--dir", str(rows), "--name", "traffic",
                     "--no-write-config", *buckets, env=env)
    assert kept.returncode == 0, kept.stderr
    assert config.read_text() == CONFIG.read_text()
    assert f"set calibration.dataset in {config} to s3://{seoul}/calibration/traffic/" in kept.stdout

    out = fleetcast("stage", "calibration", "--config", str(config), "--dir", str(rows), "--name", "traffic",
                    *buckets, env=env)
    assert out.returncode == 0, out.stderr
    assert load_config(config).model.calibration.dataset == f"s3://{seoul}/calibration/traffic/"
    # Everything else, comments included, is as it was.
    assert [ln for ln in CONFIG.read_text().splitlines() if ln.lstrip().startswith("#")] == \
        [ln for ln in config.read_text().splitlines() if ln.lstrip().startswith("#")]


MULTI = ROOT / "examples" / "multi-model" / "fleet.yaml"


def test_stage_each_model_of_a_multi_model_fleet(tmp_path, env, make_bucket):
    """Each model is staged under its own models/<id>/<revision>/ prefix; status reports each one."""
    bucket = make_bucket("ap-northeast-2")
    buckets = ["--bucket", f"ap-northeast-2={bucket}"]
    status = fleetcast("stage", "status", "--config", str(MULTI), *buckets, "--repository",
                       "ap-northeast-2=111122223333.dkr.ecr.ap-northeast-2.amazonaws.com/fleetcast/tensorrt-llm",
                       env=env)
    assert status.returncode == 1
    for model in ("gpt2-xl", "qwen2.5-0.5b", "qwen2.5-3b"):
        assert f"model {model} MISSING" in status.stdout and f"--model {model}`" in status.stdout

    weights = tmp_path / "w"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    (weights / "model.safetensors").write_bytes(os.urandom(1024))
    refused = fleetcast("stage", "model", "--config", str(MULTI), "--local-dir", str(weights), *buckets, env=env)
    assert refused.returncode == 2 and "name it with --model (gpt2-xl, qwen2.5-0.5b, qwen2.5-3b)" in refused.stderr
    unknown = fleetcast("stage", "model", "--config", str(MULTI), "--model", "llama", "--local-dir", str(weights),
                        *buckets, env=env)
    assert unknown.returncode == 2 and "--model 'llama' is not a model" in unknown.stderr

    staged = fleetcast("stage", "model", "--config", str(MULTI), "--model", "qwen2.5-3b", "--local-dir",
                       str(weights), *buckets, env=env)
    assert staged.returncode == 0, staged.stderr
    keys = {o["Key"] for o in boto3.client("s3", region_name="ap-northeast-2", endpoint_url=env["AWS_ENDPOINT_URL"])
            .list_objects_v2(Bucket=bucket)["Contents"]}
    assert "models/qwen2.5-3b/main/model.safetensors" in keys
    status = fleetcast("stage", "status", "--config", str(MULTI), *buckets, "--repository",
                       "ap-northeast-2=111122223333.dkr.ecr.ap-northeast-2.amazonaws.com/fleetcast/tensorrt-llm",
                       env=env)
    assert "model qwen2.5-3b@main: 2 file(s)" in status.stdout and "model gpt2-xl MISSING" in status.stdout


def test_status_names_a_missing_model_whose_id_holds_a_colon(tmp_path, env, make_bucket):
    """A fine-tune id (ft:base:org::id) holds ':'; its MISSING line must be read as such, not as staged weights."""
    fine_tune = "ft:gpt2-xl:acme::8abc1234"
    text = MULTI.read_text()
    text = text.replace("  - id: gpt2-xl ", f"  - id: '{fine_tune}' ").replace("{model: gpt2-xl", f"{{model: '{fine_tune}'")
    config = tmp_path / "fleet.yaml"
    config.write_text(text)
    assert fine_tune in load_config(config).models_for("voice-app")
    bucket = make_bucket("ap-northeast-2")
    status = fleetcast("stage", "status", "--config", str(config), "--bucket", f"ap-northeast-2={bucket}",
                       "--repository",
                       "ap-northeast-2=111122223333.dkr.ecr.ap-northeast-2.amazonaws.com/fleetcast/tensorrt-llm",
                       env=env)
    assert status.returncode == 1, status.stderr
    assert f"model {fine_tune} MISSING" in status.stdout and "Traceback" not in status.stderr


def test_stage_calibration_per_model_of_a_multi_model_fleet(tmp_path, env, make_bucket):
    """Each model calibrates on its own set: --model names it (required with several models) and the staged set
    goes in that model's calibration.dataset, nothing else of the file changing."""
    rows = tmp_path / "rows"
    rows.mkdir()
    (rows / "traffic.jsonl").write_text("".join(json.dumps({"text": f"prompt {i}"}) + "\n" for i in range(520)))
    config = tmp_path / "fleet.yaml"
    config.write_text(MULTI.read_text())
    bucket = make_bucket("ap-northeast-2")
    buckets = ["--bucket", f"ap-northeast-2={bucket}"]

    refused = fleetcast("stage", "calibration", "--config", str(config), "--dir", str(rows), "--name", "chat",
                        *buckets, env=env)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "--model is needed: the config has 3 models (gpt2-xl, qwen2.5-0.5b, qwen2.5-3b)" in refused.stderr
    unknown = fleetcast("stage", "calibration", "--config", str(config), "--dir", str(rows), "--name", "chat",
                        "--model", "llama", *buckets, env=env)
    assert unknown.returncode == 2 and "--model 'llama' is not a model of the config" in unknown.stderr

    out = fleetcast("stage", "calibration", "--config", str(config), "--dir", str(rows), "--name", "chat",
                    "--model", "qwen2.5-3b", *buckets, env=env)
    assert out.returncode == 0, out.stderr
    uri = f"s3://{bucket}/calibration/chat/"
    assert f"models[qwen2.5-3b].calibration.dataset: {uri} in {config}" in out.stdout
    cfg = load_config(config)
    assert cfg.model_by_id("qwen2.5-3b").calibration.dataset == uri
    assert cfg.model_by_id("gpt2-xl").calibration is None and cfg.model_by_id("qwen2.5-0.5b").calibration is None
    # One block added under that model; every other line, comments included, as it was.
    before, after = MULTI.read_text().splitlines(), config.read_text().splitlines()
    assert [ln for ln in after if ln not in before] == ["    calibration:", f"      dataset: {uri}"]
    again = fleetcast("stage", "calibration", "--config", str(config), "--dir", str(rows), "--name", "chat",
                      "--model", "qwen2.5-3b", *buckets, env=env)
    assert f"models[qwen2.5-3b].calibration.dataset in {config} already names {uri}" in again.stdout
