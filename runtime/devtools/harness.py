"""DEV TOOL: a loopback "AWS" for running the instance runtime on a laptop or CI box.

moto in server mode plays S3 and SSM; the fakes in runtime.devtools.fakes play
the instance metadata service, the lifecycle-hook calls and the one EC2 call the
gateway makes. `LocalAws.runtime_env()` gives the environment a
`python -m runtime.bootstrap` process needs to run against them, exactly as on an
instance but with endpoints on 127.0.0.1 (boto3's AWS_ENDPOINT_URL_<SERVICE>
variables, so the product code carries no test hooks). Used by `make demo` and
tests/runtime.
"""

from __future__ import annotations

import json
import os
import queue
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetcast.config import FleetConfig, config_from_json, load_config
from fleetcast.contract import telemetry
from fleetcast.contract.instance_env import PREFIX, Var

from .fakes import FakeAutoScaling, FakeEc2, FakeImds

REPO = Path(__file__).resolve().parents[2]
DEMO_VPCE = "vpce-0a1b2c3d4e5f60718"


def _ephemeral_port_range() -> tuple[int, int]:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux default


def _bindable(*ports: int) -> bool:
    socks = [socket.socket() for _ in ports]
    try:
        for sock, port in zip(socks, ports):
            sock.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for sock in socks:
            sock.close()


def free_port(span: int = 1) -> int:
    """A loopback port p (and p+1 .. p+span-1) free now and outside the kernel's ephemeral range.

    Why not bind(0): the kernel hands out ports from the ephemeral range, the same range it
    draws outgoing connections' source ports from. Between this check and the server's own
    bind, a kept-alive client socket (boto3 to moto, the gateway to its upstream) can take
    the port and hold it for as long as the connection lives; CI once saw the model server
    fail to bind for 20 s that way. Ports below the range are never used as source ports.
    """
    low, high = _ephemeral_port_range()
    candidates = [p for p in range(10000, 65535 - span) if p + span - 1 < low or p > high]
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.choice(candidates)
        if _bindable(*range(port, port + span)):
            return port
    raise RuntimeError(f"no {span} free loopback port(s) outside the ephemeral range {low}-{high}")


def free_port_pair() -> int:
    """A port p with p+1 also free (gateway on p, model server on p+1)."""
    return free_port(span=2)


def tiny_config(region: str = "ap-northeast-2", **operations: Any) -> FleetConfig:
    """The shipped config/fleet.yaml, shrunk for the tiny reference model (fp16, short prompts)."""
    data = load_config(REPO / "config" / "fleet.yaml").model_dump(mode="json")
    data["model"].update(id="gpt2-tiny", max_input_len=128, max_output_len=64)
    data["engine"].update(precision="fp16", kv_cache_dtype="auto", max_batch_size=8)
    data["operations"].update({"drain_timeout_s": 30, **operations})
    for r in data["regions"]:
        for pool in r["pools"]:
            pool["engine"] = {}
            # validate refuses a load target above max_batch_size (an instance never reaches it)
            pool["scaling"]["target"] = min(pool["scaling"]["target"], data["engine"]["max_batch_size"])
    cfg = config_from_json(json.dumps(data))
    cfg.region(region)  # must be a provider region of the shipped config
    return cfg


def reference_cache_key(cfg: FleetConfig, region: str, model_id: str | None = None) -> str:
    """The engine cache key an instance of `region`'s first pool computes for a model (reference backend, CPU)."""
    from runtime.backends import ReferenceBackend
    from runtime.engine_cache import CacheInputs

    pool = cfg.region(region).pools[0]
    model = cfg.model if model_id is None else cfg.model_by_id(model_id)
    engine = cfg.engine_for(pool, model.id)
    backend = ReferenceBackend(cfg, engine, model=model)
    return CacheInputs(model_id=model.id, revision=model.revision, backend=engine.backend.value,
                       precision=engine.precision.value, kv_cache_dtype=engine.kv_cache_dtype.value,
                       max_batch_size=engine.max_batch_size, max_num_tokens=engine.max_num_tokens,
                       max_input_len=model.max_input_len, max_output_len=model.max_output_len,
                       builder=backend.name, builder_version=backend.version, compute_capability="0.0").key


