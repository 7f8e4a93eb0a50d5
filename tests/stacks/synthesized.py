"""Synthesized fleets shared by the stack tests: each config variant is built and synthesized once per run.

`synthesize(doc)` builds the real app (`stacks.app_builder.build_app`, cdk-nag
registered, cdk.json feature flags) in-process and synthesizes it into a
temporary cloud assembly; a cdk-nag finding makes it raise, exactly as
`cdk synth` would fail.

aws-cdk-lib's built-in CloudFormation validation (`CloudFormationValidatePlugin`, on by default in an App;
cfn-lint's rules compiled to WebAssembly) never fails a synthesis: it turns its errors into warnings unless the
`@aws-cdk/core:validateAgainstDefaultRules` flag is set (aws-cdk-lib 2.275, core/lib/private/synthesis-validation.js,
downgradeCfnValidateErrorsToWarnings), and reports them only in the assembly's validation report. Its engine costs
8 s of CPU to start in each process and about 0.5 s a synthesis. So it runs where a test reads that report: the
fleets the gates check (tests/stacks/test_gates.py: default, variant, nat, spot, multi-model) and the syntheses
whose findings are compared with the acknowledgments.
"""

from __future__ import annotations

import atexit
import copy
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from aws_cdk import App
from aws_cdk.assertions import Template
from ruamel.yaml import YAML

from fleetcast.config import FleetConfig, parse_config
from stacks.app_builder import build_app, cdk_json_context
from tests.jsii_banner import node_major

NODE_MAJOR = node_major()
os.environ["JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"] = NODE_MAJOR

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = ROOT / "config" / "fleet.yaml"


@dataclass
class Synthesized:
    cfg: FleetConfig
    outdir: Path
    stacks: dict  # stack name -> Stack
    messages: list[str] = field(default_factory=list)
    validated: bool = False  # CDK's built-in CloudFormation validation ran (its findings in the report)

    def template_json(self, stack_name: str) -> dict:
        return json.loads((self.outdir / f"{stack_name}.template.json").read_text())

    def template(self, stack_name: str) -> Template:
        return Template.from_json(self.template_json(stack_name))

    def template_files(self) -> list[Path]:
        return sorted(self.outdir.glob("*.template.json"))

    def resources(self, stack_name: str, type_: str) -> dict[str, dict]:
        return {k: v for k, v in self.template_json(stack_name)["Resources"].items() if v["Type"] == type_}


def default_doc() -> dict:
    return YAML(typ="safe").load(DEFAULT_CONFIG.read_text())


def synthesize(doc: dict, label: str, context: dict | None = None, *, validated: bool = False) -> Synthesized:
    """`context` adds to cdk.json's, as `cdk synth -c key=value` does; `validated` runs CDK's built-in
    CloudFormation validation too, for a test that reads its findings in the validation report."""
    cfg = parse_config(copy.deepcopy(doc), f"<{label}>")
    outdir = Path(tempfile.mkdtemp(prefix=f"fleetcast-{label}-"))
    atexit.register(shutil.rmtree, outdir, ignore_errors=True)
    app = fleet_app(outdir, context, validated=validated)
    messages: list[str] = []
    stacks = build_app(cfg, app, report=messages.append)
    app.synth()
    return Synthesized(cfg=cfg, outdir=outdir, stacks=stacks, messages=messages, validated=validated)


def fleet_app(outdir: Path, context: dict | None = None, *, validated: bool = False) -> App:
    """The App `synthesize` builds a fleet in: cdk.json's context and `context`, CDK's built-in validation on only
    when `validated`."""
    return App(outdir=str(outdir), context={**cdk_json_context(), **(context or {})},
               builtin_cloud_formation_validation=validated)


