"""Read what `fleetcast stage` put in the region bucket: the model checkpoint and calibration set.

Instances never reach the hub. They wait (bounded) for the staged manifest,
download every file it lists and verify size and sha256 before a build uses it.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from fleetcast.contract.manifest import MANIFEST_NAME, Manifest, verify_tree

from .engine_cache import CacheError, NotABuildFailure, RetryingS3

log = logging.getLogger("fleetcast.staged")


class StagingMissing(NotABuildFailure):
    """The staged model or calibration set is not in the bucket (or is incomplete): staging's fault, not the
    build's, so it is not BuildFailed. It does count toward the key's circuit breaker: every new instance
    would wait the whole staging wait for the same absent input (a mistaken calibration.dataset, a revision
    never staged), so after operations.build_failure_limit of them the next instances abandon at once,
    naming it. Once the missing manifest is staged, the breaker clears itself (EngineCache.check_breaker)."""

    counts_toward_breaker = True

    def __init__(self, message: str, missing_key: str | None = None):
        super().__init__(message)
        self.missing_key = missing_key


def calibration_key_prefix(dataset_uri: str) -> str:
    """The key prefix of the staged calibration set; read from this region's bucket (staging copies it there)."""
    without_scheme = dataset_uri[len("s3://"):]
    _, _, key = without_scheme.partition("/")
    return key.rstrip("/") + "/"


def fetch_staged(store: RetryingS3, prefix: str, dest: Path, wait_s: float, poll_s: float = 15.0,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                 stage_with: str = "`fleetcast stage model` (or `fleetcast stage calibration`)") -> tuple[Manifest, float]:
    """Download and verify s3://bucket/<prefix> into `dest`; returns (manifest, seconds waited for it).
    `stage_with`: the command a missing or damaged artifact is staged with, for the error."""
    started = clock()
    while True:
        got = store.get_bytes(prefix + MANIFEST_NAME)
        if got is not None:
            break
        left = wait_s - (clock() - started)
        if left <= 0:
            raise StagingMissing(
                f"s3://{store.bucket}/{prefix}{MANIFEST_NAME} is missing after waiting {wait_s:.0f} s: "
                f"stage it with {stage_with}",
                missing_key=prefix + MANIFEST_NAME,
            )
        log.warning("waiting for staged s3://%s/%s", store.bucket, prefix)
        # The last poll comes at wait_s, not up to poll_s after it: wait_s is the bound the operator set. What is
        # left is read once: read again after the check and the log line, it could be below 0 (time.sleep refuses).
        sleep(min(poll_s, left))
    waited = clock() - started
    try:
        manifest = Manifest.from_json(got[0])
    except (ValueError, TypeError, KeyError) as exc:
        raise StagingMissing(f"s3://{store.bucket}/{prefix}{MANIFEST_NAME} is unreadable: {exc}") from None
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for f in manifest.files:
        target = dest / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            store.download_file(prefix + f.path, target)
        except Exception as exc:
            if isinstance(exc, CacheError):
                raise
            raise StagingMissing(f"s3://{store.bucket}/{prefix}{f.path} listed in the manifest cannot be read: {exc}") from None
    problems = verify_tree(dest, manifest)
    if problems:
        raise StagingMissing(f"staged s3://{store.bucket}/{prefix} does not match its manifest: {'; '.join(problems[:5])}; "
                             f"stage it again with {stage_with}")
    return manifest, waited
