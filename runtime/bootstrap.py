"""`python -m runtime.bootstrap`: the instance runtime, from launch to drain.

Started by the systemd unit (runtime/systemd/fleetcast-runtime.service) inside the
serving container. In order:

 1. read /etc/fleetcast/env (passed as the container's environment), IMDSv2 for the
    instance id, the ASG name (instance tag) and the target lifecycle state;
 2. load the validated config from SSM and resolve this pool's engine;
 3. detect the GPU; refuse unsupported model/precision/GPU combinations before
    anything is downloaded;
 4. obtain the engine: local disk (warm pool restart), the S3 cache, or build it
    once under the cache lock, sending lifecycle heartbeats all along;
 5. warm pool (`Warmed:*`): complete the launch hook with CONTINUE and stop here;
 6. otherwise start the server and the gateway, wait for health plus one real
    generation, complete the launch hook with CONTINUE;
 7. serve; publish gauges; on SIGTERM or the terminate hook, drain, then complete
    the terminate hook.

Any failure before serving completes the launch hook with ABANDON (the ASG
replaces the instance) and exits 0, so systemd does not restart a process whose
instance is being replaced; a crash loop while serving exits non-zero so systemd
restarts the container.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetcast.config import ConfigError, FleetConfig, GpuSharing, Pool, config_from_json
from fleetcast.config.memory import binding_fraction, served_overhead
from fleetcast.config.model import ServedModel
from fleetcast.contract import telemetry
from fleetcast.contract.adapters import MODULES_KEY, RANK_KEY, ModelDimsError, adapter_dir, lora_cache_plan, model_dims
from fleetcast.contract.bucket import adapter_prefix, model_prefix
from fleetcast.contract.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, UserError
from fleetcast.contract.instance_env import Var, check_names, default, setting
from fleetcast.contract.isolation import block_reuse
from fleetcast.contract.serving import LOOPBACK_HOST, first_process_port, process_slots

from . import gpu as gpu_mod, spot
from .backends import ReferenceBackend, ServingBackend, select_backend
from .engine_cache import (
    BuildFailed,
    CacheError,
    CacheInputs,
    CacheSettings,
    CircuitOpen,
    EngineCache,
    RetryingS3,
    s3_client,
)
from .kv_budget import artifact_bytes, check_budgets_bind, mps_memory_limit, plan_budgets
from .lifecycle import ABANDON, CONTINUE, Heartbeat, HookClient, Imds, MetadataError, heartbeat_interval
from .metrics import Emf
from .mps import mps_root
from .serve import ServeError, ServerProcess, ServeSettings, Serving, server_name
from .staged import StagingMissing, calibration_key_prefix, fetch_staged
from .supervisor import Child, RestartPolicy

log = logging.getLogger("fleetcast.bootstrap")

REQUIRED = tuple(v.value for v in (Var.FLEET, Var.REGION, Var.POOL, Var.BUCKET))

# Exit statuses as systemd reads them (Restart=on-failure), on the contract's table.
EXIT_ABANDONED = EXIT_OK  # the ASG replaces the instance; a systemd restart would only rebuild in vain
EXIT_SERVING_FAILED = EXIT_INVALID  # systemd restarts the container


def _leaving_service(state: str | None) -> bool:
    """Scale-in pauses the instance in the terminate hook: toward Terminated, or back into the
    warm pool (Warmed:Stopped/Running/Hibernated) when the pool reuses instances on scale-in."""
    return state == "Terminated" or bool(state and state.startswith("Warmed:"))


@dataclass(frozen=True)
class InstanceEnv:
    """The instance's environment file, plus development knobs (all optional, product defaults)."""

    fleet: str
    region: str
    pool: str
    bucket: str
    config_param: str | None
    config_digest: str | None
    config_file: str | None
    local_root: Path
    imds_endpoint: str
    port: int | None
    gateway: bool
    proxy_protocol: bool
    listen_host: str
    cache: CacheSettings
    staging_wait_s: float
    ready_timeout_s: float | None
    terminate_poll_s: float
    gauges_s: float
    gateway_refresh_s: float
    restart: RestartPolicy
    liveness_interval_s: float = default(Var.LIVENESS_INTERVAL_S)
    liveness_timeout_s: float = default(Var.LIVENESS_TIMEOUT_S)
    liveness_failures: int = default(Var.LIVENESS_FAILURES)
    upstream_idle_s: float = default(Var.UPSTREAM_IDLE_S)
    replace_wait_s: float = default(Var.REPLACE_WAIT_S)

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> InstanceEnv:
        check_names(env)  # a misspelt or stale variable would silently leave a setting at its default
        missing = [k for k in REQUIRED if not env.get(k)]
        if not env.get(Var.CONFIG_PARAM) and not env.get(Var.CONFIG_FILE):
            missing.append(Var.CONFIG_PARAM.value)
        if missing:
            raise UserError(f"instance environment is missing {', '.join(missing)} (written by user data to "
                            f"{telemetry.INSTANCE_ENV_FILE})")

        def get(var: Var) -> Any:
            return setting(env, var)

        cache = CacheSettings(
            lock_ttl_s=get(Var.LOCK_TTL_S), lock_refresh_s=get(Var.LOCK_REFRESH_S),
            wait_timeout_s=get(Var.WAIT_TIMEOUT_S), poll_s=get(Var.POLL_S),
            s3_retry_deadline_s=get(Var.S3_RETRY_DEADLINE_S), s3_backoff_base_s=get(Var.S3_BACKOFF_S),
            s3_stall_timeout_s=get(Var.S3_STALL_S),
        )  # failure_limit: replaced from the config later
        return cls(
            fleet=env[Var.FLEET], region=env[Var.REGION], pool=env[Var.POOL],
            bucket=env[Var.BUCKET], config_param=env.get(Var.CONFIG_PARAM),
            config_digest=env.get(Var.CONFIG_DIGEST), config_file=env.get(Var.CONFIG_FILE),
            local_root=Path(get(Var.LOCAL_ROOT)),
            imds_endpoint=get(Var.IMDS_ENDPOINT),
            port=get(Var.PORT),
            gateway=get(Var.GATEWAY) != "off",
            proxy_protocol=get(Var.GATEWAY_PROXY_PROTOCOL) != "off",
            listen_host=get(Var.LISTEN_HOST),
            cache=cache,
            staging_wait_s=get(Var.STAGING_WAIT_S),
            ready_timeout_s=get(Var.READY_TIMEOUT_S) or None,
            terminate_poll_s=get(Var.TERMINATE_POLL_S),
            gauges_s=get(Var.GAUGES_S),
            gateway_refresh_s=get(Var.GATEWAY_REFRESH_S),
            restart=RestartPolicy(max_restarts=get(Var.MAX_RESTARTS), backoff_base_s=get(Var.RESTART_BACKOFF_S)),
            liveness_interval_s=get(Var.LIVENESS_INTERVAL_S),
            liveness_timeout_s=get(Var.LIVENESS_TIMEOUT_S),
            liveness_failures=get(Var.LIVENESS_FAILURES),
            upstream_idle_s=get(Var.UPSTREAM_IDLE_S),
            replace_wait_s=get(Var.REPLACE_WAIT_S),
        )


