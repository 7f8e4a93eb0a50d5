"""Benchmark mode, consumer side: one self-stopping probe per consumer stack that runs the sweep through
the consumer's interface endpoint (stacks/consumer_probe.py), hardened like the fleet, and absent
without `-c bench=true`."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from aws_cdk import App, Environment
from aws_cdk.assertions import Template

from fleetcast.bench.probe_wheels import download_argv
from fleetcast.config import load_config
from fleetcast.contract.errors import UserError
from fleetcast.contract.probe_wheels import check_wheelhouse
from runtime.probe.userdata import render_probe_user_data
from stacks import nag
from stacks.app_builder import cdk_json_context
from stacks.consumer import ConsumerStack
from stacks.consumer_probe import probe_group_name, probe_results_key

from .bench_fleet import bench_app  # noqa: F401
from .conftest import WHEEL_NAMES, fake_wheelhouse

ROOT = Path(__file__).resolve().parents[2]


def consumer_templates(bench_app):
    cfg, _, outdir = bench_app
    for c in cfg.consumers:
        yield cfg, c, json.loads((outdir / f"{cfg.name}-consumer-{c.name}.template.json").read_text())


def of_type(template, type_):
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_}


def probe_user_data(template) -> str:
    """The probe's user data with CloudFormation intrinsics rendered as JSON, for substring checks."""
    (lt,) = of_type(template, "AWS::EC2::LaunchTemplate").values()
    return json.dumps(lt["Properties"]["LaunchTemplateData"]["UserData"])


def test_each_consumer_gets_one_probe_group_that_can_scale_to_zero(bench_app):
    for cfg, c, t in consumer_templates(bench_app):
        (asg,) = of_type(t, "AWS::AutoScaling::AutoScalingGroup").values()
        props = asg["Properties"]
        assert props["AutoScalingGroupName"] == probe_group_name(cfg, c)
        assert (props["MinSize"], props["DesiredCapacity"], props["MaxSize"]) == ("0", "1", "1")
        assert sorted(props["VPCZoneIdentifier"]) == sorted(s.id for s in c.subnets)
        assert "TargetGroupARNs" not in props


def test_probe_instance_is_hardened(bench_app):
    for _, _, t in consumer_templates(bench_app):
        (lt,) = of_type(t, "AWS::EC2::LaunchTemplate").values()
        data = lt["Properties"]["LaunchTemplateData"]
        assert data["InstanceType"] == "c7i.large"
        assert data["MetadataOptions"]["HttpTokens"] == "required"
        assert [n["AssociatePublicIpAddress"] for n in data["NetworkInterfaces"]] == [False]
        assert all(b["Ebs"]["Encrypted"] for b in data["BlockDeviceMappings"])
        assert "KeyName" not in data  # Session Manager only, no SSH key
        # Amazon Linux 2023 (SSM agent and AWS CLI preinstalled), resolved at deploy, not looked up at synth.
        image_param = data["ImageId"]["Ref"]
        assert "al2023" in t["Parameters"][image_param]["Default"]


def test_probe_security_group_egress_is_only_the_serving_port_to_the_consumer_cidrs_and_https(bench_app):
    for cfg, c, t in consumer_templates(bench_app):
        groups = of_type(t, "AWS::EC2::SecurityGroup")
        (probe_sg,) = [g for k, g in groups.items() if k.startswith("BenchProbe")]
        props = probe_sg["Properties"]
        assert "SecurityGroupIngress" not in props
        egress = {(r["CidrIp"], r["IpProtocol"], r["FromPort"], r["ToPort"]) for r in props["SecurityGroupEgress"]}
        port = cfg.engine.port
        assert egress == {(cidr, "tcp", port, port) for cidr in c.cidrs} | {("0.0.0.0/0", "tcp", 443, 443)}
        assert not of_type(t, "AWS::EC2::SecurityGroupEgress")


