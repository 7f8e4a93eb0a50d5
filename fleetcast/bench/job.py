"""The benchmark job of a bench instance (stacks/bench_fleet.py): wait until the
local server is healthy, run `fleetcast bench run` against it, upload the results
file to the region bucket, then scale the instance's own group to zero.

It runs only where the launch template set FLEETCAST_BENCH_KEY (bench groups);
elsewhere `main` returns at once. Inputs, all from the instance env file:
  FLEETCAST_BENCH_KEY          results object key, e.g. bench/RUN/REGION/g6e.xlarge/int8_wo.json
  FLEETCAST_BENCH_GROUP        this instance's Auto Scaling group (a literal name: no cycle)
  FLEETCAST_BENCH_ENDPOINT     the server to measure (defaults: fleetcast/contract/bench.py)
  FLEETCAST_BENCH_CONCURRENCY  sweep, e.g. 1,2,4,8,16,32,64
  FLEETCAST_BENCH_REQUESTS     requests per level
  FLEETCAST_BENCH_INPUT_TOKENS / FLEETCAST_BENCH_OUTPUT_TOKENS  length specs
  FLEETCAST_BENCH_LABELS       label pairs: instance_type=...,precision=...,region=...,backend=...
  FLEETCAST_BUCKET, FLEETCAST_REGION  (always present on fleet instances)
  FLEETCAST_BENCH_PROBE_MODELS optional (the probe of a fleet of several models): the models to measure one
                               after another through the endpoint, each to its own key (probe_model_key)
  FLEETCAST_BENCH_API_KEY_SECRET  optional: Secrets Manager secret (name) holding an API key for the
                               endpoint (the consumer-side probe of a consumer with api_keys: true);
                               a plain string, or JSON {"keys": [...]} of which the first is used
A pool serving several models (FLEETCAST_BENCH_MODELS set, MODEL:PORT:PRECISION:BACKEND each, with
FLEETCAST_BENCH_MODEL_MIX, FLEETCAST_BENCH_PACKING and FLEETCAST_BENCH_GPU_SHARING, the pool's gpu_sharing):
every model's engine process is measured alone (`--model`, the others loaded and idle), then all at once
(`--model-mix`, each at its own port, each level contract/bench.MIX_REPEATS times, recorded with the mode); each
model's two files go to fleetcast.contract.bucket.packed_model_key under the pool's key.
The group is scaled to zero whatever happened (a failed benchmark uploads an
error note instead of results), so a bench instance never runs on idle.
No CDK import: this runs on the instance.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from fleetcast.contract import bench
from fleetcast.contract.instance_env import Var

log = logging.getLogger("fleetcast.bench_job")


def _wait_healthy(endpoint: str, timeout_s: float, poll_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{endpoint.rstrip('/')}/health", timeout=5) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(max(0.0, min(poll_s, deadline - time.monotonic())))
    return False


def bench_argv(env: dict[str, str], out: Path, api_key: str | None = None) -> list[str]:
    """The `fleetcast bench run` command line this instance runs (in-process: the key never reaches a
    process list)."""
    argv = ["bench", "run", "--endpoint", env.get(Var.BENCH_ENDPOINT, bench.ENDPOINT),
            "--concurrency", env.get(Var.BENCH_CONCURRENCY, bench.CONCURRENCY),
            "--requests-per-level", env.get(Var.BENCH_REQUESTS, bench.REQUESTS_PER_LEVEL),
            "--input-tokens", env.get(Var.BENCH_INPUT_TOKENS, bench.INPUT_TOKENS),
            "--output-tokens", env.get(Var.BENCH_OUTPUT_TOKENS, bench.OUTPUT_TOKENS),
            "--rtt-probe", "--quiet", "--out", str(out)]
    for pair in filter(None, env.get(Var.BENCH_LABELS, "").split(",")):
        argv += ["--label", pair]
    if api_key:
        argv += ["--header", f"Authorization:Bearer {api_key}"]
    return argv


def packed_models(env: dict[str, str]) -> list[tuple[str, int, str, str]]:
    """(model, port, precision, backend) of each model a packed bench instance serves (FLEETCAST_BENCH_MODELS)."""
    out = []
    for entry in filter(None, env.get(Var.BENCH_MODELS, "").split(",")):
        model, port, precision, backend = entry.rsplit(":", 3)  # the id may hold ':' (ft:...)
        out.append((model, int(port), precision, backend))
    return out


def packed_runs(env: dict[str, str], out_dir: Path) -> list[tuple[list[str], dict[str, tuple[Path, str, bool]]]]:
    """The `fleetcast bench run` command lines of a packed bench instance, each with what it writes:
    {model: (results file, that model's key, together)}. Alone first, model by model, then the mix (its levels
    below the number of models dropped: each model needs a worker)."""
    from fleetcast.bench.cli import mix_out_path
    from fleetcast.contract.bucket import packed_model_key
    from fleetcast.contract.model_ids import model_slug

    models = packed_models(env)
    key = env[Var.BENCH_KEY]
    common = ["--requests-per-level", env.get(Var.BENCH_REQUESTS, bench.REQUESTS_PER_LEVEL),
              "--input-tokens", env.get(Var.BENCH_INPUT_TOKENS, bench.INPUT_TOKENS),
              "--output-tokens", env.get(Var.BENCH_OUTPUT_TOKENS, bench.OUTPUT_TOKENS),
              "--packing", env[Var.BENCH_PACKING], "--quiet"]
    if env.get(Var.BENCH_GPU_SHARING):
        common += ["--gpu-sharing", env[Var.BENCH_GPU_SHARING]]
    for pair in filter(None, env.get(Var.BENCH_LABELS, "").split(",")):
        common += ["--label", pair]
    levels = env.get(Var.BENCH_CONCURRENCY, bench.CONCURRENCY)
    runs = []
    for model, port, precision, backend in models:
        out = out_dir / f"alone-{model_slug(model)}.json"  # one file name, whatever the id holds
        runs.append((["bench", "run", "--endpoint", f"http://127.0.0.1:{port}", "--model", model,
                      "--concurrency", levels, "--label", f"precision={precision}", "--label", f"backend={backend}",
                      "--rtt-probe", "--out", str(out), *common],
                     {model: (out, packed_model_key(key, model, precision, False), False)}))
    from fleetcast.bench.mix import parse_model_mix, smallest_concurrency

    # The levels the mix's shares can be split at (a lower one is refused by --model-mix: check_concurrency).
    least = smallest_concurrency(parse_model_mix(env[Var.BENCH_MODEL_MIX]))
    mix_levels = ",".join(x for x in levels.split(",") if int(x) >= least)
    if mix_levels:
        out = out_dir / "mix.json"
        argv = ["bench", "run", "--endpoint", f"http://127.0.0.1:{models[0][1]}",
                "--model-mix", env[Var.BENCH_MODEL_MIX], "--concurrency", mix_levels, "--repeats", bench.MIX_REPEATS,
                "--out", str(out), *common]
        for model, port, _, _ in models[1:]:
            argv += ["--model-endpoint", f"{model}=http://127.0.0.1:{port}"]
        for model, _, precision, _ in models:
            argv += ["--model-precision", f"{model}={precision}"]
        runs.append((argv, {model: (mix_out_path(out, model), packed_model_key(key, model, precision, True), True)
                            for model, _, precision, _ in models}))
    return runs


def _labelled(path: Path, backend: str) -> bytes:
    """A mix run's file with its model's backend (one mix run shares one set of --label; each model's precision
    is its --model-precision)."""
    data = json.loads(path.read_text())
    data["labels"].update(backend=backend)
    return json.dumps(data, separators=(",", ":")).encode()


def _run_packed(env: dict[str, str], s3: Any, bucket: str, health_timeout_s: float) -> None:
    from fleetcast.bench.cli import main as fleetcast

    models = packed_models(env)
    for model, port, _, _ in models:
        endpoint = f"http://127.0.0.1:{port}"
        if not _wait_healthy(endpoint, health_timeout_s):
            raise RuntimeError(f"{model}'s server {endpoint}/health never answered 200 within {health_timeout_s:.0f} s")
    backends = {model: backend for model, _, _, backend in models}
    with tempfile.TemporaryDirectory() as tmp:
        for argv, writes in packed_runs(env, Path(tmp)):
            rc = fleetcast(argv)
            if rc != 0:
                raise RuntimeError(f"fleetcast bench run exited {rc}: {' '.join(argv[:8])} ...")
            for model, (path, key, together) in writes.items():
                body = _labelled(path, backends[model]) if together else path.read_bytes()
                s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")
                log.info("uploaded s3://%s/%s", bucket, key)


def _api_key(secrets: Any, name: str) -> str:
    value: str = secrets.get_secret_value(SecretId=name)["SecretString"].strip()
    if value.startswith("{"):
        keys = json.loads(value).get("keys") or []
        if not keys or not isinstance(keys[0], str):
            raise RuntimeError(f"secret {name} is JSON without a non-empty \"keys\" list of strings")
        return keys[0]
    return value


def run(env: dict[str, str], *, s3: Any = None, autoscaling: Any = None, secrets: Any = None,
        health_timeout_s: float = 7200.0) -> int:
    key = env.get(Var.BENCH_KEY)
    if not key:
        return 0
    import boto3

    region = env.get(Var.REGION)
    s3 = s3 or boto3.client("s3", region_name=region)
    autoscaling = autoscaling or boto3.client("autoscaling", region_name=region)
    bucket = env[Var.BUCKET]
    group = env.get(Var.BENCH_GROUP)
    rc = 1
    try:
        if env.get(Var.BENCH_MODELS):
            _run_packed(env, s3, bucket, health_timeout_s)
            rc = 0
            return rc
        endpoint = env.get(Var.BENCH_ENDPOINT, bench.ENDPOINT)
        if not _wait_healthy(endpoint, health_timeout_s):
            raise RuntimeError(f"{endpoint}/health never answered 200 within {health_timeout_s:.0f} s")
        from fleetcast.bench.cli import main as fleetcast

        api_key = None
        if env.get(Var.BENCH_API_KEY_SECRET):
            secrets = secrets or boto3.client("secretsmanager", region_name=region)
            api_key = _api_key(secrets, env[Var.BENCH_API_KEY_SECRET])
        from fleetcast.contract.bucket import probe_model_key

        # The probe of a fleet of several models measures each model the consumer may call, one after another.
        models = [m for m in env.get(Var.BENCH_PROBE_MODELS, "").split(",") if m]
        runs = ([(["--model", m, "--label", f"model={m}"], probe_model_key(key, m)) for m in models] if models
                else [([], key)])
        with tempfile.TemporaryDirectory() as tmp:
            for extra, target in runs:
                out = Path(tmp) / "results.json"
                rc = fleetcast(bench_argv(env, out, api_key) + extra)
                if rc != 0 or not out.is_file():
                    raise RuntimeError(f"fleetcast bench run{''.join(' ' + x for x in extra)} exited {rc}")
                s3.put_object(Bucket=bucket, Key=target, Body=out.read_bytes(), ContentType="application/json")
                log.info("uploaded s3://%s/%s", bucket, target)
                out.unlink()
            rc = 0
    except Exception as exc:  # noqa: BLE001 - whatever failed, leave a note and scale to zero
        log.error("benchmark failed: %s", exc)
        note = {"error": str(exc)[:2000], "key": key}
        try:
            s3.put_object(Bucket=bucket, Key=key.removesuffix(".json") + ".error.txt",
                          Body=json.dumps(note).encode(), ContentType="text/plain")
        except Exception as upload_exc:  # noqa: BLE001
            log.error("could not upload the failure note: %s", upload_exc)
        rc = 1
    finally:
        if group:
            autoscaling.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=0, HonorCooldown=False)
            log.info("scaled %s to zero", group)
    return rc


def main() -> int:
    logging.basicConfig(level=os.environ.get(Var.LOG_LEVEL, "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(dict(os.environ))


if __name__ == "__main__":
    sys.exit(main())
