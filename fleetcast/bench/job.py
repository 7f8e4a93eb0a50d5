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
  FLEETCAST_BENCH_API_KEY_SECRET  optional: Secrets Manager secret (name) holding an API key for the
                               endpoint (the consumer-side probe of a consumer with api_keys: true);
                               a plain string, or JSON {"keys": [...]} of which the first is used
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


def _api_key(secrets, name: str) -> str:
    value = secrets.get_secret_value(SecretId=name)["SecretString"].strip()
    if value.startswith("{"):
        keys = json.loads(value).get("keys") or []
        if not keys or not isinstance(keys[0], str):
            raise RuntimeError(f"secret {name} is JSON without a non-empty \"keys\" list of strings")
        return keys[0]
    return value


def run(env: dict[str, str], *, s3=None, autoscaling=None, secrets=None, health_timeout_s: float = 7200.0) -> int:
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
        endpoint = env.get(Var.BENCH_ENDPOINT, bench.ENDPOINT)
        if not _wait_healthy(endpoint, health_timeout_s):
            raise RuntimeError(f"{endpoint}/health never answered 200 within {health_timeout_s:.0f} s")
        from fleetcast.bench.cli import main as fleetcast

        api_key = None
        if env.get(Var.BENCH_API_KEY_SECRET):
            secrets = secrets or boto3.client("secretsmanager", region_name=region)
            api_key = _api_key(secrets, env[Var.BENCH_API_KEY_SECRET])
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "results.json"
            rc = fleetcast(bench_argv(env, out, api_key))
            if rc != 0 or not out.is_file():
                raise RuntimeError(f"fleetcast bench run exited {rc}")
            s3.put_object(Bucket=bucket, Key=key, Body=out.read_bytes(), ContentType="application/json")
            log.info("uploaded s3://%s/%s", bucket, key)
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