def two_model_config(region: str = "ap-northeast-2") -> FleetConfig:
    """tiny_config with two models on every pool (explicit KV budgets a CPU can hold) and a second
    consumer in `region` that may call only the first model (the demo's)."""
    data = tiny_config(region).model_dump(mode="json")
    first = data.pop("model")
    data.pop("calibration", None)
    consumers = [c for c in data["consumers"] if c["service_region"] == region]
    other = {**consumers[0], "name": "call-center", "account": "777788889999",
             "vpc_id": "vpc-0c1d2e3f4a5b6c7d8", "cidrs": ["10.80.0.0/16"]}
    data["consumers"] = [consumers[0], other]
    data["models"] = [first, {**first, "id": "gpt2-tiny-chat", "consumers": [consumers[0]["name"]]}]
    for r in data["regions"]:
        if r["region"] == region:
            r["allowed_principals"] = [*r["allowed_principals"], f"arn:aws:iam::{other['account']}:root"]
        for pool in r["pools"]:
            # 1 MiB each: ten sequences of the tiny shape's 192 positions (float32 on the CPU)
            pool["serves"] = [{"model": m["id"], "copies": 1, "kv_cache_gb": 1 / 1024} for m in data["models"]]
    return config_from_json(json.dumps(data))


ADAPTER_ID = "gpt2-tiny-sql"


def adapter_config(region: str = "ap-northeast-2") -> FleetConfig:
    """two_model_config with its second model on the PyTorch backend (where TensorRT-LLM serves LoRA per request)
    carrying one adapter, ADAPTER_ID; the reference backend serves both models on a CPU."""
    data = two_model_config(region).model_dump(mode="json")
    second = data["models"][1]
    second.update(family="qwen2", engine={"backend": "pytorch", "precision": "bf16"},
                  adapters=[{"id": ADAPTER_ID, "source": "example-org/gpt2-tiny-sql-lora", "revision": "v1"}])
    return config_from_json(json.dumps(data))


def write_peft_adapter(directory: Path, rank: int = 8, modules: tuple[str, ...] = ("q_proj", "v_proj")) -> Path:
    """A PEFT LoRA directory as peft's save_pretrained lays it out (adapter_config.json, adapter_model.safetensors);
    the weights are placeholder bytes: the reference backend checks an adapter, it does not apply it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(modules)}))
    (directory / "adapter_model.safetensors").write_bytes(bytes(1024))
    return directory


@dataclass
class RuntimeProcess:
    """A `python -m runtime.bootstrap` child with its stdout parsed for the runtime's JSON events."""

    proc: subprocess.Popen[str]
    started: float
    lines: list[str] = field(default_factory=list)
    events: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    seen: list[dict[str, Any]] = field(default_factory=list)
    pump: threading.Thread | None = None

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("{"):
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if "event" in record:
                    self.events.put(record)

    def wait_event(self, name: str, timeout_s: float) -> dict[str, Any] | None:
        """The first `event` named `name`, or None if the process exits or time runs out first."""
        for record in self.seen:
            if record.get("event") == name:
                return record
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                record = self.events.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self.events.empty():
                    return None
                continue
            self.seen.append(record)
            if record.get("event") == name:
                return record
        return None

    def emf(self, where: Callable[[dict[str, Any]], bool] | None = None, wait_s: float = 10.0) -> list[dict[str, Any]]:
        """The EMF records the process has written; with `where`, the ones it selects, waiting up to `wait_s` for the
        first. The wait is for the pump thread, not the process: a record written before something the test saw (the
        process's exit, a call it made to a fake AWS API) may still be in the pipe, unread (a full run of the suite
        read a SetInstanceHealth call before the SERVER_UNRECOVERABLE record written ahead of it)."""
        deadline = time.monotonic() + wait_s
        if self.proc.poll() is not None and self.pump is not None:
            self.pump.join(wait_s)  # the process has ended: its records are all in the pipe (unless a child holds it)
        while True:
            out = []
            for line in list(self.lines):
                if line.startswith('{"Fleet"') or '"_aws"' in line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
            if where is None:
                return out
            selected = [r for r in out if where(r)]
            if selected or time.monotonic() >= deadline:
                return selected
            time.sleep(0.05)

    def metric_values(self, name: str) -> list[float]:
        """The values of metric `name` the process wrote, waiting (`emf`) for the first."""
        return [r[name] for r in self.emf(lambda r: name in r)]


