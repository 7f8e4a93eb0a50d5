"""The metric table: every metric Fleetcast publishes has one unit, and that unit is one CloudWatch knows."""

from __future__ import annotations

import botocore.session

from fleetcast.contract import telemetry as t
from runtime.gateway.metrics import emf_record
from runtime.metrics import Emf

# Module constants that are not metric names (namespace, dimensions, hooks, paths, units themselves).
NOT_METRICS = {"NAMESPACE", "LAUNCH_HOOK", "TERMINATE_HOOK", "INSTANCE_ENV_FILE",
               "MILLISECONDS", "SECONDS", "PERCENT", "COUNT"}


def _metric_names() -> dict[str, str]:
    return {k: v for k, v in vars(t).items()
            if k.isupper() and isinstance(v, str) and not k.startswith("DIM_") and k not in NOT_METRICS}


def test_every_metric_name_has_a_unit():
    missing = sorted(k for k, v in _metric_names().items() if v not in t.UNITS)
    assert not missing, f"metric names without a unit in fleetcast.contract.telemetry.UNITS: {missing}"


def test_units_are_cloudwatch_units():
    # Valid values of MetricDatum.Unit (CloudWatch API reference, API_MetricDatum.html): the StandardUnit
    # enum of botocore's CloudWatch service model (botocore/data/cloudwatch/2010-08-01/service-2.json).
    known = set(botocore.session.get_session().get_service_model("cloudwatch").shape_for("StandardUnit").enum)
    assert set(t.UNITS.values()) <= known
    assert {t.MILLISECONDS, t.SECONDS, t.PERCENT, t.COUNT} <= known


def test_latencies_are_milliseconds_and_durations_seconds():
    # The name says the unit: ...Ms in milliseconds, ...Seconds in seconds, ...Percent in percent.
    for name, unit in t.UNITS.items():
        if name.endswith("Ms"):
            assert unit == t.MILLISECONDS, name
        elif name.endswith("Seconds"):
            assert unit == t.SECONDS, name
        elif name.endswith("Percent"):
            assert unit == t.PERCENT, name
        else:
            assert unit == t.COUNT, name


def test_the_gateway_and_the_bootstrap_publish_with_the_table_units():
    values = {t.TTFT_MS: 12.5, t.REQUESTS: 1}
    record = emf_record("f", "p", "c", values,
                        shape={t.DIM_IN_FLIGHT: "1", t.DIM_INPUT_BUCKET: "1-64", t.DIM_OUTPUT_BUCKET: "1-64"})
    published = {m["Name"]: m["Unit"] for d in record["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}
    assert published == {t.TTFT_MS: "Milliseconds", t.REQUESTS: "Count", t.SHAPED_REQUESTS: "Count"}

    import io
    out = io.StringIO()
    record = Emf("f", "p", "i-1", stream=out).emit({t.ENGINE_BUILD_SECONDS: 3.0, t.GPU_UTILIZATION: 50.0})
    published = {m["Name"]: m["Unit"] for m in record["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert published == {t.ENGINE_BUILD_SECONDS: "Seconds", t.GPU_UTILIZATION: "Percent"}
