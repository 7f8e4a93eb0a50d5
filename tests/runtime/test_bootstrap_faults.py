"""The instance runtime under S3 faults: every launch ends with its hook completed, never a crash loop.

Real `python -m runtime.bootstrap` processes; S3 is moto behind runtime.devtools.fakes.FaultyS3,
which fails requests at the HTTP level so boto3's transfer layer raises its own wrappers
(S3UploadFailedError from upload_file, RetriesExceededError from download_file; see
tests/runtime/test_engine_cache_faults.py for the boto3/s3transfer source lines).
"""

import itertools
import os
import subprocess

import pytest

from fleetcast.contract import telemetry
from runtime.backends import ReferenceBackend
from runtime.devtools.fakes import FaultyS3
from runtime.devtools.harness import LocalAws, free_port_pair, tiny_config
from runtime.engine_cache import CacheInputs, CacheSettings, EngineCache
from tests.runtime.cache_worker import fake_build

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("forked_engines")]


# Each test's LocalAws is on the session's moto server (`moto_endpoint`, one bucket each): a moto server of its own
# took half a second to stop (werkzeug's serve_forever polls for shutdown every 0.5 s).
_buckets = itertools.count()


@pytest.fixture
def faulty(moto_endpoint):
    aws = LocalAws(bucket=f"fleetcast-f-{os.getpid()}-{next(_buckets)}", moto_url=moto_endpoint).start()
    proxy = FaultyS3(aws.moto_url).start()
    cfg = tiny_config()
    aws.put_config(cfg)
    yield aws, proxy, cfg
    proxy.stop()
    aws.stop()


def start(aws, proxy, cfg, tmp_path, instance_id, **extra):
    imds = aws.instance(instance_id)
    env = aws.runtime_env(imds, cfg, tmp_path / "disk", free_port_pair(), AWS_ENDPOINT_URL_S3=proxy.url,
                          FLEETCAST_S3_RETRY_DEADLINE_S="1", FLEETCAST_S3_BACKOFF_S="0.1", **extra)
    return aws.start_runtime(env, tmp_path / "log")


def exit_code(rp, timeout_s=150):
    try:
        return rp.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        rp.proc.kill()
        rp.proc.wait(10)
        return "still running"


def hook_results(aws, instance_id):
    return [c.result for c in aws.asg.completed if c.instance_id == instance_id and c.hook == telemetry.LAUNCH_HOOK]


def runtime_cache(aws, cfg) -> EngineCache:
    """The cache entry the runtime on this loopback region computes (reference backend on CPU: 0.0)."""
    engine = cfg.engine_for(cfg.region(aws.region).pools[0])
    backend = ReferenceBackend(cfg, engine)
    inputs = CacheInputs(model_id=cfg.model.id, revision=cfg.model.revision, backend=engine.backend.value,
                         precision=engine.precision.value, kv_cache_dtype=engine.kv_cache_dtype.value,
                         max_batch_size=engine.max_batch_size, max_num_tokens=engine.max_num_tokens,
                         max_input_len=cfg.model.max_input_len, max_output_len=cfg.model.max_output_len,
                         builder=backend.name, builder_version=backend.version, compute_capability="0.0")
    return EngineCache(aws.s3(), aws.bucket, inputs, holder="i-seed", settings=CacheSettings(s3_retry_deadline_s=10))


def test_uploads_refused_with_503_abandon_the_launch_with_the_cause(faulty, tmp_path):
    """S3 answers 503 to every upload of the built engine: retried, then ABANDON, exit 0 (no systemd
    restart into the same failure), the cause logged and published, the build lock freed.
    (ServiceUnavailable: botocore's four attempts per upload back off from 50 ms, not SlowDown's 1 s;
    what the runtime does after them is the same, tests/runtime/test_engine_cache_faults.py.)"""
    aws, proxy, cfg = faulty
    proxy.add("PUT", "/builds/", "503-unavailable")
    rp = start(aws, proxy, cfg, tmp_path, "i-00000000000000f01")
    assert exit_code(rp) == 0
    assert hook_results(aws, "i-00000000000000f01") == ["ABANDON"]
    log = (tmp_path / "log").read_text()
    assert "S3UploadFailedError" in log and "; retry " in log
    abandoned = rp.emf(lambda r: telemetry.LAUNCH_ABANDONED in r)
    assert [r["cause"] for r in abandoned] == ["StorageUnavailable"]
    assert aws.keys("locks/") == [] and aws.keys("failures/") == []