# moto's S3 handlers that change an object (PUT, POST for CompleteMultipartUpload, DELETE): each checks a request's
# If-Match / If-None-Match and then writes, two steps (moto/s3/responses.py put_object, delete_object and
# _key_response_post in moto 5), so under its threaded server two writers can both pass the check.
_MOTO_S3_WRITES = ("_key_response_put", "_key_response_post", "_key_response_delete")
_moto_s3_writes = threading.RLock()


def atomic_conditional_writes() -> None:
    """Make moto's conditional writes atomic in this process, as S3's are.

    S3 checks an If-None-Match or If-Match condition during the write, so of two racing writers one gets 412
    (docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html); the build lock in
    runtime/engine_cache.py rests on it. moto checks, then writes: two cold starts could both take the lock and
    both build. One lock around moto's object writes restores S3's answer; idempotent.
    """
    from moto.s3.responses import S3Response

    for name in _MOTO_S3_WRITES:
        handler = getattr(S3Response, name)
        if getattr(handler, "serialized", False):
            continue

        def serialized(self: Any, *args: Any, _handler: Any = handler, **kwargs: Any) -> Any:
            with _moto_s3_writes:
                return _handler(self, *args, **kwargs)

        serialized.serialized = True  # type: ignore[attr-defined]
        setattr(S3Response, name, serialized)


