"""Metric names shared by the runtime (which publishes), the stacks (alarms, scaling,
dashboards) and the CLIs (usage reports). One place, so a rename cannot split them.

All metrics go to one CloudWatch namespace, per region. Dimensions:
  Fleet  - the config's `name` (two fleets can share an account and region)
  Pool   - the pool name within the region
  Consumer - the consumer name from the config (per-request metrics only)
Per-request values are published as embedded-metric-format (EMF) records, one
per request, so fleet P99s are computed by CloudWatch from raw values rather
than averaged from per-instance percentiles.
"""

NAMESPACE = "Fleetcast"

DIM_FLEET = "Fleet"
DIM_POOL = "Pool"
DIM_CONSUMER = "Consumer"
DIM_INSTANCE = "InstanceId"

# Per request (EMF, from the gateway): dimension sets [Fleet, Pool] and [Fleet, Pool, Consumer].
TTFT_MS = "TimeToFirstTokenMs"
ITL_MS = "InterTokenLatencyMs"
E2E_MS = "EndToEndLatencyMs"
INPUT_TOKENS = "InputTokens"
OUTPUT_TOKENS = "OutputTokens"
REQUESTS = "Requests"
ERRORS = "Errors"  # 5xx, upstream failures, streams cut short
STREAMS_CUT = "StreamsCut"  # streams the model server broke off; the client got an error event
THROTTLED = "Throttled"  # 429 from per-consumer limits
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

# Lifecycle hook names: fixed strings, so the launch template's user data never
# has to reference its own Auto Scaling group (that would be a cycle).
LAUNCH_HOOK = "fleetcast-launch"
TERMINATE_HOOK = "fleetcast-terminate"

# Instances find their config, bucket and pool through this env file, written by user data.
INSTANCE_ENV_FILE = "/etc/fleetcast/env"
