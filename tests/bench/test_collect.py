"""`fleetcast bench collect` against S3 on a loopback moto server."""

import json
from datetime import UTC, datetime

import boto3
import pytest

from fleetcast.bench.collect import upload
from fleetcast.bench.schema import ClientInfo, Labels, Results, dump_results, load_results
from scripts.cli import main

REGION = "us-east-1"


@pytest.fixture
def aws_env(aws_env, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)  # `collect` without --region uses the default region
    return aws_env


def results(instance_type):
    now = datetime.now(UTC)
    return Results(labels=Labels(instance_type=instance_type, precision="int8", backend="tensorrt"),
                   endpoint="http://127.0.0.1:8000", api="completions",
                   client=ClientInfo(host="i-0abc", cpus=4, python="3.11", fleetcast_version="0.1.0"),
                   started_at=now, finished_at=now, seed=0)


def test_collect_downloads_valid_results_and_skips_the_rest(moto_endpoint, aws_env, tmp_path, capsys):
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=moto_endpoint)
    s3.create_bucket(Bucket="bench-results")
    for it in ("g5.xlarge", "g6e.xlarge"):
        path = tmp_path / f"{it}.json"
        dump_results(results(it), path)
        assert upload(path, "bench-results", f"bench/run1/{it}/int8.json", client=s3).startswith("s3://bench-results/")
    s3.put_object(Bucket="bench-results", Key="bench/run1/notes.json", Body=json.dumps({"hello": 1}))
    s3.put_object(Bucket="bench-results", Key="bench/run1/log.txt", Body=b"text")
    s3.put_object(Bucket="bench-results", Key="other/x.json", Body=b"{}")

    out = tmp_path / "collected"
    rc = main(["bench", "collect", "--bucket", "bench-results", "--prefix", "bench/", "--out", str(out),
               "--endpoint-url", moto_endpoint, "--region", REGION])
    captured = capsys.readouterr()
    assert rc == 0
    got = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.json"))
    assert got == ["run1/g5.xlarge/int8.json", "run1/g6e.xlarge/int8.json"]
    assert load_results(out / "run1/g6e.xlarge/int8.json").labels.instance_type == "g6e.xlarge"
    assert "skipping s3://bench-results/bench/run1/notes.json" in captured.err


def test_missing_bucket_is_one_clear_line(moto_endpoint, aws_env, tmp_path, capsys):
    rc = main(["bench", "collect", "--bucket", "no-such-bucket", "--out", str(tmp_path),
               "--endpoint-url", moto_endpoint])
    err = capsys.readouterr().err
    assert rc == 1 and "no-such-bucket" in err and "NoSuchBucket" in err and "Traceback" not in err
