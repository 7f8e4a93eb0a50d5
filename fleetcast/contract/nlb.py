"""What the region's NLB does with a draining instance: the stack configures it, the runtime and planner count on it.

Sources (the test that ties each number to the stack names them again):
- Health checks (Network Load Balancer User Guide, "Health checks for Network Load Balancer target groups"):
  a target is unhealthy after UNHEALTHY_THRESHOLD failed checks HEALTH_INTERVAL_S apart, so a gateway that
  answers /health 503 at the start of its drain stops getting new flows about STOP_ROUTING_S later. The same
  page: "If a target becomes unhealthy, the load balancer sends a TCP RST for packets received on the client
  connections associated with the target" - left at its defaults, the NLB would reset every stream the drain
  is keeping alive about 20 s into it.
- Target group attributes (Elastic Load Balancing API Reference, TargetGroupAttribute; the same text is in
  botocore's elbv2 service model): `target_health_state.unhealthy.connection_termination.enabled` (default
  true) and `target_health_state.unhealthy.draining_interval_seconds` (0-360000, default 0, settable only
  with termination off): how long an unhealthy target keeps its established connections in the
  `unhealthy.draining` state before the NLB closes them. Deregistration has its own pair
  (`deregistration_delay.*`), which the scale-in path uses.

Stdlib only: the gateway (through runtime.spot) imports it on the instance.
"""

from __future__ import annotations

# The gateway's health path: the NLB's health check and the consumer's failover probe (stacks/consumer_failover.py)
# both call it through the listener.
HEALTH_PATH = "/health"
HEALTH_INTERVAL_S = 10
HEALTHY_THRESHOLD = 2
UNHEALTHY_THRESHOLD = 2
# From /health 503 to the NLB routing no new flow to the target. The open connections stay (below).
STOP_ROUTING_S = HEALTH_INTERVAL_S * UNHEALTHY_THRESHOLD

UNHEALTHY_CONNECTION_TERMINATION = "target_health_state.unhealthy.connection_termination.enabled"
UNHEALTHY_DRAINING_INTERVAL = "target_health_state.unhealthy.draining_interval_seconds"
DRAINING_INTERVAL_MAX_S = 360000


def unhealthy_drain_attributes(drain_budget_s: int) -> dict[str, str]:
    """Target group attributes that let a target which turned unhealthy because it drains keep its open
    streams for the whole drain. The gateway's drain never outlasts `drain_budget_s` (a Spot notice only
    shortens it: runtime.spot.drain_budget_s), and it starts STOP_ROUTING_S before the NLB sees the target
    unhealthy, so an interval of the budget covers every drain with that much to spare."""
    if not 0 <= drain_budget_s <= DRAINING_INTERVAL_MAX_S:
        raise ValueError(f"drain budget {drain_budget_s} s is outside the NLB's 0-{DRAINING_INTERVAL_MAX_S} s")
    return {UNHEALTHY_CONNECTION_TERMINATION: "false", UNHEALTHY_DRAINING_INTERVAL: str(int(drain_budget_s))}
