"""The product path (TensorRT-LLM backend) end to end, with stand-ins for the TensorRT-LLM tools.

The stand-ins (tests/runtime/fake_trtllm.py) parse every command line with the 1.2.x
option definitions and produce the files the real tools leave behind; trtllm-serve is
played by the reference server. Everything else is the shipped runtime: staged model and
calibration set from S3, convert -> build under the cache lock, upload, serve, hooks.
"""

import contextlib
import itertools
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from fleetcast.config import config_from_json
from fleetcast.contract import telemetry
from fleetcast.contract.bucket import model_prefix
from fleetcast.contract.calibration import MIN_ROWS
from fleetcast.contract.manifest import MANIFEST_NAME, build_manifest
from fleetcast.staging.calibration import write_layout as write_calibration_layout
from runtime import vendor
from runtime.devtools.harness import LocalAws, free_port_pair, tiny_config
from tests.runtime import fake_trtllm
from tests.runtime.streaming import stream_completion

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("forked_engines")]
L40S = "NVIDIA L40S, 8.9, 46068"
_buckets = itertools.count()


def sq_config(bucket: str):
    data = tiny_config().model_dump(mode="json")
    data["engine"].update(precision="int8_sq", kv_cache_dtype="int8")  # SmoothQuant + INT8 KV: calibrated
    data["calibration"] = {"dataset": f"s3://{bucket}/calibration/lambada/", "samples": 64}
    return config_from_json(json.dumps(data))


def stage(aws, src: Path, prefix: str, kind: str) -> None:
    manifest = build_manifest(src, kind=kind, name=src.name, revision="main")
    s3 = aws.s3()
    for f in manifest.files:
        s3.upload_file(str(src / f.path), aws.bucket, prefix + f.path)
    s3.put_object(Bucket=aws.bucket, Key=prefix + MANIFEST_NAME, Body=manifest.to_json().encode())


@contextlib.contextmanager
def read_only_dir(path: Path):
    """A directory nothing can be written to, like the container's working directory (the runtime
    bundle, mounted read-only at /opt/fleetcast by runtime/host/run-container.sh)."""
    path.mkdir()
    path.chmod(0o555)
    immutable = os.geteuid() == 0  # root ignores mode bits; an immutable directory refuses root too
    if immutable and subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        immutable = False
    try:
        try:
            (path / "probe").write_text("x")
        except OSError:
            pass
        else:
            pytest.skip("cannot make a read-only directory on this machine")
        yield path
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=False)
        path.chmod(0o755)


@pytest.fixture
def region(tmp_path, moto_endpoint):
    # On the session's moto server (one bucket each): a moto server of its own took half a second to stop
    # (werkzeug's serve_forever polls for shutdown every 0.5 s).
    with LocalAws(bucket=f"fleetcast-trt-{os.getpid()}-{next(_buckets)}", moto_url=moto_endpoint) as aws:
        cfg = sq_config(aws.bucket)
        aws.put_config(cfg)
        model = tmp_path / "hf-model"
        model.mkdir()
        for name, body in {"config.json": '{"model_type": "gpt2", "n_positions": 1024}', "tokenizer.json": "{}",
                           "vocab.json": "{}", "merges.txt": "#version: 0.2", "model.safetensors": "weights"}.items():
            (model / name).write_text(body)
        stage(aws, model, model_prefix(cfg.model.id, cfg.model.revision), "model")
        calib = tmp_path / "calibration-set"
        write_calibration_layout([f"calibration sample {i}" for i in range(MIN_ROWS)], calib)  # as staging writes it
        stage(aws, calib, "calibration/lambada/", "calibration")
        bin_dir, examples = fake_trtllm.install(tmp_path / "trtllm")
        (tmp_path / "vendored").mkdir()
        with read_only_dir(tmp_path / "opt-fleetcast"):
            yield aws, cfg, tmp_path, bin_dir, examples


def start(aws, cfg, tmp_path, bin_dir, examples, instance_id, **extra):
    env = aws.runtime_env(aws.instance(instance_id), cfg, tmp_path / instance_id, free_port_pair(),
                          FLEETCAST_SERVING_BACKEND="tensorrt-llm", FLEETCAST_FAKE_GPU=L40S,
                          FLEETCAST_TRTLLM_EXAMPLES=str(examples), FAKE_TRTLLM_LOG=str(tmp_path / "tools.jsonl"),
                          FAKE_TRTLLM_MODEL=cfg.model.id, **extra)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    # As in the container: the vendored packages on PYTHONPATH (and named by FLEETCAST_DEPS, as
    # docker/Dockerfile does), the working directory read-only.
    env["PYTHONPATH"] = str(tmp_path / "vendored")
    env[vendor.VENDOR_DIR_ENV] = str(tmp_path / "vendored")
    return (aws.start_runtime(env, tmp_path / f"{instance_id}.log", cwd=tmp_path / "opt-fleetcast"),
            int(env["FLEETCAST_PORT"]))


