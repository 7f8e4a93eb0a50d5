"""The engine cache in the region bucket: build once per key, share with every instance.

Layout (region bucket):
    engines/<key>/manifest.json              written last; names the build that is the entry
    engines/<key>/builds/<build_id>/<files>  one immutable prefix per build attempt
    locks/<key>.json                         build lock (conditional writes only)
    failures/<key>/<n>.json                  one marker per failed build (circuit breaker)

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
  as StorageUnavailable (the caller ABANDONs the launch).
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from fleetcast.staging.manifest import MANIFEST_NAME, Manifest, build_manifest, verify_tree

log = logging.getLogger("fleetcast.engine_cache")

CACHE_FORMAT = 1  # bump to invalidate every key when the layout or key recipe changes


# ---------------------------------------------------------------- errors


class CacheError(RuntimeError):
    """Base of every engine-cache failure the bootstrap turns into ABANDON."""


class StorageUnavailable(CacheError):
    """S3 kept failing past the retry deadline."""


class CircuitOpen(CacheError):
    """Too many failed builds for this key: stop rebuilding until someone looks."""


class BuildFailed(CacheError):
    """This instance's build attempt failed (a failure marker was written)."""


class WaitTimeout(CacheError):
    """Another instance held the build lock for longer than we may wait."""


class CorruptEntry(CacheError):
    """An entry's files do not match its manifest."""


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
        """Readable prefix (model, precision, GPU arch) plus a hash of every input."""
        arch = "sm" + self.compute_capability.replace(".", "")
        return f"{self.model_id}-{self.precision}-{arch}-{self.digest()[:20]}"


# ---------------------------------------------------------------- settings & results


@dataclass(frozen=True)
class CacheSettings:
    failure_limit: int = 3
    lock_ttl_s: float = 300.0  # a lock not refreshed for this long is stale
    lock_refresh_s: float = 60.0
    wait_timeout_s: float = 3 * 3600.0  # how long a waiter waits for another builder
    poll_s: float = 10.0
    s3_retry_deadline_s: float = 300.0
    s3_backoff_base_s: float = 0.5
    s3_backoff_max_s: float = 20.0


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
    body: dict
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


def _not_found(exc: ClientError) -> bool:
    return _code(exc) in ("NoSuchKey", "404", "NotFound") or _status(exc) == 404


