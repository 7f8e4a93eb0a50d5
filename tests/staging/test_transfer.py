"""Staging uploads: resumable, verified, manifest last, server-side copy between regions (moto S3 on loopback)."""

import os
from pathlib import Path

import pytest

from fleetcast.contract.bucket import model_prefix
from fleetcast.contract.manifest import Manifest, build_manifest, verify_tree
from fleetcast.staging import transfer
from fleetcast.staging.transfer import TreeUploader, copy_prefix, read_manifest, verify_prefix

MIB = 1024 * 1024
PART = 5 * MIB


@pytest.fixture
def model_dir(tmp_path) -> Path:
    root = tmp_path / "model"
    (root / "tokenizer").mkdir(parents=True)
    (root / "config.json").write_text('{"n_layer": 2}')
    (root / "tokenizer" / "tokenizer.json").write_text('{"model": "bpe"}')
    # 3 full parts and a short one: the multipart path.
    (root / "model.safetensors").write_bytes(os.urandom(3 * PART + 1234))
    return root


def manifest_of(root: Path) -> Manifest:
    return build_manifest(root, kind="model", name="gpt2-xl", revision="abc123", source="test")


class FailAfter:
    """Test double for a dropped connection: the N+1th UploadPart never reaches S3."""

    def __init__(self, parts: int):
        self.allowed, self.calls = parts, 0

    def __call__(self, **kwargs):
        self.calls += 1
        if self.calls > self.allowed:
            raise ConnectionError("simulated kill in the middle of a multipart upload")


def count_calls(client, *operations: str) -> list:
    seen = []
    for operation in operations:
        client.meta.events.register(f"before-call.s3.{operation}", lambda **kw: seen.append(1))
    return seen


def test_upload_writes_every_file_and_the_manifest_last(clients, make_bucket, model_dir):
    s3, bucket = clients("s3", "us-east-1"), make_bucket("us-east-1")
    manifest = manifest_of(model_dir)
    puts = []
    s3.meta.events.register("provide-client-params.s3.PutObject", lambda params, **kw: puts.append(params["Key"]))
    report = TreeUploader(s3, bucket, part_size=PART).upload(model_dir, model_prefix("gpt2-xl", "abc123"), manifest)
    assert report.files_uploaded == 3 and report.parts_sent == 2 + 4
    assert puts[-1] == "models/gpt2-xl/abc123/manifest.json"
    assert verify_prefix(s3, bucket, "models/gpt2-xl/abc123/", manifest) == []
    assert read_manifest(s3, bucket, "models/gpt2-xl/abc123/") == manifest


def test_second_run_skips_verified_objects(clients, make_bucket, model_dir):
    s3, bucket = clients("s3", "us-east-1"), make_bucket("us-east-1")
    manifest = manifest_of(model_dir)
    TreeUploader(s3, bucket, part_size=PART).upload(model_dir, "models/m/r/", manifest)
    again = TreeUploader(s3, bucket, part_size=PART).upload(model_dir, "models/m/r/", manifest)
    assert again.files_skipped == 3 and again.parts_sent == 0 and again.bytes_sent == 0


def test_killed_multipart_upload_resumes_sending_only_missing_parts(clients, make_bucket, model_dir):
    s3, bucket = clients("s3", "us-east-1"), make_bucket("us-east-1")
    manifest = manifest_of(model_dir)
    kill = FailAfter(parts=2)
    s3.meta.events.register("before-call.s3.UploadPart", kill)
    with pytest.raises(ConnectionError):
        TreeUploader(s3, bucket, part_size=PART).upload(model_dir, "models/m/r/", manifest)
    # A reader never sees the partial artifact: no manifest yet.
    assert read_manifest(s3, bucket, "models/m/r/") is None
    s3.meta.events.unregister("before-call.s3.UploadPart", kill)

    sent = count_calls(s3, "UploadPart")
    report = TreeUploader(s3, bucket, part_size=PART).upload(model_dir, "models/m/r/", manifest)
    assert report.parts_reused == 2, report
    assert len(sent) == 2  # parts 3 and 4 of the weights; parts 1-2 were already there
    tokenizer_bytes = (model_dir / "tokenizer" / "tokenizer.json").stat().st_size
    assert report.bytes_sent == PART + 1234 + tokenizer_bytes
    body = s3.get_object(Bucket=bucket, Key="models/m/r/model.safetensors")["Body"].read()
    assert body == (model_dir / "model.safetensors").read_bytes()
    assert verify_prefix(s3, bucket, "models/m/r/", manifest) == []


