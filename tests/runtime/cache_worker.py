"""Process entry points for the engine-cache tests (importable by spawned children)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import boto3

from runtime.engine_cache import CacheInputs, CacheSettings, EngineCache


def inputs(**changes) -> CacheInputs:
    base = dict(model_id="gpt2-tiny", revision="r1", backend="tensorrt", precision="fp16", kv_cache_dtype="auto",
                max_batch_size=8, max_num_tokens=1024, max_input_len=128, max_output_len=64, builder="test",
                builder_version="1", compute_capability="8.9")
    base.update(changes)
    return CacheInputs(**base)


def client(endpoint: str):
    return boto3.client("s3", region_name="ap-northeast-2", endpoint_url=endpoint,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def fake_build(counter: Path, seconds: float):
    """A build that takes `seconds` and leaves a line in `counter` (O_APPEND: safe across processes)."""

    def build(workdir: Path) -> Path:
        fd = os.open(counter, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.close(fd)
        time.sleep(seconds)
        artifact = workdir / "artifact"
        (artifact / "engine").mkdir(parents=True)
        (artifact / "engine" / "rank0.engine").write_bytes(os.urandom(256 * 1024))
        (artifact / "engine" / "config.json").write_text(json.dumps({"built_by": os.getpid()}))
        return artifact

    return build


def cold_start(endpoint: str, bucket: str, local_root: str, counter: str, build_seconds: float, holder: str,
               result_file: str, reference: bool = False) -> None:
    """One instance's cold start: obtain the engine, write what happened to `result_file`."""
    settings = CacheSettings(poll_s=0.2, lock_ttl_s=30, lock_refresh_s=1, wait_timeout_s=120, s3_retry_deadline_s=10)
    if reference:
        from fleetcast.config import load_config
        from runtime.backends import ReferenceBackend

        cfg = load_config(Path(__file__).resolve().parents[2] / "config" / "fleet.yaml")
        backend = ReferenceBackend(cfg, cfg.engine, size="tiny")
        counting = fake_build(Path(counter), 0)

        def build(workdir: Path) -> Path:
            counting(workdir / "ignored")
            return backend.build(None, None, workdir)
        key_inputs = inputs(builder="reference", builder_version=backend.version)
    else:
        build = fake_build(Path(counter), build_seconds)
        key_inputs = inputs()
    cache = EngineCache(client(endpoint), bucket, key_inputs, holder=holder, settings=settings)
    res = cache.obtain(Path(local_root), build)
    Path(result_file).write_text(json.dumps({"outcome": res.outcome, "build_id": res.manifest.extra["build_id"],
                                             "files": [asdict(f) for f in res.manifest.files], "events": res.events}))
