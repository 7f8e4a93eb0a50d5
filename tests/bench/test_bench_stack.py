"""Benchmark mode of the app (`cdk synth -c bench=true`): one self-benchmarking,
self-stopping instance per pool, from the fleet's own launch template path."""

import json
from pathlib import Path

import pytest
from aws_cdk import App
from aws_cdk.assertions import Match, Template

from fleetcast.config import load_config
from fleetcast.contract.bucket import bench_results_key as results_key
from fleetcast.contract.errors import UserError
from stacks.app_builder import build_app, cdk_json_context
from tests.cfn_lint import assert_lint_clean
from tests.stacks.synthesized import default_fleet

from .bench_fleet import bench_app  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


def _provider(cfg, stacks, outdir, region):
    name = next(n for n, s in stacks.items() if getattr(s, "region_cfg", None) is not None and s.region_cfg.region == region)
    return name, Template.from_json(json.loads((outdir / f"{name}.template.json").read_text()))


def test_each_pool_gets_one_bench_instance_that_is_not_behind_the_nlb(bench_app):
    cfg, stacks, outdir = bench_app
    for region in cfg.regions:
        _, t = _provider(cfg, stacks, outdir, region.region)
        for pool in region.pools:
            group = f"{cfg.name}-{region.region}-bench-{pool.name}"
            t.has_resource_properties("AWS::AutoScaling::AutoScalingGroup", {
                "AutoScalingGroupName": group, "MinSize": "0", "DesiredCapacity": "1", "MaxSize": "1",
                "TargetGroupARNs": Match.absent(),
            })
            # The serving group is still there, unchanged, behind the NLB.
            t.has_resource_properties("AWS::AutoScaling::AutoScalingGroup", {
                "AutoScalingGroupName": f"{cfg.name}-{region.region}-{pool.name}",
                "TargetGroupARNs": Match.any_value(),
            })


def test_bench_user_data_carries_the_job_and_the_real_pool(bench_app):
    cfg, stacks, outdir = bench_app
    region = cfg.regions[0]
    pool = region.pools[0]
    _, t = _provider(cfg, stacks, outdir, region.region)
    templates = t.find_resources("AWS::EC2::LaunchTemplate")
    user_data = [json.dumps(r["Properties"]["LaunchTemplateData"].get("UserData")) for r in templates.values()]
    bench = [u for u in user_data if "FLEETCAST_BENCH_KEY" in u]
    assert len(bench) == len(region.pools)
    key = results_key("r1", region.region, pool.instance_type, cfg.engine_for(pool).precision.value)
    # The real pool's digest too: the runtime compares it with the parameter's config for that pool.
    digest = f"FLEETCAST_CONFIG_DIGEST={cfg.instance_digest(region.region, pool.name)}"
    assert any(key in u and f"FLEETCAST_POOL={pool.name}" in u and "FLEETCAST_BENCH_CONCURRENCY=1,4,16" in u
               and "path=instance" in u and digest in u for u in bench)
    # Same hardening as the fleet: IMDSv2 required, no public IP, encrypted root volume.
    for r in templates.values():
        data = r["Properties"]["LaunchTemplateData"]
        assert data["MetadataOptions"]["HttpTokens"] == "required"
        assert all(bdm["Ebs"]["Encrypted"] for bdm in data["BlockDeviceMappings"])


def test_bench_role_may_write_only_its_results_and_scale_only_its_group(bench_app):
    cfg, stacks, outdir = bench_app
    region = cfg.regions[0]
    pool = region.pools[0]
    _, t = _provider(cfg, stacks, outdir, region.region)
    key = results_key("r1", region.region, pool.instance_type, cfg.engine_for(pool).precision.value)
    policies = [json.dumps(p) for p in t.find_resources("AWS::IAM::Policy").values()]
    upload = [p for p in policies if "UploadOwnBenchResults" in p]
    assert len(upload) == len(region.pools)
    assert any(f"/{key}" in p and "ScaleOwnGroupToZero" in p
               and f"autoScalingGroupName/{cfg.name}-{region.region}-bench-{pool.name}" in p for p in upload)
    for p in upload:
        assert "bench/*" not in p  # no wildcard over other candidates' results


def test_no_bench_groups_without_the_flag():
    fleet = default_fleet()  # config/fleet.yaml as `cdk synth` builds it (cdk.json's context), no -c bench
    assert fleet.stacks
    for stack in fleet.stacks.values():
        assert stack.node.try_find_child("Bench") is None


def test_bench_mode_templates_pass_cfn_lint(bench_app):
    _, _, outdir = bench_app
    # Providers with bench groups and consumers with the PrivateLink probe.
    templates = [str(p) for p in sorted(outdir.glob("*.template.json"))]
    assert any("consumer" in t for t in templates) and any("provider" in t for t in templates)
    assert_lint_clean(*templates)


@pytest.mark.parametrize("knob, value", [
    ("bench_concurrency", "1, 2, 4"), ("bench_requests", "two hundred"), ("bench_input_tokens", "0"),
    ("bench_run", "2026/12 01"), ("bench_concurrency", "1,2,400"),
])
def test_a_bad_bench_knob_is_a_user_error_naming_it_not_a_traceback(tmp_path, knob, value):
    """Each knob reaches the instance's env file, which takes no quoting: refused at synth, by name."""
    cfg = load_config(ROOT / "config" / "fleet.yaml")
    app = App(outdir=str(tmp_path), context={**cdk_json_context(), "bench": "true", "bench_probe": "false",
                                             knob: value})
    with pytest.raises(UserError, match=f"-c {knob}[= ]"):
        build_app(cfg, app, report=lambda line: None)
    assert not app.node.children, "refused before any stack is built"
