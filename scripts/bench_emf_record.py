"""Cost of one request's EMF record on the gateway's event loop, with and without the traffic-shape directive.

    python -m scripts.bench_emf_record
"""
import json
import timeit

from fleetcast.contract import telemetry as t
from runtime.gateway.metrics import emf_record

values = {t.REQUESTS: 1, t.THROTTLED: 0, t.ERRORS: 0, t.INPUT_TOKENS: 300, t.OUTPUT_TOKENS: 120,
          t.TTFT_MS: 15.123, t.E2E_MS: 980.456, t.ITL_MS: 8.012}
props = {"path": "/v1/completions", "status": 200}
def old() -> None:
    json.dumps(emf_record("fleetcast", "l40s", "voice-app", values, props, 1764547200000), separators=(",", ":"))
def new() -> None:
    shape = {t.DIM_IN_FLIGHT: t.in_flight_label(23), t.DIM_INPUT_BUCKET: t.token_label(300),
             t.DIM_OUTPUT_BUCKET: t.token_label(120)}
    json.dumps(emf_record("fleetcast", "l40s", "voice-app", values, props, 1764547200000, shape), separators=(",", ":"))
n = 20000
for name, fn in (("without shape", old), ("with shape", new)):
    best = min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e6
    print(f"{name}: {best:.2f} us per record")