# Per-model readiness while serving (runtime/serve.py writes it), under FLEETCAST_LOCAL_ROOT.
MODELS_STATE_FILE = "models-ready.json"
GATEWAY_QUEUE_FILE = "gateway-queue.json"
# A Spot notice's signal to a build, sent again this often while the build runs on (`_signal_build`), this many
# times at most: 30 s of a notice's two minutes.
BUILD_SIGNAL_EVERY_S = 0.5
BUILD_SIGNAL_TRIES = 60


class ModelsUnavailable(Exception):
    """One or more of the instance's models cannot be served; the others were still prepared."""

    def __init__(self, failures: list[tuple[str, Exception]]):
        self.failures = failures
        super().__init__("; ".join(f"model {model}: {type(exc).__name__}: {exc}" for model, exc in failures))


@dataclass(frozen=True)
class PreparedModel:
    """A served model whose engine is on local disk: what serving one of its processes needs."""

    served: Any  # fleetcast.config.model.ServedModel
    backend: ServingBackend
    cache: EngineCache
    resolution: Any  # runtime.engine_cache.Resolution
    lora: dict[str, Any] | None = None  # the engine's LoRA options, where the model serves adapters
    lora_cache_bytes: int = 0  # GPU memory of each process's LoRA device cache (within LORA_DEVICE_RESERVE_BYTES)
    block_reuse: bool = True  # KV blocks reused across requests: fleetcast.contract.isolation.block_reuse