def run_app_entry_point(config: Path, outdir: Path) -> tuple[int, str]:
    """app.py's `main()` given the App `cdk synth -c config=FILE -o DIR` hands it (cdk.json's context plus
    `config`), in this process: (exit code, what it wrote to stderr). In-process because a Python start per case
    cost a second; the CLI runs app.py itself in test_cdk_cli and, failing, in test_makefile."""
    import contextlib
    import importlib
    import io

    app = App(outdir=str(outdir), context={**cdk_json_context(), "config": str(config)})
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = importlib.import_module("app").main(app)
    return code, err.getvalue()


@cache
def default_fleet() -> Synthesized:
    """config/fleet.yaml as shipped."""
    return synthesize(default_doc(), "default", validated=True)


def variant_doc() -> dict:
    """Every other branch at once: imported VPCs (with and without endpoints), a TLS listener, a
    pinned AMI id (the default ships `latest`), two pools of different GPUs in one region, an engine change (new digest), and a
    consumer whose endpoint service name is not published yet."""
    doc = default_doc()
    seoul = doc["regions"][0]
    seoul["vpc"] = {
        "vpc_id": "vpc-0123456789abcdef0",
        "cidr": "10.50.0.0/16",
        "subnet_ids": ["subnet-0123456789abcdef1", "subnet-0123456789abcdef2"],
        "route_table_ids": ["rtb-0123456789abcdef1", "rtb-0123456789abcdef2"],
    }
    seoul["ami"] = {"id": "ami-0123456789abcdef0"}  # what `fleetcast ami pin` writes
    doc["regions"][1]["vpc"] = {  # a VPC that already has its endpoints
        "vpc_id": "vpc-0123456789abcdef9",
        "cidr": "10.51.0.0/16",
        "subnet_ids": ["subnet-0123456789abcdef7", "subnet-0123456789abcdef8"],
        "route_table_ids": ["rtb-0123456789abcdef7"],
        "create_endpoints": False,
    }
    seoul["pools"].append({
        "name": "a10g",
        "instance_type": "g5.2xlarge",
        "capacity": {"min": 0, "desired": 1, "max": 3},
        "engine": {"precision": "int8_wo", "max_batch_size": 32},
        "root_volume_gib": 300,
    })
    doc["network"]["tls_certificate_arns"] = {
        "ap-northeast-2": "arn:aws:acm:ap-northeast-2:111122223333:certificate/0a1b2c3d-4e5f-6789-abcd-ef0123456789"
    }
    doc["engine"]["max_batch_size"] = 32
    seoul["allowed_principals"].append("arn:aws:iam::555566667777:root")
    doc["consumers"].append({
        "name": "late-team",
        "account": "555566667777",  # its own account: one consumer per account and region (or API keys on each)
        "region": "ap-northeast-2",
        "service_region": "ap-northeast-2",
        "vpc_id": "vpc-0a1b2c3d4e5f60719",
        "subnets": [{"id": "subnet-0a1b2c3d4e5f60713", "az_id": "apne2-az1"}],
        "cidrs": ["10.61.0.0/16"],
    })
    return doc


@cache
def variant_fleet() -> Synthesized:
    return synthesize(variant_doc(), "variant", validated=True)


def nat_doc() -> dict:
    doc = default_doc()
    doc["network"]["egress"] = "nat"
    doc["regions"] = doc["regions"][:1]
    doc["consumers"] = [c for c in doc["consumers"] if c["service_region"] == doc["regions"][0]["region"]]
    return doc


@cache
def nat_fleet() -> Synthesized:
    return synthesize(nat_doc(), "nat", validated=True)


@cache
def bench_mode_fleet() -> Synthesized:
    """config/fleet.yaml in benchmark mode (`-c bench=true`, run r1, concurrency 1,4,16): bench groups per pool,
    a probe per consumer."""
    from tests.bench.conftest import fake_wheelhouse

    wheels = fake_wheelhouse(Path(tempfile.mkdtemp(prefix="fleetcast-wheels-")))
    atexit.register(shutil.rmtree, wheels, ignore_errors=True)
    return synthesize(default_doc(), "bench", {"bench": "true", "bench_run": "r1", "bench_concurrency": "1,4,16",
                                               "bench_probe_wheels": str(wheels)})


