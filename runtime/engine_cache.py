"""The engine cache in the region bucket: build once per key, share with every instance.

Layout (region bucket, fleetcast/contract/bucket.py): engines/<key>/manifest.json, written last, names
the build that is the entry; engines/<key>/builds/<build_id>/ holds one immutable prefix per build attempt;
locks/<key>.json is the build lock (conditional writes only); failures/<key>/<n>.json one marker per failed
build (the circuit breaker).

Why it is safe:
- A reader never sees a partial entry: artifact files go under a prefix unique to
  the build, and the manifest that points at them is written after all of them.
  Two builders (say, one that lost its lock) never write the same object.
- One builder per key: the lock is created with `IfNoneMatch="*"`. A lock whose
  holder stopped refreshing it is taken over with `IfMatch` on the ETag that was
  read, so of several waiters exactly one wins; there is no delete-then-create
  window. The holder refreshes it (again `IfMatch`) while it builds.
- Every file is checked against the manifest's size and sha256 before use; an
  entry that fails is rebuilt under the lock and replaced with `IfMatch` on the
  bad manifest's ETag, never served.
- A failed build leaves a marker; after `failure_limit` markers new instances stop
  at once (CircuitOpen) instead of burning GPU hours in a replace-and-fail loop.
- Transient S3 errors are retried with backoff up to a deadline, then surface
  as StorageUnavailable (the caller ABANDONs the launch). That includes the
  wrappers of boto3's transfer layer (S3UploadFailedError around a ClientError,
  RetriesExceededError around broken or stalled downloads), and a download that
  delivers no byte for `s3_stall_timeout_s` (the client's socket read timeout).
- A holder that lost its lock (it froze past the lock's lifetime and someone took
  over) deletes what it uploaded instead of publishing it; so does a holder whose
  manifest write lost the race. A replaced (corrupt) entry's build files are
  deleted once the new manifest is in; the bucket's lifecycle rules expire the
  noncurrent versions and abort multipart uploads a killed holder left behind
  (stacks/storage.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from boto3.exceptions import RetriesExceededError, S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import (
    ClientError,
    ConnectionError as BotoConnectionError,
    HTTPClientError,
    IncompleteReadError,
)
from s3transfer.exceptions import RetriesExceededError as TransferRetriesExceededError

from fleetcast.contract import bucket as bucket_layout
from fleetcast.contract.instance_env import Var, default
from fleetcast.contract.manifest import MANIFEST_NAME, Manifest, build_manifest, verify_tree
from fleetcast.contract.model_ids import model_slug

log = logging.getLogger("fleetcast.engine_cache")
_T = TypeVar("_T")

CACHE_FORMAT = 1  # bump to invalidate every key when the layout or key recipe changes


# ---------------------------------------------------------------- errors


class CacheError(RuntimeError):
    """Base of every engine-cache failure the bootstrap turns into ABANDON."""


class NotABuildFailure(CacheError):
    """A build stopped for a reason outside it (S3 down, inputs not staged yet, the instance reclaimed):
    it is not BuildFailed. Most record no failure marker (the breaker is for builds that fail on their own);
    one that would repeat on every new instance (`counts_toward_breaker`, e.g. a staged input that is not
    there after the whole wait) records one, so a config mistake ends in an open breaker, not a relaunch loop.
    `missing_key`: the object whose arrival would make the next attempt succeed (the breaker then heals)."""

    counts_toward_breaker = False
    missing_key: str | None = None


class StorageUnavailable(NotABuildFailure):
    """S3 kept failing past the retry deadline."""


class WriteConflicts(StorageUnavailable):
    """A conditional write met 409 ConditionalRequestConflict on every try (`EngineCache.put_if_at`)."""


class CircuitOpen(CacheError):
    """Too many failed builds for this key: stop rebuilding until someone looks."""


class BuildFailed(CacheError):
    """This instance's build attempt failed (a failure marker was written)."""


class WaitTimeout(CacheError):
    """Another instance held the build lock for longer than we may wait."""


class CorruptEntry(CacheError):
    """An entry's files do not match its manifest."""


class LockLost(CacheError):
    """This holder's lock was taken over while it built (it froze, or its refreshes failed)."""


# ---------------------------------------------------------------- key


