"""The host side of the serving unit, run for real with stand-ins for aws, docker and curl on PATH."""

import subprocess
from pathlib import Path

import pytest

HOST = Path(__file__).resolve().parents[2] / "runtime" / "host"


def fake_bin(tmp_path: Path, **scripts: str) -> Path:
    """Executables that log their argv (and stdin for docker login) to calls.log, then run `body`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in scripts.items():
        exe = bin_dir / name
        exe.write_text(f'#!/bin/bash\necho "{name} $*" >> "{tmp_path}/calls.log"\n{body}\n')
        exe.chmod(0o755)
    return bin_dir


def run(script: str, tmp_path: Path, bin_dir: Path, **env: str) -> subprocess.CompletedProcess:
    full = {"PATH": f"{bin_dir}:/usr/bin:/bin", **env}
    return subprocess.run(["bash", str(HOST / script)], env=full, capture_output=True, text=True, timeout=60)


def calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls.log"
    return path.read_text().splitlines() if path.exists() else []


ECR_IMAGE = "111122223333.dkr.ecr.ap-northeast-2.amazonaws.com/fleetcast/tensorrt-llm@sha256:" + "a" * 64


def test_private_ecr_image_logs_in_then_pulls(tmp_path):
    bin_dir = fake_bin(tmp_path, aws='echo ecr-password',
                       docker='[ "$1" = login ] && read -r pw && echo "stdin $pw" >> "' + str(tmp_path) + '/calls.log"; exit 0')
    result = run("pull-image.sh", tmp_path, bin_dir, FLEETCAST_IMAGE=ECR_IMAGE, FLEETCAST_REGION="ap-northeast-2")
    assert result.returncode == 0, result.stderr
    log = calls(tmp_path)
    # `aws ecr get-login-password | docker login` runs both at once: their log lines come in either order.
    assert "aws ecr get-login-password --region ap-northeast-2" in log[:2]
    assert any(line.startswith("docker login --username AWS --password-stdin 111122223333.dkr.ecr.") for line in log[:2])
    assert "stdin ecr-password" in log  # the password travels on stdin, never on the command line
    assert log[-1] == f"docker pull --quiet {ECR_IMAGE}"


def test_public_registry_image_is_pulled_without_ecr_login(tmp_path):
    bin_dir = fake_bin(tmp_path, aws="exit 1", docker="exit 0")
    result = run("pull-image.sh", tmp_path, bin_dir, FLEETCAST_IMAGE="nvcr.io/nvidia/tensorrt-llm/release:1.2.1",
                 FLEETCAST_REGION="us-east-1")
    assert result.returncode == 0 and calls(tmp_path) == ["docker pull --quiet nvcr.io/nvidia/tensorrt-llm/release:1.2.1"]


def test_pull_failure_fails_the_unit_start(tmp_path):
    # A transient failure (registry unreachable): bounded retries, and the launch is not given up.
    bin_dir = fake_bin(tmp_path, docker='echo "Error response from daemon: Get https://nvcr.io/v2/: net/http: '
                       'request canceled while waiting for connection" >&2; exit 1', sleep="exit 0", aws="exit 0")
    result = run("pull-image.sh", tmp_path, bin_dir, FLEETCAST_IMAGE="nvcr.io/x:1", FLEETCAST_REGION="us-east-1")
    assert result.returncode == 1 and "cannot pull" in result.stderr
    assert calls(tmp_path).count("docker pull --quiet nvcr.io/x:1") == 5
    assert not [c for c in calls(tmp_path) if c.startswith("aws autoscaling")]


# What docker prints when the registry answers MANIFEST_UNKNOWN / NAME_UNKNOWN (OCI distribution-spec,
# spec.md "Errors": "manifest unknown", "repository name not known to registry"); ECR's own messages.
MISSING_TAG = ("Error response from daemon: manifest for {image} not found: manifest unknown: "
               "Requested image not found")
MISSING_REPOSITORY = ("Error response from daemon: repository {repo} not found: name unknown: The repository "
                      "with name 'fleetcast/tensorrt-llm' does not exist in the registry with id '111122223333'")
ECR_TAGGED = "111122223333.dkr.ecr.ap-northeast-2.amazonaws.com/fleetcast/tensorrt-llm:1.2.1-fleetcast-0123456789"
IMDS = ('case "$*" in *api/token*) echo tok;; *instance-id*) echo i-0abc123;; '
        '*autoScaling:groupName*|*autoscaling:groupName*) echo fleetcast-ap-northeast-2-l40s;; *) exit 22;; esac')


def registry_answers(message: str) -> str:
    """A docker stand-in: login reads its password from stdin and succeeds; pull fails with `message`."""
    return f'[ "$1" = login ] && {{ cat >/dev/null; exit 0; }}; echo "{message}" >&2; exit 1'


@pytest.mark.parametrize("message", [MISSING_TAG, MISSING_REPOSITORY])
def test_an_image_that_is_not_staged_abandons_the_launch_at_once(tmp_path, message):
    """No retry can make a missing tag appear: the instance completes its launch hook with ABANDON now,
    instead of waiting the hook's whole timeout (operations.launch_hook_timeout_s) in Pending:Wait."""
    from fleetcast.contract.telemetry import LAUNCH_HOOK

    text = message.format(image=ECR_TAGGED, repo=ECR_TAGGED.rsplit(":", 1)[0])
    bin_dir = fake_bin(tmp_path, aws='[ "$1" = ecr ] && echo ecr-password; exit 0', docker=registry_answers(text),
                       sleep="exit 0", curl=IMDS)
    result = run("pull-image.sh", tmp_path, bin_dir, FLEETCAST_IMAGE=ECR_TAGGED, FLEETCAST_REGION="ap-northeast-2")
    assert result.returncode == 1 and "not staged in ap-northeast-2" in result.stderr
    log = calls(tmp_path)
    assert log.count(f"docker pull --quiet {ECR_TAGGED}") == 1 and not any(c.startswith("sleep") for c in log)
    (abandon,) = [c for c in log if c.startswith("aws autoscaling")]
    assert abandon == ("aws autoscaling complete-lifecycle-action --region ap-northeast-2 --lifecycle-hook-name "
                       f"{LAUNCH_HOOK} --auto-scaling-group-name fleetcast-ap-northeast-2-l40s --instance-id "
                       "i-0abc123 --lifecycle-action-result ABANDON")
    assert any("X-aws-ec2-metadata-token-ttl-seconds" in c for c in log if c.startswith("curl"))  # IMDSv2


