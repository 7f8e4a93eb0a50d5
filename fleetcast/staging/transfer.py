"""Resumable, verifying uploads of a staged tree into a region bucket, and server-side copies between regions.

Resumption needs no local state: an interrupted multipart upload is still
listed by S3 (ListMultipartUploads) with the parts it received (ListParts). Each
part already there is checked against the local bytes (its ETag is the MD5 of the
part) and only missing or different parts are sent again. Whole objects already
in the bucket are skipped when their size and recorded sha256 match. The
manifest is written last, so a reader never sees a partial artifact.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetcast.contract.manifest import MANIFEST_NAME, Manifest

DEFAULT_PART_SIZE = 64 * 1024 * 1024
# S3 API Reference, CopyObject: "You create a copy of your object up to 5 GB in size in a single atomic action
# using this API. However, to copy an object greater than 5 GB, you must use the multipart upload Upload Part -
# Copy (UploadPartCopy) API." Parts: at most 10,000 (the multipart upload limits).
COPY_OBJECT_MAX_BYTES = 5 * 1024**3
MAX_PARTS = 10_000
SHA_META = "sha256"  # x-amz-meta-sha256: the whole-object digest, checked before skipping


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


@dataclass
class TransferReport:
    files_uploaded: int = 0
    files_skipped: int = 0
    parts_sent: int = 0
    parts_reused: int = 0
    bytes_sent: int = 0
    bytes_copied: int = 0  # server-side copies between buckets: nothing crosses this machine's link
    seconds: float = 0.0
    keys: list[str] = field(default_factory=list)

    def line(self) -> str:
        if self.bytes_copied:
            return (f"{self.files_uploaded} file(s) copied server-side, {self.files_skipped} already there and "
                    f"verified; {human_bytes(self.bytes_copied)} copied in {self.seconds:.1f} s, nothing re-sent")
        return (f"{self.files_uploaded} file(s) uploaded, {self.files_skipped} already there and verified; "
                f"{self.parts_sent} part(s) sent, {self.parts_reused} resumed part(s) reused; "
                f"{human_bytes(self.bytes_sent)} sent in {self.seconds:.1f} s")


class Progress:
    """A one-line progress bar on stderr (only when it is a terminal, unless forced)."""

    def __init__(self, total: int, label: str, enabled: bool | None = None):
        self.total, self.done, self.label = max(total, 1), 0, label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._last = 0.0

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.2 or self.done >= self.total):
            self._last = now
            width = 30
            filled = int(width * self.done / self.total)
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] "
                             f"{human_bytes(self.done)}/{human_bytes(self.total)}")
            if self.done >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


class TreeUploader:
    """Uploads the files a manifest names from `root` to `bucket/prefix`, resumably."""

    def __init__(self, s3: Any, bucket: str, *, part_size: int = DEFAULT_PART_SIZE,
                 progress: bool | None = None, log: Callable[[str], None] = lambda m: None):
        if part_size < 5 * 1024 * 1024:
            raise ValueError("part size must be at least 5 MiB (S3's minimum for multipart parts)")
        self.s3, self.bucket, self.part_size, self.log = s3, bucket, part_size, log
        self.progress_enabled = progress

    def upload(self, root: Path, prefix: str, manifest: Manifest) -> TransferReport:
        report = TransferReport()
        started = time.monotonic()
        bar = Progress(manifest.total_bytes, f"s3://{self.bucket}/{prefix}", self.progress_enabled)
        for entry in manifest.files:
            key = prefix + entry.path
            report.keys.append(key)
            if self.verified_in_bucket(key, entry.size, entry.sha256):
                report.files_skipped += 1
                bar.advance(entry.size)
                continue
            path = root / entry.path
            if entry.size <= self.part_size:
                body = path.read_bytes()
                self.s3.put_object(Bucket=self.bucket, Key=key, Body=body, Metadata={SHA_META: entry.sha256})
                report.parts_sent += 1
                report.bytes_sent += len(body)
                bar.advance(entry.size)
            else:
                self._multipart(key, path, entry.size, entry.sha256, report, bar)
            report.files_uploaded += 1
        # Last: the manifest makes the artifact visible to readers.
        self.s3.put_object(Bucket=self.bucket, Key=prefix + MANIFEST_NAME, Body=manifest.to_json().encode(),
                           ContentType="application/json")
        report.seconds = time.monotonic() - started
        return report

    def verified_in_bucket(self, key: str, size: int, sha256: str) -> bool:
        try:
            head = self.s3.head_object(Bucket=self.bucket, Key=key)
        except self.s3.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return bool(head.get("ContentLength") == size and head.get("Metadata", {}).get(SHA_META) == sha256)

    def _pending_upload(self, key: str) -> str | None:
        paginator = self.s3.get_paginator("list_multipart_uploads")
        newest = None
        for page in paginator.paginate(Bucket=self.bucket, Prefix=key):
            for upload in page.get("Uploads", []):
                if upload["Key"] == key and (newest is None or upload["Initiated"] > newest["Initiated"]):
                    newest = upload
        return newest["UploadId"] if newest else None

    def _parts_received(self, key: str, upload_id: str) -> dict[int, tuple[str, int]]:
        parts: dict[int, tuple[str, int]] = {}
        paginator = self.s3.get_paginator("list_parts")
        for page in paginator.paginate(Bucket=self.bucket, Key=key, UploadId=upload_id):
            for part in page.get("Parts", []):
                parts[part["PartNumber"]] = (part["ETag"].strip('"'), part["Size"])
        return parts

    def _multipart(self, key: str, path: Path, size: int, sha256: str, report: TransferReport, bar: Progress) -> None:
        upload_id = self._pending_upload(key)
        received: dict[int, tuple[str, int]] = {}
        if upload_id:
            received = self._parts_received(key, upload_id)
            self.log(f"resuming {key}: {len(received)} part(s) already received")
        else:
            upload_id = self.s3.create_multipart_upload(Bucket=self.bucket, Key=key, Metadata={SHA_META: sha256})["UploadId"]
        completed = []
        with path.open("rb") as handle:
            number = 0
            while chunk := handle.read(self.part_size):
                number += 1
                md5 = hashlib.md5(chunk, usedforsecurity=False).hexdigest()
                have = received.get(number)
                if have and have == (md5, len(chunk)):
                    etag = have[0]
                    report.parts_reused += 1
                else:
                    etag = self.s3.upload_part(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                               PartNumber=number, Body=chunk)["ETag"].strip('"')
                    report.parts_sent += 1
                    report.bytes_sent += len(chunk)
                completed.append({"PartNumber": number, "ETag": f'"{etag}"'})
                bar.advance(len(chunk))
        self.s3.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                          MultipartUpload={"Parts": completed})
        # A resumed upload keeps the metadata it was created with; make sure the digest is this file's.
        head = self.s3.head_object(Bucket=self.bucket, Key=key)
        if head.get("Metadata", {}).get(SHA_META) != sha256 or head.get("ContentLength") != size:
            self._set_digest(key, size, sha256)

    def _set_digest(self, key: str, size: int, sha256: str) -> None:
        """Rewrite the object's sha256 metadata in place: one CopyObject up to its 5 GB limit, a multipart copy
        (UploadPartCopy by byte range, server-side) above it."""
        source = {"Bucket": self.bucket, "Key": key}
        if size <= COPY_OBJECT_MAX_BYTES:
            self.s3.copy_object(Bucket=self.bucket, Key=key, CopySource=source,
                                Metadata={SHA_META: sha256}, MetadataDirective="REPLACE")
            return
        part = max(self.part_size, -(-size // MAX_PARTS))
        upload_id = self.s3.create_multipart_upload(Bucket=self.bucket, Key=key, Metadata={SHA_META: sha256})["UploadId"]
        try:
            parts = []
            for number, start in enumerate(range(0, size, part), start=1):
                end = min(start + part, size) - 1
                etag = self.s3.upload_part_copy(Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                                CopySource=source, CopySourceRange=f"bytes={start}-{end}",
                                                )["CopyPartResult"]["ETag"]
                parts.append({"PartNumber": number, "ETag": etag})
            self.s3.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                              MultipartUpload={"Parts": parts})
        except BaseException:
            # The object is whole either way (only completion replaces it); leave no parts behind to pay for.
            self.s3.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise


def read_manifest(s3: Any, bucket: str, prefix: str) -> Manifest | None:
    try:
        body = s3.get_object(Bucket=bucket, Key=prefix + MANIFEST_NAME)["Body"].read()
    except s3.exceptions.ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    return Manifest.from_json(body)


def copy_prefix(src_s3: Any, src_bucket: str, dst_s3: Any, dst_bucket: str, prefix: str,
                manifest: Manifest, *, progress: bool | None = None) -> TransferReport:
    """Server-side copy of a staged artifact to another region's bucket (no second download)."""
    report = TransferReport()
    started = time.monotonic()
    uploader = TreeUploader(dst_s3, dst_bucket)
    bar = Progress(manifest.total_bytes, f"s3://{dst_bucket}/{prefix}", progress)
    for entry in manifest.files:
        key = prefix + entry.path
        report.keys.append(key)
        if uploader.verified_in_bucket(key, entry.size, entry.sha256):
            report.files_skipped += 1
        else:
            # Managed copy: multipart UploadPartCopy for large objects, metadata (sha256) carried over.
            dst_s3.copy({"Bucket": src_bucket, "Key": key}, dst_bucket, key, SourceClient=src_s3,
                        ExtraArgs={"MetadataDirective": "REPLACE", "Metadata": {SHA_META: entry.sha256}})
            report.files_uploaded += 1
            report.bytes_copied += entry.size
        bar.advance(entry.size)
    dst_s3.put_object(Bucket=dst_bucket, Key=prefix + MANIFEST_NAME, Body=manifest.to_json().encode(),
                      ContentType="application/json")
    report.seconds = time.monotonic() - started
    return report


def verify_prefix(s3: Any, bucket: str, prefix: str, manifest: Manifest) -> list[str]:
    """Size and recorded digest of every object the manifest names (no download)."""
    problems = []
    checker = TreeUploader(s3, bucket)
    for entry in manifest.files:
        if not checker.verified_in_bucket(prefix + entry.path, entry.size, entry.sha256):
            problems.append(f"s3://{bucket}/{prefix}{entry.path}: missing or not matching the manifest")
    return problems
