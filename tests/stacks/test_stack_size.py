"""The provider stack's resource count, computed at validate (fleetcast/contract/stack_size.py), equals the
synthesized template's, and a region over CloudFormation's 500 resources per template is refused at validate.

Source of the limit: CloudFormation User Guide, "Understand CloudFormation quotas" (Resources: 500 per
template). Issue 25: twenty Spot pools in one region validated and then failed; the count says where the
limit falls (19 Spot pools fit the default region, 20 do not). Issue 32: pools serving several models were
undercounted (89 against 101 for examples/multi-model: each model's own SLO alarms), so every shipped config
and a generated several-model region are held to their templates.
"""

from __future__ import annotations

import pytest

from fleetcast.config import ConfigError, load_config, parse_config
from fleetcast.contract.stack_size import CLOUDFORMATION_MAX_RESOURCES, provider_stack_resources

from .synthesized import EXAMPLE_CONFIGS, ROOT, default_doc, default_fleet, example_fleet, multi_model_doc, synthesize


def _pool(i: int, **extra) -> dict:
    return {"name": f"p{i}", "instance_type": "g6e.xlarge", "capacity": {"min": 1, "max": 8}, **extra}


def _one_region(doc: dict) -> dict:
    doc["regions"] = doc["regions"][:1]
    doc["consumers"] = [c for c in doc["consumers"] if c["service_region"] == doc["regions"][0]["region"]]
    return doc


def _varied() -> dict:
    """Every feature the count knows, at once: NAT over three AZs, the optional Lambdas and subscription, and
    three pools each serving the three models of examples/multi-model (each model alarmed apart), with and
    without Spot tiers, warm pools, schedules and SLO protection."""
    doc = _one_region(multi_model_doc())
    region = doc["regions"][0]
    region["availability_zones"].append({"name": "ap-northeast-2d", "id": "apne2-az4"})
    doc["network"]["egress"] = "nat"
    doc["operations"] = {"alarm_email": "oncall@fleet.corp.internal", "auto_approve_connections": True,
                         "plan_drift_check": {"schedule": "rate(1 day)"}}
    region["pools"] = [
        _pool(0, warm_pool={"size": 1}, schedule=[{"cron": "0 8 * * *", "min": 1, "max": 4},
                                                  {"cron": "0 20 * * *", "min": 1, "max": 2}]),
        _pool(1, spot={"on_demand_base": 1}),
        _pool(2, scaling={"slo_protection": False}),
    ]
    return doc


def _existing_vpc() -> dict:
    doc = _one_region(default_doc())
    doc["regions"][0]["vpc"] = {"vpc_id": "vpc-0d93f1a7c2e4b6085", "cidr": "10.40.0.0/16",
                                "subnet_ids": ["subnet-05c8e2f19a7d3b640", "subnet-0b71d4e9c3a2f5086"],
                                "route_table_ids": ["rtb-0a94f1c7e3b5d2086"], "create_endpoints": False}
    doc["regions"][0]["pools"] = [_pool(i, spot={"on_demand_base": 1}) for i in range(2)]
    return doc


@pytest.mark.parametrize("label,make", [("default", default_doc), ("varied", _varied), ("existing-vpc", _existing_vpc)])
def test_the_computed_count_is_the_templates(label, make):
    # The default config's fleet is the one the stack tests share, synthesized once per run, not again here.
    fleet = default_fleet() if make is default_doc else synthesize(make(), f"size-{label}")
    for region in fleet.cfg.regions:
        template = fleet.template_json(f"{fleet.cfg.name}-provider-{region.region}")
        assert provider_stack_resources(fleet.cfg, region) == len(template["Resources"]), region.region


@pytest.mark.parametrize("path", EXAMPLE_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_computed_count_is_the_templates_for_every_shipped_config(path):
    fleet = example_fleet(path)
    for region in fleet.cfg.regions:
        template = fleet.template_json(f"{fleet.cfg.name}-provider-{region.region}")
        assert provider_stack_resources(fleet.cfg, region) == len(template["Resources"]), region.region


def test_the_shipped_configs_include_several_models_per_pool():
    """The case the count missed stays among the shipped configs the test above holds to their templates."""
    configs = [load_config(path) for path in EXAMPLE_CONFIGS]
    assert any(len(cfg.serves_of(pool)) > 1 for cfg in configs for region in cfg.regions for pool in region.pools)


def _spot_pools(n: int) -> dict:
    doc = _one_region(default_doc())
    doc["regions"][0]["pools"] = [_pool(i, spot={"on_demand_base": 1}) for i in range(n)]
    return doc


def test_twenty_spot_pools_in_one_region_are_refused_at_validate_and_nineteen_fit():
    with pytest.raises(ConfigError) as refused:
        parse_config(_spot_pools(20), "<t>")
    [issue] = refused.value.issues
    assert issue.dotted == "regions[0].pools" and f"at most {CLOUDFORMATION_MAX_RESOURCES}" in issue.message
    cfg = parse_config(_spot_pools(19), "<t>")
    assert provider_stack_resources(cfg, cfg.regions[0]) <= CLOUDFORMATION_MAX_RESOURCES