def moto_server(port: int = 0) -> Any:
    """A started moto server on loopback whose S3 conditional writes are atomic (`atomic_conditional_writes`)."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per S3 call drowns the output
    atomic_conditional_writes()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server


class LocalAws:
    """Loopback S3/SSM (moto), IMDSv2, Auto Scaling hooks and EC2 endpoint connections."""

    def __init__(self, region: str = "ap-northeast-2", bucket: str = "fleetcast-dev-engines",
                 param: str | None = None, moto_url: str | None = None):
        # moto keeps one in-process backend for every server it starts: name things per bucket
        # so that several LocalAws in one process (a test session) never see each other's state.
        self.region, self.bucket = region, bucket
        self.param = param or f"/fleetcast/dev/{bucket}/config"
        # A moto server shared with others (a test session's) is used as it is, never stopped here.
        self.moto: Any = None
        self.moto_url = moto_url or ""
        self.asg = FakeAutoScaling()
        self.ec2 = FakeEc2()
        self.imds: list[FakeImds] = []
        self.group = "fleetcast-dev-asg"

    # -- lifecycle

    def __enter__(self) -> LocalAws:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LocalAws:
        if not self.moto_url:
            port = free_port()
            self.moto = moto_server(port)
            self.moto_url = f"http://127.0.0.1:{port}"
        self.asg.start()
        self.ec2.start()
        self.s3().create_bucket(Bucket=self.bucket, CreateBucketConfiguration={"LocationConstraint": self.region})
        return self

    def stop(self) -> None:
        for imds in self.imds:
            imds.stop()
        self.asg.stop()
        self.ec2.stop()
        if self.moto is not None:
            self.moto.stop()

    # -- clients for the test/demo side

    def client(self, service: str) -> Any:
        import boto3

        return boto3.client(service, region_name=self.region, endpoint_url=self.moto_url,
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def s3(self) -> Any:
        return self.client("s3")

    def put_adapter(self, cfg: FleetConfig, model_id: str, adapter_id: str, directory: Path) -> str:
        """A PEFT adapter directory laid out in the bucket as `fleetcast stage adapter` leaves it (its files under
        the adapter's prefix, then a manifest recording rank and modules), for the demo: the runtime may not import
        the staging tool (tests/contract/test_layering.py), so this writes the contract's layout directly. Tests
        stage with the tool itself. Returns the prefix."""
        from fleetcast.contract.adapters import ADAPTER_CONFIG, MODULES_KEY, RANK_KEY, adapter_shape
        from fleetcast.contract.bucket import adapter_prefix
        from fleetcast.contract.manifest import MANIFEST_NAME, build_manifest

        model = cfg.model_by_id(model_id)
        adapter = next(a for a in model.adapters if a.id == adapter_id)
        rank, modules = adapter_shape((directory / ADAPTER_CONFIG).read_bytes(), str(directory))
        manifest = build_manifest(directory, kind="adapter", name=adapter.id, revision=adapter.revision,
                                  source=str(directory),
                                  extra={"model": model.id, RANK_KEY: rank, MODULES_KEY: list(modules)})
        prefix = adapter_prefix(model.id, model.revision, adapter.id, adapter.revision)
        s3 = self.s3()
        for f in manifest.files:
            s3.upload_file(str(directory / f.path), self.bucket, prefix + f.path)
        s3.put_object(Bucket=self.bucket, Key=prefix + MANIFEST_NAME, Body=manifest.to_json().encode())
        return prefix

    def put_config(self, cfg: FleetConfig) -> None:
        self.client("ssm").put_parameter(Name=self.param, Value=json.dumps(cfg.model_dump(mode="json")),
                                         Type="String", Overwrite=True, Tier="Advanced")
        for consumer in cfg.consumers_of(self.region):
            self.ec2.connections.append({"service_id": "vpce-svc-0a1b2c3d4e5f60718", "vpce_id": DEMO_VPCE,
                                         "account": consumer.account, "region": consumer.region})
            break

    def instance(self, instance_id: str, state: str = "InService", launching: bool = True) -> FakeImds:
        imds = FakeImds(instance_id=instance_id, region=self.region, asg_name=self.group,
                        target_lifecycle_state=state).start()
        self.imds.append(imds)
        if launching:
            self.asg.begin(self.group, telemetry.LAUNCH_HOOK, instance_id)
        return imds

    def keys(self, prefix: str = "") -> list[str]:
        out, token = [], None
        while True:
            kwargs = {"Bucket": self.bucket, "Prefix": prefix, **({"ContinuationToken": token} if token else {})}
            page = self.s3().list_objects_v2(**kwargs)
            out += [o["Key"] for o in page.get("Contents", [])]
            token = page.get("NextContinuationToken")
            if not token:
                return out

    # -- the runtime side

    def runtime_env(self, imds: FakeImds, cfg: FleetConfig, local_root: Path, port: int, pool: str | None = None,
                    **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", PREFIX))}
        pool_name = pool or cfg.region(self.region).pools[0].name
        env.update({
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_ENDPOINT_URL_S3": self.moto_url, "AWS_ENDPOINT_URL_SSM": self.moto_url,
            "AWS_ENDPOINT_URL_SECRETS_MANAGER": self.moto_url,
            "AWS_ENDPOINT_URL_AUTO_SCALING": self.asg.url, "AWS_ENDPOINT_URL_EC2": self.ec2.url,
            Var.FLEET.value: cfg.name, Var.REGION.value: self.region, Var.POOL.value: pool_name,
            Var.BUCKET.value: self.bucket, Var.CONFIG_PARAM.value: self.param,
            Var.CONFIG_DIGEST.value: cfg.instance_digest(self.region, pool_name), Var.IMAGE.value: "local/reference",
            Var.LOG_GROUP.value: "/fleetcast/dev",
            Var.IMDS_ENDPOINT.value: imds.url, Var.LOCAL_ROOT.value: str(local_root),
            Var.PORT.value: str(port), Var.LISTEN_HOST.value: "127.0.0.1",
            Var.SERVING_BACKEND.value: "reference", Var.REFERENCE_SIZE.value: "tiny",
            Var.POLL_S.value: "0.5", Var.TERMINATE_POLL_S.value: "0.5",
            Var.S3_RETRY_DEADLINE_S.value: "20", Var.READY_TIMEOUT_S.value: "120",
            "PYTHONUNBUFFERED": "1",
        })
        env.update(extra)
        return env

    def start_runtime(self, env: dict[str, str], log_file: Path | None = None,
                      cwd: Path | None = None) -> RuntimeProcess:
        """Run `python -m runtime.bootstrap` in the repository, or in `cwd` with the repository on
        PYTHONPATH, as the container does (its working directory is the read-only bundle)."""
        if cwd is not None:
            env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)}
        stderr = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen([sys.executable, "-m", "runtime.bootstrap"], env=env, cwd=str(cwd or REPO),
                                stdout=subprocess.PIPE, stderr=stderr, text=True)
        rp = RuntimeProcess(proc=proc, started=time.monotonic())
        rp.pump = threading.Thread(target=rp._pump, daemon=True)
        rp.pump.start()
        return rp