class Bootstrap:
    """One run of the instance runtime."""

    def __init__(self, env: InstanceEnv, session: Any = None, imds: Imds | None = None, emf_stream: Any = None):
        import boto3
        from botocore.config import Config

        self.env = env
        self.session = session or boto3.Session(region_name=env.region)
        bcfg = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=60)
        self.s3 = s3_client(self.session, env.cache)
        self.autoscaling = self.session.client("autoscaling", config=bcfg)
        self.imds = imds or Imds(env.imds_endpoint)
        self.emf_stream = emf_stream
        self.started = time.monotonic()
        self.hooks: HookClient | None = None
        self.emf: Emf | None = None
        self.instance_id = ""
        self.stop_reason: str | None = None
        self._stop = threading.Event()
        self.summary: dict[str, Any] = {}
        self.spot_watcher: spot.SpotWatcher | None = None  # on Spot instances only (runtime/spot.py)
        self._phase = "preparing"
        self._in_build = False
        self._build_stopped = threading.Event()  # the notice's signal raised in the build (it raises once)

    # ------------------------------------------------------------ pieces

    def load_config(self) -> FleetConfig:
        if self.env.config_file:
            text = Path(self.env.config_file).read_text()
        else:
            ssm = self.session.client("ssm")
            text = RetryingS3(ssm, "", self.env.cache).call(
                "get_parameter", Name=self.env.config_param, WithDecryption=True)["Parameter"]["Value"]
        cfg = config_from_json(text)
        digest = self._instance_digest(cfg)
        if self.env.config_digest and digest is not None and digest != self.env.config_digest:
            # The parameter moved on since this launch template was made (a rollout is
            # under way): serve the current config, and say so.
            log.warning("config digest %s differs from the launch template's %s; serving the parameter's config",
                        digest[:12], self.env.config_digest[:12])
        return cfg

    def _instance_digest(self, cfg: FleetConfig) -> str | None:
        try:
            return cfg.instance_digest(self.env.region, self.env.pool)
        except KeyError:
            return None  # resolve_pool says what is wrong, with the choices

    def resolve_pool(self, cfg: FleetConfig) -> Pool:
        try:
            region = cfg.region(self.env.region)
        except KeyError:
            raise UserError(f"{Var.REGION}: {self.env.region} is not a provider region of fleet {cfg.name}") from None
        for pool in region.pools:
            if pool.name == self.env.pool:
                return pool
        raise UserError(f"{Var.POOL}: {self.env.pool} is not a pool of {self.env.region}; "
                        f"pools: {', '.join(p.name for p in region.pools)}")

    def detect_gpu(self, backend: ServingBackend) -> gpu_mod.GpuInfo:
        try:
            return gpu_mod.detect_gpu()
        except gpu_mod.GpuError:
            if isinstance(backend, ReferenceBackend) and backend.device == "cpu":
                return gpu_mod.GpuInfo(name="cpu", compute_capability="0.0", count=0, memory_mib=0)
            raise

    def complete(self, hook: str, result: str) -> None:
        if self.hooks is None:
            log.warning("not in an Auto Scaling group: no %s hook to complete with %s", hook, result)
            return
        self.hooks.complete(hook, result)
        self.summary.setdefault("hooks", []).append([hook, result])

    def heartbeat(self, hook: str, window_s: int) -> contextlib.AbstractContextManager[object]:
        if self.hooks is None:
            return contextlib.nullcontext()
        hooks = self.hooks
        return Heartbeat(lambda: hooks.heartbeat(hook), heartbeat_interval(window_s))

    def metric(self, name: str, value: float = 1.0, **props: object) -> None:
        if self.emf is not None:
            self.emf.emit({name: value}, props)

    # ------------------------------------------------------------ the flow

    def run(self) -> int:
        try:
            self.instance_id = self.imds.instance_id()
            try:
                group = self.imds.asg_name()
                self.hooks = HookClient(self.autoscaling, group, self.instance_id)
            except MetadataError as exc:
                log.warning("%s; lifecycle hooks are skipped", exc)
            target = self.imds.target_lifecycle_state()
        except MetadataError as exc:
            log.error("cannot read instance metadata: %s", exc)
            return EXIT_SERVING_FAILED  # systemd retries; the launch hook's timeout is the backstop
        self.emf = Emf(self.env.fleet, self.env.pool, self.instance_id, self.emf_stream)
        self._watch_spot()
        try:
            cfg, pool, gpu, prepared = self.prepare()
        except ModelsUnavailable as exc:
            return self.abandon(exc)  # each model's metric is out already
        except CircuitOpen as exc:
            self.metric(telemetry.CIRCUIT_BREAKER_OPEN, 1, error=str(exc))
            return self.abandon(exc)
        except BuildFailed as exc:
            self.metric(telemetry.ENGINE_BUILD_FAILURE, 1, error=str(exc))
            return self.abandon(exc)
        except StagingMissing as exc:
            self.metric(telemetry.STAGING_MISSING, 1, error=str(exc))
            return self.abandon(exc)
        except (CacheError, UserError, ConfigError, gpu_mod.GpuError, OSError) as exc:
            return self.abandon(exc)
        except Exception as exc:
            log.exception("unexpected error while preparing the engine")
            return self.abandon(exc)
        self._phase = "ready"  # a Spot notice from here on stops serving, not a build

        if target and target.startswith("Warmed:"):
            self.complete(telemetry.LAUNCH_HOOK, CONTINUE)
            log.info("warm pool (%s): engines ready at %s; not serving", target,
                     ", ".join(str(p.resolution.path) for p in prepared))
            self.summary.update(warm=target, served=False)
            if target != "Warmed:Running":
                return EXIT_OK  # the ASG stops the instance; the next start serves from local disk
            while (state := self.imds.target_lifecycle_state()) != "InService":
                if state == "Terminated" or self._stop.wait(self.env.terminate_poll_s):
                    return EXIT_OK
        return self.serve(cfg, gpu, prepared, sharing=pool.gpu_sharing)

    def prepare(self) -> tuple[FleetConfig, Pool, gpu_mod.GpuInfo, list[PreparedModel]]:
        """Every model this pool serves: checked, then obtained one after another (disk, cache or build).

        Each model has its own cache key, build lock, staging and circuit breaker: a model that
        cannot be built is recorded (its metric, its marker) and the others are still obtained, so
        their engines reach the cache; the launch is then abandoned naming every model that failed.
        """
        cfg = self.load_config()
        pool = self.resolve_pool(cfg)
        served = cfg.served_by(pool)
        backends = [select_backend(cfg, entry.engine, model=entry.model) for entry in served]
        gpu = self.detect_gpu(backends[0])
        for backend in backends:
            backend.check(gpu.compute_capability, gpu.name)  # before anything is downloaded
        prepared: list[PreparedModel] = []
        failures: list[tuple[str, Exception]] = []
        local = self.env.local_root / "engines"
        for entry, backend in zip(served, backends):
            try:
                prepared.append(self._prepare_model(cfg, entry, backend, gpu))
            except (CircuitOpen, BuildFailed, StagingMissing, CacheError, UserError, OSError) as exc:
                if self._stop.is_set() or len(served) == 1:
                    raise  # a Spot notice or SIGTERM stops every build; one model: its own error, as before
                self._failure_metric(exc, entry.model.id)
                log.error("model %s cannot be served: %s: %s", entry.model.id, type(exc).__name__, exc)
                failures.append((entry.model.id, exc))
        if failures:
            raise ModelsUnavailable(failures)
        pruned = prepared[0].cache.prune_local(local, keep={p.cache.key for p in prepared})
        if pruned:
            log.info("removed engines of other configs from local disk: %s", ", ".join(pruned))
        first = prepared[0]
        self.summary.update(key=first.cache.key, gpu=gpu.name, backend=first.backend.name,
                            outcome=first.resolution.outcome, build_s=round(first.resolution.build_seconds, 3),
                            download_s=round(first.resolution.download_seconds, 3), events=first.resolution.events)
        if len(prepared) > 1:
            self.summary["models"] = {p.served.model.id: {"key": p.cache.key, "outcome": p.resolution.outcome}
                                      for p in prepared}
        return cfg, pool, gpu, prepared

    def _failure_metric(self, exc: Exception, model_id: str | None = None) -> None:
        props = {"error": str(exc)} if model_id is None else {"error": str(exc), "model": model_id}
        if isinstance(exc, CircuitOpen):
            self.metric(telemetry.CIRCUIT_BREAKER_OPEN, 1, **props)
        elif isinstance(exc, BuildFailed):
            self.metric(telemetry.ENGINE_BUILD_FAILURE, 1, **props)
        elif isinstance(exc, StagingMissing):
            self.metric(telemetry.STAGING_MISSING, 1, **props)

    def _prepare_model(self, cfg: FleetConfig, entry: ServedModel, backend: ServingBackend, gpu: gpu_mod.GpuInfo) -> PreparedModel:
        m, engine = entry.model, entry.engine
        calibration_spec = m.calibration
        calibration = ""
        if backend.needs_calibration and calibration_spec:
            calibration = f"{calibration_spec.dataset}#{calibration_spec.samples}"
        inputs = CacheInputs(
            model_id=m.id, revision=m.revision, backend=engine.backend.value, precision=engine.precision.value,
            kv_cache_dtype=engine.kv_cache_dtype.value, max_batch_size=engine.max_batch_size,
            max_num_tokens=engine.max_num_tokens, max_input_len=m.max_input_len, max_output_len=m.max_output_len,
            builder=backend.name, builder_version=backend.version, compute_capability=gpu.compute_capability,
            calibration=calibration,
        )
        settings = CacheSettings(**{**self.env.cache.__dict__, "failure_limit": cfg.operations.build_failure_limit})
        cache = EngineCache(self.s3, self.env.bucket, inputs, holder=self.instance_id, settings=settings)
        log.info("engine cache key %s (%s %s on %s, %s)", cache.key, m.id, engine.precision.value, gpu.name,
                 gpu.compute_capability)

        def build(workdir: Path) -> Path:
            model_dir = calib_dir = None
            if backend.needs_model:
                _, waited = fetch_staged(cache.store, model_prefix(m.id, m.revision), workdir / "model",
                                         self.env.staging_wait_s)
                self.metric(telemetry.STAGING_WAIT_SECONDS, waited, model=m.id)
                model_dir = workdir / "model"
            if backend.needs_calibration:
                if calibration_spec is None:
                    raise UserError(f"{m.id}: calibration: this precision needs a staged calibration set "
                                    "(calibration.dataset)")
                fetch_staged(cache.store, calibration_key_prefix(calibration_spec.dataset), workdir / "calibration",
                             self.env.staging_wait_s)
                calib_dir = workdir / "calibration"
            return backend.build(model_dir, calib_dir, workdir)

        # The launch hook must outlive builds and waits: heartbeat all through.
        with self.heartbeat(telemetry.LAUNCH_HOOK, cfg.operations.launch_hook_timeout_s):
            resolution = cache.obtain(self.env.local_root / "engines", self._interruptible_build(build))
        if resolution.outcome == "built":
            self.metric(telemetry.ENGINE_CACHE_MISS, 1, key=cache.key, model=m.id)
            self.metric(telemetry.ENGINE_BUILD_SECONDS, resolution.build_seconds, key=cache.key, model=m.id)
        else:
            self.metric(telemetry.ENGINE_CACHE_HIT, 1, key=cache.key, source=resolution.outcome,
                        waited_s=round(resolution.waited_seconds, 3), model=m.id)
        with self.heartbeat(telemetry.LAUNCH_HOOK, cfg.operations.launch_hook_timeout_s):
            lora, lora_bytes = self._fetch_adapters(cache, m, resolution.path)
        return PreparedModel(entry, backend, cache, resolution, lora, lora_bytes,
                             block_reuse(backend.name, cfg.salt_groups_of(m.id)))

    def _fetch_adapters(self, cache: EngineCache, m: Any, artifact: Path) -> tuple[dict[str, Any] | None, int]:
        """Every LoRA adapter of model `m`, verified into its adapter_dir before the model's processes start;
        returns the engine's LoRA options from the staged manifests and the bytes of the LoRA device cache they
        give each process, sized from the artifact's config.json within LORA_DEVICE_RESERVE_BYTES ((None, 0): the
        model has no adapters).

        Adapters are not part of the engine (loaded per request), so they are fetched on a cache hit too. A missing
        or damaged one fails this model like missing weights do: a StagingMissing marker on the model's cache key,
        so after operations.build_failure_limit of them the model's breaker opens at once (and clears itself once
        the adapter is staged); the other models of the instance are still prepared.
        """
        if not m.adapters:
            return None, 0
        cache.check_breaker()
        shapes: list[tuple[int, tuple[str, ...]]] = []
        for a in m.adapters:
            prefix = adapter_prefix(m.id, m.revision, a.id, a.revision)
            dest = Path(adapter_dir(str(self.env.local_root), m.id, a.id))
            try:
                manifest, waited = fetch_staged(cache.store, prefix, dest, self.env.staging_wait_s,
                                                stage_with=f"`fleetcast stage adapter --adapter {a.id}`")
                rank, modules = manifest.extra.get(RANK_KEY), manifest.extra.get(MODULES_KEY)
                if not isinstance(rank, int) or not isinstance(modules, list) or not modules:
                    raise StagingMissing(f"s3://{cache.store.bucket}/{prefix}manifest.json records no LoRA rank and "
                                         f"modules ({RANK_KEY}, {MODULES_KEY}): stage it again with "
                                         f"`fleetcast stage adapter --adapter {a.id}`")
            except StagingMissing as exc:
                try:
                    cache.record_failure(f"adapter {a.id}: {type(exc).__name__}: {exc}", f"adapter-{a.id}",
                                         exc.missing_key)
                except CacheError as marker_exc:  # S3 down too: the instance still reports its own error
                    log.error("no failure marker written for adapter %s: %s", a.id, marker_exc)
                raise StagingMissing(f"adapter {a.id}: {exc}", exc.missing_key) from None
            self.metric(telemetry.STAGING_WAIT_SECONDS, waited, model=m.id, adapter=a.id)
            shapes.append((rank, tuple(modules)))
        config_path = artifact / "config.json"
        try:
            dims = model_dims(json.loads(config_path.read_text()), str(config_path))
            options, cache_bytes = lora_cache_plan(dims, shapes)
        except (OSError, ValueError) as exc:  # ModelDimsError is a ValueError, as is unreadable JSON
            detail = str(exc) if isinstance(exc, ModelDimsError) else f"{config_path} is unreadable ({exc})"
            raise UserError(f"model {m.id}: cannot size the LoRA device cache of its adapters: {detail}") from None
        log.info("model %s: %d LoRA adapter(s) at %s; LoRA device cache %d bytes for %d of them (max_loras)", m.id,
                 len(shapes), str(Path(adapter_dir(str(self.env.local_root), m.id, "x")).parent) + "/*", cache_bytes, options["max_loras"])
        return options, cache_bytes

    def abandon(self, exc: Exception) -> int:
        log.error("cannot serve on this instance: %s: %s", type(exc).__name__, exc)
        self.summary.update(abandoned=str(exc), cause=type(exc).__name__)
        try:
            self.metric(telemetry.LAUNCH_ABANDONED, 1, cause=type(exc).__name__, error=str(exc)[-2000:])
        except Exception as metric_exc:  # noqa: BLE001 - a closed log pipe must not keep the hook open
            log.error("could not publish %s: %s", telemetry.LAUNCH_ABANDONED, metric_exc)
        try:
            self.complete(telemetry.LAUNCH_HOOK, ABANDON)
        except Exception as hook_exc:  # noqa: BLE001 - nothing else to do; the hook timeout defaults to ABANDON
            log.error("could not complete the launch hook with ABANDON: %s", hook_exc)
        return EXIT_ABANDONED

    def server_processes(self, prepared: list[PreparedModel], gpu: gpu_mod.GpuInfo,
                         mps: bool = False) -> list[ServerProcess]:
        """One engine process per (model, copy) on the contract's loopback ports, each with its KV budget; under
        MPS (`mps`) each with its device-memory limit (its planned share) and its serve's SM share, if any."""
        served = [p.served for p in prepared]
        # From the gateway's port: FLEETCAST_PORT (development) moves the processes with it, and the gateway
        # derives the same ports from the first one it is given (runtime/gateway/routing.py).
        slots = process_slots(served, base=first_process_port(self.env.port or served[0].engine.port))
        by_model = {p.served.model.id: p for p in prepared}
        explicit = {p.served.model.id: p.served.kv_cache_bytes for p in prepared}
        budgets: dict[tuple[str, int], Any] = {(s.model_id, s.copy_index): explicit[s.model_id] for s in slots}
        weights = {m: artifact_bytes(p.resolution.path) for m, p in by_model.items()}
        lora = {m: p.lora_cache_bytes for m, p in by_model.items()}
        # The validator's per-process overhead (activations and, on the PyTorch backend, CUDA graphs counted), so
        # the instance plans the budgets and MPS limits the validator checked, not a smaller figure.
        overhead = {m: served_overhead(p.served).total_bytes for m, p in by_model.items()}
        free = gpu_mod.free_memory_bytes() if len(slots) > 1 and gpu.count else None
        if len(slots) > 1 and gpu.count and any(v is None for v in explicit.values()):
            if free is None:
                raise UserError("kv_cache_gb: this GPU's free memory cannot be read; give every model of a pool "
                                "that runs several processes a kv_cache_gb")
            budgets = plan_budgets(slots, explicit, weights, free,
                                   min(p.served.engine.kv_cache_free_gpu_memory_fraction for p in prepared),
                                   overhead_bytes=overhead, lora_bytes=lora)
        # A process with a budget gets the highest fraction, so max_tokens is the smaller of the two in
        # TensorRT-LLM's min(); the plan is refused where even that could not hold in some start order.
        fraction = binding_fraction()
        if free is not None:
            check_budgets_bind(slots, budgets, weights, free, fraction, overhead_bytes=overhead, lora_bytes=lora)
        single = len(slots) == 1
        processes = []
        for slot in slots:
            p = by_model[slot.model_id]
            budget = budgets[(slot.model_id, slot.copy_index)]
            kv_fraction = None if budget is None else fraction
            limit = None
            if mps and budget is not None:
                limit = mps_memory_limit(weights[slot.model_id], budget, fraction, lora[slot.model_id],
                                         overhead[slot.model_id])
            processes.append(ServerProcess(
                name=server_name(slot.model_id, slot.copy_index, single), model_id=slot.model_id,
                copy_index=slot.copy_index, port=slot.port,
                argv=p.backend.server_command(p.resolution.path, LOOPBACK_HOST, slot.port, budget, p.lora, kv_fraction,
                                              block_reuse=p.block_reuse),
                env=p.backend.server_env(), kv_cache_bytes=budget,
                kv_tokens_planned=p.backend.planned_kv_tokens(p.resolution.path, budget),
                mps_mem_limit_bytes=limit,
                mps_active_thread_percentage=p.served.mps_active_thread_percentage if mps else None))
        return processes

    def serve(self, cfg: FleetConfig, gpu: gpu_mod.GpuInfo, prepared: list[PreparedModel],
              sharing: GpuSharing = GpuSharing.TIME_SLICING) -> int:
        engine = prepared[0].served.engine
        port = self.env.port or engine.port
        config_json = self.env.local_root / "config.json"
        config_json.write_text(json.dumps(cfg.model_dump(mode="json")))
        settings = ServeSettings(
            port=port, model_name=prepared[0].served.model.id, region=self.env.region, pool=self.env.pool,
            config_json=config_json,
            listen_host=self.env.listen_host, gateway=self.env.gateway, proxy_protocol=self.env.proxy_protocol,
            ready_timeout_s=self.env.ready_timeout_s or float(cfg.operations.launch_hook_timeout_s),
            drain_timeout_s=float(cfg.operations.drain_timeout_s), restart=self.env.restart,
            gateway_refresh_s=self.env.gateway_refresh_s,
            liveness_interval_s=self.env.liveness_interval_s, liveness_timeout_s=self.env.liveness_timeout_s,
            liveness_failures=self.env.liveness_failures, upstream_idle_timeout_s=self.env.upstream_idle_s,
            drain_deadline_file=self._spot_deadline_file if self.spot_watcher else None,
            models_state_file=self.env.local_root / MODELS_STATE_FILE,
            queue_state_file=self.env.local_root / GATEWAY_QUEUE_FILE,
        )
        self._enter_serving(cfg)
        try:
            processes = self.server_processes(prepared, gpu, mps=sharing is GpuSharing.MPS)
        except UserError as exc:
            return self.abandon(exc)
        serving = Serving(settings, servers=processes, stop=self._stop,
                          mps_root=mps_root(self.env.local_root) if sharing is GpuSharing.MPS else None)
        self._install_signals()
        try:
            with self.heartbeat(telemetry.LAUNCH_HOOK, cfg.operations.launch_hook_timeout_s):
                serving.start()
                timings = serving.wait_ready()
        except ServeError as exc:
            serving.drain()
            return self.abandon(exc)
        start_to_healthy = time.monotonic() - self.started
        self.complete(telemetry.LAUNCH_HOOK, CONTINUE)
        self.metric(telemetry.START_TO_HEALTHY_SECONDS, start_to_healthy, outcome=prepared[0].resolution.outcome)
        self.summary.update(served=True, start_to_healthy_s=round(start_to_healthy, 3),
                            probe_text=timings.get("probe_text"), gateway_port=port,
                            processes=[{"model": p.model_id, "copy": p.copy_index, "port": p.port,
                                        "kv_cache_bytes": p.kv_cache_bytes} for p in processes],
                            gpu_sharing=sharing.value, kv_short=timings.get("kv_short", {}))
        print(json.dumps({"event": "fleetcast_serving", **self.summary}), flush=True)
        return self.serve_until_stopped(serving, cfg)

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum: int, _frame: object) -> None:
            self.stop_reason = self.stop_reason or signal.Signals(signum).name
            self._stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def serve_until_stopped(self, serving: Serving, cfg: FleetConfig) -> int:
        """Serve until SIGTERM or the terminate hook, then drain and complete the hook."""
        # Gauges run on their own thread: a slow or frozen server must never delay the drain.
        gauges_stop = threading.Event()

        def gauges() -> None:
            while True:
                try:
                    self.publish_gauges(serving)
                except Exception as exc:  # noqa: BLE001 - a missed sample is not worth a crash
                    log.warning("gauge sampling failed: %s", exc)
                if gauges_stop.wait(self.env.gauges_s):
                    return

        threading.Thread(target=gauges, name="gauges", daemon=True).start()
        next_poll = time.monotonic()
        while not self._stop.wait(0.2):
            now = time.monotonic()
            if serving.supervisor.gave_up.is_set():
                child = serving.supervisor.failed_child
                if child is not None and child.name.startswith("server") and self.replace_instance(child):
                    self.stop_reason = "unhealthy"
                    break
                log.error("serving processes keep crashing; exiting so systemd restarts the container")
                gauges_stop.set()
                serving.drain()
                return EXIT_SERVING_FAILED
            if now >= next_poll:
                next_poll = now + self.env.terminate_poll_s
                try:
                    if _leaving_service(self.imds.target_lifecycle_state()):
                        self.stop_reason = "terminate-hook"
                        break
                except MetadataError as exc:
                    log.warning("lifecycle state poll failed: %s", exc)
        gauges_stop.set()
        if self.stop_reason == "unhealthy" and not self.wait_for_replacement():
            serving.drain()
            return EXIT_SERVING_FAILED
        log.info("draining (%s)", self.stop_reason)
        terminating = self.stop_reason == "terminate-hook"
        if not terminating:
            with contextlib.suppress(MetadataError):
                terminating = _leaving_service(self.imds.target_lifecycle_state())
        notice = self.spot_watcher.notice if self.spot_watcher else None
        deadline = notice.deadline_epoch() if notice is not None else None
        with self.heartbeat(telemetry.TERMINATE_HOOK, max(30, cfg.operations.drain_timeout_s)) if terminating \
                else contextlib.nullcontext():
            report = serving.drain(None if deadline is None else deadline - time.time())
        if notice is not None:
            report["spot"] = self._spot_outcome(notice)
        self.summary.update(drain=report, stop_reason=self.stop_reason)
        if terminating:
            self.complete(telemetry.TERMINATE_HOOK, CONTINUE)
        print(json.dumps({"event": "fleetcast_drained", "stop_reason": self.stop_reason, **report}), flush=True)
        return EXIT_OK

    def replace_instance(self, child: Child) -> bool:
        """The server could not be kept up by restarts (frozen or crashing): ask the group for a
        replacement. False when that is impossible (outside a group, or the call failed)."""
        why = (f"the model server did not answer its liveness probe ({child.unresponsive} time(s))"
               if child.unresponsive else "the model server kept crashing")
        log.error("%s; restarts (%d) did not bring it back", why, len(child.restarts))
        self.metric(telemetry.SERVER_UNRECOVERABLE, 1, reason=why, exit_codes=str(child.exit_codes[-5:]))
        if self.hooks is None:
            return False
        try:
            self.hooks.set_unhealthy()
        except Exception as exc:  # noqa: BLE001 - fall back to the container restart
            log.error("could not mark the instance unhealthy: %s", exc)
            return False
        self.summary.update(unhealthy=why)
        return True

    def wait_for_replacement(self) -> bool:
        """After SetInstanceHealth, the group moves this instance toward termination: wait (bounded)
        for the terminate hook, so it is completed after the drain like any scale-in."""
        deadline = time.monotonic() + self.env.replace_wait_s
        while time.monotonic() < deadline:
            try:
                if _leaving_service(self.imds.target_lifecycle_state()):
                    return True
            except MetadataError as exc:
                log.warning("lifecycle state poll failed: %s", exc)
            if self._stop.wait(self.env.terminate_poll_s):
                return True  # SIGTERM: the instance is going away
        log.error("the group did not start replacing this instance within %.0f s", self.env.replace_wait_s)
        return False
    # ------------------------------------------------------------ spot (runtime/spot.py)

    @property
    def _spot_deadline_file(self) -> Path:
        return self.env.local_root / "spot-drain-deadline.json"

    def _watch_spot(self) -> None:
        """On a Spot instance, watch for the interruption notice from launch on (a build in progress too)."""
        if not spot.is_spot_instance(self.imds):
            return
        with contextlib.suppress(FileNotFoundError):
            self._spot_deadline_file.unlink()  # a deadline left by an earlier run of this container
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, self._interrupt_build)
        self.spot_watcher = spot.SpotWatcher(self.imds, self._on_spot_notice,
                                             poll_s=min(spot.POLL_S, self.env.terminate_poll_s)).start()

    def _enter_serving(self, cfg: FleetConfig) -> None:
        self._phase = "serving"
        pool = next((p for p in cfg.region(self.env.region).pools if p.name == self.env.pool), None)
        if self.spot_watcher is not None and pool is not None and pool.spot is not None:
            self.spot_watcher.drain_on_rebalance = pool.spot.drain_on_rebalance

    def _on_spot_notice(self, notice: spot.Notice) -> None:
        """The watcher thread's report: count it, then drain (serving) or stop the build (preparing)."""
        name = telemetry.SPOT_INTERRUPTION if notice.interruption else telemetry.SPOT_REBALANCE
        self.metric(name, 1, action=notice.action, phase=self._phase)
        if notice.interruption:
            self._spot_deadline_file.parent.mkdir(parents=True, exist_ok=True)
            spot.write_deadline(self._spot_deadline_file, notice)
        self.stop_reason = self.stop_reason or f"spot-{notice.kind}"
        self._stop.set()
        main = threading.main_thread().ident  # None only for a thread not started yet
        if self._phase == "preparing" and notice.interruption and main is not None:
            self._signal_build(main)

    def _signal_build(self, main: int) -> None:
        """SIGUSR1 to the main thread until the build it runs has stopped. CPython runs a Python handler at a later
        bytecode, once its C handler has set a flag, and a blocking call returns early only for a signal that comes
        while it blocks (EINTR: docs.python.org/3/library/signal.html, "Execution of Python signal handlers"; PEP
        475). A signal that lands between the main thread's last look at that flag and its next read of a build
        step's output (runtime/trtllm.py, run_logged) runs its handler only once that read returns, and a step can
        print nothing for minutes. So it is sent again until the handler has raised or the build has ended."""
        for _ in range(BUILD_SIGNAL_TRIES):
            signal.pthread_kill(main, signal.SIGUSR1)
            if self._build_stopped.wait(BUILD_SIGNAL_EVERY_S) or not self._in_build:
                return

    def _interruptible_build(self, build: Callable[[Path], Path]) -> Callable[[Path], Path]:
        """The build, stopped by a Spot notice. It runs inside the engine cache's lock (whose `finally` releases
        it), so only there may the notice raise: not while waiting for another builder or downloading."""
        def run(workdir: Path) -> Path:
            self._in_build = True
            try:
                self._raise_if_interrupted()  # a notice seen before the build began
                return build(workdir)
            finally:
                self._in_build = False
        return run

    def _raise_if_interrupted(self) -> None:
        notice = self.spot_watcher.notice if self.spot_watcher else None
        if notice is not None and notice.interruption:
            from .engine_cache import NotABuildFailure

            raise spot.as_cache_error(NotABuildFailure)("Spot interruption notice: engine build stopped, lock released")

    def _interrupt_build(self, _signum: int, _frame: object) -> None:
        # Once: a signal sent again (`_signal_build`) must not raise inside the step's cleanup of the first one.
        if self._phase == "preparing" and self._in_build and not self._build_stopped.is_set():
            try:
                self._raise_if_interrupted()
            except BaseException:
                self._build_stopped.set()
                raise

    def _spot_outcome(self, notice: spot.Notice) -> dict[str, Any]:
        outcome = spot.read_outcome(self._spot_deadline_file) if notice.interruption else None
        if outcome is None:  # a rebalance drain (no deadline) or a gateway that could not report
            outcome = {"in_flight": None, "cut": None}
        cut = outcome.get("cut")
        if notice.interruption:
            self.metric(telemetry.SPOT_DRAIN_COMPLETED, 1 if cut == 0 else 0, kind=notice.kind)
            if isinstance(cut, int) and cut > 0:
                self.metric(telemetry.SPOT_DRAIN_CUT, cut, kind=notice.kind)
        return {"kind": notice.kind, "action": notice.action, **outcome}

    def publish_gauges(self, serving: Serving) -> None:
        values: dict[str, float] = {}
        stats = serving.server_stats()
        if stats:
            if "active" in stats:
                values[telemetry.ACTIVE_REQUESTS] = stats["active"]
            if "queued" in stats:
                values[telemetry.QUEUED_REQUESTS] = stats["queued"]
            if "kv_util" in stats:
                values[telemetry.KV_CACHE_UTILIZATION] = stats["kv_util"]
        util = gpu_mod.sample_utilization()
        if util:
            values[telemetry.GPU_UTILIZATION], values[telemetry.GPU_MEMORY_USED] = util
        if values and self.emf is not None:
            self.emf.emit(values, per_instance=True)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=setting(os.environ, Var.LOG_LEVEL), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        env = InstanceEnv.from_environ(os.environ)
    except UserError as exc:
        print(f"fleetcast runtime: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return Bootstrap(env).run()


if __name__ == "__main__":
    sys.exit(main())
