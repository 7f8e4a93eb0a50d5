"""`fleetcast stage model|calibration`: fetch once, upload to one region, copy server-side to the rest.

Hub downloads happen on the operator's machine (which has internet); the
fleet's instances only ever read their region's bucket. A gated model's token
comes from the environment (HF_TOKEN) or Secrets Manager and is only passed in
memory to the hub client: never written to disk, never logged.
"""

from __future__ import annotations

import glob
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetcast.config import FleetConfig
from fleetcast.config.model import ModelSpec
from fleetcast.contract import selection
from fleetcast.contract.bucket import calibration_prefix, model_prefix
from fleetcast.contract.calibration import FORMAT as CALIBRATION_FORMAT
from fleetcast.contract.errors import UserError
from fleetcast.contract.manifest import Manifest, build_manifest

from .transfer import (
    DEFAULT_PART_SIZE,
    TransferReport,
    TreeUploader,
    copy_prefix,
    human_bytes,
    read_manifest,
    verify_prefix,
)

ClientFactory = Callable[[str, str], Any]  # (service, region) -> boto3 client


@dataclass
class StageResult:
    prefix: str
    manifest: Manifest
    reports: dict[str, TransferReport] = field(default_factory=dict)  # region -> report

    def lines(self) -> list[str]:
        out = [f"{self.manifest.kind} {self.manifest.name}@{self.manifest.revision}: "
               f"{len(self.manifest.files)} file(s), {human_bytes(self.manifest.total_bytes)} staged "
               f"({self.manifest.total_bytes} bytes)"]
        for region, report in self.reports.items():
            out.append(f"  {region}: {report.line()}")
        return out


def resolve_hub_token(cfg: FleetConfig, clients: ClientFactory, model: ModelSpec | None = None) -> str | None:
    model = model or cfg.model
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token or not model.hub_token_secret:
        return token
    sm = clients("secretsmanager", cfg.regions[0].region)
    try:
        secret: str = sm.get_secret_value(SecretId=model.hub_token_secret)["SecretString"]
        return secret
    except sm.exceptions.ClientError as exc:
        raise UserError(f"cannot read the hub_token_secret {model.hub_token_secret!r} of model {model.id}: "
                        f"{exc.response.get('Error', {}).get('Code')}") from None


@dataclass(frozen=True)
class Selection:
    """What staging takes from a model repository and what it leaves out (path -> size in bytes)."""

    staged: dict[str, int]
    left_out: dict[str, int]

    @classmethod
    def of(cls, files: dict[str, int], extra: tuple[str, ...] = ()) -> Selection:
        chosen = {p: n for p, n in files.items() if selection.staged(p, extra)}
        return cls(staged=chosen, left_out={p: n for p, n in files.items() if p not in chosen})

    def check(self, where: str) -> None:
        if not selection.has_weights(self.staged):
            others = ", ".join(sorted(self.left_out)) or "none"
            raise UserError(f"{where} has no *.safetensors weights (other files: {others}); the build reads "
                            "safetensors: add the format it has to model.stage_patterns, e.g. ['*.bin']")

    def line(self) -> str:
        out = f"staging {len(self.staged)} file(s), {human_bytes(sum(self.staged.values()))}"
        if self.left_out:
            names = sorted(self.left_out, key=lambda p: -self.left_out[p])
            shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
            out += (f"; left out {len(self.left_out)} file(s), {human_bytes(sum(self.left_out.values()))} the build "
                    f"does not read ({shown}; model.stage_patterns adds files)")
        return out


def _hub_failure(exc: BaseException) -> bool:
    """An error of the hub client (an HTTP answer, a connection that failed), not of fleetcast."""
    return isinstance(exc, OSError) or any(c.__module__.split(".")[0] in ("huggingface_hub", "httpx", "httpx2",
                                                                         "httpcore", "httpcore2", "requests")
                                           for c in type(exc).__mro__)


