"""`fleetcast bench`: measure TTFT, inter-token latency and tail latency of any
OpenAI-compatible endpoint under sweeps, arrival rates, trace replay and traffic
mixes. The results file (`fleetcast.bench.schema`) is what the planner reads.

Metric definitions are pinned in docs/bench.md.
"""
