"""The instance runtime end to end: real `python -m runtime.bootstrap` processes on loopback AWS.

Each instance is a process with its own IMDSv2 fake, its own local disk and its own
ports; S3 and SSM are moto, the lifecycle-hook calls a loopback Auto Scaling fake.
The model server is the reference backend (tiny GPT-2 on CPU) behind the real gateway.
"""

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from fleetcast.contract import telemetry
from runtime.devtools.harness import LocalAws, free_port, free_port_pair, tiny_config
from runtime.serve import raw_health
from tests.runtime.streaming import StreamResult, stream_completion

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("forked_engines")]
# Every LocalAws here is on the session's moto server (`moto_endpoint`, one bucket each): a moto server of its own
# took half a second to stop (werkzeug's serve_forever polls for shutdown every 0.5 s).


@pytest.fixture(scope="module")
def fleet(moto_endpoint):
    """One loopback region shared by the scenario tests of this module (the cache persists between them)."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="fleetcast-e2e-"))
    with LocalAws(bucket=f"fleetcast-e2e-{os.getpid()}", moto_url=moto_endpoint) as aws:
        cfg = tiny_config()
        aws.put_config(cfg)
        yield aws, cfg, root
    shutil.rmtree(root, ignore_errors=True)


def launch(aws, cfg, root: Path, instance_id: str, state="InService", **extra):
    imds = aws.instance(instance_id, state)
    port = free_port_pair()
    env = aws.runtime_env(imds, cfg, root / instance_id, port, **extra)
    (root / instance_id).mkdir(parents=True, exist_ok=True)
    return aws.start_runtime(env, root / f"{instance_id}.log"), imds, port


def log_of(root: Path, instance_id: str) -> str:
    return (root / f"{instance_id}.log").read_text()


def server_pid(root: Path, instance_id: str) -> int:
    pids = re.findall(r"started server \(pid (\d+)\)", log_of(root, instance_id))
    return int(pids[-1])


def unread_requests(port: int) -> int:
    """Sockets at local `port` holding received, unread bytes (Linux /proc/net/tcp: rx_queue > 0)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            rx_queue = int(fields[4].split(":")[1], 16)
            if local_port == port and fields[3] == "01" and rx_queue > 0:  # 01: ESTABLISHED
                count += 1
    return count


def builds_in_cache(aws) -> set[str]:
    return {k.split("/builds/")[1].split("/")[0] for k in aws.keys("engines/") if "/builds/" in k}


def hook_results(aws, instance_id: str, hook: str) -> list[str]:
    return [c.result for c in aws.asg.completed if c.instance_id == instance_id and c.hook == hook]


