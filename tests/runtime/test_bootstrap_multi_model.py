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

pytestmark = pytest.mark.timeout(300)


def call(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    from runtime.demo import _call
    from runtime.devtools.harness import DEMO_VPCE

    return _call(port, method, path, DEMO_VPCE, body)


def test_each_model_gets_its_process_and_the_gateway_routes_by_model(tmp_path):
    cfg = two_model_config()
    aws = LocalAws(bucket=f"fleetcast-mm-{os.getpid()}-ok").start()
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


def test_a_model_that_cannot_be_built_is_named_and_the_other_still_reaches_the_cache(tmp_path):
    cfg = two_model_config()
    aws = LocalAws(bucket=f"fleetcast-mm-{os.getpid()}-brk").start()
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
        abandoned = [r for r in rp.emf() if telemetry.LAUNCH_ABANDONED in r]
        assert len(abandoned) == 1 and abandoned[0]["cause"] == "ModelsUnavailable"
        assert f"model {broken}: CircuitOpen" in abandoned[0]["error"] and f"model {good}:" not in abandoned[0]["error"]
        breaker = [r for r in rp.emf() if telemetry.CIRCUIT_BREAKER_OPEN in r]
        assert [r["model"] for r in breaker] == [broken]
        # The other model was built and published all the same: the next instance finds it.
        manifests = [k for k in aws.keys("engines/") if k.endswith("/manifest.json")]
        assert len(manifests) == 1 and manifests[0].split("/")[1] == reference_cache_key(cfg, aws.region, good)
        assert not [k for k in aws.keys("engines/") if k.startswith(f"engines/{key}/")]
    finally:
        aws.stop()
