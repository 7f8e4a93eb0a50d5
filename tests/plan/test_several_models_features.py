"""Planning features on a fleet of several models (issue 34, "Every feature for several models"), each on
examples/plan/multi-model: --reserved per instance type, --quality per model and precision, --write-schedule,
plan simulate --candidate with a packing. Before, each was refused with "not available for fleets of several
models yet"."""

from __future__ import annotations

import shutil
from datetime import date

import pytest

from fleetcast.config import load_config
from fleetcast.contract.errors import UserError
from fleetcast.plan.run import PlanOptions, build_packing
from scripts.cli import main

from .conftest import ROOT

EXAMPLE = ROOT / "examples" / "plan" / "multi-model"
ARGS = ["--results", str(EXAMPLE / "results"), "--traffic", str(EXAMPLE / "traffic.yaml"),
        "--config", str(EXAMPLE / "fleet.yaml")]
CHOICE = "g6e.xlarge [gpt2-xl int8_wo x1 + qwen2.5-0.5b bf16 x1 + qwen2.5-3b fp8 x1]"


def _plan(**kw):
    opts = PlanOptions(results=[str(EXAMPLE / "results")], traffic=str(EXAMPLE / "traffic.yaml"),
                       config=str(EXAMPLE / "fleet.yaml"), today=date(2026, 2, 1), **kw)
    return build_packing(opts)[0]


def _written(tmp_path, capsys, flag: str):
    """The example's pool as `plan --write-config --allow-estimated FLAG` writes it, and what the command printed."""
    fleet = tmp_path / "fleet.yaml"
    shutil.copy(EXAMPLE / "fleet.yaml", fleet)
    code = main(["plan", *ARGS[:4], "--config", str(fleet), "--write-config", str(fleet), "--allow-estimated", flag])
    out = capsys.readouterr().out
    assert code == 0, out
    (pool,) = load_config(fleet).regions[0].pools
    return pool, out


@pytest.fixture(scope="module")
def plain():
    return _plan()


def test_reserved_instances_of_a_type_are_paid_whatever_the_packing_on_them(plain):
    """--reserved g6e.xlarge@ap-northeast-2=2 covers every instance the 1-2 instance packing runs: it then pays only
    fixed costs, and says how many reserved instances it uses."""
    w = plain.regions[0].winner
    reserved = _plan(reserved={("g6e.xlarge", "ap-northeast-2"): 2}).regions[0].winner
    assert reserved.label == w.label and reserved.reserved_used == 2
    assert reserved.cost_per_hour == pytest.approx(sum(w.fixed_by_hour) / 24)
    assert reserved.cost_per_hour < w.cost_per_hour


def test_quality_is_checked_per_model_and_precision(tmp_path, plain):
    """A failed quality result for qwen2.5-3b at fp8 rules out fp8 for that model only: gpt2-xl keeps int8_wo, and
    the region's notes say which model and precision failed."""
    quality = tmp_path / "quality.yaml"
    quality.write_text("schema: fleetcast.quality/v1\nmetric: accuracy_drop_pct\nthreshold: 1.0\nresults:\n"
                       "  - {precision: fp8, value: 3.0, model: qwen2.5-3b}\n"
                       "  - {precision: int8_wo, value: 0.2, model: gpt2-xl}\n")
    region = _plan(quality=str(quality)).regions[0]
    assert {m.model: m.precision for m in region.winner.loads}["qwen2.5-3b"] == "bf16"
    assert {m.model: m.precision for m in region.winner.loads}["gpt2-xl"] == "int8_wo"
    assert any(n.startswith("qwen2.5-3b fp8 on g6e.xlarge: ruled out: quality check failed: accuracy_drop_pct 3 > "
                            "threshold 1") for n in region.notes)
    bad = tmp_path / "bad.yaml"
    bad.write_text(quality.read_text().replace("model: gpt2-xl", "model: llama"))
    with pytest.raises(UserError, match=r"--quality: results\[\]\.model llama is not a model of the config"):
        _plan(quality=str(bad))