def killed_upload_then_changed(s3, bucket, model_dir, byte: int) -> bytes:
    """A multipart upload killed after two parts; then one byte of the weights changes on disk (new contents)."""
    kill = FailAfter(parts=2)
    s3.meta.events.register("before-call.s3.UploadPart", kill)
    with pytest.raises(ConnectionError):
        TreeUploader(s3, bucket, part_size=PART).upload(model_dir, "models/m/r/", manifest_of(model_dir))
    s3.meta.events.unregister("before-call.s3.UploadPart", kill)
    weights = model_dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[byte] ^= 0xFF
    weights.write_bytes(bytes(data))
    return bytes(data)


def test_resumed_parts_that_no_longer_match_the_file_are_sent_again(clients, make_bucket, model_dir):
    s3, bucket = clients("s3", "us-east-1"), make_bucket("us-east-1")
    killed_upload_then_changed(s3, bucket, model_dir, byte=10)  # the first part changed on disk
    manifest = manifest_of(model_dir)
    report = TreeUploader(s3, bucket, part_size=PART).upload(model_dir, "models/m/r/", manifest)
    assert report.parts_reused == 1 and report.parts_sent >= 3
    assert verify_prefix(s3, bucket, "models/m/r/", manifest) == []


def test_copy_object_limit_is_s3s_5_gb():
    # S3 API Reference, CopyObject (the same text is in botocore's s3 model): "up to 5 GB in size in a single atomic
    # action ... to copy an object greater than 5 GB, you must use the multipart upload Upload Part - Copy".
    import re

    import botocore.session

    doc = botocore.session.get_session().get_service_model("s3").operation_model("CopyObject").documentation
    assert "to copy an object greater than 5 GB, you must use the multipart upload" in re.sub(r"<[^>]+>", "", doc)
    assert transfer.COPY_OBJECT_MAX_BYTES == 5 * 1024**3


def test_a_resumed_upload_above_the_copy_object_limit_fixes_its_digest_with_a_multipart_copy(
        clients, make_bucket, model_dir, monkeypatch):
    # A resumed upload keeps the digest it was created with; the fix is a copy onto itself. A 6.4 GB weights
    # file is over CopyObject's limit: scaled down here by lowering the limit below the test file's size.
    monkeypatch.setattr(transfer, "COPY_OBJECT_MAX_BYTES", PART)
    s3, bucket = clients("s3", "us-east-1"), make_bucket("us-east-1")
    # The last part changed: the pending upload's metadata holds the old digest.
    data = killed_upload_then_changed(s3, bucket, model_dir, byte=-1)
    single, ranged = count_calls(s3, "CopyObject"), count_calls(s3, "UploadPartCopy")
    manifest = manifest_of(model_dir)
    TreeUploader(s3, bucket, part_size=PART).upload(model_dir, "models/m/r/", manifest)
    assert not single and len(ranged) == 4  # 3 full parts and the short one, by byte range
    assert verify_prefix(s3, bucket, "models/m/r/", manifest) == []
    assert s3.get_object(Bucket=bucket, Key="models/m/r/model.safetensors")["Body"].read() == data
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_cross_region_copy_is_server_side(clients, make_bucket, model_dir):
    src, dst = make_bucket("ap-northeast-2"), make_bucket("us-east-1")
    manifest = manifest_of(model_dir)
    TreeUploader(clients("s3", "ap-northeast-2"), src, part_size=PART).upload(model_dir, "models/m/r/", manifest)
    dst_s3 = clients("s3", "us-east-1")
    uploads = count_calls(dst_s3, "UploadPart", "PutObject")
    report = copy_prefix(clients("s3", "ap-northeast-2"), src, dst_s3, dst, "models/m/r/", manifest)
    assert report.files_uploaded == 3 and report.bytes_sent == 0 and report.bytes_copied == manifest.total_bytes
    assert len(uploads) == 1  # only the manifest is written; every file is copied, not re-sent
    assert verify_prefix(dst_s3, dst, "models/m/r/", manifest) == []


def test_manifest_verification_catches_corruption(model_dir):
    manifest = manifest_of(model_dir)
    assert verify_tree(model_dir, manifest) == []
    (model_dir / "config.json").write_text('{"n_layer": 3}')
    (model_dir / "tokenizer" / "tokenizer.json").unlink()
    problems = verify_tree(model_dir, manifest)
    assert "config.json: sha256 mismatch" in problems and "tokenizer/tokenizer.json: missing" in problems


def test_manifest_refuses_paths_outside_its_prefix(model_dir):
    text = manifest_of(model_dir).to_json().replace('"config.json"', '"../../etc/passwd"')
    with pytest.raises(ValueError, match="escapes"):
        Manifest.from_json(text)
