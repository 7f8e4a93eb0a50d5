"""Two models on one instance, end to end: real `python -m runtime.bootstrap` on loopback AWS.

Per model: its own cache key, build, lock and circuit breaker. One engine process each behind one
gateway that routes by the body's `model`; a model that cannot be built is named in the ABANDON and
does not keep the other's engine out of the cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from fleetcast.contract import telemetry
from runtime.devtools.harness import LocalAws, free_port_pair, reference_cache_key, two_model_config

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("forked_engines")]
# Each test's LocalAws is on the session's moto server (`moto_endpoint`, one bucket each): a moto server of its own
# took half a second to stop (werkzeug's serve_forever polls for shutdown every 0.5 s).


def call(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    from runtime.demo import _call
    from runtime.devtools.harness import DEMO_VPCE

    return _call(port, method, path, DEMO_VPCE, body)


def test_each_model_gets_its_process_and_the_gateway_routes_by_model(tmp_path, moto_endpoint):
    cfg = two_model_config()
    aws = LocalAws(bucket=f"fleetcast-mm-{os.getpid()}-ok", moto_url=moto_endpoint).start()
    rp = None
    try:
        aws.put_config(cfg)
        imds = aws.instance("i-00000000000000e01")
        port = free_port_pair()
        rp = aws.start_runtime(aws.runtime_env(imds, cfg, tmp_path / "disk", port), tmp_path / "log")
        serving = rp.wait_event("fleetcast_serving", 240)
        assert serving is not None, (tmp_path / "log").read_text()[-3000:]
        models = [m.id for m in cfg.models]
        assert {m: e["outcome"] for m, e in serving["models"].items()} == {m: "built" for m in models}
        processes = serving["processes"]
        assert [p["model"] for p in processes] == models
        assert len({p["port"] for p in processes}) == 2 and processes[0]["port"] == port + 1
        assert all(p["kv_cache_bytes"] == 1 << 20 for p in processes)  # kv_cache_gb 1/1024 each
        texts = {}
        for model in models:
            status, reply = call(port, "POST", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 8,
                                                                   "temperature": 0, "ignore_eos": True})
            assert status == 200 and reply["model"] == model and reply["usage"]["completion_tokens"] == 8
            texts[model] = reply["choices"][0]["text"]
        # Each process holds its own weights (runtime/backends.reference_seed): greedy text tells them apart.
        assert len(set(texts.values())) == len(models), texts
        status, health = call(port, "GET", "/health")
        assert status == 200 and health["models"] == {m: True for m in models}
        manifests = [k for k in aws.keys("engines/") if k.endswith("/manifest.json")]
        assert sorted(k.split("/")[1].split("-fp16-")[0] for k in manifests) == sorted(models)
    finally:
        # SIGTERM, as systemd stops the service: the runtime stops its gateway and every engine process, so
        # nothing outlives the test.
        if rp is not None and rp.proc.poll() is None:
            rp.proc.terminate()
            try:
                rp.proc.wait(120)
            except subprocess.TimeoutExpired:
                rp.proc.kill()
        aws.stop()


def test_a_model_that_cannot_be_built_is_named_and_the_other_still_reaches_the_cache(tmp_path, moto_endpoint):
    cfg = two_model_config()
    aws = LocalAws(bucket=f"fleetcast-mm-{os.getpid()}-brk", moto_url=moto_endpoint).start()
    try:
        aws.put_config(cfg)
        good, broken = (m.id for m in cfg.models)
        key = reference_cache_key(cfg, aws.region, broken)
        for n in range(1, cfg.operations.build_failure_limit + 1):  # three earlier instances failed this key
            aws.s3().put_object(Bucket=aws.bucket, Key=f"failures/{key}/{n:04d}.json",
                                Body=json.dumps({"error": "trtllm-build exited 1: out of memory"}).encode())
        imds = aws.instance("i-00000000000000e02")
        started = time.monotonic()
        rp = aws.start_runtime(aws.runtime_env(imds, cfg, tmp_path / "disk", free_port_pair()), tmp_path / "log")
        assert rp.proc.wait(180) == 0
        assert time.monotonic() - started < 180
        assert [c.result for c in aws.asg.completed if c.hook == telemetry.LAUNCH_HOOK] == ["ABANDON"]
        abandoned = rp.emf(lambda r: telemetry.LAUNCH_ABANDONED in r)
        assert len(abandoned) == 1 and abandoned[0]["cause"] == "ModelsUnavailable"
        assert f"model {broken}: CircuitOpen" in abandoned[0]["error"] and f"model {good}:" not in abandoned[0]["error"]
        breaker = rp.emf(lambda r: telemetry.CIRCUIT_BREAKER_OPEN in r)
        assert [r["model"] for r in breaker] == [broken]
        # The other model was built and published all the same: the next instance finds it.
        manifests = [k for k in aws.keys("engines/") if k.endswith("/manifest.json")]
        assert len(manifests) == 1 and manifests[0].split("/")[1] == reference_cache_key(cfg, aws.region, good)
        assert not [k for k in aws.keys("engines/") if k.startswith(f"engines/{key}/")]
    finally:
        aws.stop()


def _pid_listening_on(port: int) -> int:
    """The engine process started with `--port PORT` (its cmdline in /proc)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")  # noqa: SIM115
            except OSError:
                continue
            if b"runtime.reference.server" in argv and f"{port}".encode() in argv:
                return int(entry)
    raise AssertionError(f"no engine process on port {port}")