def wait_until(predicate, timeout_s=60.0, step=0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return None


def test_cold_start_builds_serves_then_hit_and_warm_pool_skip_the_build(fleet):
    aws, cfg, root = fleet

    # 1. First instance, empty cache: build, upload, serve, launch hook CONTINUE.
    miss, _, port = launch(aws, cfg, root, "i-00000000000000a01")
    serving = miss.wait_event("fleetcast_serving", 150)
    assert serving is not None, log_of(root, "i-00000000000000a01")[-3000:]
    assert serving["outcome"] == "built"
    assert hook_results(aws, "i-00000000000000a01", telemetry.LAUNCH_HOOK) == ["CONTINUE"]
    assert raw_health("127.0.0.1", port, proxy_protocol=True) == 200  # what the NLB sees
    reply = stream_completion(port, "Hello", 16)
    assert reply.status == 200 and reply.usage["completion_tokens"] == 16 and reply.done
    assert len(builds_in_cache(aws)) == 1
    assert miss.metric_values(telemetry.ENGINE_CACHE_MISS) == [1.0]
    assert miss.metric_values(telemetry.ENGINE_BUILD_SECONDS)[0] > 0
    assert miss.metric_values(telemetry.START_TO_HEALTHY_SECONDS)[0] == pytest.approx(serving["start_to_healthy_s"], abs=0.01)
    gauges = wait_until(lambda: [r for r in miss.emf() if telemetry.KV_CACHE_UTILIZATION in r], 10)
    assert gauges and gauges[0][telemetry.DIM_INSTANCE] == "i-00000000000000a01"  # per-instance dimension set
    miss.proc.send_signal(signal.SIGTERM)
    assert miss.proc.wait(60) == 0

    # 2. Second instance: cache hit, no build.
    hit, _, port = launch(aws, cfg, root, "i-00000000000000a02")
    serving = hit.wait_event("fleetcast_serving", 120)
    assert serving is not None and serving["outcome"] == "hit", log_of(root, "i-00000000000000a02")[-3000:]
    assert serving["build_s"] == 0 and len(builds_in_cache(aws)) == 1
    assert hit.metric_values(telemetry.ENGINE_CACHE_HIT) == [1.0]
    assert stream_completion(port, "Hello", 8).usage["completion_tokens"] == 8
    hit.proc.send_signal(signal.SIGTERM)
    assert hit.proc.wait(60) == 0

    # 3. Warm pool: the instance prepares the engine on its disk, completes the hook, never serves.
    warm, _, port = launch(aws, cfg, root, "i-00000000000000a03", state="Warmed:Stopped")
    assert warm.proc.wait(60) == 0
    assert hook_results(aws, "i-00000000000000a03", telemetry.LAUNCH_HOOK) == ["CONTINUE"]
    assert warm.wait_event("fleetcast_serving", 0.1) is None
    assert "started server" not in log_of(root, "i-00000000000000a03")
    assert raw_health("127.0.0.1", port, proxy_protocol=True) is None  # nothing listens
    assert any((root / "i-00000000000000a03" / "engines").iterdir())

    # 4. The same instance started into service later: serves from local disk (no download, no build).
    again = aws.start_runtime(aws.runtime_env(aws.instance("i-00000000000000a03", "InService"), cfg,
                                              root / "i-00000000000000a03", port),
                              root / "i-00000000000000a03.log")
    serving = again.wait_event("fleetcast_serving", 120)
    assert serving is not None and serving["outcome"] == "local"
    assert hook_results(aws, "i-00000000000000a03", telemetry.LAUNCH_HOOK) == ["CONTINUE", "CONTINUE"]
    again.proc.send_signal(signal.SIGTERM)
    assert again.proc.wait(60) == 0
    assert len(builds_in_cache(aws)) == 1


@pytest.mark.parametrize("trigger", ["terminate-hook", "warm-pool-return", "SIGTERM"])
def test_drain_lets_inflight_streams_finish(fleet, trigger):
    """Scale-in (the terminate hook, seen through IMDS; toward Terminated, or back into a warm pool
    that reuses instances) or a plain SIGTERM (docker stop) with streams in flight.

    The scale-in variant first SIGKILLs the model server: the runtime's supervisor restarts it and
    the instance turns healthy again without a container restart.
    """
    aws, cfg, root = fleet
    iid = {"terminate-hook": "i-00000000000000b01", "SIGTERM": "i-00000000000000b02",
           "warm-pool-return": "i-00000000000000b03"}[trigger]
    # The crashed server is restarted after 0.1 s, not the product's 1 s (it is 503 for its ~2 s of
    # loading either way), and the terminate hook is seen within 0.1 s of IMDS showing it.
    rp, imds, port = launch(aws, cfg, root, iid, FLEETCAST_RESTART_BACKOFF_S="0.1", FLEETCAST_TERMINATE_POLL_S="0.1")
    assert rp.wait_event("fleetcast_serving", 150) is not None, log_of(root, iid)[-3000:]

    if trigger == "terminate-hook":
        # A crash of the model server first: the supervisor brings it back, the instance stays healthy.
        first = server_pid(root, iid)
        os.kill(first, signal.SIGKILL)
        # The supervisor saw it die (a forked server is back within about 0.3 s, inside the readiness file's 0.5 s
        # poll, so the 503 in between is not always there to see)
        assert wait_until(lambda: f"server exited with {-signal.SIGKILL}; restarting in" in log_of(root, iid), 10)
        assert wait_until(lambda: server_pid(root, iid) != first, 30)
        # Serving again through the gateway: until the new server has loaded, a request is refused. The health
        # answer follows the readiness file, polled every 0.5 s and read by the gateway every second, so it may
        # still be the 200 of before the crash, or a 503 of it once the new server already serves.
        again = wait_until(lambda: (reply := stream_completion(port, "again", 4)).status == 200 and reply, 60)
        assert again and again.usage["completion_tokens"] == 4
        assert wait_until(lambda: raw_health("127.0.0.1", port, True) == 200, 10)

    # Requests in flight at scale-in. The server is frozen first, so the streams provably cannot
    # finish before the drain starts (no timing luck involved); they are in flight once the
    # gateway has forwarded all four (request bytes waiting, unread, at the server's port).
    pid = server_pid(root, iid)
    os.kill(pid, signal.SIGSTOP)
    results = [StreamResult() for _ in range(4)]
    threads = [threading.Thread(target=stream_completion, args=(port, f"stream {i}", 48, results[i]))
               for i in range(4)]
    try:
        for t in threads:
            t.start()
        assert wait_until(lambda: unread_requests(port + 1) >= 4, 30)
        if trigger == "SIGTERM":
            rp.proc.send_signal(signal.SIGTERM)
        else:
            aws.asg.begin(aws.group, telemetry.TERMINATE_HOOK, iid)
            # The ASG chose this instance for scale-in: terminated, or stopped back into the warm pool.
            imds.target_lifecycle_state = "Terminated" if trigger == "terminate-hook" else "Warmed:Stopped"

        assert wait_until(lambda: raw_health("127.0.0.1", port, True) == 503, 10), \
            log_of(root, iid)[-3000:]  # the NLB stops sending first
        assert all(r.finished_at is None for r in results)  # ... while the streams are still open
        late = stream_completion(port, "late", 4)
        assert late.status == 503 and "draining" in (late.error or "")  # no new work accepted
        assert hook_results(aws, iid, telemetry.TERMINATE_HOOK) == []  # not before they finish
    finally:
        os.kill(pid, signal.SIGCONT)
    for t in threads:
        t.join(60)
    for r in results:
        assert r.status == 200 and r.done and r.error is None
        assert r.usage["completion_tokens"] == 48  # every stream keeps its full token count
    assert rp.proc.wait(60) == 0
    drained = rp.wait_event("fleetcast_drained", 5)
    expected_reason = "SIGTERM" if trigger == "SIGTERM" else "terminate-hook"
    assert drained["stop_reason"] == expected_reason and drained["gateway_exit"] == 0
    # The terminate hook is completed when there is one (scale-in), never for a plain stop.
    assert hook_results(aws, iid, telemetry.TERMINATE_HOOK) == (["CONTINUE"] if trigger != "SIGTERM" else [])
    with pytest.raises(ConnectionRefusedError):  # the listener is gone: new connections are refused
        import socket

        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def _quick_instance(moto_endpoint, tmp_path, instance_id, cfg=None, **extra):
    """A runtime that is expected to stop before serving (fresh loopback region: a bucket of its own)."""
    aws = LocalAws(bucket=f"fleetcast-q-{os.getpid()}-{instance_id[-3:]}", moto_url=moto_endpoint).start()
    cfg = cfg or tiny_config()
    aws.put_config(cfg)
    imds = aws.instance(instance_id)
    rp = aws.start_runtime(aws.runtime_env(imds, cfg, tmp_path / "disk", free_port_pair(), **extra),
                           tmp_path / "log")
    return aws, rp


def test_unsupported_combination_is_refused_before_any_download(tmp_path, moto_endpoint):
    data = tiny_config().model_dump(mode="json")
    data["engine"]["precision"] = "fp8"  # valid for the pool's L40S, but this instance found an A10G (sm86): no FP8
    data["calibration"] = {"dataset": "s3://fleetcast-staging/calibration/lambada/"}
    from fleetcast.config import config_from_json

    cfg = config_from_json(json.dumps(data))
    aws, rp = _quick_instance(moto_endpoint, tmp_path, "i-00000000000000c01", cfg, FLEETCAST_SERVING_BACKEND="tensorrt-llm",
                              FLEETCAST_FAKE_GPU="NVIDIA A10G, 8.6, 23028")
    try:
        assert rp.proc.wait(60) == 0
        assert hook_results(aws, "i-00000000000000c01", telemetry.LAUNCH_HOOK) == ["ABANDON"]
        log = (tmp_path / "log").read_text()
        assert "engine.precision: fp8 is not supported on NVIDIA A10G" in log
        assert aws.keys() == []  # no lock, no marker, nothing read or written
    finally:
        aws.stop()


def test_s3_outage_is_retried_then_the_launch_is_abandoned(tmp_path, moto_endpoint):
    dead = f"http://127.0.0.1:{free_port()}"
    aws, rp = _quick_instance(moto_endpoint, tmp_path, "i-00000000000000c02", AWS_ENDPOINT_URL_S3=dead,
                              FLEETCAST_S3_RETRY_DEADLINE_S="2", FLEETCAST_S3_BACKOFF_S="0.1")
    try:
        assert rp.proc.wait(60) == 0
        assert hook_results(aws, "i-00000000000000c02", telemetry.LAUNCH_HOOK) == ["ABANDON"]
        log = (tmp_path / "log").read_text()
        assert log.count("; retry ") >= 2 and "failed for 2 s" in log
    finally:
        aws.stop()


def test_open_circuit_breaker_abandons_at_once_and_raises_a_metric(tmp_path, moto_endpoint):
    cfg = tiny_config()
    aws = LocalAws(bucket=f"fleetcast-q-{os.getpid()}-brk", moto_url=moto_endpoint).start()
    try:
        aws.put_config(cfg)
        # Three earlier instances failed to build this key (the key is what the runtime computes).
        imds = aws.instance("i-00000000000000c03")
        env = aws.runtime_env(imds, cfg, tmp_path / "disk", free_port_pair())
        from runtime.devtools.harness import reference_cache_key

        key = reference_cache_key(cfg, aws.region)
        for n in range(1, cfg.operations.build_failure_limit + 1):
            aws.s3().put_object(Bucket=aws.bucket, Key=f"failures/{key}/{n:04d}.json",
                                Body=json.dumps({"error": "trtllm-build exited 1: out of memory"}).encode())
        started = time.monotonic()
        rp = aws.start_runtime(env, tmp_path / "log")
        assert rp.proc.wait(60) == 0
        assert time.monotonic() - started < 30
        assert hook_results(aws, "i-00000000000000c03", telemetry.LAUNCH_HOOK) == ["ABANDON"]
        assert rp.metric_values(telemetry.CIRCUIT_BREAKER_OPEN) == [1.0]
        assert "out of memory" in (tmp_path / "log").read_text()
        assert not [k for k in aws.keys() if k.startswith(("engines/", "locks/"))]  # no build attempted
    finally:
        aws.stop()


def test_a_consumer_change_in_the_config_parameter_reaches_the_serving_instance(fleet):
    """Consumers are not in the launch template (the instance digest leaves them out), so a
    deploy that changes them replaces no instance: the running gateway re-reads the SSM
    parameter the stack updates. Removed, the consumer is refused; put back, it is served."""
    aws, cfg, root = fleet
    iid = "i-00000000000000d01"
    rp, _, port = launch(aws, cfg, root, iid, FLEETCAST_GATEWAY_REFRESH_S="0.3")
    ssm = aws.client("ssm")

    def publish(data: dict) -> None:
        ssm.put_parameter(Name=aws.param, Value=json.dumps(data), Type="String", Overwrite=True, Tier="Advanced")

    original = cfg.model_dump(mode="json")
    try:
        assert rp.wait_event("fleetcast_serving", 150) is not None, log_of(root, iid)[-3000:]
        assert stream_completion(port, "Hi", 2).status == 200
        publish({**original, "consumers": [c for c in original["consumers"] if c["service_region"] != aws.region]})
        try:
            refused = wait_until(lambda: stream_completion(port, "Hi", 2).status == 403, 20, step=0.2)
        finally:
            publish(original)  # the module's other tests share this parameter
        assert refused, log_of(root, iid)[-3000:]
        assert wait_until(lambda: stream_completion(port, "Hi", 2).status == 200, 20, step=0.2)
        log = log_of(root, iid)
        assert '"removed": ["voice-app"]' in log and '"added": ["voice-app"]' in log
        assert '"config_source": "ssm:' in log
        assert "config_instance_fields_changed" not in log  # consumers only: no rollout wanted
    finally:
        rp.proc.send_signal(signal.SIGTERM)
        assert rp.proc.wait(60) == 0
