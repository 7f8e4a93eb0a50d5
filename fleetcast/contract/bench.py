"""The benchmark's knobs and their defaults, one home for the three places that take them: the bench
stacks (`cdk synth -c bench=true -c bench_*`, written into the instance env), the bench job on the instance
(which reads that env back, fleetcast/bench/job.py) and `fleetcast bench run`'s own flags.
Where results land: fleetcast/contract/bucket.py.
"""

from __future__ import annotations

from .context import Context

RUN = "latest"  # the results prefix's run part
CONCURRENCY = "1,2,4,8,16,32,64"  # the closed-loop sweep
REQUESTS_PER_LEVEL = "200"
INPUT_TOKENS = "128"  # a length spec (fleetcast/bench/distributions.py): a fixed 128 tokens
OUTPUT_TOKENS = "128"
# The model server itself (runtime/serve.py listens on 127.0.0.1:engine.port+1; 8000 when unset).
ENDPOINT = "http://127.0.0.1:8000"
# A packed pool's co-located level is run this many times (issue 33 §3: two runs of one H200 packing differed by
# up to 44% in P99 TTFT), so the planner sizes from the worst repeat and reports the spread.
MIX_REPEATS = "3"
PROBE_INSTANCE_TYPE = "c7i.large"
PROBE_WHEELS_DIR = "build/probe-wheels"  # relative to the repository root

# The `-c` knobs of bench mode with their defaults (stacks/bench_fleet.py, stacks/consumer_probe.py).
KNOB_DEFAULTS: dict[str, str] = {
    Context.BENCH_RUN.value: RUN,
    Context.BENCH_CONCURRENCY.value: CONCURRENCY,
    Context.BENCH_REQUESTS.value: REQUESTS_PER_LEVEL,
    Context.BENCH_INPUT_TOKENS.value: INPUT_TOKENS,
    Context.BENCH_OUTPUT_TOKENS.value: OUTPUT_TOKENS,
}
PROBE_KNOB_DEFAULTS: dict[str, str] = {
    Context.BENCH_PROBE_INSTANCE_TYPE.value: PROBE_INSTANCE_TYPE,
    Context.BENCH_PROBE_WHEELS.value: PROBE_WHEELS_DIR,
}