def test_a_pool_with_gpu_sharing_mps_serves_its_models_as_clients_of_one_daemon_and_restarts_them_together(
        tmp_path, fake_mps, moto_endpoint):
    """The pool's gpu_sharing reaches the instance in the config it reads (SSM, validated again there): the runtime
    starts the GPU's MPS control daemon (the stand-in, tests/runtime/fake_mps_control.py) before the first engine
    process; when one of them dies, both restart together while the gateway answers 200 or a retryable 503 (never
    a hang); at SIGTERM the daemon quits after the last process."""
    from fleetcast.config import config_from_json

    data = two_model_config().model_dump(mode="json")
    for region in data["regions"]:
        for pool in region["pools"]:
            pool["gpu_sharing"] = "mps"
    cfg = config_from_json(json.dumps(data))
    aws = LocalAws(bucket=f"fleetcast-mm-{os.getpid()}-mps", moto_url=moto_endpoint).start()
    rp = None
    try:
        aws.put_config(cfg)
        imds = aws.instance("i-00000000000000e03")
        port = free_port_pair()
        # The group restart waits its backoff first: 1 s by default, for a restart this test waits out.
        rp = aws.start_runtime(aws.runtime_env(imds, cfg, tmp_path / "disk", port, FLEETCAST_RESTART_BACKOFF_S="0.1"),
                               tmp_path / "log")
        serving = rp.wait_event("fleetcast_serving", 240)
        assert serving is not None, (tmp_path / "log").read_text()[-3000:]
        assert serving["gpu_sharing"] == "mps" and serving["kv_short"] == {}
        starts = [json.loads(line) for line in fake_mps.read_text().splitlines()]
        assert [c["argv"] for c in starts] == [["-d"]]
        assert starts[0]["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "disk" / "mps" / "gpu0" / "pipe")
        models = [p["model"] for p in serving["processes"]]
        ports = {p["model"]: p["port"] for p in serving["processes"]}
        pids = {m: _pid_listening_on(ports[m]) for m in models}
        env = dict(item.decode().split("=", 1) for item in open(f"/proc/{pids[models[0]]}/environ", "rb").read()  # noqa: SIM115
                   .split(b"\0") if b"=" in item)
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == starts[0]["env"]["CUDA_MPS_PIPE_DIRECTORY"]
        os.kill(pids[models[0]], 9)  # one client dies: the other is restarted with it
        seen: set[int] = set()
        deadline = time.monotonic() + 180  # bounds the wait; the verdicts are below
        while time.monotonic() < deadline:
            statuses = [call(port, "POST", "/v1/completions", {"model": m, "prompt": "hi", "max_tokens": 2})[0]
                        for m in models]
            seen.update(statuses)
            if statuses == [200, 200] and all(_pid_listening_on(ports[m]) != pids[m] for m in models):
                break
            time.sleep(0.2)
        assert all(_pid_listening_on(ports[m]) != pids[m] for m in models)  # both restarted
        assert seen <= {200, 503}
        rp.proc.terminate()
        rp.proc.wait(120)
        calls = [json.loads(line) for line in fake_mps.read_text().splitlines()]
        assert [c["argv"] for c in calls] == [["-d"], []]  # the daemon's quit, after the last engine process
    finally:
        if rp is not None and rp.proc.poll() is None:
            rp.proc.terminate()
            try:
                rp.proc.wait(120)
            except subprocess.TimeoutExpired:
                rp.proc.kill()
        aws.stop()