@contextmanager
def hub_errors(field: str, repo_id: str, revision: str) -> Iterator[None]:
    """A hub fetch that fails (no such repository or revision, gated, no token, no network) as one line naming
    the config field to check, instead of the client's traceback."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        if not _hub_failure(exc):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise UserError(f"{field}: fetching {repo_id} at revision {revision!r} from the hub failed: "
                        f"{type(exc).__name__}{': ' + first if first else ''} (check the source and revision, the "
                        "hub token for a gated or private repository, and that this machine reaches the hub)") from None


def fetch_from_hub(repo_id: str, revision: str, dest: Path, token: str | None, extra: tuple[str, ...] = (),
                   log: Callable[[str], None] = print) -> str:
    """Download what the build reads of a hub snapshot into `dest`; returns the commit sha it resolved to."""
    try:
        from huggingface_hub import HfApi, snapshot_download
    except ImportError:  # pragma: no cover - it is a declared dependency
        raise UserError("huggingface_hub is not installed; run `make synth` to set up the environment") from None
    info = HfApi(token=token).model_info(repo_id, revision=revision, files_metadata=True)
    if info.sha is None:
        # huggingface_hub types ModelInfo.sha Optional; downloading at revision=None would fetch the default
        # branch, not `revision`, and record no commit for what was staged.
        raise UserError(f"{repo_id} at revision {revision!r}: the hub named no commit for it; cannot pin what is staged")
    chosen = Selection.of({s.rfilename: s.size or 0 for s in info.siblings or []}, extra)
    chosen.check(f"{repo_id}@{info.sha}")
    log(f"{repo_id}@{info.sha}: {chosen.line()}")
    # Exact names (escaped for fnmatch), so the download is exactly the selection shown above.
    snapshot_download(repo_id, revision=info.sha, local_dir=str(dest), token=token,
                      allow_patterns=[glob.escape(p) for p in chosen.staged])
    return info.sha


def _local_files(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in sorted(root.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
            and p.name != "manifest.json"}


def stage_tree(root: Path, manifest: Manifest, prefix: str, buckets: dict[str, str], clients: ClientFactory, *,
               part_size: int = DEFAULT_PART_SIZE, progress: bool | None = None,
               log: Callable[[str], None] = print) -> StageResult:
    """Upload to the first region, server-side copy to the others, verify every region."""
    if not buckets:
        raise UserError("no region bucket to stage into")
    result = StageResult(prefix=prefix, manifest=manifest)
    regions = list(buckets)
    first = regions[0]
    s3_first = clients("s3", first)
    result.reports[first] = TreeUploader(s3_first, buckets[first], part_size=part_size, progress=progress,
                                         log=log).upload(root, prefix, manifest)
    for region in regions[1:]:
        result.reports[region] = copy_prefix(s3_first, buckets[first], clients("s3", region), buckets[region],
                                             prefix, manifest, progress=progress)
    for region in regions:
        problems = verify_prefix(clients("s3", region), buckets[region], prefix, manifest)
        stored = read_manifest(clients("s3", region), buckets[region], prefix)
        if problems or stored is None or stored.files != manifest.files:
            raise UserError(f"verification failed in {region}: " + "; ".join(problems or ["manifest differs"]))
    return result


def stage_model(cfg: FleetConfig, buckets: dict[str, str], clients: ClientFactory, *, local_dir: Path | None = None,
                part_size: int = DEFAULT_PART_SIZE, progress: bool | None = None,
                log: Callable[[str], None] = print, model_id: str | None = None) -> StageResult:
    """Stage one model of the config (`model_id`; left out: the only one) into every region bucket."""
    model = cfg.model if model_id is None else cfg.model_by_id(model_id)
    prefix = model_prefix(model.id, model.revision)
    if local_dir is not None:
        if not local_dir.is_dir():
            raise UserError(f"--local-dir {local_dir} is not a directory")
        chosen = Selection.of(_local_files(local_dir), model.stage_patterns)
        chosen.check(f"--local-dir {local_dir}")
        log(f"{local_dir}: {chosen.line()}")
        manifest = build_manifest(local_dir, kind="model", name=model.id, revision=model.revision,
                                  source=str(local_dir), include=chosen.staged.__contains__)
        return stage_tree(local_dir, manifest, prefix, buckets, clients, part_size=part_size, progress=progress, log=log)
    if model.staged:
        raise UserError(f"model.source {model.source} is already in S3: copy it with --local-dir after "
                        "downloading, or point source at the hub id")
    token = resolve_hub_token(cfg, clients, model)
    with tempfile.TemporaryDirectory(prefix="fleetcast-model-") as tmp:
        with hub_errors(f"models[{model.id}].source", model.source, model.revision):
            sha = fetch_from_hub(model.source, model.revision, Path(tmp), token, model.stage_patterns, log=log)
        if sha != model.revision:
            log(f"note: revision {model.revision!r} resolved to commit {sha}; pin it in model.revision")
        chosen = Selection.of(_local_files(Path(tmp)), model.stage_patterns)
        manifest = build_manifest(Path(tmp), kind="model", name=model.id, revision=model.revision,
                                  source=f"hub:{model.source}", extra={"commit": sha},
                                  include=chosen.staged.__contains__)
        return stage_tree(Path(tmp), manifest, prefix, buckets, clients, part_size=part_size, progress=progress, log=log)


def stage_calibration(name: str, directory: Path, buckets: dict[str, str], clients: ClientFactory, *,
                      samples: int | None = None, part_size: int = DEFAULT_PART_SIZE, progress: bool | None = None,
                      log: Callable[[str], None] = print) -> StageResult:
    """Validate a JSON Lines calibration set and stage it in the layout TensorRT-LLM's loaders read."""
    from . import calibration

    rows, files = calibration.read_rows(directory)
    log(f"{directory}: {len(rows)} row(s) from {', '.join(p.name for p in files)}")
    if samples is not None and samples > len(rows):
        log(f"note: calibration.samples is {samples} but the set has {len(rows)} row(s); FP8 calibration "
            f"(quantize.py) will use {len(rows)}")
    with tempfile.TemporaryDirectory(prefix="fleetcast-calibration-") as tmp:
        calibration.write_layout(rows, Path(tmp))
        manifest = build_manifest(Path(tmp), kind="calibration", name=name, revision="1", source=str(directory),
                                  extra={"format": CALIBRATION_FORMAT, "rows": len(rows)})
        return stage_tree(Path(tmp), manifest, calibration_prefix(name), buckets, clients,
                          part_size=part_size, progress=progress, log=log)
