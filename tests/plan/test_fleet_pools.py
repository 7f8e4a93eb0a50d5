"""Consumer regions share a provider pool when that is cheaper for the fleet as a whole.

Planned region by region, every consumer region pays for a pool's minimum and for an NLB
and the provider VPC's endpoints of its own. A small region whose traffic fits in a big
region's spare capacity costs far less there (network and SLO permitting); the planner
finds such moves (packing.pool_across_regions), the report says what each costs, and --write-config sizes the shared
pool for the summed load with one minimum.
"""

from __future__ import annotations

import json
import shutil

from fleetcast.plan.run import PlanOptions, build_packing
from scripts.cli import main

from .conftest import ROOT, SEED, east_and_west_traffic

RESULTS = str(SEED / "results")
SLO = dict(ttft_p99_ms=300, itl_p99_ms=40)


def build(path):
    result, _, _ = build_packing(PlanOptions(results=[RESULTS], traffic=str(path), config=None, min_instances=1, **SLO))
    return result, result.regions


def test_a_small_region_joins_the_big_regions_pool_when_that_is_cheaper(tmp_path):
    result, plans = build(east_and_west_traffic(tmp_path, '{"0-24": 100}', '{"0-24": 0.5}'))
    east, west = plans
    assert west.winner.region == "us-west-2"  # on its own, a small pool next to it is cheapest
    (pool,) = result.pools
    assert (pool.region, pool.label) == ("us-east-1", east.winner.label)
    assert pool.consumer_regions == ("us-east-1", "us-west-2")
    assert list(pool.marginal) == ["us-west-2"]  # joined the east's pool
    separate = east.winner.cost_per_hour + west.winner.cost_per_hour
    assert pool.cost_per_hour < separate - 1.0  # the west pool's instance and NLB are gone
    assert 0 < pool.marginal["us-west-2"] < west.winner.cost_per_hour
    # One minimum, summed load: never fewer instances than the big region alone needs.
    assert all(p >= e for p, e in zip(pool.instances_by_hour, east.winner.instances_by_hour))
    assert min(pool.instances_by_hour) == min(east.winner.instances_by_hour)


def test_regions_stay_apart_when_joining_would_cost_more(tmp_path):
    # 112 req/s all day runs the us-east-1 pool (g6e int8_wo, 10 instances) at the edge of a whole instance:
    # 3 req/s more would tip it over every hour, which costs more than the west's own pool.
    result, plans = build(east_and_west_traffic(tmp_path, '{"0-24": 112}', '{"0-24": 3}'))
    assert sorted((p.region, p.consumer_regions or (p.region,)) for p in result.pools) == [
        ("us-east-1", ("us-east-1",)), ("us-west-2", ("us-west-2",))]
    assert all(not p.marginal for p in result.pools) and not result.joins


def test_report_and_write_config_follow_the_pooled_fleet(tmp_path, capsys):
    path = east_and_west_traffic(tmp_path, '{"0-24": 100}', '{"0-24": 0.5}')
    fleet = tmp_path / "fleet.yaml"
    shutil.copy(ROOT / "config" / "fleet.yaml", fleet)
    # Calibrated precisions need a staged dataset: give the config one, whatever the plan picks.
    fleet.write_text(fleet.read_text().replace("\nslo:", "\ncalibration:\n  dataset: s3://fleetcast-staging/calibration/lambada/\n\nslo:", 1))
    code = main(["plan", "--results", RESULTS, "--traffic", str(path), "--config", str(fleet), "--ttft-p99-ms", "300",
                 "--itl-p99-ms", "40", "--min-instances", "1", "--json", "--write-config", str(fleet)])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    (pool,) = [p for p in report["pools"] if len(p["consumer_regions"]) > 1]
    assert pool["consumer_regions"] == ["us-east-1", "us-west-2"] and pool["joined"] == ["us-west-2"]
    assert pool["marginal_cost_per_hour"]["us-west-2"] > 0
    from fleetcast.config import load_config

    cfg = load_config(fleet)
    east_pool = cfg.region("us-east-1").pools[0]
    assert f"{east_pool.instance_type} [gpt2-xl {cfg.engine_for(east_pool).precision.value} x1]" == pool["candidate"]
    assert (east_pool.capacity.min, east_pool.capacity.max) == (min(pool["instances_by_hour"]),
                                                               max(pool["instances_by_hour"]))
    # The west consumers are served from us-east-1 (cross-region), as the plan pooled them. Region by
    # region, the plan would have put them on a us-west-2 pool, which this config has no region for:
    # --write-config would have refused.
    assert {c.service_region for c in cfg.consumers if c.region == "us-west-2"} == {"us-east-1"}

    code = main(["plan", "--results", RESULTS, "--traffic", str(path), "--ttft-p99-ms", "300", "--itl-p99-ms", "40",
                 "--min-instances", "1"])
    text = capsys.readouterr().out
    assert "Fleet (what --write-config writes):" in text
    assert "us-west-2 joins the us-east-1 pool (" in text and "for its own g5.xlarge [gpt2-xl int8_wo x1] pool in us-west-2" in text
