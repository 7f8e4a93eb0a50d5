"""`fleetcast stage image`: the pinned TensorRT-LLM image in each region's private ECR repository.

What is pushed is, by default, the derived image (docker/Dockerfile): the
pinned release plus the Python packages the runtime needs that it lacks;
`--plain` mirrors the release unchanged. Two paths:
- `local`: docker pull / build / tag / push from this machine, once per
  region. Simple, but 40-60 GB crosses the operator's link.
- `codebuild` (default): start the provider stack's image-mirror CodeBuild
  project in each region, so the image moves only inside AWS.
Either way the pushed digest is read back from ECR and pinned in the config
(`engine.image_digest`); instances then pull by digest.
"""

from __future__ import annotations

import base64
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fleetcast.config import FleetConfig
from fleetcast.contract.errors import UserError
from fleetcast.contract.image import DOCKERFILE, image_tag


@dataclass(frozen=True)
class ImageTarget:
    region: str
    repository_uri: str  # <account>.dkr.ecr.<region>.amazonaws.com/<name>
    project: str | None = None  # CodeBuild project name (codebuild path)

    @property
    def registry(self) -> str:
        return self.repository_uri.split("/", 1)[0]

    @property
    def repository_name(self) -> str:
        return self.repository_uri.split("/", 1)[1]


LOCAL_NAME = "fleetcast-serving"


def local_build_commands(cfg: FleetConfig, *, derived: bool) -> list[list[str]]:
    """Pull (and build the derived image) once; every region then receives the same bytes, hence one digest."""
    local = f"{LOCAL_NAME}:{image_tag(cfg, derived)}"
    commands = [["docker", "pull", cfg.engine.image]]
    if derived:
        commands.append(["docker", "build", "--file", DOCKERFILE, "--build-arg", f"BASE={cfg.engine.image}",
                         "--tag", local, "."])
    else:
        commands.append(["docker", "tag", cfg.engine.image, local])
    return commands


def local_push_commands(cfg: FleetConfig, target: ImageTarget, *, derived: bool) -> list[list[str]]:
    tag = image_tag(cfg, derived)
    dest = f"{target.repository_uri}:{tag}"
    return [["docker", "tag", f"{LOCAL_NAME}:{tag}", dest], ["docker", "push", dest]]


def ecr_login(ecr: Any, registry: str, run: Callable[..., Any] = subprocess.run) -> None:
    token = ecr.get_authorization_token()["authorizationData"][0]["authorizationToken"]
    user, _, password = base64.b64decode(token).decode().partition(":")
    result = run(["docker", "login", "--username", user, "--password-stdin", registry],
                 input=password.encode(), capture_output=True)
    if result.returncode != 0:
        raise UserError(f"docker login to {registry} failed: {result.stderr.decode(errors='replace').strip()}")


def pushed_digest(ecr: Any, target: ImageTarget, tag: str) -> str:
    try:
        images = ecr.describe_images(repositoryName=target.repository_name, imageIds=[{"imageTag": tag}])
    except ecr.exceptions.ImageNotFoundException:
        raise UserError(f"{target.repository_uri}:{tag} is not in ECR after the push") from None
    digest: str = images["imageDetails"][0]["imageDigest"]
    return digest


def stage_local(cfg: FleetConfig, targets: Sequence[ImageTarget], clients: Callable[[str, str], Any], *,
                derived: bool, dry_run: bool, run: Callable[..., Any] = subprocess.run,
                log: Callable[[str], None] = print) -> dict[str, str]:
    def execute(command: list[str], where: str) -> None:
        log(f"[{where}] {' '.join(command)}")
        if not dry_run and run(command).returncode != 0:
            raise UserError(f"`{' '.join(command)}` failed ({where}); nothing was pinned")

    for command in local_build_commands(cfg, derived=derived):
        execute(command, "local")
    digests: dict[str, str] = {}
    for target in targets:
        log(f"[{target.region}] docker login {target.registry} (password from ECR, on stdin)")
        if not dry_run:
            ecr_login(clients("ecr", target.region), target.registry, run)
        for command in local_push_commands(cfg, target, derived=derived):
            execute(command, target.region)
        if not dry_run:
            digests[target.region] = pushed_digest(clients("ecr", target.region), target, image_tag(cfg, derived))
    return digests


def stage_codebuild(cfg: FleetConfig, targets: Sequence[ImageTarget], clients: Callable[[str, str], Any], *,
                    derived: bool, dry_run: bool, timeout_s: float = 5400, poll_s: float = 20,
                    sleep: Callable[[float], None] = time.sleep, log: Callable[[str], None] = print) -> dict[str, str]:
    tag = image_tag(cfg, derived)
    builds: dict[str, str] = {}
    for target in targets:
        if not target.project:
            raise UserError(f"no image-mirror CodeBuild project found for {target.region}; deploy the provider stack")
        env = [
            {"name": "UPSTREAM_IMAGE", "value": cfg.engine.image, "type": "PLAINTEXT"},
            {"name": "IMAGE_TAG", "value": tag, "type": "PLAINTEXT"},
            {"name": "DERIVED", "value": "1" if derived else "0", "type": "PLAINTEXT"},
        ]
        log(f"[{target.region}] start CodeBuild {target.project}: {cfg.engine.image} -> {target.repository_uri}:{tag}")
        if dry_run:
            continue
        build = clients("codebuild", target.region).start_build(projectName=target.project,
                                                               environmentVariablesOverride=env)
        builds[target.region] = build["build"]["id"]
    digests: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    pending = dict(builds)
    while pending:
        for region, build_id in list(pending.items()):
            status = clients("codebuild", region).batch_get_builds(ids=[build_id])["builds"][0]["buildStatus"]
            if status == "SUCCEEDED":
                target = next(t for t in targets if t.region == region)
                digests[region] = pushed_digest(clients("ecr", region), target, tag)
                log(f"[{region}] mirrored: {digests[region]}")
                del pending[region]
            elif status != "IN_PROGRESS":
                raise UserError(f"[{region}] CodeBuild {build_id} ended {status}; see its logs in CloudWatch")
        if pending:
            if time.monotonic() > deadline:
                raise UserError(f"image mirror still running after {timeout_s:.0f} s: {', '.join(pending)}")
            sleep(poll_s)
    return digests


def single_digest(digests: dict[str, str]) -> str | None:
    """The same image pushed everywhere has one digest; differing digests mean different images."""
    values = set(digests.values())
    if len(values) > 1:
        raise UserError("regions hold different digests for the same tag: " +
                        ", ".join(f"{r}={d}" for r, d in digests.items()))
    return values.pop() if values else None
