"""The instance environment: every `FLEETCAST_*` variable a Fleetcast process reads, in one table.

The stacks render the serving host's variables (`HostEnv.render`) into /etc/fleetcast/env; the runtime
parses the same names back (`check_names` first, so a misspelt or stale variable is an error at boot that
names it, rather than a setting silently left at its default).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum

from .errors import UserError

PREFIX = "FLEETCAST_"


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
