"""A traffic profile region where the config has no consumer: the planner plans it, one model or several (the
profile may describe consumers still to come, as examples/plan/seed/traffic-us-east-1.yaml does against
config/fleet.yaml), and says so in one warning naming the profile's `consumers[].region` and the config's consumer
regions."""

from __future__ import annotations

from datetime import date

from fleetcast.plan.run import PlanOptions, build_packing

from .conftest import ROOT, SEED

EXAMPLE = ROOT / "examples" / "plan" / "multi-model"


def _seed(traffic: str):
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / traffic), config=str(ROOT / "config/fleet.yaml"),
                       ttft_p99_ms=300, itl_p99_ms=40, today=date(2026, 1, 15))
    result, _, _ = build_packing(opts)
    return result


def _consumerless(warnings: list[str]) -> list[str]:
    return [w for w in warnings if "has no consumer in the config" in w]


def test_a_one_model_fleet_plans_a_region_without_consumers_and_says_so():
    result = _seed("traffic-us-east-1.yaml")
    assert [p.region for p in result.regions] == ["us-east-1"] and result.regions[0].winner is not None
    assert _consumerless(result.warnings) == [
        "the traffic profile's consumers[].region us-east-1 has no consumer in the config (consumers[].region: "
        "ap-northeast-2, us-west-2): planned for consumers still to come there; add them under consumers before "
        "they call (the gateway serves only configured consumers)"]


def test_a_region_with_consumers_gets_no_such_warning():
    result = _seed("traffic-seoul.yaml")
    assert _consumerless(result.warnings) == []


def test_a_fleet_of_several_models_plans_it_the_same_way_and_names_the_missing_regions_entry(tmp_path):
    traffic = tmp_path / "traffic.yaml"
    traffic.write_text((EXAMPLE / "traffic.yaml").read_text().replace("region: ap-northeast-2", "region: us-west-2"))
    opts = PlanOptions(results=[str(EXAMPLE / "results")], traffic=str(traffic), config=str(EXAMPLE / "fleet.yaml"),
                       today=date(2026, 2, 1))
    result, _, _ = build_packing(opts)
    assert [r.region for r in result.regions] == ["us-west-2"]  # planned, as for one model
    assert _consumerless(result.warnings) == [
        "the traffic profile's consumers[].region us-west-2 has no consumer in the config (consumers[].region: "
        "ap-northeast-2): planned for consumers still to come there; add them under consumers before they call "
        "(the gateway serves only configured consumers); regions has no entry for us-west-2 either, so "
        "--write-config cannot put a pool there"]
    # Said once, as the plan's warning: not again per model as an entitlement note.
    assert not any("may call it" in n for r in result.regions for n in r.notes)
