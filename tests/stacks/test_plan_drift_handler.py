"""The drift Lambda's handler against moto (S3 baseline, CloudWatch metrics) and a Stubber-checked SNS:
quiet on the planned traffic, PlanDrift = 1 and one notice with the reason once the traffic doubles."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import boto3
import pytest
from botocore.stub import ANY, Stubber

from fleetcast.contract import telemetry as t
from fleetcast.plan import drift
from runtime.gateway.metrics import emf_record
from stacks.lambdas.plan_drift import handler as h
from tests.conftest import reset_moto
from tests.traffic.emf import ShippedOnDemand, with_percentiles

REGION = "ap-northeast-2"
NOW = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
PER_HOUR = 12
SPR = 1000.0  # seconds each request holds an instance at the planned load levels (long generations)
PRICE = 1.861


def baseline() -> dict:
    """A one-model pool in the one baseline format (fleetcast.plan.check.baseline_document: a packing of one), each
    instance serving 1 / SPR req/s within the SLO (Little's law at the target)."""
    rates = [PER_HOUR / 3600] * 24
    cap = max(2, -(-int(PER_HOUR / 3600 * SPR * 1000) // 1000))
    model = {"model": "gpt2-xl", "adapters": [], "precision": "int8_wo", "copies": 1, "source": "measured",
             "hourly_rps": rates, "peak_rps": max(rates), "output_mean": 1500.0, "rps_per_instance": 1 / SPR,
             "slo": {"ttft_p99_ms": 300, "itl_p99_ms": 40}}
    pool = {"region": REGION, "pool": "l40s", "candidate": "g6e.xlarge int8_wo", "instance_type": "g6e.xlarge",
            "consumer_regions": [REGION], "target": 4, "capacity": {"min": 2, "max": cap}, "n_min": 2,
            "hourly_rps": rates, "peak_rps": max(rates), "share_above_target": 0.0, "price_per_hour": PRICE,
            "models": [model]}
    pool["usd_per_m_output"] = drift.planned_usd_per_m_output(pool)
    return {"schema": drift.SCHEMA, "written": NOW.isoformat(), "slo": {"ttft_p99_ms": 300, "itl_p99_ms": 40},
            "pools": [pool]}


def v1_baseline() -> dict:
    """The same pool as one-model plans wrote it before one format served every pool (drift.V1), as a deployed
    bucket may still hold it: read as the pool above (drift.upgrade)."""
    rates = [PER_HOUR / 3600] * 24
    cap = max(2, -(-int(PER_HOUR / 3600 * SPR * 1000) // 1000))
    return {"schema": drift.V1, "written": NOW.isoformat(), "slo": {"ttft_p99_ms": 300, "itl_p99_ms": 40},
            "pools": [{"region": REGION, "pool": "l40s", "candidate": "g6e.xlarge int8_wo", "instance_type": "g6e.xlarge",
                       "precision": "int8_wo", "consumer_regions": [REGION], "target": 4,
                       "capacity": {"min": 2, "max": cap}, "n_min": 2, "seconds_per_request": SPR,
                       "hourly_rps": rates, "peak_rps": max(rates), "slo_safe_rps": cap / SPR,
                       "share_above_target": 0.0, "price_per_hour": PRICE, "output_mean": 1500.0,
                       "usd_per_m_output": 0.0}]}


def records(per_hour: int) -> list[dict]:
    # Each hour's requests arrive within its first minute. The handler reads hourly and whole-window Sums only
    # (observe(): periods of 3600 s and the window), so where in its hour a request lands changes nothing it reads;
    # in one minute, EMF extraction files an hour's requests as one datum per metric and dimension set (as
    # CloudWatch does), not one per request: a twelfth (a 24th doubled) of the datums for moto to store and scan.
    out = []
    for hour in range(7 * 24):
        start = NOW - timedelta(days=7) + timedelta(hours=hour)
        for i in range(per_hour):
            stamp = int((start + timedelta(seconds=i * 59 / per_hour)).timestamp() * 1000)
            out.append(emf_record("fleetcast", "l40s", "voice-app",
                                  {t.REQUESTS: 1, t.THROTTLED: 0, t.ERRORS: 0, t.INPUT_TOKENS: 300,
                                   t.OUTPUT_TOKENS: 1500, t.E2E_MS: 90_000.0},
                                  timestamp_ms=stamp, shape={t.DIM_IN_FLIGHT: "1", t.DIM_INPUT_BUCKET: "257-512",
                                                             t.DIM_OUTPUT_BUCKET: "1025-2048"}))
    return out


class _PercentileCloudWatch:
    """moto's CloudWatch, with pNN statistics answered from the records (moto has none: tests/traffic/emf.py)."""

    def __init__(self, real, recs):
        self._real = real
        # Each series put into moto just before the handler first asks for it (tests/traffic/emf.py says why the
        # answers are the same), through the percentile answers
        shipped = ShippedOnDemand(recs, real)
        self._call = with_percentiles(shipped.caller(lambda _region, **p: real.get_metric_data(**p)), recs)

    def get_metric_data(self, **params):
        return self._call(REGION, **params)

    def put_metric_data(self, **params):
        return self._real.put_metric_data(**params)


@pytest.fixture
def lambda_env(aws_env, monkeypatch):
    reset_moto(aws_env)
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="model-bucket", CreateBucketConfiguration={"LocationConstraint": REGION})
    for key, value in {"FLEET": "fleetcast", "REGION": REGION, "BUCKET": "model-bucket", "BASELINE_KEY": "plan/baseline.json",
                       "TOPIC_ARN": f"arn:aws:sns:{REGION}:111122223333:ops", "THRESHOLD": "0.2",
                       "POOLS": json.dumps(["l40s"]), "CONSUMERS": json.dumps([["voice-app", REGION]])}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(h, "_CLIENTS", {"s3": s3})
    return s3


def _run(s3, per_hour: int, expect_notice: bool):
    recs = records(per_hour)
    cw = boto3.client("cloudwatch", region_name=REGION)
    sns = boto3.client("sns", region_name=REGION)
    stub = Stubber(sns)  # checks the call against the SNS API model
    if expect_notice:
        stub.add_response("publish", {"MessageId": "m-1"},
                          {"TopicArn": f"arn:aws:sns:{REGION}:111122223333:ops", "Subject": ANY, "Message": ANY,
                           "MessageAttributes": {"fleetcast_notice": {"DataType": "String", "StringValue": "plan_drift"}}})
    stub.activate()
    h._CLIENTS.update(cloudwatch=_PercentileCloudWatch(cw, recs), sns=sns)
    result = h.handler({}, None, now=NOW)
    stub.assert_no_pending_responses()
    drift_points = cw.get_metric_data(StartTime=NOW - timedelta(minutes=5), EndTime=NOW + timedelta(minutes=5),
                                      MetricDataQueries=[{"Id": "d", "MetricStat": {"Metric": {
                                          "Namespace": t.NAMESPACE, "MetricName": t.PLAN_DRIFT, "Dimensions": [
                                              {"Name": "Fleet", "Value": "fleetcast"}, {"Name": "Pool", "Value": "l40s"}]},
                                          "Period": 60, "Stat": "Maximum"}}])["MetricDataResults"][0]["Values"]
    return result, drift_points


@pytest.mark.parametrize("written", [baseline, v1_baseline])
def test_quiet_on_the_planned_traffic(lambda_env, written):
    lambda_env.put_object(Bucket="model-bucket", Key="plan/baseline.json", Body=json.dumps(written()))
    result, points = _run(lambda_env, PER_HOUR, expect_notice=False)
    assert result == {"drift": False, "findings": []}
    assert points == [0.0]


@pytest.mark.parametrize("written", [baseline, v1_baseline])
def test_doubled_traffic_publishes_plan_drift_and_the_reason(lambda_env, written):
    lambda_env.put_object(Bucket="model-bucket", Key="plan/baseline.json", Body=json.dumps(written()))
    result, points = _run(lambda_env, 2 * PER_HOUR, expect_notice=True)
    assert result["drift"] is True and points == [1.0]
    assert any("traffic grew past the SLO-safe throughput of max capacity" in f for f in result["findings"])


def test_without_a_staged_baseline_it_says_so(lambda_env):
    sns = boto3.client("sns", region_name=REGION)
    stub = Stubber(sns)
    stub.add_response("publish", {"MessageId": "m-2"}, {"TopicArn": ANY, "Subject": ANY, "Message": ANY,
                                                        "MessageAttributes": ANY})
    stub.activate()
    h._CLIENTS.update(sns=sns, cloudwatch=boto3.client("cloudwatch", region_name=REGION))
    assert h.handler({}, None, now=NOW) == {"drift": None}
    stub.assert_no_pending_responses()


def test_a_missing_baseline_reads_as_access_denied_without_list_permission_and_is_reported(lambda_env):
    # S3 GetObject API reference, "Permissions": without s3:ListBucket, a missing object is 403 AccessDenied
    # (the role may read the one key and list nothing).
    s3 = boto3.client("s3", region_name=REGION)
    s3_stub = Stubber(s3)
    s3_stub.add_client_error("get_object", service_error_code="AccessDenied", http_status_code=403,
                             expected_params={"Bucket": "model-bucket", "Key": "plan/baseline.json"})
    s3_stub.activate()
    sns = boto3.client("sns", region_name=REGION)
    sns_stub = Stubber(sns)
    sns_stub.add_response("publish", {"MessageId": "m-3"}, {"TopicArn": ANY, "Subject": ANY, "Message": ANY,
                                                            "MessageAttributes": ANY})
    sns_stub.activate()
    h._CLIENTS.update(s3=s3, sns=sns, cloudwatch=boto3.client("cloudwatch", region_name=REGION))
    assert h.handler({}, None, now=NOW) == {"drift": None}
    sns_stub.assert_no_pending_responses()


def packed_baseline() -> dict:
    """A pool packing two models (fleetcast.plan.check.baseline_document's shape): gpt2-xl planned at
    PER_HOUR requests an hour, qwen2.5-0.5b at none; each instance serves 0.01 req/s of either within its SLO."""
    models = [{"model": m, "precision": "int8_wo", "copies": 1, "source": "measured (co-located)",
               "hourly_rps": [rate] * 24, "peak_rps": rate, "output_mean": 1500.0, "rps_per_instance": 0.01,
               "slo": {"ttft_p99_ms": 300, "itl_p99_ms": 40}}
              for m, rate in (("gpt2-xl", PER_HOUR / 3600), ("qwen2.5-0.5b", 0.0))]
    by_model = {m["model"]: m["hourly_rps"] for m in models}
    instances = drift.packed_instances(by_model, models, 1)
    tokens = PER_HOUR * 24 * 1500.0
    return {"schema": drift.SCHEMA, "written": NOW.isoformat(), "slo": {"ttft_p99_ms": 300, "itl_p99_ms": 40},
            "pools": [{"region": REGION, "pool": "l40s", "candidate": "g6e.xlarge [gpt2-xl int8_wo x1 + qwen2.5-0.5b "
                       "int8_wo x1]", "instance_type": "g6e.xlarge", "consumer_regions": [REGION],
                       "capacity": {"min": 1, "max": 1}, "n_min": 1, "hourly_rps": [PER_HOUR / 3600] * 24,
                       "peak_rps": PER_HOUR / 3600, "price_per_hour": PRICE,
                       "usd_per_m_output": sum(instances) * PRICE / tokens * 1e6, "models": models}]}


@pytest.mark.parametrize("named, adapters", [("gpt2-xl", []), ("gpt2-xl-sql", ["gpt2-xl-sql"])])
def test_a_packed_pool_names_the_model_whose_traffic_grew(lambda_env, named, adapters):
    """The gateway meters each request per [Fleet, Pool, Model] too (runtime/gateway/metrics.py), Model being the
    id the request named: the Lambda reads each model's arrivals, its adapters' included (they load its
    processes; the baseline lists them), and the check names the one past what max capacity serves of it."""
    doc = packed_baseline()
    doc["pools"][0]["models"][0]["adapters"] = adapters
    lambda_env.put_object(Bucket="model-bucket", Key="plan/baseline.json", Body=json.dumps(doc))
    recs = []
    for hour in range(7 * 24):
        start = NOW - timedelta(days=7) + timedelta(hours=hour)
        for i in range(4 * PER_HOUR):  # four times the planned gpt2-xl traffic: 48 an hour > 36 one instance serves
            stamp = int((start + timedelta(seconds=i * 59 / (4 * PER_HOUR))).timestamp() * 1000)
            recs.append(emf_record("fleetcast", "l40s", "voice-app",
                                   {t.REQUESTS: 1, t.THROTTLED: 0, t.ERRORS: 0, t.INPUT_TOKENS: 300,
                                    t.OUTPUT_TOKENS: 1500, t.E2E_MS: 90_000.0}, timestamp_ms=stamp, model=named,
                                   shape={t.DIM_IN_FLIGHT: "1", t.DIM_INPUT_BUCKET: "257-512",
                                          t.DIM_OUTPUT_BUCKET: "1025-2048"}))
    cw = boto3.client("cloudwatch", region_name=REGION)
    sns = boto3.client("sns", region_name=REGION)
    stub = Stubber(sns)
    stub.add_response("publish", {"MessageId": "m-3"}, {"TopicArn": ANY, "Subject": ANY, "Message": ANY,
                                                        "MessageAttributes": ANY})
    stub.activate()
    h._CLIENTS.update(cloudwatch=_PercentileCloudWatch(cw, recs), sns=sns)
    result = h.handler({}, None, now=NOW)
    stub.assert_no_pending_responses()
    assert result["drift"] is True
    assert any("traffic for gpt2-xl grew past the SLO-safe throughput of max capacity" in f for f in result["findings"])
    assert not any("qwen2.5-0.5b" in f for f in result["findings"])
