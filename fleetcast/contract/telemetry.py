"""Metric names and their units, shared by the runtime (which publishes), the stacks (alarms, scaling,
dashboards) and the CLIs (usage reports). One place, so a rename cannot split them.

All metrics go to one CloudWatch namespace, per region. Dimensions:
  Fleet  - the config's `name` (two fleets can share an account and region)
  Pool   - the pool name within the region
  Consumer - the consumer name from the config (per-request metrics only)
Per-request values are published as embedded-metric-format (EMF) records, one
per request, so fleet P99s are computed by CloudWatch from raw values rather
than averaged from per-instance percentiles.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

NAMESPACE = "Fleetcast"

DIM_FLEET = "Fleet"
DIM_POOL = "Pool"
DIM_CONSUMER = "Consumer"
DIM_MODEL = "Model"  # the OpenAI `model` a request named (a model or adapter id of the config)
DIM_INSTANCE = "InstanceId"

# Per request (EMF, from the gateway): dimension sets [Fleet, Pool], [Fleet, Pool, Consumer] and, for a request
# routed to a model, [Fleet, Pool, Consumer, Model] and [Fleet, Pool, Model].
TTFT_MS = "TimeToFirstTokenMs"
ITL_MS = "InterTokenLatencyMs"
E2E_MS = "EndToEndLatencyMs"
INPUT_TOKENS = "InputTokens"
OUTPUT_TOKENS = "OutputTokens"
REQUESTS = "Requests"
ERRORS = "Errors"  # 5xx, upstream failures, streams cut short
STREAMS_CUT = "StreamsCut"  # streams the model server broke off; the client got an error event
THROTTLED = "Throttled"  # 429 from per-consumer limits
# A request its home gateway forwarded to another region (issue 36): counted at home, under the home record's
# dimensions, never with Requests or tokens, which the serving region's gateway meters (once, where it ran).
SPILLED_REQUESTS = "SpilledRequests"
# A request its gateway forwarded to a peer instance of the same region with room (issue 36, section 1): likewise
# counted where it arrived, metered where it ran.
PEER_FORWARDED_REQUESTS = "PeerForwardedRequests"
UNKNOWN_ENDPOINT = "UnknownEndpointRequests"
PROXY_PROTOCOL_ERRORS = "ProxyProtocolErrors"  # connections refused for a missing or malformed PROXY v2 header

# Per instance gauges (every 10-60 s): dimension set [Fleet, Pool] (and [Fleet, Pool, InstanceId]).
ACTIVE_REQUESTS = "ActiveRequests"
QUEUED_REQUESTS = "QueuedRequests"
KV_CACHE_UTILIZATION = "KvCacheUtilizationPercent"
GPU_UTILIZATION = "GpuUtilizationPercent"
GPU_MEMORY_USED = "GpuMemoryUsedPercent"

# Engine cache and bootstrap events: dimension set [Fleet, Pool].
ENGINE_CACHE_HIT = "EngineCacheHit"
ENGINE_CACHE_MISS = "EngineCacheMiss"
ENGINE_BUILD_FAILURE = "EngineBuildFailure"
ENGINE_BUILD_SECONDS = "EngineBuildSeconds"
CIRCUIT_BREAKER_OPEN = "CircuitBreakerOpen"
STAGING_WAIT_SECONDS = "StagingWaitSeconds"
STAGING_MISSING = "StagingMissing"
START_TO_HEALTHY_SECONDS = "StartToHealthySeconds"
SERVER_UNRECOVERABLE = "ServerUnrecoverable"  # restarts did not bring the model server back: instance replaced
LAUNCH_ABANDONED = "LaunchAbandoned"  # every ABANDON of the launch hook; properties: cause (error type), error

# Spot tier (runtime/spot.py), dimension set [Fleet, Pool]: one SpotInterruption per interruption notice seen
# (one SpotRebalanceRecommendation per recommendation acted on), then the drain's outcome: SpotDrainCompleted 1
# when every in-flight stream finished inside the notice, else 0 and SpotDrainCutRequests the streams cut.
SPOT_INTERRUPTION = "SpotInterruption"
SPOT_REBALANCE = "SpotRebalanceRecommendation"
SPOT_DRAIN_COMPLETED = "SpotDrainCompleted"
SPOT_DRAIN_CUT = "SpotDrainCutRequests"

# Plan drift (the scheduled check, stacks/plan_drift.py): dimension set [Fleet, Pool]; 1 = the traffic no
# longer fits the plan the config was written from, 0 = it does.
PLAN_DRIFT = "PlanDrift"

# Consumer failover (stacks/consumer_failover.py): the probe in the consumer's VPC publishes, once a minute, 1 when
# the home endpoint's /health answered 200 and 0 when it did not; dimension set [Fleet, Consumer]. Published into
# the consumer's account, at standard resolution (a Route 53 health check reads only those alarms).
HOME_ENDPOINT_HEALTHY = "HomeEndpointHealthy"

# Lifecycle hook names: fixed strings, so the launch template's user data never
# has to reference its own Auto Scaling group (that would be a cycle).
LAUNCH_HOOK = "fleetcast-launch"
TERMINATE_HOOK = "fleetcast-terminate"

# Instances find their config, bucket and pool through this env file, written by user data.
INSTANCE_ENV_FILE = "/etc/fleetcast/env"

# Traffic shape (EMF, from the gateway, one record per admitted inference request): `ShapedRequests` = 1
# under the dimension sets SHAPE_DIMENSION_SETS / SHAPE_MODEL_DIMENSION_SETS below.
# Its own metric (not `Requests` again) so that each EMF directive names members no other directive names.
SHAPED_REQUESTS = "ShapedRequests"
# Summed per hour they are exact per-bucket request counts for as long as CloudWatch keeps the hour
# (`fleetcast traffic export`, docs/gateway.md "Traffic shape"). Bucket labels are the traffic profile's
# level/range keys ("3-4"), so a count maps to a profile key without translation.
DIM_IN_FLIGHT = "InFlightAtArrival"  # requests in flight on this instance when this one arrived, itself included
DIM_INPUT_BUCKET = "InputTokensBucket"
DIM_OUTPUT_BUCKET = "OutputTokensBucket"
# The traffic-shape directive's dimension sets: one per bucket dimension; in a fleet of several models, for a
# request naming one of them, the in-flight count per model as well ([Fleet, Pool, Consumer, Model,
# InFlightAtArrival]), so that `traffic export` gives each model's entry its own `concurrency` (the lengths per
# model are trimmed counts of InputTokens / OutputTokens, fleetcast/traffic/export.py). A one-model fleet's export
# reads no model dimension, so its records leave that set out (it would only add custom metrics). EMF (Amazon
# CloudWatch User Guide, "Specification: Embedded metric format"): a dimension set holds at most 30 dimensions
# (5 here); each set files its own custom metrics, created only for the bucket values that occur.
SHAPE_DIMENSION_SETS = tuple((DIM_FLEET, DIM_POOL, DIM_CONSUMER, d)
                             for d in (DIM_IN_FLIGHT, DIM_INPUT_BUCKET, DIM_OUTPUT_BUCKET))
SHAPE_MODEL_DIMENSION_SETS = SHAPE_DIMENSION_SETS + ((DIM_FLEET, DIM_POOL, DIM_CONSUMER, DIM_MODEL, DIM_IN_FLIGHT),)


def metered_per_model(model_count: int) -> bool:
    """Whether a fleet of `model_count` models is metered and exported per model (traffic shape included)."""
    return model_count > 1


def alarmed_per_model(served_count: int) -> bool:
    """Whether a pool serving `served_count` models watches each against its own SLO (alarms, dashboard rows): a
    small model's breach would hide in the pool's P99 behind a busier one's traffic. A pool of one model's own
    alarms already are that model's."""
    return served_count > 1