@dataclass(frozen=True)
class CacheInputs:
    """Everything that makes two engines different. Its hash is the cache key."""

    model_id: str
    revision: str
    backend: str
    precision: str
    kv_cache_dtype: str
    max_batch_size: int
    max_num_tokens: int
    max_input_len: int
    max_output_len: int
    builder: str  # "tensorrt-llm" or "reference"
    builder_version: str  # TensorRT-LLM release, or the reference backend's artifact format
    compute_capability: str
    calibration: str = ""  # staged calibration set + samples, for calibrated precisions

    def digest(self) -> str:
        canonical = json.dumps({"format": CACHE_FORMAT, **asdict(self)}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def key(self) -> str:
        """Readable prefix (model slug, precision, GPU arch) plus a hash of every input. The slug keeps the key one
        S3 key segment and one directory (fleetcast/contract/model_ids.py); the hash holds the id itself."""
        arch = "sm" + self.compute_capability.replace(".", "")
        return f"{model_slug(self.model_id)}-{self.precision}-{arch}-{self.digest()[:20]}"


# ---------------------------------------------------------------- settings & results


@dataclass(frozen=True)
class CacheSettings:
    failure_limit: int = 3
    lock_ttl_s: float = default(Var.LOCK_TTL_S)
    lock_refresh_s: float = default(Var.LOCK_REFRESH_S)
    wait_timeout_s: float = default(Var.WAIT_TIMEOUT_S)
    poll_s: float = default(Var.POLL_S)
    s3_retry_deadline_s: float = default(Var.S3_RETRY_DEADLINE_S)
    s3_backoff_base_s: float = default(Var.S3_BACKOFF_S)
    s3_backoff_max_s: float = 20.0
    s3_stall_timeout_s: float = default(Var.S3_STALL_S)
    # A release that fails is retried this long at most: the original error must surface soon.
    lock_release_deadline_s: float = 30.0


def s3_client(session: Any, settings: CacheSettings) -> Any:
    """The S3 client the runtime uses: the socket read timeout is the stall bound.

    botocore applies `read_timeout` to every socket read, so a transfer that stops
    delivering bytes fails after that long with ReadTimeoutError instead of waiting
    on a dead connection; RetryingS3 then retries it within its deadline.
    """
    from botocore.config import Config

    return session.client("s3", config=Config(
        retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5,
        read_timeout=settings.s3_stall_timeout_s))


# One attempt per download_file call: RetryingS3 owns retries (backoff, deadline, the log
# line), instead of s3transfer's num_download_attempts=5 silently multiplying a stall by five.
_TRANSFER = TransferConfig(num_download_attempts=1)


@dataclass
class Resolution:
    """How the engine was obtained."""

    path: Path
    outcome: str  # "local" (already on disk), "hit" (downloaded), "built"
    manifest: Manifest
    build_seconds: float = 0.0
    download_seconds: float = 0.0
    waited_seconds: float = 0.0
    events: list[str] = field(default_factory=list)


@dataclass
class _Lock:
    etag: str
    body: dict[str, Any]
    lost: bool = False


_TRANSIENT_CODES = {
    "InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "RequestTimeTooSkewed",
    "Throttling", "ThrottlingException", "503", "500", "502", "504",
}


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _precondition_failed(exc: ClientError) -> bool:
    return _code(exc) == "PreconditionFailed" or _status(exc) == 412


def _conflict(exc: ClientError) -> bool:
    # S3 answers 409 ConditionalRequestConflict when two conditional writes race.
    return _code(exc) == "ConditionalRequestConflict" or _status(exc) == 409


# A conditional PutObject that keeps meeting 409 ConditionalRequestConflict (another write overlapping it each time)
# is tried this many times, backing off, before the cache reports S3 as unavailable.
_CONFLICT_ATTEMPTS = 6


def _not_found(exc: ClientError) -> bool:
    return _code(exc) in ("NoSuchKey", "404", "NotFound") or _status(exc) == 404


def _transient_client_error(exc: ClientError) -> bool:
    return _code(exc) in _TRANSIENT_CODES or _status(exc) >= 500


# Connection failures, timeouts and broken response streams (botocore), plus what boto3's
# transfer layer turns them into. boto3/s3/transfer.py (S3Transfer.download_file) re-raises
# s3transfer's RetriesExceededError as boto3.exceptions.RetriesExceededError once
# s3transfer/download.py (GetObjectTask) has run out of attempts on the errors in
# s3transfer/utils.py S3_RETRYABLE_DOWNLOAD_ERRORS (socket errors, ReadTimeoutError,
# IncompleteReadError, ResponseStreamingError).
_TRANSIENT_ERRORS = (BotoConnectionError, HTTPClientError, IncompleteReadError, RetriesExceededError,
                     TransferRetriesExceededError)


def _upload_cause(exc: S3UploadFailedError) -> ClientError | None:
    """The ClientError boto3 wrapped: boto3/s3/transfer.py (S3Transfer.upload_file) raises
    S3UploadFailedError inside `except ClientError`, so the original is its __context__."""
    cause = exc.__cause__ or exc.__context__
    return cause if isinstance(cause, ClientError) else None


class RetryingS3:
    """S3 calls of one bucket, retried with capped exponential backoff on transient failures.

    Client errors that are answers (404, 412 PreconditionFailed, 403) pass through
    at once; connection failures, timeouts, throttling and 5xx are retried until
    `s3_retry_deadline_s`, then StorageUnavailable.
    """

    def __init__(self, s3: Any, bucket: str, settings: CacheSettings, sleep: Callable[[float], None] = time.sleep):
        self.s3, self.bucket, self.settings, self._sleep = s3, bucket, settings, sleep

    def _retry(self, what: str, fn: Callable[[], _T], deadline_s: float | None = None) -> _T:
        s = self.settings
        limit = s.s3_retry_deadline_s if deadline_s is None else deadline_s
        deadline = time.monotonic() + limit
        attempt = 0
        while True:
            try:
                return fn()
            except _TRANSIENT_ERRORS as exc:
                error: Exception = exc
            except S3UploadFailedError as exc:
                cause = _upload_cause(exc)
                if cause is not None and not _transient_client_error(cause):
                    raise cause from None  # an answer (403, 400): callers see the ClientError itself
                error = exc
            except ClientError as exc:
                if not _transient_client_error(exc):
                    raise
                error = exc
            attempt += 1
            # At least one retry whatever the clock says: a single slow attempt (botocore's own retries
            # inside it, a loaded host) must not use up the deadline without S3 being asked again.
            if time.monotonic() >= deadline and attempt >= 2:
                raise StorageUnavailable(
                    f"S3 {what} on s3://{self.bucket} failed for {limit:.0f} s "
                    f"({attempt} attempts); last error: {_describe(error)}"
                ) from None
            delay = min(s.s3_backoff_max_s, s.s3_backoff_base_s * 2 ** min(attempt, 16))
            delay = min(delay * random.uniform(0.5, 1.0), max(0.0, deadline - time.monotonic()))
            log.warning("S3 %s failed (%s); retry %d in %.1f s", what, _describe(error), attempt, delay)
            self._sleep(delay)

    def call(self, op: str, deadline_s: float | None = None, **kwargs: Any) -> Any:
        return self._retry(op, lambda: getattr(self.s3, op)(**kwargs), deadline_s)

    def download_file(self, key: str, target: Path) -> None:
        self._retry(f"download of {key}",
                    lambda: self.s3.download_file(self.bucket, key, str(target), Config=_TRANSFER))

    def get_object_bytes(self, key: str) -> tuple[bytes, str]:
        """GetObject and read its body, both inside one retried attempt (a body can break mid-read)."""
        def fetch() -> tuple[bytes, str]:
            resp = self.s3.get_object(Bucket=self.bucket, Key=key)
            return resp["Body"].read(), resp["ETag"]

        return self._retry(f"get_object {key}", fetch)

    def get_bytes(self, key: str) -> tuple[bytes, str] | None:
        """(body, etag), or None when the object does not exist."""
        try:
            return self.get_object_bytes(key)
        except ClientError as exc:
            if _not_found(exc):
                return None
            raise


def _describe(exc: Exception) -> str:
    """An error with what the transfer layer wrapped: 'Max Retries Exceeded' alone names no cause."""
    inner = getattr(exc, "last_exception", None)
    if isinstance(exc, (RetriesExceededError, TransferRetriesExceededError)) and inner is not None:
        text = f"{type(exc).__name__}: {type(inner).__name__}: {inner}"
        if "timeout" in type(inner).__name__.lower() or "timed out" in str(inner).lower():
            text += " (stalled: no bytes within the S3 stall timeout)"
        return text
    if "timeout" in type(exc).__name__.lower():
        return f"{type(exc).__name__}: {exc} (stalled: no bytes within the S3 stall timeout)"
    return f"{type(exc).__name__}: {exc}"


class EngineCache:
    """One cache key in one bucket, seen from one instance."""

    def __init__(self, s3: Any, bucket: str, inputs: CacheInputs, *, holder: str = "",
                 settings: CacheSettings | None = None, sleep: Callable[[float], None] = time.sleep):
        self.s3 = s3
        self.bucket = bucket
        self.inputs = inputs
        self.key = inputs.key
        self.settings = settings or CacheSettings()
        self.holder = holder or f"{socket.gethostname()}-{os.getpid()}"
        self._sleep = sleep
        self.store = RetryingS3(s3, bucket, self.settings, sleep)
        self.entry_prefix = bucket_layout.engine_prefix(self.key)
        self.manifest_key = f"{self.entry_prefix}{MANIFEST_NAME}"
        self.lock_key = bucket_layout.lock_key(self.key)
        self.failure_prefix = bucket_layout.failure_prefix(self.key)
        self._refresh_mutex = threading.Lock()

    def _call(self, op: str, **kwargs: Any) -> Any:
        return self.store.call(op, **kwargs)

    def _get_json(self, key: str) -> tuple[dict[str, Any] | None, str | None, bytes | None]:
        """(parsed body or None if unparseable, etag, raw) or (None, None, None) when absent."""
        found = self.store.get_bytes(key)
        if found is None:
            return None, None, None
        raw, etag = found
        try:
            return json.loads(raw), etag, raw
        except ValueError:
            return None, etag, raw

    # ------------------------------------------------------------ manifest

    def read_manifest(self) -> tuple[Manifest | None, str | None]:
        """The published entry, if any: (manifest, etag). An unreadable manifest is (None, etag)."""
        _, etag, raw = self._get_json(self.manifest_key)
        if etag is None:
            return None, None
        try:
            manifest = Manifest.from_json(raw or b"")
            if manifest.extra.get("key") != self.key or "artifact_prefix" not in manifest.extra:
                raise ValueError("manifest does not describe this key")
            return manifest, etag
        except (ValueError, TypeError, KeyError) as exc:
            log.error("engine manifest s3://%s/%s is unreadable (%s): treating the entry as corrupt",
                      self.bucket, self.manifest_key, exc)
            return None, etag

    # ------------------------------------------------------------ circuit breaker

    def failures(self) -> list[str]:
        resp = self._call("list_objects_v2", Bucket=self.bucket, Prefix=self.failure_prefix)
        return sorted(o["Key"] for o in resp.get("Contents", []))

    def check_breaker(self) -> None:
        failures = self.failures()
        if len(failures) < self.settings.failure_limit:
            return
        last, _, _ = self._get_json(failures[-1])
        missing = (last or {}).get("missing")
        if missing and self._get_json(missing)[1] is not None:
            # What the staging failures waited for is there now (`fleetcast stage ...` ran): those markers
            # no longer describe this key, so the next instance tries again instead of needing a manual reset.
            for key in failures:
                body, _, _ = self._get_json(key)
                if (body or {}).get("missing"):
                    self._call("delete_object", Bucket=self.bucket, Key=key)
            log.info("s3://%s/%s is staged now: cleared the staging failures of %s", self.bucket, missing, self.key)
            return self.check_breaker()
        reason = (last or {}).get("error", "unknown error")
        if missing:
            reason += f" (this clears itself once s3://{self.bucket}/{missing} is staged)"
        raise CircuitOpen(
            f"engine build for {self.key} failed {len(failures)} time(s) (limit {self.settings.failure_limit}); "
            f"last error: {reason}. Not rebuilding: fix the cause, then delete s3://{self.bucket}/{self.failure_prefix}"
        )

    def record_failure(self, error: str, build_id: str, missing: str | None = None) -> str:
        body = {"key": self.key, "holder": self.holder, "build_id": build_id, "error": error[-4000:],
                "at": time.time(), "inputs": asdict(self.inputs)}
        if missing:
            body["missing"] = missing
        n = len(self.failures()) + 1
        for _ in range(100):
            key = f"{self.failure_prefix}{n:04d}.json"
            if self.put_if_at(key, json.dumps(body).encode(), None) is not None:
                return key
            n += 1
        raise CacheError(f"could not write a failure marker under {self.failure_prefix}")

    # ------------------------------------------------------------ conditional writes

    def put_if_at(self, key: str, body: bytes, etag: str | None, deadline_s: float | None = None) -> str | None:
        """Write `body` at `key` if the key is still at `etag` (None: absent). The new ETag, or None when the key
        has moved on (S3 answered 412, or 404 to an If-Match, or another ETag is there now); WriteConflicts when
        every try met a 409. `deadline_s` bounds each try's retries of S3 failures (RetryingS3).

        Two answers are not what they look like. A 409 ConditionalRequestConflict is an overlap, not a verdict:
        PutObject's reference says to fetch the ETag and retry, so the write is retried while the key is still at
        `etag`. And a write whose answer was lost (RetryingS3 sent it again after a timeout or a 5xx) meets its own
        first copy: the key holding exactly `body` is this write's (every body written here is unique: a nonce, a
        build id, a time).
        """
        condition = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
        for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
            try:
                resp = self.store.call("put_object", deadline_s=deadline_s, Bucket=self.bucket, Key=key, Body=body,
                                       ContentType="application/json", **condition)
                return str(resp["ETag"])
            except ClientError as exc:
                # A 404 answers an If-Match (the key is gone); to a create it can only be NoSuchBucket: an error.
                gone = etag is not None and _not_found(exc)
                if not (_conflict(exc) or _precondition_failed(exc) or gone):
                    raise
                overlapped = _conflict(exc)
            _, current, raw = self._get_json(key)
            if raw == body:
                return current
            if not overlapped or current != etag:
                return None
            if attempt < _CONFLICT_ATTEMPTS:
                self._sleep(min(2.0, 0.05 * 2 ** attempt) * random.uniform(0.5, 1.0))
        raise WriteConflicts(f"S3 PutObject of s3://{self.bucket}/{key} met {_CONFLICT_ATTEMPTS} conflicting "
                             "writes in a row (409 ConditionalRequestConflict)")

    def clear_failures(self) -> None:
        for key in self.failures():
            self._call("delete_object", Bucket=self.bucket, Key=key)

    # ------------------------------------------------------------ lock

    def _lock_body(self, build_id: str) -> dict[str, Any]:
        now = time.time()
        return {"key": self.key, "holder": self.holder, "build_id": build_id, "heartbeat_at": now,
                "ttl_s": self.settings.lock_ttl_s, "nonce": uuid.uuid4().hex}

    def try_lock(self, build_id: str) -> _Lock | None:
        """Take the lock if it is free or stale; None when someone else holds it, or others keep writing it (every
        try met a 409: the wait loop polls again)."""
        try:
            return self._take_lock(build_id)
        except WriteConflicts:
            return None

    def _take_lock(self, build_id: str) -> _Lock | None:
        body = self._lock_body(build_id)
        data = json.dumps(body).encode()
        taken = self.put_if_at(self.lock_key, data, None)
        if taken is not None:
            log.info("took build lock %s", self.lock_key)
            return _Lock(etag=taken, body=body)
        current, etag, _ = self._get_json(self.lock_key)
        if etag is None:
            return None  # released between our two calls: next round tries again
        age = time.time() - float((current or {}).get("heartbeat_at", 0))
        if current is not None and age <= self.settings.lock_ttl_s:
            return None
        # Stale (or unreadable) lock: replace exactly that version of it. If another
        # waiter got there first the ETag no longer matches and we keep waiting.
        taken = self.put_if_at(self.lock_key, data, etag)
        if taken is None:
            return None
        log.warning("took over stale build lock %s (held by %s, silent for %.0f s)",
                    self.lock_key, (current or {}).get("holder", "?"), age)
        return _Lock(etag=taken, body=body)

    def refresh_lock(self, lock: _Lock) -> bool:
        # One refresh at a time (the refresher thread and publish's confirmation): two
        # conditional writes on the same ETag would make the second look like a takeover.
        with self._refresh_mutex:
            if lock.lost:
                return False
            return self._refresh_lock(lock)

    def _refresh_lock(self, lock: _Lock) -> bool:
        body = dict(lock.body, heartbeat_at=time.time(), nonce=uuid.uuid4().hex)
        etag = self.put_if_at(self.lock_key, json.dumps(body).encode(), lock.etag)
        if etag is None:
            lock.lost = True
            log.error("build lock %s was taken over by another instance", self.lock_key)
            return False
        lock.etag, lock.body = etag, body
        return True

    def release_lock(self, lock: _Lock) -> None:
        """Delete the lock if it is still ours. S3 failing here is retried briefly
        (`lock_release_deadline_s`), then StorageUnavailable.

        A refresh may still be in flight when the build ends (the refresher gets 5 s to stop), and move the lock
        to an ETag this release does not know yet: a lock that still names this holder and build is ours, and is
        deleted at the ETag it has, instead of being left to go stale while every waiter waits `lock_ttl_s`.
        """
        deadline = min(self.settings.lock_release_deadline_s, self.settings.s3_retry_deadline_s)
        etag: str | None = lock.etag
        for _ in range(_CONFLICT_ATTEMPTS):
            try:
                self.store.call("delete_object", deadline_s=deadline, Bucket=self.bucket, Key=self.lock_key,
                                IfMatch=etag)
                return
            except ClientError as exc:
                if _not_found(exc):
                    return  # gone already: a resent delete's first copy
                if not (_precondition_failed(exc) or _conflict(exc)):
                    raise
            current, etag, _ = self._get_json(self.lock_key)
            if etag is None:
                return
            if not self._names_this_build(current, lock):
                log.warning("build lock %s was no longer ours at release", self.lock_key)
                return
        log.warning("build lock %s kept changing under its release; it goes stale in %.0f s (lock_ttl_s)",
                    self.lock_key, self.settings.lock_ttl_s)

    @staticmethod
    def _names_this_build(body: dict[str, Any] | None, lock: _Lock) -> bool:
        return (body is not None and not body.get("released") and body.get("holder") == lock.body["holder"]
                and body.get("build_id") == lock.body["build_id"])

    def abandon_lock(self, lock: _Lock) -> None:
        """Let others build now, whatever S3 does; never raises (the caller has a better error to report).

        The delete may fail while a PutObject still works (S3 throttles per operation and
        prefix): then the lock is rewritten as released (heartbeat 0), which every waiter
        takes over at its next poll instead of after `lock_ttl_s`.
        """
        try:
            self.release_lock(lock)
            return
        except Exception as exc:  # noqa: BLE001 - reported, then the fallback below
            log.error("could not release build lock %s: %s", self.lock_key, exc)
        body = dict(lock.body, heartbeat_at=0, released=True, nonce=uuid.uuid4().hex)
        try:
            if self.put_if_at(self.lock_key, json.dumps(body).encode(), lock.etag,
                              deadline_s=min(self.settings.lock_release_deadline_s, self.settings.s3_retry_deadline_s)):
                log.warning("marked build lock %s released; waiters take it over now", self.lock_key)
            else:
                log.warning("build lock %s was no longer ours at release", self.lock_key)
        except Exception as exc:  # noqa: BLE001
            log.error("could not mark build lock %s released either (%s); other instances take it over "
                      "once it is %.0f s old (lock_ttl_s)", self.lock_key, exc, self.settings.lock_ttl_s)

    # ------------------------------------------------------------ transfer

    def download(self, manifest: Manifest, dest: Path) -> None:
        """Fetch every file of the entry into `dest` and verify it; CorruptEntry on any mismatch."""
        prefix = manifest.extra["artifact_prefix"]
        partial = dest.with_name(dest.name + f".partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            for f in manifest.files:
                target = partial / f.path
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    self._download_file(prefix + f.path, target)
                except ClientError as exc:
                    if _not_found(exc) or _status(exc) == 403:
                        raise CorruptEntry(f"{self.key}: {f.path} is listed in the manifest but missing") from None
                    raise
            problems = verify_tree(partial, manifest)
            if problems:
                raise CorruptEntry(f"{self.key}: " + "; ".join(problems[:5]))
            (partial / MANIFEST_NAME).write_text(manifest.to_json())
            shutil.rmtree(dest, ignore_errors=True)
            partial.rename(dest)
        finally:
            shutil.rmtree(partial, ignore_errors=True)

    def _download_file(self, key: str, target: Path) -> None:
        self.store.download_file(key, target)

    def publish(self, artifact: Path, build_id: str, build_seconds: float, replace_etag: str | None,
                lock: _Lock | None = None) -> Manifest | None:
        """Upload the artifact under its own prefix, then the manifest (last).

        None when this build did not become the entry (another was published first):
        its files are deleted then, so nothing unreferenced stays in the bucket. With
        `lock`, the lock is confirmed ours (a conditional refresh) after the upload and
        before the manifest: a holder that froze past the lock's lifetime and was taken
        over discards its upload and raises LockLost instead of publishing.
        """
        prefix = bucket_layout.engine_build_prefix(self.key, build_id)
        manifest = build_manifest(
            artifact, kind="engine", name=self.inputs.model_id, revision=self.inputs.revision,
            extra={"key": self.key, "build_id": build_id, "artifact_prefix": prefix, "inputs": asdict(self.inputs),
                   "built_by": self.holder, "build_seconds": round(build_seconds, 3), "built_at": time.time()},
        )
        uploaded: list[str] = []
        try:
            for f in manifest.files:
                self._confirm_lock(lock)
                self._call("upload_file", Filename=str(artifact / f.path), Bucket=self.bucket, Key=prefix + f.path)
                uploaded.append(prefix + f.path)
            self._confirm_lock(lock)
            if self.put_if_at(self.manifest_key, manifest.to_json().encode(), replace_etag or None) is None:
                log.warning("another build of %s was published first; keeping it as the entry and deleting "
                            "this build's upload", self.key)
                self._discard(uploaded)
                return None
        except LockLost:
            self._discard(uploaded)
            raise
        return manifest

    def _confirm_lock(self, lock: _Lock | None) -> None:
        if lock is None:
            return
        if lock.lost or not self.refresh_lock(lock):
            raise LockLost(f"build lock {self.lock_key} was taken over while this instance built "
                           f"(it was silent for more than {self.settings.lock_ttl_s:.0f} s)")

    def _discard(self, keys: list[str]) -> None:
        """Best effort: what is left is an unreferenced build, reclaimed by `delete_build` of a later
        replacement or, failing that, found by `aws s3 ls engines/<key>/builds/`."""
        for key in keys:
            try:
                self._call("delete_object", Bucket=self.bucket, Key=key)
            except Exception as exc:  # noqa: BLE001 - never hide the outcome for a cleanup
                log.warning("could not delete unreferenced s3://%s/%s: %s", self.bucket, key, exc)
                return

    def delete_build(self, prefix: str) -> None:
        """Delete a replaced build's files (in the versioned bucket they become noncurrent
        versions, which the bucket's lifecycle rule expires)."""
        if not prefix.startswith(f"{self.entry_prefix}builds/"):
            return  # a garbled manifest names no prefix of ours: leave the bucket alone
        resp = self._call("list_objects_v2", Bucket=self.bucket, Prefix=prefix)
        self._discard([o["Key"] for o in resp.get("Contents", [])])

    # ------------------------------------------------------------ the whole flow

    def local_entry(self, local_root: Path) -> Manifest | None:
        """A verified entry already on this instance's disk (warm pool restart), else None."""
        path = local_root / self.key
        mf = path / MANIFEST_NAME
        if not mf.is_file():
            return None
        try:
            manifest = Manifest.from_json(mf.read_text())
        except (ValueError, TypeError, KeyError):
            manifest = None
        if manifest is None or manifest.extra.get("key") != self.key or verify_tree(path, manifest):
            log.warning("local engine at %s is incomplete or corrupt; discarding it", path)
            shutil.rmtree(path, ignore_errors=True)
            return None
        return manifest

    def prune_local(self, local_root: Path, keep: set[str] | None = None) -> list[str]:
        """Delete other keys' engines (and dead build dirs) from this disk: an old config's engine is GBs.
        `keep`: every key this instance serves (default: this one's)."""
        keep = {self.key} if keep is None else keep
        removed = []
        for path in local_root.iterdir() if local_root.is_dir() else ():
            if path.name not in keep:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path.name)
        return removed

    def obtain(self, local_root: Path, build: Callable[[Path], Path]) -> Resolution:
        """Return a verified engine on local disk: from disk, from the cache, or built here once.

        `build(workdir)` produces the artifact directory; it runs only while this
        instance holds the lock.
        """
        local_root.mkdir(parents=True, exist_ok=True)
        dest = local_root / self.key
        start = time.monotonic()
        events: list[str] = []
        manifest = self.local_entry(local_root)
        if manifest is not None:
            return Resolution(dest, "local", manifest, events=["local"])
        corrupt: set[str] = set()
        deadline = start + self.settings.wait_timeout_s
        while True:
            manifest, etag = self.read_manifest()
            if etag is not None and etag not in corrupt:
                if manifest is None:
                    corrupt.add(etag)
                else:
                    t0 = time.monotonic()
                    try:
                        self.download(manifest, dest)
                        events.append("hit")
                        return Resolution(dest, "hit", manifest, download_seconds=time.monotonic() - t0,
                                          waited_seconds=t0 - start, events=events)
                    except CorruptEntry as exc:
                        log.error("engine cache entry is corrupt, rebuilding: %s", exc)
                        events.append("corrupt")
                        corrupt.add(etag)
            # No usable entry: building is the way forward, unless the breaker says stop.
            self.check_breaker()
            build_id = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}"
            lock = self.try_lock(build_id)
            if lock is not None:
                events.append("locked")
                try:
                    resolution = self._build_locked(lock, build_id, build, local_root, dest, corrupt, start, events)
                except LockLost as exc:
                    # Froze past the lock's lifetime: the build that took over is the one to serve.
                    log.error("%s; discarded this build, serving the entry of the instance that took over", exc)
                    events.append("lock-lost")
                    continue
                if resolution is not None:
                    return resolution
                events.append("lost-publish")  # another build became the entry first: fetch it
                continue
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"waited {self.settings.wait_timeout_s:.0f} s for another instance to build {self.key}")
            if "waiting" not in events:
                events.append("waiting")
                log.info("another instance is building %s; waiting", self.key)
            self._sleep(self.settings.poll_s * random.uniform(0.8, 1.2))

    def _build_locked(self, lock: _Lock, build_id: str, build: Callable[[Path], Path], local_root: Path, dest: Path,
                      corrupt: set[str], start: float, events: list[str]) -> Resolution | None:
        """Build and publish under `lock`; None when another build became the entry first."""
        stop = threading.Event()

        def refresher() -> None:
            while not stop.wait(self.settings.lock_refresh_s):
                try:
                    if not self.refresh_lock(lock):
                        return
                except Exception as exc:  # noqa: BLE001 - a missed refresh only risks a takeover
                    log.warning("could not refresh build lock: %s", exc)

        thread = threading.Thread(target=refresher, name="build-lock-refresh", daemon=True)
        thread.start()
        try:
            # Someone may have published while we were taking the lock.
            manifest, etag = self.read_manifest()
            if manifest is not None and etag not in corrupt:
                try:
                    t0 = time.monotonic()
                    self.download(manifest, dest)
                    events.append("hit")
                    return Resolution(dest, "hit", manifest, download_seconds=time.monotonic() - t0,
                                      waited_seconds=t0 - start, events=events)
                except CorruptEntry:
                    corrupt.add(etag or "")
            replace = etag if etag is not None else None
            replaced_prefix = str(manifest.extra.get("artifact_prefix", "")) if manifest is not None else ""
            self.check_breaker()
            work = local_root / f".build-{build_id}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            t0 = time.monotonic()
            try:
                artifact = build(work)
            except NotABuildFailure as exc:
                shutil.rmtree(work, ignore_errors=True)
                if exc.counts_toward_breaker:
                    try:
                        self.record_failure(f"{type(exc).__name__}: {exc}", build_id, exc.missing_key)
                    except CacheError as marker_exc:  # S3 down too: the instance still reports its own error
                        log.error("no failure marker written for %s: %s", self.key, marker_exc)
                raise
            except Exception as exc:
                shutil.rmtree(work, ignore_errors=True)
                try:
                    where = f"marker s3://{self.bucket}/{self.record_failure(f'{type(exc).__name__}: {exc}', build_id)}"
                except CacheError as marker_exc:  # S3 down too: the build's own error is still the one to report
                    where = f"no failure marker written: {marker_exc}"
                raise BuildFailed(f"engine build for {self.key} failed: {exc} ({where})") from exc
            build_seconds = time.monotonic() - t0
            events.append("built")
            try:
                published = self.publish(artifact, build_id, build_seconds, replace, lock)
            except BaseException:
                shutil.rmtree(work, ignore_errors=True)
                raise
            if published is None:
                shutil.rmtree(work, ignore_errors=True)
                return None
            manifest = published
            if replaced_prefix and replaced_prefix != manifest.extra["artifact_prefix"]:
                self.delete_build(replaced_prefix)  # the corrupt entry's files: nobody references them now
            self.clear_failures()
            (artifact / MANIFEST_NAME).write_text(manifest.to_json())
            shutil.rmtree(dest, ignore_errors=True)
            shutil.move(str(artifact), str(dest))
            shutil.rmtree(work, ignore_errors=True)
            return Resolution(dest, "built", manifest, build_seconds=build_seconds, waited_seconds=t0 - start,
                              events=events)
        finally:
            stop.set()
            thread.join(timeout=5)
            if not lock.lost:
                # Never raises: an error in flight (an S3 outage, a failed build) is the one to report,
                # and a release S3 refuses must not keep others waiting the lock's whole lifetime.
                self.abandon_lock(lock)