@pytest.mark.parametrize("action", ["truncate", "stall"])
def test_downloads_that_keep_breaking_or_stall_abandon_the_launch(faulty, tmp_path, action):
    """A published entry whose downloads break (truncated bodies) or stall (no bytes after the head):
    each is retried within the deadline, a stall is cut after FLEETCAST_S3_STALL_S, then ABANDON."""
    aws, proxy, cfg = faulty
    runtime_cache(aws, cfg).obtain(tmp_path / "seed", fake_build(tmp_path / "n", 0))
    proxy.add("GET", "/builds/", action)
    rp = start(aws, proxy, cfg, tmp_path, "i-00000000000000f02", FLEETCAST_S3_STALL_S="0.5")
    # Bounded by the 1 s retry deadline and 0.5 s stall bound (plus the runtime's start-up); the
    # product default would be five attempts of 60 s for one stalled GET, then a crash.
    assert exit_code(rp, 120) == 0
    assert hook_results(aws, "i-00000000000000f02") == ["ABANDON"]
    log = (tmp_path / "log").read_text()
    assert "RetriesExceededError" in log
    if action == "stall":
        assert "stalled" in log
    assert [r["cause"] for r in rp.emf(lambda r: telemetry.LAUNCH_ABANDONED in r)] == ["StorageUnavailable"]


def _server_pids(log_file) -> list[int]:
    import re

    return [int(p) for p in re.findall(r"started server \(pid (\d+)\)", log_file.read_text())]


def _wait(predicate, timeout_s=120.0):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    return None


def test_a_frozen_server_is_restarted_and_an_unrecoverable_one_gets_the_instance_replaced(tmp_path, moto_endpoint):
    """The model server stops answering (SIGSTOP: alive, silent). Liveness kills and restarts it;
    the restarted one freezes too, restarts are used up, and the instance asks its group for a
    replacement (SetInstanceHealth Unhealthy, grace period not respected), then drains and
    completes the terminate hook when the group moves it to Terminated."""
    import signal

    aws = LocalAws(bucket=f"fleetcast-f-{os.getpid()}-live", moto_url=moto_endpoint).start()
    cfg = tiny_config()
    aws.put_config(cfg)
    iid = "i-00000000000000f03"
    imds = aws.instance(iid)
    # A SIGSTOPped server holds each probe for the whole timeout: 2 probes of 0.5 s, 0.2 s apart, per
    # freeze. A healthy idle server answers /health in milliseconds (two misses in a row to be killed).
    # The move toward Terminated is seen within 0.1 s of IMDS showing it, not the harness's 0.5 s.
    env = aws.runtime_env(imds, cfg, tmp_path / "disk", free_port_pair(), FLEETCAST_LIVENESS_INTERVAL_S="0.2",
                          FLEETCAST_LIVENESS_TIMEOUT_S="0.5", FLEETCAST_LIVENESS_FAILURES="2",
                          FLEETCAST_MAX_RESTARTS="1", FLEETCAST_RESTART_BACKOFF_S="0.1",
                          FLEETCAST_REPLACE_WAIT_S="120", FLEETCAST_TERMINATE_POLL_S="0.1")
    log = tmp_path / "log"
    rp = aws.start_runtime(env, log)
    frozen: list[int] = []
    try:
        assert rp.wait_event("fleetcast_serving", 180) is not None, log.read_text()[-3000:]
        for incarnation in (1, 2):
            pid = _server_pids(log)[-1]
            assert _wait(lambda: f"server (pid {pid}) answers its liveness probe" in log.read_text())  # noqa: B023 - called only within this iteration
            os.killpg(pid, signal.SIGSTOP)
            frozen.append(pid)
            if incarnation == 1:
                assert _wait(lambda: len(_server_pids(log)) == 2), "a frozen server must be restarted"
        assert _wait(lambda: aws.asg.health, 60) == [(iid, "Unhealthy", "false")]
        assert rp.metric_values(telemetry.SERVER_UNRECOVERABLE) == [1.0]
        aws.asg.begin(aws.group, telemetry.TERMINATE_HOOK, iid)
        imds.target_lifecycle_state = "Terminated"
        assert exit_code(rp, 120) == 0
        assert [c.result for c in aws.asg.completed if c.hook == telemetry.TERMINATE_HOOK] == ["CONTINUE"]
        text = log.read_text()
        assert "did not answer 2 liveness probes in a row" in text
    finally:
        for pid in frozen:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if rp.proc.poll() is None:
            rp.proc.kill()
        aws.stop()
