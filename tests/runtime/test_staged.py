"""Instances read staged models and calibration sets from their region bucket, verified against the manifest."""

import time

import pytest

from fleetcast.contract.bucket import model_prefix
from fleetcast.contract.manifest import MANIFEST_NAME, build_manifest
from runtime.engine_cache import CacheSettings, RetryingS3
from runtime.staged import StagingMissing, calibration_key_prefix, fetch_staged
from tests.runtime.cache_worker import client


def stage(aws, tmp_path, prefix):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text('{"n_layer": 2}')
    (src / "sub" / "model.safetensors").write_bytes(b"w" * 4096)
    manifest = build_manifest(src, kind="model", name="gpt2-tiny", revision="r1")
    s3 = client(aws.moto_url)
    for f in manifest.files:
        s3.upload_file(str(src / f.path), aws.bucket, prefix + f.path)
    s3.put_object(Bucket=aws.bucket, Key=prefix + MANIFEST_NAME, Body=manifest.to_json().encode())
    return manifest


def store(aws):
    return RetryingS3(client(aws.moto_url), aws.bucket, CacheSettings(s3_retry_deadline_s=2))


def test_staged_model_is_downloaded_and_verified(aws, tmp_path):
    prefix = model_prefix("gpt2-tiny", "r1")
    manifest = stage(aws, tmp_path, prefix)
    got, waited = fetch_staged(store(aws), prefix, tmp_path / "model", wait_s=5)
    assert got == manifest and waited < 1
    assert (tmp_path / "model" / "sub" / "model.safetensors").read_bytes() == b"w" * 4096


def test_a_staged_file_that_does_not_match_is_refused(aws, tmp_path):
    prefix = model_prefix("gpt2-tiny", "r1")
    stage(aws, tmp_path, prefix)
    client(aws.moto_url).put_object(Bucket=aws.bucket, Key=prefix + "sub/model.safetensors", Body=b"x" * 4096)
    with pytest.raises(StagingMissing, match="sha256 mismatch.*stage it again"):
        fetch_staged(store(aws), prefix, tmp_path / "model", wait_s=5)


def test_missing_staging_is_waited_for_then_named(aws, tmp_path):
    started = time.monotonic()
    with pytest.raises(StagingMissing, match="fleetcast stage model"):
        fetch_staged(store(aws), model_prefix("gpt2-tiny", "r9"), tmp_path / "m", wait_s=0.6, poll_s=0.2)
    assert 0.6 <= time.monotonic() - started < 30  # waited wait_s, then gave up (not forever)


def test_the_wait_ends_at_wait_s_even_when_a_poll_period_would_run_past_it(aws, tmp_path):
    """FLEETCAST_STAGING_WAIT_S bounds the wait (README, "Deploying"): with the 15 s poll period and a shorter wait,
    the last poll is cut to what is left of the wait instead of sleeping a whole period past it."""
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        assert seconds <= 0.3, f"slept {seconds} s of a 0.3 s wait"
        time.sleep(seconds)

    with pytest.raises(StagingMissing, match="after waiting"):
        fetch_staged(store(aws), model_prefix("gpt2-tiny", "r9"), tmp_path / "m", wait_s=0.3, sleep=sleep)
    assert slept and sum(slept) <= 0.3


def test_the_last_sleep_is_never_negative_however_long_the_check_before_it_took(aws, tmp_path):
    """A clock that moves 0.6 s at each reading, against a 1 s wait: the check passes with 0.4 s left, and the
    sleep gets that 0.4 s, not what a second reading would leave (-0.2 s: time.sleep raises ValueError on it)."""
    ticks = iter(range(100))
    slept: list[float] = []
    with pytest.raises(StagingMissing):
        fetch_staged(store(aws), model_prefix("gpt2-tiny", "r8"), tmp_path / "m", wait_s=1.0, sleep=slept.append,
                     clock=lambda: 0.6 * next(ticks))
    assert slept and all(s > 0 for s in slept), slept


def test_calibration_prefix_comes_from_the_dataset_uri():
    assert calibration_key_prefix("s3://any-bucket/calibration/lambada") == "calibration/lambada/"
    assert calibration_key_prefix("s3://any-bucket/calibration/lambada/") == "calibration/lambada/"
