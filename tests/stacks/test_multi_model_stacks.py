"""The provider stack of a fleet serving several models (examples/multi-model/fleet.yaml): the instances learn
what to serve from the config parameter, and each model on each pool is watched against its own SLO."""

from __future__ import annotations

import json

from fleetcast.config import config_from_json
from fleetcast.config.parameter import decode_parameter
from fleetcast.contract import telemetry
from fleetcast.contract.names import provider_stack_name

from .synthesized import multi_model_fleet

REGION = "ap-northeast-2"


def _provider():
    fleet = multi_model_fleet()
    return fleet, fleet.template_json(provider_stack_name(fleet.cfg.name, REGION))


def _resources(template: dict, type_: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_}


def test_the_config_parameter_tells_each_instance_what_to_serve():
    fleet, template = _provider()
    (parameter,) = [p for p in _resources(template, "AWS::SSM::Parameter").values()
                    if p["Properties"]["Name"] == fleet.cfg.config_parameter_name]
    delivered = config_from_json(decode_parameter(parameter["Properties"]["Value"]))
    assert delivered == fleet.cfg
    for pool in fleet.cfg.region(REGION).pools:
        assert delivered.served_by(pool) == fleet.cfg.served_by(pool)


def test_each_model_of_each_pool_has_slo_alarms_on_its_own_metrics():
    fleet, template = _provider()
    alarms = {a["Properties"]["AlarmName"]: a["Properties"] for a in _resources(template, "AWS::CloudWatch::Alarm").values()}
    for pool in fleet.cfg.region(REGION).pools:
        for served in fleet.cfg.served_by(pool):
            slo = served.model.slo or fleet.cfg.slo
            for signal, metric, threshold in (("ttft-p99", telemetry.TTFT_MS, slo.ttft_p99_ms),
                                              ("itl-p99", telemetry.ITL_MS, slo.itl_p99_ms)):
                alarm = alarms[f"{fleet.cfg.name}-{REGION}-{pool.name}-{served.model.id}-{signal}"]
                assert alarm["MetricName"] == metric and alarm["ExtendedStatistic"] == "p99"
                assert alarm["Threshold"] == threshold
                assert {d["Name"]: d["Value"] for d in alarm["Dimensions"]} == {
                    telemetry.DIM_FLEET: fleet.cfg.name, telemetry.DIM_POOL: pool.name,
                    telemetry.DIM_MODEL: served.model.id}
    # The example gives the small model a tighter SLO than the fleet's.
    small = alarms[f"{fleet.cfg.name}-{REGION}-l40s-qwen2.5-0.5b-ttft-p99"]
    assert small["Threshold"] < fleet.cfg.slo.ttft_p99_ms


def test_the_gateway_publishes_the_dimension_set_the_model_alarms_read():
    from runtime.gateway.metrics import emf_record

    record = emf_record("multimodel", "l40s", "voice-app", {telemetry.TTFT_MS: 12.0}, model="qwen2.5-0.5b")
    assert [telemetry.DIM_FLEET, telemetry.DIM_POOL, telemetry.DIM_MODEL] in \
        record["_aws"]["CloudWatchMetrics"][0]["Dimensions"]
    assert json.dumps(record)  # a plain EMF record


def test_the_dashboard_shows_each_model_against_its_own_slo():
    fleet, template = _provider()
    (dashboard,) = _resources(template, "AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    assert "Per model: P99 time to first token (ms)" in body
    for model in fleet.cfg.models:
        assert f"{model.id} SLO P99 TTFT" in body
