"""The instance-side benchmark job: measure, upload, scale to zero (S3 on moto, Auto Scaling stubbed)."""

import json
import tempfile
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from fleetcast.bench import job as bench_job
from fleetcast.bench.schema import load_results

REGION = "us-east-1"


@pytest.fixture(scope="module")
def s3(moto_endpoint):
    client = boto3.client("s3", region_name=REGION, endpoint_url=moto_endpoint,
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket="models")
    return client


def autoscaling_expecting_scale_to_zero(group):
    client = boto3.client("autoscaling", region_name=REGION, aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    stub = Stubber(client)
    stub.add_response("set_desired_capacity", {},
                      {"AutoScalingGroupName": group, "DesiredCapacity": 0, "HonorCooldown": False})
    stub.activate()
    return client, stub


def env(endpoint, key):
    return {"FLEETCAST_BENCH_KEY": key, "FLEETCAST_BENCH_GROUP": "fc-us-east-1-bench-l40s",
            "FLEETCAST_BENCH_ENDPOINT": endpoint, "FLEETCAST_BENCH_CONCURRENCY": "1,2",
            "FLEETCAST_BENCH_REQUESTS": "4", "FLEETCAST_BENCH_INPUT_TOKENS": "16", "FLEETCAST_BENCH_OUTPUT_TOKENS": "4",
            "FLEETCAST_BENCH_LABELS": "instance_type=g6e.xlarge,precision=int8_wo,region=us-east-1,backend=tensorrt",
            "FLEETCAST_BUCKET": "models", "FLEETCAST_REGION": REGION}


def test_job_benchmarks_the_local_server_uploads_and_scales_to_zero(fast_server, s3, tmp_path):
    asg, stub = autoscaling_expecting_scale_to_zero("fc-us-east-1-bench-l40s")
    key = "bench/r1/us-east-1/g6e.xlarge/int8_wo.json"
    assert bench_job.run(env(fast_server.url, key), s3=s3, autoscaling=asg, health_timeout_s=10) == 0
    stub.assert_no_pending_responses()
    path = tmp_path / "r.json"
    path.write_bytes(s3.get_object(Bucket="models", Key=key)["Body"].read())
    res = load_results(path)
    assert [r.load.concurrency for r in res.runs] == [1, 2]
    assert (res.labels.instance_type, res.labels.precision, res.labels.backend) == ("g6e.xlarge", "int8_wo", "tensorrt")
    assert res.runs[0].summary.network_rtt_ms is not None


def test_a_failed_job_leaves_a_note_and_still_scales_to_zero(s3):
    asg, stub = autoscaling_expecting_scale_to_zero("fc-us-east-1-bench-l40s")
    key = "bench/r1/us-east-1/g5.xlarge/fp16.json"
    monkey_env = env("http://127.0.0.1:9", key)
    assert bench_job.run(monkey_env, s3=s3, autoscaling=asg, health_timeout_s=0.2) == 1
    stub.assert_no_pending_responses()
    note = json.loads(s3.get_object(Bucket="models", Key="bench/r1/us-east-1/g5.xlarge/fp16.error.txt")["Body"].read())
    assert "never answered 200" in note["error"]


def test_instances_without_a_bench_key_do_nothing():
    assert bench_job.run({"FLEETCAST_BUCKET": "models"}) == 0


def test_systemd_unit_runs_the_job_only_on_bench_instances():
    import configparser
    from pathlib import Path

    unit_path = Path(__file__).resolve().parents[2] / "runtime" / "systemd" / "fleetcast-bench.service"
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string(unit_path.read_text())
    service = parser["Service"]
    assert service["ExecCondition"] == "/bin/sh -c 'test -n \"$FLEETCAST_BENCH_KEY\"'"
    assert "python3 -m fleetcast.bench.job" in service["ExecStart"]
    assert service["Type"] == "oneshot" and service["Restart"] == "no"
    assert parser["Install"]["WantedBy"] == "multi-user.target"


def secrets_returning(name, secret_string):
    client = boto3.client("secretsmanager", region_name=REGION, aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    stub = Stubber(client)
    stub.add_response("get_secret_value", {"Name": name, "SecretString": secret_string}, {"SecretId": name})
    stub.activate()
    return client, stub


def test_job_reads_the_api_key_secret_and_sends_it_as_a_bearer_token(tmp_path):
    secrets, stub = secrets_returning("fc/bench/voice/api-key", '{"keys": ["k-first", "k-second"]}')
    assert bench_job._api_key(secrets, "fc/bench/voice/api-key") == "k-first"
    stub.assert_no_pending_responses()
    argv = bench_job.bench_argv({}, tmp_path / "r.json", "k-first")
    assert argv[argv.index("--header") + 1] == "Authorization:Bearer k-first"
    assert "--header" not in bench_job.bench_argv({}, tmp_path / "r.json")


def test_job_with_a_key_secret_benchmarks_with_it_and_scales_to_zero(fast_server, s3):
    asg, asg_stub = autoscaling_expecting_scale_to_zero("fc-us-east-1-bench-l40s")
    secrets, secret_stub = secrets_returning("fc/bench/voice/api-key", "plain-key")
    key = "bench/r1/us-east-1/privatelink/voice.json"
    job_env = {**env(fast_server.url, key), "FLEETCAST_BENCH_API_KEY_SECRET": "fc/bench/voice/api-key"}
    assert bench_job.run(job_env, s3=s3, autoscaling=asg, secrets=secrets, health_timeout_s=10) == 0
    secret_stub.assert_no_pending_responses()
    asg_stub.assert_no_pending_responses()
    assert s3.head_object(Bucket="models", Key=key)["ContentLength"] > 0


def test_a_key_secret_without_keys_fails_the_job_with_a_note_and_scales_to_zero(fast_server, s3):
    asg, asg_stub = autoscaling_expecting_scale_to_zero("fc-us-east-1-bench-l40s")
    secrets, _ = secrets_returning("fc/bench/voice/api-key", '{"keys": []}')
    key = "bench/r1/us-east-1/privatelink/nokey.json"
    job_env = {**env(fast_server.url, key), "FLEETCAST_BENCH_API_KEY_SECRET": "fc/bench/voice/api-key"}
    assert bench_job.run(job_env, s3=s3, autoscaling=asg, secrets=secrets, health_timeout_s=10) == 1
    asg_stub.assert_no_pending_responses()
    note = json.loads(s3.get_object(Bucket="models", Key="bench/r1/us-east-1/privatelink/nokey.error.txt")["Body"].read())
    assert "keys" in note["error"]


def test_a_packed_instance_measures_each_model_alone_then_all_at_once(s3):
    """A pool serving several models: each engine process alone (the others loaded and idle), then the mix with
    every model at its own port, each level MIX_REPEATS times; one pair of files per model, each with its own
    precision and backend, and the pool's gpu_sharing recorded in every file's packing."""
    from fleetcast.bench.accuracy import TestServerProcess
    from fleetcast.bench.testserver import Timings
    from fleetcast.contract.bench import MIX_REPEATS
    from fleetcast.contract.bucket import bench_packed_key, packed_model_key
    from tests.bench.conftest import free_port

    key = bench_packed_key("r1", REGION, "g6e.xlarge")
    with TestServerProcess(free_port(), Timings(models=(("gpt2-xl", 4.0, 1.0),))) as xl, \
            TestServerProcess(free_port(), Timings(models=(("qwen2.5-0.5b", 2.0, 1.0),))) as qwen:
        asg, stub = autoscaling_expecting_scale_to_zero("fc-us-east-1-bench-l40s")
        packed = {**env("http://127.0.0.1:9", key),
                  "FLEETCAST_BENCH_LABELS": "instance_type=g6e.xlarge,region=us-east-1,path=instance",
                  "FLEETCAST_BENCH_MODELS": f"gpt2-xl:{xl.port}:int8_wo:tensorrt,qwen2.5-0.5b:{qwen.port}:bf16:pytorch",
                  "FLEETCAST_BENCH_MODEL_MIX": "gpt2-xl:0.5,qwen2.5-0.5b:0.5",
                  "FLEETCAST_BENCH_PACKING": "gpt2-xl:1:8,qwen2.5-0.5b:1:4",
                  "FLEETCAST_BENCH_GPU_SHARING": "mps"}
        assert bench_job.run(packed, s3=s3, autoscaling=asg, health_timeout_s=10) == 0
        stub.assert_no_pending_responses()
    files = {}
    for model, precision, backend in (("gpt2-xl", "int8_wo", "tensorrt"), ("qwen2.5-0.5b", "bf16", "pytorch")):
        for together in (False, True):
            body = s3.get_object(Bucket="models", Key=packed_model_key(key, model, precision, together))["Body"].read()
            path = Path(tempfile.mkdtemp()) / "r.json"
            path.write_bytes(body)
            res = files[(model, together)] = load_results(path)
            assert (res.labels.model, res.labels.precision, res.labels.backend) == (model, precision, backend)
            # The mix records every model's precision in its packing (--model-precision); alone, its own (its label):
            # the idle peer's is not said.
            xl = "int8_wo " if together or model == "gpt2-xl" else ""
            small = "bf16 " if together or model == "qwen2.5-0.5b" else ""
            said = f"gpt2-xl {xl}x1 (KV 8 GiB each), qwen2.5-0.5b {small}x1 (KV 4 GiB each)"
            assert res.packing.text() == f"{said} on g6e.xlarge (mps)" and res.packing.gpu_sharing == "mps"
    # Concurrency 1,2: alone at both levels with the peer idle; the mix at 2 only (one worker per model).
    assert [r.load.concurrency for r in files[("gpt2-xl", False)].runs] == [1, 2]
    assert files[("gpt2-xl", False)].runs[0].peers == {"qwen2.5-0.5b": 0.0}
    mix = files[("gpt2-xl", True)]
    assert [r.total.load.concurrency for r in mix.runs] == [2] * int(MIX_REPEATS)
    assert [r.repeat for r in mix.runs] == list(range(1, int(MIX_REPEATS) + 1))
    assert all(r.peers["qwen2.5-0.5b"] > 0 for r in mix.runs)
    assert [r.repeat for r in files[("gpt2-xl", False)].runs] == [None, None]  # alone: each level once


def test_the_probe_of_several_models_measures_each_to_its_own_key(fast_server, s3):
    from fleetcast.contract.bucket import probe_model_key, probe_results_key

    key = probe_results_key("r1", REGION, "voice-app")
    asg, stub = autoscaling_expecting_scale_to_zero("fc-us-east-1-bench-l40s")
    probe = {**env(fast_server.url, key), "FLEETCAST_BENCH_LABELS": "region=us-east-1,consumer=voice-app,path=privatelink",
             "FLEETCAST_BENCH_PROBE_MODELS": "gpt2-xl,qwen2.5-0.5b"}
    assert bench_job.run(probe, s3=s3, autoscaling=asg, health_timeout_s=10) == 0
    for model in ("gpt2-xl", "qwen2.5-0.5b"):
        path = Path(tempfile.mkdtemp()) / "r.json"
        path.write_bytes(s3.get_object(Bucket="models", Key=probe_model_key(key, model))["Body"].read())
        res = load_results(path)
        assert res.labels.model == model and res.labels.path == "privatelink" and res.packing is None
