"""The serving image's name in each region's ECR repository: the derived image's tag (a digest of its
recipe) and how a launch template names the image. `fleetcast stage image` pushes under this tag and
checks it (fleetcast/staging/image.py, readiness.py); the stacks give instances the same reference.
The config is described by the two attributes read here (fleetcast.config's models have them).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol

from .errors import UserError
from .packaging import installed_path


class _Engine(Protocol):
    @property
    def image(self) -> str: ...
    @property
    def image_digest(self) -> str | None: ...


class FleetConfig(Protocol):
    @property
    def engine(self) -> _Engine: ...


DOCKERFILE = "docker/Dockerfile"
REPO_ROOT = Path(__file__).resolve().parents[2]  # or the site-packages of an installed wheel (installed_path)
# What the derived image is built from. Its digest is part of the tag: ECR tags are immutable
# and staging skips a tag already there, so a changed recipe (say, one more vendored package)
# must get a new tag, or it would never reach a region that staged the old one.
DERIVED_RECIPE = (DOCKERFILE, "runtime/vendor.py")


def derived_recipe_digest(root: Path = REPO_ROOT) -> str:
    digest = hashlib.sha256()
    for rel in DERIVED_RECIPE:
        try:
            content = installed_path(root, rel).read_bytes()
        except OSError as exc:
            raise UserError(f"{rel}: cannot read the derived image's recipe ({exc.strerror}); run from a Fleetcast "
                            "checkout, or stage with --plain") from None
        digest.update(rel.encode() + b"\0" + content + b"\0")
    return digest.hexdigest()[:10]


def image_tag(cfg: FleetConfig, derived: bool, root: Path = REPO_ROOT) -> str:
    """`<release tag>` mirrored plain; `<release tag>-fleetcast-<recipe digest>` derived."""
    upstream_tag = cfg.engine.image.rsplit(":", 1)[-1]
    return f"{upstream_tag}-fleetcast-{derived_recipe_digest(root)}" if derived else upstream_tag


def instance_image_id(cfg: FleetConfig) -> dict[str, str]:
    """How instances name their image in the region repository: by the pinned digest once `fleetcast stage
    image` wrote one, by the derived image's immutable tag before that (ECR `ImageIdentifier`)."""
    if cfg.engine.image_digest:
        return {"imageDigest": cfg.engine.image_digest}
    return {"imageTag": image_tag(cfg, derived=True)}


def image_reference(repository_uri: str, image_id: dict[str, str]) -> str:
    """`<repo>@<digest>` or `<repo>:<tag>`, as docker pulls it."""
    if "imageDigest" in image_id:
        return f"{repository_uri}@{image_id['imageDigest']}"
    return f"{repository_uri}:{image_id['imageTag']}"
