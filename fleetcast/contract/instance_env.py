"""The instance environment: every `FLEETCAST_*` variable a Fleetcast process reads, in one table, and
every runtime setting's type and product default (`SETTINGS`).

The stacks render the serving host's variables (`HostEnv.render`) into /etc/fleetcast/env; the runtime
parses the same names back (`check_names` first, so a misspelt or stale variable is an error at boot that
names it, rather than a setting silently left at its default). A setting's default is stated here once:
the bootstrap reads it (`setting`), and the serve settings, the engine cache and the gateway's command
line take their defaults from `default`, so the hops from env file to gateway flag cannot disagree.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from .errors import UserError

PREFIX = "FLEETCAST_"
# The here-document delimiter user data writes the env file with (runtime/userdata.py); no variable's name.
ENV_FILE_DELIMITER = "FLEETCAST_ENV"


class Var(StrEnum):
    # Written by user data for every serving instance (HostEnv).
    FLEET = "FLEETCAST_FLEET"
    REGION = "FLEETCAST_REGION"
    POOL = "FLEETCAST_POOL"
    BUCKET = "FLEETCAST_BUCKET"
    CONFIG_PARAM = "FLEETCAST_CONFIG_PARAM"
    CONFIG_DIGEST = "FLEETCAST_CONFIG_DIGEST"
    IMAGE = "FLEETCAST_IMAGE"
    RUNTIME_BUNDLE = "FLEETCAST_RUNTIME_BUNDLE"
    LOG_GROUP = "FLEETCAST_LOG_GROUP"
    # Runtime settings with product defaults (the bootstrap, the gateway, the build steps).
    CONFIG_FILE = "FLEETCAST_CONFIG_FILE"
    LOG_LEVEL = "FLEETCAST_LOG_LEVEL"
    LOCAL_ROOT = "FLEETCAST_LOCAL_ROOT"
    IMDS_ENDPOINT = "FLEETCAST_IMDS_ENDPOINT"
    PORT = "FLEETCAST_PORT"
    LISTEN_HOST = "FLEETCAST_LISTEN_HOST"
    GATEWAY = "FLEETCAST_GATEWAY"
    GATEWAY_PROXY_PROTOCOL = "FLEETCAST_GATEWAY_PROXY_PROTOCOL"
    GATEWAY_REFRESH_S = "FLEETCAST_GATEWAY_REFRESH_S"
    ENDPOINT_SERVICE_ID = "FLEETCAST_ENDPOINT_SERVICE_ID"
    GAUGES_S = "FLEETCAST_GAUGES_S"
    LOCK_TTL_S = "FLEETCAST_LOCK_TTL_S"
    LOCK_REFRESH_S = "FLEETCAST_LOCK_REFRESH_S"
    WAIT_TIMEOUT_S = "FLEETCAST_WAIT_TIMEOUT_S"
    POLL_S = "FLEETCAST_POLL_S"
    S3_RETRY_DEADLINE_S = "FLEETCAST_S3_RETRY_DEADLINE_S"
    S3_BACKOFF_S = "FLEETCAST_S3_BACKOFF_S"
    S3_STALL_S = "FLEETCAST_S3_STALL_S"
    STAGING_WAIT_S = "FLEETCAST_STAGING_WAIT_S"
    READY_TIMEOUT_S = "FLEETCAST_READY_TIMEOUT_S"
    TERMINATE_POLL_S = "FLEETCAST_TERMINATE_POLL_S"
    MAX_RESTARTS = "FLEETCAST_MAX_RESTARTS"
    RESTART_BACKOFF_S = "FLEETCAST_RESTART_BACKOFF_S"
    LIVENESS_INTERVAL_S = "FLEETCAST_LIVENESS_INTERVAL_S"
    LIVENESS_TIMEOUT_S = "FLEETCAST_LIVENESS_TIMEOUT_S"
    LIVENESS_FAILURES = "FLEETCAST_LIVENESS_FAILURES"
    REPLACE_WAIT_S = "FLEETCAST_REPLACE_WAIT_S"
    UPSTREAM_IDLE_S = "FLEETCAST_UPSTREAM_IDLE_S"
    BUILD_STEP_TIMEOUT_S = "FLEETCAST_BUILD_STEP_TIMEOUT_S"
    TRTLLM_EXAMPLES = "FLEETCAST_TRTLLM_EXAMPLES"
    DEPS = "FLEETCAST_DEPS"  # the image's vendored packages (docker/Dockerfile), kept off TensorRT-LLM's path
    # Serving backend selection (the PyTorch reference backend serves development and CI).
    SERVING_BACKEND = "FLEETCAST_SERVING_BACKEND"
    REFERENCE_DEVICE = "FLEETCAST_REFERENCE_DEVICE"
    REFERENCE_SEED = "FLEETCAST_REFERENCE_SEED"
    REFERENCE_SIZE = "FLEETCAST_REFERENCE_SIZE"
    FAKE_GPU = "FLEETCAST_FAKE_GPU"
    # Bench instances and the consumer-side probe (`cdk synth -c bench=true`).
    BENCH_KEY = "FLEETCAST_BENCH_KEY"
    BENCH_GROUP = "FLEETCAST_BENCH_GROUP"
    BENCH_ENDPOINT = "FLEETCAST_BENCH_ENDPOINT"
    BENCH_API_KEY_SECRET = "FLEETCAST_BENCH_API_KEY_SECRET"
    BENCH_CONCURRENCY = "FLEETCAST_BENCH_CONCURRENCY"
    BENCH_REQUESTS = "FLEETCAST_BENCH_REQUESTS"
    BENCH_INPUT_TOKENS = "FLEETCAST_BENCH_INPUT_TOKENS"
    BENCH_OUTPUT_TOKENS = "FLEETCAST_BENCH_OUTPUT_TOKENS"
    BENCH_LABELS = "FLEETCAST_BENCH_LABELS"
    # A bench instance of a pool serving several models (stacks/bench_fleet.py, fleetcast/bench/job.py):
    # MODEL:PORT:PRECISION:BACKEND per model, the --model-mix and the --packing of its runs.
    BENCH_MODELS = "FLEETCAST_BENCH_MODELS"
    BENCH_MODEL_MIX = "FLEETCAST_BENCH_MODEL_MIX"
    BENCH_PACKING = "FLEETCAST_BENCH_PACKING"
    BENCH_GPU_SHARING = "FLEETCAST_BENCH_GPU_SHARING"  # the pool's gpu_sharing, recorded in the packing
    # The consumer-side probe of a fleet of several models: the models it measures one by one (comma-separated).
    BENCH_PROBE_MODELS = "FLEETCAST_BENCH_PROBE_MODELS"
    PROBE_BUNDLE = "FLEETCAST_PROBE_BUNDLE"
    # Operator side (CLI and synth), never on an instance: data-table overrides and the bench API key.
    AVAILABILITY = "FLEETCAST_AVAILABILITY"
    INSTANCES = "FLEETCAST_INSTANCES"
    PRIVATELINK_REGIONS = "FLEETCAST_PRIVATELINK_REGIONS"
    SPOT_DRAIN = "FLEETCAST_SPOT_DRAIN"  # the planner's drain-budget table (fleetcast/plan/spot.py)
    BENCH_API_KEY = "FLEETCAST_BENCH_API_KEY"


KNOWN = frozenset(v.value for v in Var)


def check_names(environ: Mapping[str, str]) -> None:
    """Refuse any `FLEETCAST_*` variable this table does not define, naming it and its nearest known name."""
    problems = []
    for name in sorted(k for k in environ if k.startswith(PREFIX) and k not in KNOWN):
        near = difflib.get_close_matches(name, sorted(KNOWN), n=1)
        problems.append(f"{name}" + (f" (did you mean {near[0]}?)" if near else ""))
    if problems:
        raise UserError(f"unknown instance environment variable(s): {', '.join(problems)}; "
                        "known ones are defined in fleetcast/contract/instance_env.py")


@dataclass(frozen=True)
class HostEnv:
    """What user data writes into /etc/fleetcast/env on every serving instance (all required)."""

    fleet: str
    region: str
    pool: str
    bucket: str
    config_param: str
    config_digest: str
    image: str
    runtime_bundle: str
    log_group: str

    def render(self, extra: Mapping[Var, str] | None = None) -> dict[str, str]:
        """The env file's variables; `extra` adds variables of other jobs that reuse the serving host."""
        out = {_VAR_OF[f.name].value: getattr(self, f.name) for f in fields(self)}
        for var, value in (extra or {}).items():
            out[Var(var).value] = value
        return out