def tool_calls(tmp_path):
    path = tmp_path / "tools.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def arg(argv, flag):
    return argv[argv.index(flag) + 1]


def test_smoothquant_engine_is_built_once_from_staged_inputs_and_served(region):
    aws, cfg, tmp_path, bin_dir, examples = region
    rp, port = start(aws, cfg, tmp_path, bin_dir, examples, "i-00000000000000d01")
    serving = rp.wait_event("fleetcast_serving", 150)
    assert serving is not None, (tmp_path / "i-00000000000000d01.log").read_text()[-3000:]
    assert serving["outcome"] == "built" and serving["gpu"] == "NVIDIA L40S"

    convert, build, serve = tool_calls(tmp_path)
    assert convert["tool"] == "convert_checkpoint.py"
    for flag in ("--smoothquant", "--per_token", "--per_channel", "--int8_kv_cache"):
        assert flag in convert["argv"]
    calib_dir = arg(convert["argv"], "--calib_dataset")
    assert calib_dir.endswith("/calibration/lambada")  # the staged set's loader directory; never the hub's lambada
    assert build["tool"] == "trtllm-build" and arg(build["argv"], "--max_seq_len") == "192"
    assert serve["tool"] == "trtllm-serve" and arg(serve["argv"], "--backend") == "tensorrt"
    assert arg(serve["argv"], "--port") == str(port + 1) and arg(serve["argv"], "--host") == "127.0.0.1"
    # The model has no `consumers` list: every consumer may call it, and trtllm-serve's /v1/completions cannot
    # carry a cache_salt, so its engine must not reuse KV blocks across accounts (fleetcast.contract.isolation).
    options = json.loads(Path(arg(serve["argv"], "--extra_llm_api_options")).read_text())
    assert options["kv_cache_config"]["enable_block_reuse"] is False
    work = Path(build["cwd"])
    assert convert["cwd"] == build["cwd"] and work.is_relative_to(tmp_path / "i-00000000000000d01")
    assert Path(arg(build["argv"], "--output_timing_cache")).parent == work  # not the read-only cwd
    for call in (convert, build, serve):  # TensorRT-LLM's processes: released packages only, hub offline
        assert str(tmp_path / "vendored") not in (call["env"]["PYTHONPATH"] or ""), call
        assert call["env"]["HF_HUB_OFFLINE"] == call["env"]["HF_DATASETS_OFFLINE"] == "1"
        assert call["env"]["TRANSFORMERS_OFFLINE"] == "1"

    entry = [k.split("/builds/")[1].split("/", 1)[1] for k in aws.keys("engines/") if "/builds/" in k]
    assert "engine/rank0.engine" in entry and "tokenizer/tokenizer.json" in entry
    assert "tokenizer/model.safetensors" not in entry  # HF weights are not shipped beside the engine
    assert not [k for k in entry if k.endswith("model.cache")]  # the timing cache stays on the build host
    assert stream_completion(port, "Hello", 8).usage["completion_tokens"] == 8

    # A second instance of the same pool: cache hit, trtllm-serve only.
    rp2, port2 = start(aws, cfg, tmp_path, bin_dir, examples, "i-00000000000000d02")
    hit = rp2.wait_event("fleetcast_serving", 150)
    assert hit is not None and hit["outcome"] == "hit"
    assert [c["tool"] for c in tool_calls(tmp_path)] == ["convert_checkpoint.py", "trtllm-build", "trtllm-serve",
                                                          "trtllm-serve"]
    for p in (rp, rp2):
        p.proc.send_signal(signal.SIGTERM)
        assert p.proc.wait(60) == 0


def test_a_failing_engine_build_leaves_a_marker_and_abandons(region):
    aws, cfg, tmp_path, bin_dir, examples = region
    rp, _ = start(aws, cfg, tmp_path, bin_dir, examples, "i-00000000000000d03", FAKE_TRTLLM_FAIL="trtllm-build")
    assert rp.proc.wait(90) == 0
    assert [c.result for c in aws.asg.completed if c.hook == telemetry.LAUNCH_HOOK] == ["ABANDON"]
    markers = aws.keys("failures/")
    assert len(markers) == 1
    marker = json.loads(aws.s3().get_object(Bucket=aws.bucket, Key=markers[0])["Body"].read())
    assert "out of memory" in marker["error"] and marker["holder"] == "i-00000000000000d03"
    assert rp.metric_values(telemetry.ENGINE_BUILD_FAILURE) == [1.0]
    assert aws.keys("locks/") == []
