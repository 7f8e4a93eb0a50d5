"""LoRA adapters on an instance, end to end: `fleetcast stage adapter` into the loopback bucket, the real
`python -m runtime.bootstrap` fetching each adapter to its contract directory before the base model's
engine process starts with LoRA options, and a request for the adapter routed through the gateway.

The reference server (runtime/reference/server.py) is started with the same `lora_config` TensorRT-LLM
would get and refuses a `lora_request` it could not load, so a 200 for the adapter means the options
reached the engine process and the adapter is where `lora_path` says.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request

import pytest

from fleetcast.contract import telemetry
from fleetcast.contract.adapters import adapter_dir, lora_device_cache_bytes, model_dims
from fleetcast.contract.bucket import adapter_prefix
from fleetcast.contract.instance_env import Var
from fleetcast.contract.serving import first_process_port
from fleetcast.staging.adapters import stage_adapter
from runtime.devtools.harness import (
    ADAPTER_ID,
    LocalAws,
    adapter_config,
    free_port_pair,
    reference_cache_key,
    write_peft_adapter,
)

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("forked_engines")]
# Each test's LocalAws is on the session's moto server (`moto_endpoint`, one bucket each): a moto server of its own
# took half a second to stop (werkzeug's serve_forever polls for shutdown every 0.5 s).


def call(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    from runtime.demo import _call
    from runtime.devtools.harness import DEMO_VPCE

    return _call(port, method, path, DEMO_VPCE, body)


def stop(rp) -> None:
    if rp is not None and rp.proc.poll() is None:
        rp.proc.terminate()  # as systemd stops the service: no engine or gateway outlives the test
        try:
            rp.proc.wait(120)
        except subprocess.TimeoutExpired:
            rp.proc.kill()


def test_a_staged_adapter_is_fetched_before_its_base_model_serves_and_requests_for_it_are_routed(tmp_path,
                                                                                                   moto_endpoint):
    cfg = adapter_config()
    base = cfg.models[1]
    aws = LocalAws(bucket=f"fleetcast-lora-{os.getpid()}-ok", moto_url=moto_endpoint).start()
    rp = None
    try:
        aws.put_config(cfg)
        stage_adapter(cfg, base.id, ADAPTER_ID, {aws.region: aws.bucket}, lambda _service, _region: aws.s3(),
                      local_dir=write_peft_adapter(tmp_path / "peft", rank=8), log=lambda _: None)
        port = free_port_pair()
        disk = tmp_path / "disk"
        rp = aws.start_runtime(aws.runtime_env(aws.instance("i-00000000000000f01"), cfg, disk, port),
                               tmp_path / "log")
        serving = rp.wait_event("fleetcast_serving", 240)
        assert serving is not None, (tmp_path / "log").read_text()[-3000:]
        fetched = disk / "adapters" / base.id / ADAPTER_ID
        assert str(fetched) == adapter_dir(str(disk), base.id, ADAPTER_ID)
        assert sorted(p.name for p in fetched.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
        # The base model's process holds the LoRA device cache its max_loras sizes (here the one adapter),
        # computed from the artifact's config.json as TensorRT-LLM sizes it (tests/runtime/test_lora_cache.py).
        engine_port = first_process_port(port) + [m.id for m in cfg.models].index(base.id)
        with urllib.request.urlopen(f"http://127.0.0.1:{engine_port}/memory", timeout=10) as resp:
            memory = json.loads(resp.read())
        artifact_config = json.loads(next((disk / "engines").rglob("config.json")).read_text())
        assert memory["lora_max_loras"] == 1
        assert memory["lora_cache_bytes"] == lora_device_cache_bytes(
            model_dims(artifact_config, "artifact"), ["attn_q", "attn_v"], 8, 1)

        # Greedy and past the end-of-text token, so the count is exact (the default, temperature 1, may sample it)
        status, reply = call(port, "POST", "/v1/completions", {"model": ADAPTER_ID, "prompt": "hi", "max_tokens": 3,
                                                               "temperature": 0, "ignore_eos": True})
        assert status == 200, reply
        assert reply["usage"]["completion_tokens"] == 3
        status, models = call(port, "GET", "/v1/models")
        assert ADAPTER_ID in [m["id"] for m in models["data"]]
        # The base model's own requests carry no adapter and still work next to it.
        assert call(port, "POST", "/v1/completions", {"model": base.id, "prompt": "hi", "max_tokens": 2})[0] == 200
        stop(rp)
        metered = rp.emf(lambda r: r.get(telemetry.DIM_MODEL) == ADAPTER_ID)
        assert len(metered) == 1 and metered[0][telemetry.OUTPUT_TOKENS] == 3  # metered as the adapter
    finally:
        stop(rp)
        aws.stop()


def test_an_adapter_never_staged_fails_its_model_by_name_and_arms_its_breaker(tmp_path, moto_endpoint):
    cfg = adapter_config()
    good, base = cfg.models
    aws = LocalAws(bucket=f"fleetcast-lora-{os.getpid()}-missing", moto_url=moto_endpoint).start()
    try:
        aws.put_config(cfg)
        env = aws.runtime_env(aws.instance("i-00000000000000f02"), cfg, tmp_path / "disk", free_port_pair(),
                              **{Var.STAGING_WAIT_S.value: "1"})
        rp = aws.start_runtime(env, tmp_path / "log")
        assert rp.proc.wait(240) == 0
        assert [c.result for c in aws.asg.completed if c.hook == telemetry.LAUNCH_HOOK] == ["ABANDON"]
        (abandoned,) = rp.emf(lambda r: telemetry.LAUNCH_ABANDONED in r)
        assert f"model {base.id}: StagingMissing: adapter {ADAPTER_ID}:" in abandoned["error"]
        assert "fleetcast stage adapter --adapter gpt2-tiny-sql" in abandoned["error"]
        assert f"model {good.id}:" not in abandoned["error"]
        # One marker on the base model's key naming what would heal it; the other model still reached the cache.
        key = reference_cache_key(cfg, aws.region, base.id)
        (marker,) = aws.keys(f"failures/{key}/")
        body = json.loads(aws.s3().get_object(Bucket=aws.bucket, Key=marker)["Body"].read())
        prefix = adapter_prefix(base.id, base.revision, ADAPTER_ID, "v1")
        assert body["missing"] == f"{prefix}manifest.json" and body["error"].startswith(f"adapter {ADAPTER_ID}:")
        assert f"engines/{reference_cache_key(cfg, aws.region, good.id)}/manifest.json" in aws.keys("engines/")
    finally:
        aws.stop()


def test_the_breaker_of_a_model_whose_adapter_keeps_missing_opens_then_clears_once_it_is_staged(tmp_path,
                                                                                                  moto_endpoint):
    cfg = adapter_config()
    good, base = cfg.models
    aws = LocalAws(bucket=f"fleetcast-lora-{os.getpid()}-breaker", moto_url=moto_endpoint).start()
    rp = None
    try:
        aws.put_config(cfg)
        key = reference_cache_key(cfg, aws.region, base.id)
        missing = f"{adapter_prefix(base.id, base.revision, ADAPTER_ID, 'v1')}manifest.json"
        for n in range(1, cfg.operations.build_failure_limit + 1):  # earlier instances found no adapter
            aws.s3().put_object(Bucket=aws.bucket, Key=f"failures/{key}/{n:04d}.json", Body=json.dumps(
                {"error": f"adapter {ADAPTER_ID}: StagingMissing: ... is missing", "missing": missing}).encode())
        env = aws.runtime_env(aws.instance("i-00000000000000f03"), cfg, tmp_path / "a", free_port_pair(),
                              **{Var.STAGING_WAIT_S.value: "1"})
        first = aws.start_runtime(env, tmp_path / "log-a")
        assert first.proc.wait(240) == 0
        (abandoned,) = first.emf(lambda r: telemetry.LAUNCH_ABANDONED in r)
        # Open: the model is given up at once (CircuitOpen, not another staging wait), by name.
        assert f"model {base.id}: CircuitOpen" in abandoned["error"] and f"model {good.id}:" not in abandoned["error"]
        assert f"once s3://{aws.bucket}/{missing} is staged" in abandoned["error"]

        stage_adapter(cfg, base.id, ADAPTER_ID, {aws.region: aws.bucket}, lambda _service, _region: aws.s3(),
                      local_dir=write_peft_adapter(tmp_path / "peft"), log=lambda _: None)
        port = free_port_pair()
        rp = aws.start_runtime(aws.runtime_env(aws.instance("i-00000000000000f04"), cfg, tmp_path / "b", port),
                               tmp_path / "log-b")
        assert rp.wait_event("fleetcast_serving", 240) is not None, (tmp_path / "log-b").read_text()[-3000:]
        assert aws.keys(f"failures/{key}/") == []  # what the markers waited for is staged: they are gone
        assert call(port, "POST", "/v1/completions", {"model": ADAPTER_ID, "prompt": "hi", "max_tokens": 1})[0] == 200
    finally:
        stop(rp)
        aws.stop()


def test_the_demos_adapter_layout_is_the_one_the_staging_tool_writes(aws, tmp_path):
    """`make demo` cannot run the staging tool (the runtime does not import it); its stand-in must leave the
    same files and manifest `fleetcast stage adapter` does."""
    from fleetcast.contract.manifest import MANIFEST_NAME, Manifest

    cfg = adapter_config(aws.region)
    base = cfg.models[1]
    peft = write_peft_adapter(tmp_path / "peft", rank=8)
    prefix = adapter_prefix(base.id, base.revision, ADAPTER_ID, cfg.models[1].adapters[0].revision)

    def staged() -> tuple[list[str], Manifest]:
        keys = sorted(o["Key"] for o in aws.s3().list_objects_v2(Bucket=aws.bucket, Prefix=prefix)["Contents"])
        return keys, Manifest.from_json(aws.s3().get_object(Bucket=aws.bucket, Key=prefix + MANIFEST_NAME)["Body"].read())

    stage_adapter(cfg, base.id, ADAPTER_ID, {aws.region: aws.bucket}, lambda _service, _region: aws.s3(),
                  local_dir=peft, log=lambda _: None)
    by_tool = staged()
    assert aws.put_adapter(cfg, base.id, ADAPTER_ID, peft) == prefix
    by_demo = staged()
    assert by_demo[0] == by_tool[0]
    assert by_demo[1].files == by_tool[1].files and by_demo[1].kind == by_tool[1].kind == "adapter"
    assert by_demo[1].extra == by_tool[1].extra
