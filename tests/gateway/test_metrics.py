"""The metric record lines the gateway writes (runtime/gateway/metrics.py)."""

from __future__ import annotations

import json

from fleetcast.contract import telemetry as t
from runtime.gateway.metrics import EmfLines, emf_record


def test_the_gateways_record_line_is_the_record():
    """MetricsSink writes EmfLines' cached encoding: the line must parse to exactly emf_record's record,
    for every combination the gateway emits (no consumer, consumer, consumer and model, shaped or not)."""
    values = {t.REQUESTS: 1, t.THROTTLED: 0, t.ERRORS: 0, t.INPUT_TOKENS: 3, t.OUTPUT_TOKENS: 5, t.TTFT_MS: 1.5}
    shape = {t.DIM_IN_FLIGHT: "1", t.DIM_INPUT_BUCKET: "1-16", t.DIM_OUTPUT_BUCKET: "1-16"}
    for by_model in (False, True):  # a fleet of one model, of several (telemetry.metered_per_model)
        lines = EmfLines("f", "p", by_model)
        for consumer in (None, "c"):
            for model in (None, "m"):
                for s in (None, shape):
                    for props in (None, {"path": "/v1/completions", "status": 200, "note": 'a "quoted" \u00e9'}):
                        for _ in range(2):  # the second time from the cache
                            line = lines.line(consumer, values, props, 1764547200000, s, model)
                            assert json.loads(line) == emf_record("f", "p", consumer, values, props, 1764547200000,
                                                                  s, model, by_model)
    assert json.loads(lines.line("c", {t.REQUESTS: 1}))["_aws"]["Timestamp"] > 1764547200000


def test_consumers_and_models_share_one_cached_encoding():
    """The directives name dimensions, not their values: every consumer and model reuses one encoding per
    combination, and each line still carries its own consumer and model."""
    values = {t.REQUESTS: 1, t.ERRORS: 0}
    lines = EmfLines("f", "p", True)
    for consumer in ("a", "b", "c"):
        for model in ("m1", "m2"):
            line = lines.line(consumer, values, None, 1764547200000, None, model)
            assert json.loads(line) == emf_record("f", "p", consumer, values, None, 1764547200000, None, model, True)
    assert len(lines._directives) == 1