def metered_ids(model_id: str, adapter_ids: Iterable[str] = ()) -> tuple[str, ...]:
    """The DIM_MODEL values a fleet model's requests are metered under: its own id and its adapters' (the gateway
    meters the id a request named, and an adapter's requests run on its base model's processes), so whatever
    counts a model's traffic or latency reads all of them."""
    return (model_id, *adapter_ids)
# Inclusive upper bounds; a value above the last bound is counted in the last bucket. 4096 is the
# highest concurrency level a traffic profile accepts.
IN_FLIGHT_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
TOKEN_BOUNDS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 1048576)


def _labels(bounds: tuple[int, ...]) -> tuple[str, ...]:
    out, low = [], 1
    for high in bounds:
        out.append(str(high) if low == high else f"{low}-{high}")
        low = high + 1
    return tuple(out)


IN_FLIGHT_LABELS = _labels(IN_FLIGHT_BOUNDS)
TOKEN_LABELS = _labels(TOKEN_BOUNDS)


def in_flight_label(value: int) -> str:
    """The InFlightAtArrival bucket of a count >= 1 (past the last bound: the last bucket)."""
    return IN_FLIGHT_LABELS[min(bisect_left(IN_FLIGHT_BOUNDS, value), len(IN_FLIGHT_BOUNDS) - 1)]