def test_results_bucket_is_encrypted_private_and_tls_only(bench_app):
    for _, _, t in consumer_templates(bench_app):
        (bucket,) = of_type(t, "AWS::S3::Bucket").values()
        props = bucket["Properties"]
        assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"]
        assert props["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
        (policy,) = of_type(t, "AWS::S3::BucketPolicy").values()
        deny = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
        assert any(s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in deny)
        assert "BenchResultsBucketName" in t["Outputs"]


def test_probe_env_targets_the_interface_endpoint_dns_and_port_with_privatelink_labels(bench_app):
    for cfg, c, t in consumer_templates(bench_app):
        user_data = probe_user_data(t)
        (endpoint_id,) = of_type(t, "AWS::EC2::VPCEndpoint")
        # http://<first DNS entry's name>:<port>: the entry is "hosted-zone-id:dns-name".
        pattern = (r'FLEETCAST_BENCH_ENDPOINT=http://", \{"Fn::Select": \[1, \{"Fn::Split": \[":", \{"Fn::Select": '
                   rf'\[0, \{{"Fn::GetAtt": \["{endpoint_id}", "DnsEntries"\]\}}\]\}}\]\}}\]\}}, ":{cfg.engine.port}\\n')
        assert re.search(pattern, user_data), user_data[:600]
        assert f"FLEETCAST_BENCH_KEY={probe_results_key('r1', c)}" in user_data
        assert f"region={c.region},consumer={c.name},path=privatelink" in user_data
        assert "FLEETCAST_BENCH_CONCURRENCY=1,4,16" in user_data
        assert f"FLEETCAST_REGION={c.region}" in user_data
        assert "fleetcast-probe.service" in user_data


def test_probe_role_reads_its_bundle_writes_only_its_results_and_scales_only_its_group(bench_app):
    for cfg, c, t in consumer_templates(bench_app):
        (policy,) = of_type(t, "AWS::IAM::Policy").values()
        statements = {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
        assert set(statements) == {"ReadProbeBundle", "UploadOwnBenchResults", "ScaleOwnGroupToZero",
                                   "SessionManagerOnly"}
        assert "ManagedPolicyArns" not in next(iter(of_type(t, "AWS::IAM::Role").values()))["Properties"]
        assert statements["ReadProbeBundle"]["Action"] == "s3:GetObject"
        upload = json.dumps(statements["UploadOwnBenchResults"])
        key = probe_results_key("r1", c)
        assert statements["UploadOwnBenchResults"]["Action"] == "s3:PutObject"
        assert f"/{key}" in upload and f"/{key.removesuffix('.json')}.error.txt" in upload and "*" not in upload
        scale = statements["ScaleOwnGroupToZero"]
        assert scale["Action"] == "autoscaling:SetDesiredCapacity"
        assert f"autoScalingGroupName/{probe_group_name(cfg, c)}" in json.dumps(scale["Resource"])
        (role,) = of_type(t, "AWS::IAM::Role").values()
        principal = role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]
        assert principal == {"Service": "ec2.amazonaws.com"}


def test_no_probe_without_the_bench_flag_or_with_bench_probe_false(tmp_path):
    cfg = load_config(ROOT / "config" / "fleet.yaml")
    c = cfg.consumers[0]
    for i, context in enumerate(({}, {"bench": "true", "bench_probe": "false"})):
        app = App(outdir=str(tmp_path / str(i)), context={**cdk_json_context(), **context})
        stack = ConsumerStack(app, "C", cfg=cfg, consumer=c, env=Environment(account=c.account, region=c.region))
        assert stack.node.try_find_child("BenchProbe") is None
        template = Template.from_stack(stack).to_json()
        assert {r["Type"] for r in template["Resources"].values()} == {"AWS::EC2::SecurityGroup", "AWS::EC2::VPCEndpoint"}


def test_every_probe_acknowledgment_matches_a_real_finding(monkeypatch, tmp_path):
    """Synthesize one consumer stack in bench mode with acknowledgments recorded but not applied: the
    probe's cdk-nag findings are exactly the ones it acknowledges."""
    monkeypatch.setattr(nag, "APPLY_ACKNOWLEDGMENTS", False)
    monkeypatch.setattr(nag, "RECORDED", [])
    cfg = load_config(ROOT / "config" / "fleet.yaml")
    c = cfg.consumers[0]
    app = App(outdir=str(tmp_path / "out"), context={
        **cdk_json_context(), "bench": "true", "bench_probe_wheels": str(fake_wheelhouse(tmp_path / "w"))})
    ConsumerStack(app, "C", cfg=cfg, consumer=c, env=Environment(account=c.account, region=c.region))
    nag.enable(app)
    with pytest.raises(Exception, match="Validation ?[Ff]ailed") as failure:
        app.synth()
    report = json.loads(Path(re.search(r"found in: (\S+)", str(failure.value)).group(1)).read_text())
    findings = {(v["ruleName"], x["constructPath"]) for r in report["pluginReports"]
                for v in r["violations"] for x in v["violatingConstructs"]}
    probe_acks = {(rule, path) for path, rule in nag.RECORDED if "/BenchProbe/" in path + "/"}
    assert probe_acks
    for rule, path in probe_acks:
        assert any(r == rule and (p == path or p.startswith(path + "/")) for r, p in findings), (rule, path)
    for rule, path in findings:
        assert any(rule == r and (path == p or path.startswith(p + "/")) for p, r in nag.RECORDED), (rule, path)


# ---------------------------------------------------------------- wheelhouse and user data


def test_wheelhouse_check_names_what_is_missing_or_built_for_another_platform(tmp_path):
    good = fake_wheelhouse(tmp_path / "good")
    assert len(check_wheelhouse(good)) == len(WHEEL_NAMES)
    (good / "botocore-1.44.8-py3-none-any.whl").unlink()
    with pytest.raises(UserError, match="lacks botocore.*probe-wheels"):
        check_wheelhouse(good)
    mac = fake_wheelhouse(tmp_path / "mac")
    core = next(mac.glob("pydantic_core-*"))
    core.rename(mac / "pydantic_core-2.50.5-cp311-cp311-macosx_11_0_arm64.whl")
    with pytest.raises(UserError, match="not for CPython 3.11 on Linux x86_64"):
        check_wheelhouse(mac)
    with pytest.raises(UserError, match="does not exist.*bench_probe=false"):
        check_wheelhouse(tmp_path / "nowhere")


def test_probe_wheels_are_downloaded_for_the_probe_platform_not_this_one(tmp_path):
    argv = download_argv(tmp_path)
    assert argv[1:4] == ["-m", "pip", "download"]
    assert {"--only-binary=:all:", "manylinux2014_x86_64", "3.11"} <= set(argv)
    assert "pydantic~=2.14.0" in argv and "boto3~=1.40" in argv


def test_bench_mode_without_a_wheelhouse_fails_synth_with_the_fix(tmp_path):
    cfg = load_config(ROOT / "config" / "fleet.yaml")
    c = cfg.consumers[0]
    app = App(outdir=str(tmp_path), context={**cdk_json_context(), "bench": "true",
                                             "bench_probe_wheels": str(tmp_path / "missing")})
    with pytest.raises(UserError, match="fleetcast bench probe-wheels"):
        ConsumerStack(app, "C", cfg=cfg, consumer=c, env=Environment(account=c.account, region=c.region))


def probe_env(**overrides):
    env = {"FLEETCAST_REGION": "us-west-2", "FLEETCAST_BUCKET": "results", "FLEETCAST_BENCH_KEY": "bench/r/x.json",
           "FLEETCAST_BENCH_GROUP": "fc-analytics-bench-probe", "FLEETCAST_BENCH_ENDPOINT": "http://vpce-1.example:8000",
           "FLEETCAST_PROBE_BUNDLE": "s3://assets/bundle.zip"}
    return {**env, **overrides}


def test_probe_user_data_is_valid_bash_that_scales_to_zero_when_bootstrap_fails():
    script = render_probe_user_data(probe_env())
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert "trap 'give_up $LINENO' ERR" in script
    give_up = script[script.index("give_up() {"):script.index("trap 'give_up")]
    assert "set-desired-capacity" in give_up and "--desired-capacity 0" in give_up and ".error.txt" in give_up
    assert "FLEETCAST_BENCH_ENDPOINT=http://vpce-1.example:8000\n" in script


@pytest.mark.parametrize("env, message", [
    (probe_env(FLEETCAST_BENCH_GROUP=""), "missing required key.*FLEETCAST_BENCH_GROUP"),
    (probe_env(FLEETCAST_PROBE_BUNDLE="/tmp/bundle.zip"), "s3:// URI"),
    (probe_env(FLEETCAST_BENCH_ENDPOINT="http://x:8000; rm -rf /"), "characters outside"),
])
def test_probe_user_data_refuses_bad_env(env, message):
    with pytest.raises(ValueError, match=message):
        render_probe_user_data(env)


def test_probe_unit_runs_the_bench_job_with_the_unpacked_bundle_and_wheels():
    unit = (ROOT / "runtime" / "probe" / "fleetcast-probe.service").read_text()
    assert "ExecStart=/usr/bin/python3.11 -m fleetcast.bench.job" in unit
    assert "Environment=PYTHONPATH=/opt/fleetcast:/opt/fleetcast-deps" in unit
    assert "EnvironmentFile=/etc/fleetcast/env" in unit and "Restart=no" in unit


def test_consumer_with_api_keys_gives_the_probe_exactly_its_key_secret(tmp_path):
    cfg = load_config(ROOT / "config" / "fleet.yaml")
    c = cfg.consumers[0].model_copy(update={"api_keys": True})
    app = App(outdir=str(tmp_path / "out"), context={
        **cdk_json_context(), "bench": "true", "bench_probe_wheels": str(fake_wheelhouse(tmp_path / "w"))})
    stack = ConsumerStack(app, "C", cfg=cfg, consumer=c, env=Environment(account=c.account, region=c.region))
    nag.enable(app)
    app.synth()  # cdk-nag clean
    t = json.loads((tmp_path / "out" / "C.template.json").read_text())
    assert f"FLEETCAST_BENCH_API_KEY_SECRET={cfg.name}/bench/{c.name}/api-key\\n" in probe_user_data(t)
    (policy,) = of_type(t, "AWS::IAM::Policy").values()
    (read,) = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Sid"] == "ReadBenchApiKey"]
    assert read["Action"] == "secretsmanager:GetSecretValue"
    assert read["Resource"] == f"arn:aws:secretsmanager:{c.region}:{c.account}:secret:{cfg.name}/bench/{c.name}/api-key-??????"
    assert stack.bench_probe.api_key_secret == f"{cfg.name}/bench/{c.name}/api-key"


def test_a_bad_api_key_secret_name_is_refused_naming_the_context_key(tmp_path):
    cfg = load_config(ROOT / "config" / "fleet.yaml")
    c = cfg.consumers[0].model_copy(update={"api_keys": True})
    app = App(outdir=str(tmp_path), context={**cdk_json_context(), "bench": "true", "bench_api_key_secret": "a b;c",
                                             "bench_probe_wheels": str(fake_wheelhouse(tmp_path / "w"))})
    with pytest.raises(UserError, match="bench_api_key_secret"):
        ConsumerStack(app, "C", cfg=cfg, consumer=c, env=Environment(account=c.account, region=c.region))


@pytest.mark.parametrize("context, message", [
    ({"bench_probe_instance_type": "c7i large"}, "bench_probe_instance_type.*c7i.large"),
    ({"bench_run": "2026/11 29"}, "bench_run"),
])
def test_bad_probe_knobs_are_refused_naming_the_context_key(tmp_path, context, message):
    cfg = load_config(ROOT / "config" / "fleet.yaml")
    c = cfg.consumers[0]
    app = App(outdir=str(tmp_path), context={**cdk_json_context(), "bench": "true", **context,
                                             "bench_probe_wheels": str(fake_wheelhouse(tmp_path / "w"))})
    with pytest.raises(UserError, match=message):
        ConsumerStack(app, "C", cfg=cfg, consumer=c, env=Environment(account=c.account, region=c.region))


def test_probe_instance_type_is_configurable(tmp_path):
    cfg = load_config(ROOT / "config" / "fleet.yaml")
    c = cfg.consumers[0]
    app = App(outdir=str(tmp_path), context={**cdk_json_context(), "bench": "true",
                                             "bench_probe_instance_type": "m7i.xlarge",
                                             "bench_probe_wheels": str(fake_wheelhouse(tmp_path / "w"))})
    stack = ConsumerStack(app, "C", cfg=cfg, consumer=c, env=Environment(account=c.account, region=c.region))
    (lt,) = Template.from_stack(stack).find_resources("AWS::EC2::LaunchTemplate").values()
    assert lt["Properties"]["LaunchTemplateData"]["InstanceType"] == "m7i.xlarge"


def test_a_tls_service_is_refused_with_the_way_out(tmp_path):
    cfg = load_config(ROOT / "config" / "fleet.yaml")
    c = cfg.consumers[0]
    arn = f"arn:aws:acm:{c.service_region}:{cfg.provider.account}:certificate/12345678-1234-1234-1234-123456789012"
    tls = cfg.model_copy(update={"network": cfg.network.model_copy(
        update={"tls_certificate_arns": {c.service_region: arn}})})
    app = App(outdir=str(tmp_path), context={**cdk_json_context(), "bench": "true",
                                             "bench_probe_wheels": str(fake_wheelhouse(tmp_path / "w"))})
    with pytest.raises(UserError, match="TLS listener.*bench_probe=false"):
        ConsumerStack(app, "C", cfg=tls, consumer=c, env=Environment(account=c.account, region=c.region))