class RetryingS3:
    """S3 calls of one bucket, retried with capped exponential backoff on transient failures.

    Client errors that are answers (404, 412 PreconditionFailed, 403) pass through
    at once; connection failures, timeouts, throttling and 5xx are retried until
    `s3_retry_deadline_s`, then StorageUnavailable.
    """

    def __init__(self, s3: Any, bucket: str, settings: "CacheSettings", sleep: Callable[[float], None] = time.sleep):
        self.s3, self.bucket, self.settings, self._sleep = s3, bucket, settings, sleep

    def _retry(self, what: str, fn: Callable[[], Any]) -> Any:
        s = self.settings
        deadline = time.monotonic() + s.s3_retry_deadline_s
        attempt = 0
        while True:
            try:
                return fn()
            except (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError) as exc:
                error: Exception = exc
            except ClientError as exc:
                if _code(exc) not in _TRANSIENT_CODES and _status(exc) < 500:
                    raise
                error = exc
            attempt += 1
            if time.monotonic() >= deadline:
                raise StorageUnavailable(
                    f"S3 {what} on s3://{self.bucket} failed for {s.s3_retry_deadline_s:.0f} s "
                    f"({attempt} attempts); last error: {error}"
                ) from None
            delay = min(s.s3_backoff_max_s, s.s3_backoff_base_s * 2 ** min(attempt, 16))
            delay = min(delay * random.uniform(0.5, 1.0), max(0.0, deadline - time.monotonic()))
            log.warning("S3 %s failed (%s); retry %d in %.1f s", what, error, attempt, delay)
            self._sleep(delay)

    def call(self, op: str, **kwargs: Any) -> Any:
        return self._retry(op, lambda: getattr(self.s3, op)(**kwargs))

    def download_file(self, key: str, target: Path) -> None:
        self._retry(f"download of {key}", lambda: self.s3.download_file(self.bucket, key, str(target)))

    def get_bytes(self, key: str) -> tuple[bytes, str] | None:
        """(body, etag), or None when the object does not exist."""
        try:
            resp = self.call("get_object", Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _not_found(exc):
                return None
            raise
        return resp["Body"].read(), resp["ETag"]


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
        self.entry_prefix = f"engines/{self.key}/"
        self.manifest_key = f"{self.entry_prefix}{MANIFEST_NAME}"
        self.lock_key = f"locks/{self.key}.json"
        self.failure_prefix = f"failures/{self.key}/"

    def _call(self, op: str, **kwargs: Any) -> Any:
        return self.store.call(op, **kwargs)

    def _get_json(self, key: str) -> tuple[dict | None, str | None, bytes | None]:
        """(parsed body or None if unparseable, etag, raw) or (None, None, None) when absent."""
        try:
            resp = self._call("get_object", Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _not_found(exc):
                return None, None, None
            raise
        raw = resp["Body"].read()
        try:
            return json.loads(raw), resp["ETag"], raw
        except ValueError:
            return None, resp["ETag"], raw

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
        reason = (last or {}).get("error", "unknown error")
        raise CircuitOpen(
            f"engine build for {self.key} failed {len(failures)} time(s) (limit {self.settings.failure_limit}); "
            f"last error: {reason}. Not rebuilding: fix the cause, then delete s3://{self.bucket}/{self.failure_prefix}"
        )

    def record_failure(self, error: str, build_id: str) -> str:
        body = {"key": self.key, "holder": self.holder, "build_id": build_id, "error": error[-4000:],
                "at": time.time(), "inputs": asdict(self.inputs)}
        n = len(self.failures()) + 1
        for _ in range(100):
            key = f"{self.failure_prefix}{n:04d}.json"
            try:
                self._call("put_object", Bucket=self.bucket, Key=key, Body=json.dumps(body).encode(),
                           IfNoneMatch="*", ContentType="application/json")
                return key
            except ClientError as exc:
                if not (_precondition_failed(exc) or _conflict(exc)):
                    raise
                n += 1
        raise CacheError(f"could not write a failure marker under {self.failure_prefix}")

    def clear_failures(self) -> None:
        for key in self.failures():
            self._call("delete_object", Bucket=self.bucket, Key=key)

    # ------------------------------------------------------------ lock

    def _lock_body(self, build_id: str) -> dict:
        now = time.time()
        return {"key": self.key, "holder": self.holder, "build_id": build_id, "heartbeat_at": now,
                "ttl_s": self.settings.lock_ttl_s, "nonce": uuid.uuid4().hex}

    def try_lock(self, build_id: str) -> _Lock | None:
        """Take the lock if it is free or stale; None when someone else holds it."""
        body = self._lock_body(build_id)
        try:
            resp = self._call("put_object", Bucket=self.bucket, Key=self.lock_key, Body=json.dumps(body).encode(),
                              IfNoneMatch="*", ContentType="application/json")
            log.info("took build lock %s", self.lock_key)
            return _Lock(etag=resp["ETag"], body=body)
        except ClientError as exc:
            if _conflict(exc):
                return None
            if not _precondition_failed(exc):
                raise
        current, etag, _ = self._get_json(self.lock_key)
        if etag is None:
            return None  # released between our two calls: next round tries again
        age = time.time() - float((current or {}).get("heartbeat_at", 0))
        if current is not None and age <= self.settings.lock_ttl_s:
            return None
        # Stale (or unreadable) lock: replace exactly that version of it. If another
        # waiter got there first the ETag no longer matches and we keep waiting.
        try:
            resp = self._call("put_object", Bucket=self.bucket, Key=self.lock_key, Body=json.dumps(body).encode(),
                              IfMatch=etag, ContentType="application/json")
        except ClientError as exc:
            if _precondition_failed(exc) or _conflict(exc) or _not_found(exc):
                return None
            raise
        log.warning("took over stale build lock %s (held by %s, silent for %.0f s)",
                    self.lock_key, (current or {}).get("holder", "?"), age)
        return _Lock(etag=resp["ETag"], body=body)

    def refresh_lock(self, lock: _Lock) -> bool:
        body = dict(lock.body, heartbeat_at=time.time(), nonce=uuid.uuid4().hex)
        try:
            resp = self._call("put_object", Bucket=self.bucket, Key=self.lock_key, Body=json.dumps(body).encode(),
                              IfMatch=lock.etag, ContentType="application/json")
        except ClientError as exc:
            if _precondition_failed(exc) or _conflict(exc) or _not_found(exc):
                lock.lost = True
                log.error("build lock %s was taken over by another instance", self.lock_key)
                return False
            raise
        lock.etag, lock.body = resp["ETag"], body
        return True

    def release_lock(self, lock: _Lock) -> None:
        try:
            self._call("delete_object", Bucket=self.bucket, Key=self.lock_key, IfMatch=lock.etag)
        except ClientError as exc:
            if not (_precondition_failed(exc) or _not_found(exc) or _conflict(exc)):
                raise
            log.warning("build lock %s was no longer ours at release", self.lock_key)

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

    def publish(self, artifact: Path, build_id: str, build_seconds: float, replace_etag: str | None) -> Manifest:
        """Upload the artifact under its own prefix, then the manifest (last)."""
        prefix = f"{self.entry_prefix}builds/{build_id}/"
        manifest = build_manifest(
            artifact, kind="engine", name=self.inputs.model_id, revision=self.inputs.revision,
            extra={"key": self.key, "build_id": build_id, "artifact_prefix": prefix, "inputs": asdict(self.inputs),
                   "built_by": self.holder, "build_seconds": round(build_seconds, 3), "built_at": time.time()},
        )
        for f in manifest.files:
            self._call("upload_file", Filename=str(artifact / f.path), Bucket=self.bucket, Key=prefix + f.path)
        condition = {"IfMatch": replace_etag} if replace_etag else {"IfNoneMatch": "*"}
        try:
            self._call("put_object", Bucket=self.bucket, Key=self.manifest_key, Body=manifest.to_json().encode(),
                       ContentType="application/json", **condition)
        except ClientError as exc:
            if not (_precondition_failed(exc) or _conflict(exc)):
                raise
            log.warning("another build of %s was published first; keeping it as the entry", self.key)
        return manifest

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

    def prune_local(self, local_root: Path) -> list[str]:
        """Delete other keys' engines (and dead build dirs) from this disk: an old config's engine is GBs."""
        removed = []
        for path in local_root.iterdir() if local_root.is_dir() else ():
            if path.name != self.key:
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
                return self._build_locked(lock, build_id, build, local_root, dest, corrupt, start, events)
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"waited {self.settings.wait_timeout_s:.0f} s for another instance to build {self.key}")
            if "waiting" not in events:
                events.append("waiting")
                log.info("another instance is building %s; waiting", self.key)
            self._sleep(self.settings.poll_s * random.uniform(0.8, 1.2))

    def _build_locked(self, lock: _Lock, build_id: str, build: Callable[[Path], Path], local_root: Path, dest: Path,
                      corrupt: set[str], start: float, events: list[str]) -> Resolution:
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
            self.check_breaker()
            work = local_root / f".build-{build_id}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            t0 = time.monotonic()
            try:
                artifact = build(work)
            except CacheError:
                # S3 down or inputs not staged yet: not the build's fault, so no failure marker
                # (the breaker is for builds that fail on their own, e.g. out of GPU memory).
                shutil.rmtree(work, ignore_errors=True)
                raise
            except Exception as exc:
                marker = self.record_failure(f"{type(exc).__name__}: {exc}", build_id)
                shutil.rmtree(work, ignore_errors=True)
                raise BuildFailed(f"engine build for {self.key} failed: {exc} (marker s3://{self.bucket}/{marker})") from exc
            build_seconds = time.monotonic() - t0
            events.append("built")
            manifest = self.publish(artifact, build_id, build_seconds, replace)
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
                self.release_lock(lock)