_VAR_OF = {f.name: Var[f.name.upper()] for f in fields(HostEnv)}
HOST_REQUIRED = tuple(_VAR_OF[f.name].value for f in fields(HostEnv))


@dataclass(frozen=True)
class Setting:
    """One runtime setting: its type, its product default, and whether it must be > 0."""

    kind: type  # float, int or str; numbers parse as float first ("5.0" is 5 restarts)
    default: Any  # None: unset has a meaning of its own (PORT: the config's engine.port)
    positive: bool = False


SETTINGS: dict[Var, Setting] = {
    Var.LOG_LEVEL: Setting(str, "INFO"),
    Var.LOCAL_ROOT: Setting(str, "/var/lib/fleetcast"),
    Var.IMDS_ENDPOINT: Setting(str, "http://169.254.169.254"),
    Var.PORT: Setting(int, None),
    Var.LISTEN_HOST: Setting(str, "0.0.0.0"),
    Var.GATEWAY: Setting(str, "on"),  # "off": the model server takes the NLB port itself (development)
    Var.GATEWAY_PROXY_PROTOCOL: Setting(str, "required"),  # "off" only behind no NLB (development)
    # How often the gateway re-reads endpoints, API keys and consumers (docs/gateway.md).
    Var.GATEWAY_REFRESH_S: Setting(float, 60.0, positive=True),
    # A response whose model server sent nothing for this long is aborted (runtime/serve.py).
    Var.UPSTREAM_IDLE_S: Setting(float, 120.0, positive=True),
    Var.GAUGES_S: Setting(float, 30.0),
    # The engine cache (runtime/engine_cache.py CacheSettings).
    Var.LOCK_TTL_S: Setting(float, 300.0),  # a lock not refreshed for this long is stale
    Var.LOCK_REFRESH_S: Setting(float, 60.0),
    Var.WAIT_TIMEOUT_S: Setting(float, 3 * 3600.0),  # how long a waiter waits for another builder
    Var.POLL_S: Setting(float, 10.0),
    Var.S3_RETRY_DEADLINE_S: Setting(float, 300.0),
    Var.S3_BACKOFF_S: Setting(float, 0.5),
    Var.S3_STALL_S: Setting(float, 30.0),  # no byte for this long on one S3 connection is a stall
    Var.STAGING_WAIT_S: Setting(float, 1800.0),
    Var.READY_TIMEOUT_S: Setting(float, 0.0),  # 0: the config's
    Var.TERMINATE_POLL_S: Setting(float, 5.0),
    Var.MAX_RESTARTS: Setting(int, 5),
    Var.RESTART_BACKOFF_S: Setting(float, 1.0),
    Var.LIVENESS_INTERVAL_S: Setting(float, 10.0, positive=True),
    Var.LIVENESS_TIMEOUT_S: Setting(float, 5.0, positive=True),
    Var.LIVENESS_FAILURES: Setting(int, 3, positive=True),
    Var.REPLACE_WAIT_S: Setting(float, 300.0, positive=True),
    Var.BUILD_STEP_TIMEOUT_S: Setting(float, 7200.0),
    Var.TRTLLM_EXAMPLES: Setting(str, "/app/tensorrt_llm/examples"),  # where the release image keeps them
    Var.SERVING_BACKEND: Setting(str, "tensorrt-llm"),
    Var.REFERENCE_SIZE: Setting(str, "tiny"),
    Var.REFERENCE_SEED: Setting(int, 0),
    Var.REFERENCE_DEVICE: Setting(str, "cpu"),
}


def default(var: Var) -> Any:
    """The product default of one setting."""
    return SETTINGS[var].default


def setting(environ: Mapping[str, str], var: Var) -> Any:
    """One setting's value from `environ`, typed; its default when unset (or empty, for numbers).
    A value of the wrong type or sign is a UserError naming the variable."""
    spec = SETTINGS[var]
    raw = environ.get(var.value)
    if spec.kind is str:
        return spec.default if raw is None else raw
    if raw in (None, ""):
        return spec.default
    try:
        value = float(raw)
    except ValueError:
        raise UserError(f"{var.value}: {raw!r} is not a number") from None
    if spec.positive and not value > 0:
        raise UserError(f"{var.value}: {raw!r} must be a number > 0")
    return int(value) if spec.kind is int else value