def token_bounds(label: str) -> tuple[int, int | None]:
    """(a, b) of a token bucket label: token_label puts a count v in it when a < v <= b; b is None for the last
    bucket, which also takes every count above its bound. '65-128' -> (64, 128), '1-64' -> (0, 64)."""
    lo, _, hi = label.partition("-")
    return int(lo) - 1, None if label == TOKEN_LABELS[-1] else int(hi or lo)


def token_label(value: int) -> str:
    """The Input/OutputTokensBucket of a token count; "0" when the server reported none (failed requests)."""
    if value <= 0:
        return "0"
    return TOKEN_LABELS[min(bisect_left(TOKEN_BOUNDS, value), len(TOKEN_BOUNDS) - 1)]


# The CloudWatch unit each metric is published with (the EMF directive's `Unit`), one table for every
# publisher: the gateway's per-request records, the bootstrap's events and gauges, the drift check.
MILLISECONDS = "Milliseconds"
SECONDS = "Seconds"
PERCENT = "Percent"
COUNT = "Count"
UNITS: dict[str, str] = {
    TTFT_MS: MILLISECONDS, ITL_MS: MILLISECONDS, E2E_MS: MILLISECONDS,
    INPUT_TOKENS: COUNT, OUTPUT_TOKENS: COUNT, REQUESTS: COUNT, ERRORS: COUNT, STREAMS_CUT: COUNT,
    SPILLED_REQUESTS: COUNT, PEER_FORWARDED_REQUESTS: COUNT,
    THROTTLED: COUNT, UNKNOWN_ENDPOINT: COUNT, PROXY_PROTOCOL_ERRORS: COUNT,
    ACTIVE_REQUESTS: COUNT, QUEUED_REQUESTS: COUNT,
    KV_CACHE_UTILIZATION: PERCENT, GPU_UTILIZATION: PERCENT, GPU_MEMORY_USED: PERCENT,
    ENGINE_CACHE_HIT: COUNT, ENGINE_CACHE_MISS: COUNT, ENGINE_BUILD_FAILURE: COUNT, ENGINE_BUILD_SECONDS: SECONDS,
    CIRCUIT_BREAKER_OPEN: COUNT, STAGING_WAIT_SECONDS: SECONDS, STAGING_MISSING: COUNT,
    START_TO_HEALTHY_SECONDS: SECONDS, SERVER_UNRECOVERABLE: COUNT, LAUNCH_ABANDONED: COUNT,
    SPOT_INTERRUPTION: COUNT, SPOT_REBALANCE: COUNT, SPOT_DRAIN_COMPLETED: COUNT, SPOT_DRAIN_CUT: COUNT,
    PLAN_DRIFT: COUNT, SHAPED_REQUESTS: COUNT, HOME_ENDPOINT_HEALTHY: COUNT,
}


def unit(name: str) -> str:
    """The unit `name` is published with; Count for a name outside the table (an event counted once)."""
    return UNITS.get(name, COUNT)
