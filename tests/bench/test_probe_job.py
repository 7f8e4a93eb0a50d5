"""The consumer-side probe's job, run the way the probe runs it: the probe bundle as synth stages it,
unpacked as the user data unpacks it, started with the systemd unit's command in an interpreter that
sees nothing but the bundle and its dependencies (-S: no site-packages). S3 and Auto Scaling are a
loopback moto server (AWS_ENDPOINT_URL); the endpoint is the loopback test server."""

from __future__ import annotations

import re
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import boto3
import pytest

from fleetcast.bench.schema import load_results
from fleetcast.contract.probe_wheels import check_wheelhouse
from stacks.consumer_probe import _stage_probe_bundle

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "runtime" / "probe" / "fleetcast-probe.service"
REGION = "us-west-2"
GROUP = "fleetcast-analytics-bench-probe"
KEY = "bench/r1/us-east-1/privatelink/analytics.json"


def real_wheels() -> list[Path] | None:
    """`fleetcast bench probe-wheels` output when it was run here (needs PyPI); else None."""
    try:
        wheels = check_wheelhouse(ROOT / "build" / "probe-wheels")
    except Exception:  # noqa: BLE001 - absent or incomplete: fall back to this venv's packages
        return None
    return wheels if all(zipfile.is_zipfile(w) and zipfile.ZipFile(w).namelist() for w in wheels) else None


@pytest.fixture
def aws(moto_endpoint):
    url = moto_endpoint
    kw = dict(region_name=REGION, endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key="testing")
    s3, autoscaling = boto3.client("s3", **kw), boto3.client("autoscaling", **kw)
    s3.create_bucket(Bucket="results", CreateBucketConfiguration={"LocationConstraint": REGION})
    autoscaling.create_launch_configuration(LaunchConfigurationName="lc", ImageId="ami-12345678",
                                            InstanceType="c7i.large")
    autoscaling.create_auto_scaling_group(AutoScalingGroupName=GROUP, LaunchConfigurationName="lc", MinSize=0,
                                          MaxSize=1, DesiredCapacity=1, AvailabilityZones=[f"{REGION}a"])
    return url, s3, autoscaling


def test_probe_job_runs_from_the_bundle_alone_uploads_and_scales_its_group_to_zero(fast_server, aws, tmp_path):
    url, s3, autoscaling = aws
    wheels = real_wheels()
    staged = _stage_probe_bundle(str(tmp_path / "assembly"), wheels or [])
    bundle = Path(shutil.make_archive(str(tmp_path / "bundle"), "zip", staged))
    opt, deps = tmp_path / "opt" / "fleetcast", tmp_path / "opt" / "fleetcast-deps"
    zipfile.ZipFile(bundle).extractall(opt)
    if wheels:
        for wheel in sorted((opt / "wheels").glob("*.whl")):
            zipfile.ZipFile(wheel).extractall(deps)
        dep_paths = [deps]
    else:
        # No wheelhouse here: this venv's packages stand in for the unpacked wheels.
        dep_paths = [Path(p) for p in site.getsitepackages()]

    unit = UNIT.read_text()
    command = re.search(r"^ExecStart=(.+)$", unit, re.M).group(1).split()
    pythonpath = re.search(r"^Environment=PYTHONPATH=(.+)$", unit, re.M).group(1)
    assert command[0] == "/usr/bin/python3.11" and pythonpath == "/opt/fleetcast:/opt/fleetcast-deps"
    env = {
        "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join([str(opt), *map(str, dep_paths)]),
        "AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_EC2_METADATA_DISABLED": "true",
        "FLEETCAST_REGION": REGION, "FLEETCAST_BUCKET": "results", "FLEETCAST_BENCH_KEY": KEY,
        "FLEETCAST_BENCH_GROUP": GROUP, "FLEETCAST_BENCH_ENDPOINT": fast_server.url,
        "FLEETCAST_BENCH_CONCURRENCY": "1,4", "FLEETCAST_BENCH_REQUESTS": "8",
        "FLEETCAST_BENCH_INPUT_TOKENS": "16", "FLEETCAST_BENCH_OUTPUT_TOKENS": "4",
        "FLEETCAST_BENCH_LABELS": "region=us-west-2,consumer=analytics,path=privatelink",
    }
    proc = subprocess.run([sys.executable, "-S", *command[1:]], env=env, cwd=opt, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]

    (tmp_path / "r.json").write_bytes(s3.get_object(Bucket="results", Key=KEY)["Body"].read())
    res = load_results(tmp_path / "r.json")
    assert (res.labels.path, res.labels.consumer, res.labels.region) == ("privatelink", "analytics", REGION)
    assert [r.load.concurrency for r in res.runs] == [1, 4]
    assert all(r.summary.completed == 8 and r.summary.network_rtt_ms is not None for r in res.runs)
    (group,) = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"]
    assert group["DesiredCapacity"] == 0
