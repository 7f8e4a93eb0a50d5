"""The EMF stand-in (tests/traffic/emf.py): its series shipped on demand answer every GetMetricData query as the
records shipped all at once do, so the traffic tests that ship on demand read what CloudWatch (moto) would hold."""

from __future__ import annotations

from datetime import timedelta

import boto3

from fleetcast.contract import telemetry as t
from fleetcast.traffic.export import export
from scripts.traffic_cmd import cloudwatch_caller
from tests.conftest import reset_moto
from tests.gateway.conftest import REGION, fleet_config

from .emf import ShippedOnDemand, extract, ship, with_percentiles
from .test_export_by_model import NOW, _records
from .week import WIDE_LIMITS


def test_series_shipped_on_demand_answer_as_all_shipped_first_and_only_those_asked_for_are_put(aws_env):
    cfg = fleet_config(WIDE_LIMITS, WIDE_LIMITS)
    start = NOW - timedelta(hours=2)
    sent = [("gpt2-xl", {t.INPUT_TOKENS: 20 + 37 * i, t.OUTPUT_TOKENS: 5 + 11 * i, t.TTFT_MS: 40.0 + i})
            for i in range(90)]  # one a minute from minute 1: 59 in the first hour, 31 in the second
    records = _records(cfg, start, sent)
    cloudwatch = boto3.client("cloudwatch", region_name=REGION)

    reset_moto(aws_env)
    ship(records, cloudwatch)
    every = export(cfg, start, NOW, with_percentiles(cloudwatch_caller(None), records), region=REGION, now=NOW)[0]

    reset_moto(aws_env)
    shipped = ShippedOnDemand(records, cloudwatch)
    asked = export(cfg, start, NOW, with_percentiles(shipped.caller(cloudwatch_caller(None)), records),
                   region=REGION, now=NOW)[0]
    assert asked == every and every.consumers[0].observed.arrivals == [59, 31]
    left = {(key[1], key[3]) for series in shipped.pending.values() for key, _ in series}
    assert left and len(left) < len({(key[1], key[3]) for key in extract(records)})  # what no query named stayed out