def spot_doc() -> dict:
    """Seoul's pool with a spot tier on two L40S types, a second spot pool (A10G, an explicit On-Demand base and
    share, fallback ceiling, rebalance drain); us-east-1 stays without spot (one group)."""
    doc = default_doc()
    doc["regions"] = doc["regions"][:1]
    doc["consumers"] = [c for c in doc["consumers"] if c["service_region"] == doc["regions"][0]["region"]]
    seoul = doc["regions"][0]
    seoul["pools"][0]["spot"] = {"instance_types": ["g6e.xlarge", "g6e.2xlarge"]}
    seoul["pools"].append({
        "name": "a10g",
        "instance_type": "g5.xlarge",
        "capacity": {"min": 1, "max": 5},
        "engine": {"precision": "int8_wo"},
        "spot": {"on_demand_base": 1, "spot_percentage": 80, "instance_types": ["g5.xlarge", "g5.2xlarge"],
                 "allocation_strategy": "capacity-optimized", "on_demand_fallback_max": 3,
                 "drain_on_rebalance": True},
    })
    return doc


@cache
def spot_fleet() -> Synthesized:
    return synthesize(spot_doc(), "spot", validated=True)


def operations_doc() -> dict:
    """The default config with every operations option on at once (the default leaves them off): alarm email,
    the endpoint-connection auto-approver, the scheduled plan drift check, and on the pools schedules, a capacity
    reservation, KV-cache scaling, a warm pool of 0 and a rollout without alarm rollback. One synthesis and one
    cfn-lint pass for the operations, approver and drift tests, which each synthesized and linted their own."""
    doc = default_doc()
    doc["operations"].update(alarm_email="oncall@example.com", auto_approve_connections=True,
                             plan_drift_check={"schedule": "rate(6 hours)", "threshold": 0.25})
    doc["regions"][0]["pools"][0].update(
        scaling={"metric": "kv_cache_utilization", "target": 75},
        schedule=[{"cron": "0 23 * * *", "min": 2, "max": 6, "desired": 3}, {"cron": "0 14 * * *", "min": 1, "max": 4}],
        capacity_reservation_ids=["cr-0123456789abcdef0"],
    )
    doc["regions"][1]["pools"][0].update(warm_pool={"size": 0}, rollout={"rollback_on_alarms": False})
    return doc


@cache
def operations_fleet() -> Synthesized:
    return synthesize(operations_doc(), "operations")


MULTI_MODEL_CONFIG = ROOT / "examples" / "multi-model" / "fleet.yaml"


def multi_model_doc() -> dict:
    return YAML(typ="safe").load(MULTI_MODEL_CONFIG.read_text())


@cache
def multi_model_fleet() -> Synthesized:
    """examples/multi-model/fleet.yaml: three models, two pools packing them differently, one restricted consumer."""
    return synthesize(multi_model_doc(), "multi-model", validated=True)


# Every config the project ships as an example: the default and examples/**/fleet*.yaml.
EXAMPLE_CONFIGS = sorted([DEFAULT_CONFIG, *ROOT.glob("examples/**/fleet*.yaml")])


@cache
def example_fleet(path: Path) -> Synthesized:
    """One shipped config, synthesized once: the default and the multi-model example share their fleets above."""
    shared = {DEFAULT_CONFIG: default_fleet, MULTI_MODEL_CONFIG: multi_model_fleet}
    if path in shared:
        return shared[path]()
    label = "-".join(path.relative_to(ROOT).with_suffix("").parts)
    return synthesize(YAML(typ="safe").load(path.read_text()), label)


SPILL_CONFIG = ROOT / "examples" / "spill" / "fleet.yaml"


def spill_fleet() -> Synthesized:
    """examples/spill/fleet.yaml: a consumer that spills from us-east-1 to us-west-2 and fails over there."""
    return example_fleet(SPILL_CONFIG)
