"""The `cdk -c KEY=VALUE` context keys: `fleetcast deploy` and the user's `cdk synth` pass them, the app reads them.

Every key the app reads is here, so a key cannot be spelt one way where it is written and another where it
is read. Values arrive as strings from the command line (`-c bench=true`) and as JSON values from cdk.json.
"""

from __future__ import annotations

from enum import StrEnum


class Context(StrEnum):
    CONFIG = "config"  # the fleet config file (app.py)
    # Regions whose fleets stay at zero instances until staged (fleetcast/contract/capacity_hold.py).
    HOLD_CAPACITY = "hold_capacity"
    # Benchmark mode (stacks/bench_fleet.py, stacks/consumer_probe.py) and its knobs.
    BENCH = "bench"
    BENCH_RUN = "bench_run"
    BENCH_CONCURRENCY = "bench_concurrency"
    BENCH_REQUESTS = "bench_requests"
    BENCH_INPUT_TOKENS = "bench_input_tokens"
    BENCH_OUTPUT_TOKENS = "bench_output_tokens"
    BENCH_PROBE = "bench_probe"
    BENCH_PROBE_INSTANCE_TYPE = "bench_probe_instance_type"
    BENCH_PROBE_WHEELS = "bench_probe_wheels"
    BENCH_API_KEY_SECRET = "bench_api_key_secret"


DEFAULT_CONFIG = "config/fleet.yaml"  # `-c config` unset (cdk.json sets the same)

_TRUE = ("true", "1", "yes")


def is_true(value: object, default: bool = False) -> bool:
    """A boolean context value: true, 1 or yes (any case); `default` when the key is unset."""
    return default if value is None else str(value).lower() in _TRUE


def arg(key: Context, value: str) -> list[str]:
    """The `cdk` arguments that set `key` to `value`."""
    return ["-c", f"{key.value}={value}"]