def test_write_schedule_writes_the_packings_instances_per_hour(tmp_path, capsys, plain):
    """Per UTC hour: the largest over the models of the processes each needs / its copies, at least the floor (the
    instances the packing runs), as schedule steps."""
    pool, _ = _written(tmp_path, capsys, "--write-schedule")
    hourly = plain.regions[0].winner.instances_by_hour
    w = plain.regions[0].winner
    assert hourly == [max([1] + [-(-n // m.copies) for m in w.loads for n in [m.processes_by_hour[h]]])
                      for h in range(24)]
    steps = [(int(s.cron.split()[1]), s.min) for s in pool.schedule]
    assert steps == [(h, hourly[h]) for h in range(24) if h == 0 or hourly[h] != hourly[h - 1]]
    assert all(s.max == max(hourly) for s in pool.schedule)


def test_simulate_takes_a_packing_as_candidate(capsys):
    code = main(["plan", "simulate", *ARGS, "--candidate", CHOICE, "--max-hours", "1"])
    out, err = capsys.readouterr()
    assert code in (0, 3), err
    assert "g6e.xlarge @ ap-northeast-2: gpt2-xl int8_wo x1" in out and "N plan" in out
    code = main(["plan", "simulate", *ARGS, "--candidate", "g6e.xlarge [gpt2-xl fp16 x9]"])
    err = capsys.readouterr().err
    assert code == 1 and "--candidate 'g6e.xlarge [gpt2-xl fp16 x9]': not a feasible candidate" in err and CHOICE in err


def test_spot_advice_is_per_packed_pool_with_its_processes_drained_together(tmp_path, capsys, plain):
    """One verdict per chosen packing: an interruption cuts every model's requests on the instance, so the in-flight
    count it reads is the packing's scaling target over every model and the mix every model's; --write-spot writes
    the tier into the packed pool and the config validates."""
    from fleetcast.plan.packing import scaling_target
    from fleetcast.plan.spot import spot_pool

    region = plain.regions[0]
    (advice,) = plain.spot
    pool = spot_pool(region.winner.planned())
    assert advice.candidate == CHOICE and pool.target == scaling_target(region.winner)
    assert [t.model for t in pool.traffics] == ["gpt2-xl", "qwen2.5-0.5b", "qwen2.5-3b"]
    assert pool.error_rate == min(m.slo.error_rate for m in region.winner.loads)
    assert advice.recommended and advice.on_demand_base == 1 and advice.fallback_max == 2
    written, out = _written(tmp_path, capsys, "--write-spot")
    assert written.spot is not None and written.on_demand_base == 1
    assert "Spot tier (docs/plan.md#spot; a packing's processes are drained together):" in out


def test_estimate_adds_roofline_curves_per_model_labelled_and_never_chosen_over_the_solo_curves(plain):
    """--estimate g5.xlarge on the example: per model, a roofline estimator calibrated on that model's own solo
    curves (data notes name each), every g5.xlarge packing labelled "estimated (roofline model)", and the choice
    stays the packing of the curves given. Before, --estimate was refused for a fleet of several models."""
    from fleetcast.plan.packing import ROOFLINE

    result = _plan(estimate=["g5.xlarge"])
    (region,) = result.regions
    assert region.winner.label == plain.regions[0].winner.label
    g5 = [e for e in region.evaluations if e.instance_type == "g5.xlarge"]
    assert g5 and all(e.estimated and e.source == ROOFLINE for e in g5 if e.loads)
    for model in ("gpt2-xl", "qwen2.5-0.5b", "qwen2.5-3b"):
        assert f"{model}: roofline calibrated on" in (result.estimator or "")


def test_a_packing_plan_warns_of_unsized_reservations_and_dates_its_quality_limit_as_a_one_model_plan_does(tmp_path):
    """One context for every plan (run._context, run._data_notes): a pool launching into capacity reservations
    without --reserved is warned about, and --quality's limit is a data note. Before, only one-model plans did
    either."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text((EXAMPLE / "fleet.yaml").read_text().replace(
        "        instance_type: g6e.xlarge\n",
        "        instance_type: g6e.xlarge\n        capacity_reservation_ids: [cr-0123456789abcdef0]\n", 1))
    quality = tmp_path / "quality.yaml"
    quality.write_text("schema: fleetcast.quality/v1\nmetric: perplexity\nthreshold: 30\n"
                       "results: [{precision: bf16, value: 1}]\n")
    result = build_packing(PlanOptions(results=[str(EXAMPLE / "results")], traffic=str(EXAMPLE / "traffic.yaml"),
                                       config=str(fleet), quality=str(quality), today=date(2026, 2, 1)))[0]
    assert any(w.startswith("regions[ap-northeast-2] launches into capacity reservations") for w in result.warnings)
    assert "quality: perplexity <= 30" in result.data_notes


def _two_regions(tmp_path=None, drop: str | None = None):
    """The example across Virginia and Ohio (traffic-two-regions.yaml); `drop` leaves that model out of Ohio."""
    traffic = EXAMPLE / "traffic-two-regions.yaml"
    if drop is not None:
        from ruamel.yaml import YAML

        doc = YAML(typ="safe").load(traffic.read_text())
        doc["consumers"] = [c for c in doc["consumers"] if not (c["region"] == "us-east-2" and c["model"] == drop)]
        traffic = tmp_path / "traffic.yaml"
        YAML().dump(doc, traffic)
    opts = PlanOptions(results=[str(EXAMPLE / "results")], traffic=str(traffic), config=str(EXAMPLE / "fleet.yaml"),
                       today=date(2026, 2, 1))
    return build_packing(opts)


def test_a_pool_serves_the_same_model_set_in_every_region_it_serves():
    """Pooling across regions for several models: Ohio's three models join Virginia's packed pool (one NLB, one set
    of provider endpoints, one floor) because the fleet then costs less; each model's processes are sized for both
    regions' busiest minutes within its SLO less Ohio's network, the farther one. Before, each region of a
    several-model fleet was served from its own region only."""
    from fleetcast.plan.packing import fixed_by_hour
    from fleetcast.plan.solver import provider_side

    result, ctx, _ = _two_regions()
    (pool,) = result.pools
    own = {r.region: r.winner for r in result.regions}
    assert pool.region == "us-east-1" and pool.consumer_regions == ("us-east-1", "us-east-2")
    assert pool.label == own["us-east-1"].label
    for load in pool.loads:
        mine = [t for r in result.regions for t in r.traffic if t.model == load.model]
        assert load.traffic.hourly_rps() == pytest.approx([sum(t.hourly_rps()[h] for t in mine) for h in range(24)])
        assert load.network_ms == pytest.approx(ctx.latency.between("us-east-2", "us-east-1") - ctx.latency.same_region_ms)
    fixed = [sum(fixed_by_hour("us-east-1", r.traffic, ctx)[h] for r in result.regions)
             - provider_side("us-east-1", ctx) for h in range(24)]
    assert pool.fixed_by_hour == pytest.approx(fixed)
    assert pool.cost_per_hour == pytest.approx(sum(pool.instances_by_hour) * pool.price_per_hour / 24 + sum(fixed) / 24)
    assert result.cost_per_hour == pool.cost_per_hour < sum(w.cost_per_hour for w in own.values()) - 0.01
    # As the example's README quotes them.
    assert (round(pool.cost_per_hour, 2), round(sum(w.cost_per_hour for w in own.values()), 2)) == (2.16, 4.25)
    (planned,) = [p.planned() for p in result.pools]
    assert planned.consumer_regions == ("us-east-1", "us-east-2")
    (advice,) = result.spot
    assert advice.service_region == "us-east-1" and advice.candidate == pool.label
    assert any(line.startswith("us-east-2 joins the us-east-1 pool") for line in result.joins)
    from fleetcast.plan.check import baseline_document

    (entry,) = baseline_document([p.planned() for p in result.pools], ctx, {}, "2026-02-01")["pools"]
    assert entry["region"] == "us-east-1" and entry["consumer_regions"] == ["us-east-1", "us-east-2"]


def test_a_region_of_another_model_set_keeps_a_pool_of_its_own(tmp_path):
    """A pool serves the same model set in every region: Ohio without qwen2.5-3b is not pooled onto Virginia's
    three-model packing, however much cheaper that would be."""
    result, _, _ = _two_regions(tmp_path, drop="qwen2.5-3b")
    assert sorted(p.consumer_regions or (p.region,) for p in result.pools) == [("us-east-1",), ("us-east-2",)]
    assert not result.joins
