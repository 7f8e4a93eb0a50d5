"""Consumer DNS failover (consumers[].failover_region): the private name a consumer calls, and the timing that decides
how soon that name moves from the home endpoint to the failover endpoint.

The chain, each link built by stacks/consumer_failover.py in the consumer's own stack:
  probe (a Lambda in the consumer's subnets, every PROBE_INTERVAL_S) -> metric HomeEndpointHealthy (1 or 0)
  -> alarm (ALARM after DATAPOINTS_TO_ALARM failing periods of ALARM_PERIOD_S) -> Route 53 health check
  (CLOUDWATCH_METRIC, follows the alarm) -> failover record pair (PRIMARY: home, SECONDARY: failover), TTL RECORD_TTL_S.

Stdlib only: the stacks and the docs' figures read these numbers from here.
"""

from __future__ import annotations

ZONE_SUFFIX = "fleetcast.internal"
RECORD_LABEL = "endpoint"

PROBE_INTERVAL_S = 60
PROBE_SCHEDULE = "rate(1 minute)"
# A failing attempt is retried on a new connection, which the NLB may send to another instance: one draining
# instance (its /health answers 503) is not an outage.
PROBE_ATTEMPTS = 3
PROBE_TIMEOUT_S = 5.0
PROBE_PAUSE_S = 1.0
# The longest one probe run can take (every attempt timing out), and the function's timeout above it.
PROBE_MAX_S = int(PROBE_ATTEMPTS * PROBE_TIMEOUT_S + (PROBE_ATTEMPTS - 1) * PROBE_PAUSE_S)
PROBE_FUNCTION_TIMEOUT_S = PROBE_MAX_S + 13

ALARM_PERIOD_S = 60
EVALUATION_PERIODS = 2
DATAPOINTS_TO_ALARM = 2
RECORD_TTL_S = 30


def zone_name(fleet: str, consumer: str) -> str:
    """One private hosted zone per consumer stack: two zones of one name cannot share a VPC, and two consumers of a
    fleet may live in one VPC."""
    return f"{consumer}.{fleet}.{ZONE_SUFFIX}"


def record_name(fleet: str, consumer: str) -> str:
    """The name consumers call (a failover CNAME cannot sit at the zone apex, where the SOA and NS records are)."""
    return f"{RECORD_LABEL}.{zone_name(fleet, consumer)}"


def detection_worst_case_s() -> int:
    """From the home endpoint failing to the alarm in ALARM, at worst: the failure begins just after a passing probe,
    so the first failing probe comes up to one interval later; the alarm needs DATAPOINTS_TO_ALARM failing periods,
    the last of which closes only at its period's end; and that period's probe may take PROBE_MAX_S to report."""
    return PROBE_INTERVAL_S + DATAPOINTS_TO_ALARM * ALARM_PERIOD_S + PROBE_MAX_S


def failover_worst_case_s() -> int:
    """Detection plus the record's TTL, during which a resolver may still answer with the home endpoint. Route 53's
    own lag between the alarm's state and the health check's is not documented and is not included."""
    return detection_worst_case_s() + RECORD_TTL_S


def failback_worst_case_s() -> int:
    """From the home endpoint answering again to the name returning home: one passing period ends the ALARM (fewer
    than DATAPOINTS_TO_ALARM of the last EVALUATION_PERIODS fail), then the TTL."""
    return PROBE_INTERVAL_S + ALARM_PERIOD_S + PROBE_MAX_S + RECORD_TTL_S