def test_abandoning_outside_a_launch_is_harmless(tmp_path):
    """A serving instance whose unit restarts has no launch action: the call fails, the script still exits 1."""
    text = MISSING_TAG.format(image=ECR_TAGGED)
    no_action = '[ "$1" = ecr ] && { echo pw; exit 0; }; echo "No active Lifecycle Action found" >&2; exit 254'
    bin_dir = fake_bin(tmp_path, aws=no_action, docker=registry_answers(text), sleep="exit 0", curl=IMDS)
    result = run("pull-image.sh", tmp_path, bin_dir, FLEETCAST_IMAGE=ECR_TAGGED, FLEETCAST_REGION="ap-northeast-2")
    assert result.returncode == 1 and "no launch action to abandon" in result.stderr


def test_missing_env_is_named(tmp_path):
    bin_dir = fake_bin(tmp_path, docker="exit 0")
    result = run("pull-image.sh", tmp_path, bin_dir, FLEETCAST_REGION="us-east-1")
    assert result.returncode != 0 and "FLEETCAST_IMAGE" in result.stderr


def test_container_runs_the_bootstrap_with_the_instance_log_stream(tmp_path):
    bin_dir = fake_bin(
        tmp_path,
        curl='case "$*" in *api/token*) echo tok;; *instance-id*) echo i-0abc123;; esac',
        docker="exit 0",
    )
    # run-container.sh execs /usr/bin/docker; point it at the stand-in.
    script = (HOST / "run-container.sh").read_text().replace("/usr/bin/docker", str(bin_dir / "docker"))
    (tmp_path / "run.sh").write_text(script)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FLEETCAST_REGION": "ap-northeast-2", "FLEETCAST_POOL": "l40s",
           "FLEETCAST_LOG_GROUP": "/fleetcast/fleetcast/instances", "FLEETCAST_IMAGE": ECR_IMAGE}
    result = subprocess.run(["bash", str(tmp_path / "run.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    curl_calls = [c for c in calls(tmp_path) if c.startswith("curl")]
    assert "-X PUT" in curl_calls[0] and "X-aws-ec2-metadata-token-ttl-seconds" in curl_calls[0]  # IMDSv2
    docker = [c for c in calls(tmp_path) if c.startswith("docker run")][0]
    for part in ("--gpus all", "--network host", "--env-file /etc/fleetcast/env",
                 "--log-opt awslogs-stream=l40s/i-0abc123", "--log-opt awslogs-group=/fleetcast/fleetcast/instances",
                 "--volume /var/lib/fleetcast:/var/lib/fleetcast", f"{ECR_IMAGE} python3 -m runtime.bootstrap"):
        assert part in docker, part
