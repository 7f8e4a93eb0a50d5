"""Pieces of the method on small hand-made inputs: network latency, goodput from records,
length rescaling, cross-region transfer, and how results files become load points."""

from __future__ import annotations

import json

import pytest

from fleetcast.contract.errors import UserError
from fleetcast.plan.curves import Candidate, Curve, LoadPoint
from fleetcast.plan.inputs import load_candidates, load_fixed_costs, load_latency, load_prices, shipped_availability
from fleetcast.plan.packing import ModelCurve, PackingEval, RegionPacking, plan_packing
from fleetcast.plan.solver import PlanContext, Slo
from fleetcast.plan.traffic import ConsumerTraffic, TrafficProfile

from .conftest import SEED

FIXED = load_fixed_costs(None)
MODEL = "gpt2-xl"


def ctx(ttft=300.0, itl=40.0, err=0.01) -> PlanContext:
    return PlanContext(slo=Slo(ttft, itl, err), prices=load_prices(None), availability=shipped_availability(),
                       latency=load_latency(None), fixed=FIXED)


def traffic(region="us-east-1", rps=10.0, levels=None, output=128) -> ConsumerTraffic:
    return ConsumerTraffic.model_validate({"region": region, "model": MODEL, "rate_rps": [rps] * 24,
                                           "concurrency": levels or {"4": 1.0}, "input_tokens": 256,
                                           "output_tokens": output})


def flat(instance="g7e.2xlarge", precision="fp8", ttft=(150, 220), records=(), itl_mean=2.0, output=128):
    pts = [LoadPoint(concurrency=c, ttft_p99=t, itl_p99=5.0, e2e_mean=400.0 + 10 * c, itl_mean=itl_mean,
                     records=records if c == 4 else ()) for c, t in zip((1, 4), ttft)]
    return Candidate(instance, precision, Curve(tuple(pts)), output_mean=output, input_mean=256)


def planned(candidates: list[Candidate], t: ConsumerTraffic, c: PlanContext) -> RegionPacking:
    """One consumer region planned by the one path (packing.plan_packing, one model a packing of one), no config."""
    profile = TrafficProfile.model_validate({"schema": "fleetcast.traffic/v1", "name": "t", "consumers": [t]})
    result = plan_packing(None, [ModelCurve(MODEL, cand) for cand in candidates], profile, c, models=(MODEL,))
    (region,) = result.regions
    return region


def evaluate(candidate: Candidate, t: ConsumerTraffic, service_region: str, c: PlanContext) -> PackingEval:
    """The candidate served from `service_region`: its packing of one process there."""
    (ev,) = [e for e in planned([candidate], t, c).evaluations if e.region == service_region and e.processes == 1]
    return ev


def test_cross_region_rtt_counts_against_the_ttft_slo():
    # eu-central-1 consumers; g7e is offered in us-east-1 (RTT 90 ms) and us-west-2 (145 ms).
    plan = planned([flat()], traffic("eu-central-1"), ctx())
    by_region = {e.region: e for e in plan.evaluations if e.processes == 1}
    assert "eu-central-1" not in by_region
    assert "g7e.2xlarge: not offered in eu-central-1 (availability as of 2026-01-15)" in plan.notes
    east = by_region["us-east-1"]
    # c=1: 150 + 90 - 1 = 239 <= 300; c=4: 220 + 89 = 309 > 300.
    assert east.max_load == 1
    assert east.loads[0].histogram.first_failure.text() == "P99 TTFT 309 ms (incl. 90 ms network) > 300 ms at concurrency 4"
    west = by_region["us-west-2"]
    assert west.max_load == 1 and west.weighted_ttft_p99 == pytest.approx(150 + 145 - 1)
    assert plan.winner is east   # same price, lower transfer cost... and lower latency


def test_cross_region_transfer_is_charged_by_the_region_bytes_leave():
    t = traffic("us-east-1", rps=10.0)
    plan = planned([flat()], t, ctx())
    same, other = ({e.region: e for e in plan.evaluations if e.processes == 1}[r] for r in ("us-east-1", "us-east-2"))
    gb_in = 10 * 3600 * (256 * 4 + 750) / 1e9
    gb_out = 10 * 3600 * (128 * 180 + 750) / 1e9
    assert sum(other.fixed_by_hour) / 24 - sum(same.fixed_by_hour) / 24 == pytest.approx(gb_in * 0.02 + gb_out * 0.02)
    assert other.rtt_ms == 12 and same.rtt_ms == 1


def test_goodput_comes_from_the_records_when_present():
    # 100 requests at c=4: 90 fine, 5 too slow for the 300 ms TTFT SLO, 3 with ITL 50 ms, 2 failed.
    records = tuple([(100.0, 3.0, True)] * 90 + [(400.0, 3.0, True)] * 5 + [(100.0, 50.0, True)] * 3 + [(None, None, False)] * 2)
    ev = evaluate(flat(records=records), traffic(), "us-east-1", ctx())
    assert ev.goodput_exact
    assert ev.goodput_rps == pytest.approx(4 / 0.440 * 0.90)       # X = c / W = 4 / 0.44 s
    no_records = evaluate(flat(), traffic(), "us-east-1", ctx())
    assert not no_records.goodput_exact and no_records.goodput_rps == pytest.approx(4 / 0.440 * 0.98)


def test_e2e_is_rescaled_to_the_traffic_output_length():
    ev = evaluate(flat(itl_mean=2.0, output=128), traffic(output=256), "us-east-1", ctx())
    # W(4) = 440 ms measured at 128 tokens; at 256 tokens + 128 * 2.0 ms = 696 ms; S = 696 / 4 ms.
    assert ev.seconds_per_request == pytest.approx(0.696 / 4)
    assert any("E2E rescaled" in n for n in ev.notes)


def test_quality_and_support_matrix_rule_candidates_out():
    int8_on_blackwell = flat(precision="int8_wo")
    plan = planned([int8_on_blackwell], traffic(), ctx())
    assert plan.evaluations == [] and plan.winner is None
    (why,) = [why for label, why in plan.refused if label == f"{MODEL} int8_wo on g7e.2xlarge"]
    assert why.startswith("int8_wo is not supported on g7e.2xlarge (RTXPRO6000, sm120)")


def _write(tmp_path, name, mutate):
    doc = json.loads((SEED / "results" / "g6e.xlarge-int8_wo.json").read_text())
    mutate(doc)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_saturated_runs_are_skipped_and_rate_runs_use_their_mean_concurrency(tmp_path):
    def mutate(doc):
        doc["runs"][0]["summary"]["saturated"] = True
        doc["runs"][0]["summary"]["saturation_reason"] = "schedule lag p99 80 ms"
        doc["runs"][1]["load"] = {"mode": "rate", "concurrency": None, "rate_rps": 9.0, "arrival": "poisson"}
        doc["runs"][1]["summary"]["mean_concurrency"] = 3.7
    (cand,) = load_candidates([_write(tmp_path, "a.json", mutate)])
    assert cand.curve.levels == [3.7, 8, 16, 32, 48, 64]
    assert any("client saturated (schedule lag p99 80 ms)" in n for n in cand.curve.notes)


def test_two_files_for_one_pair_merge_and_keep_the_bigger_sample(tmp_path):
    def small(doc):
        doc["runs"] = doc["runs"][:2]
        for run in doc["runs"]:
            run["summary"]["ttft_ms"]["count"] = 50
            run["summary"]["ttft_ms"]["p99"] = 999.0
    (cand,) = load_candidates([str(SEED / "results" / "g6e.xlarge-int8_wo.json"), _write(tmp_path, "b.json", small)])
    assert cand.curve.points[0].ttft_p99 == 30 and len(cand.sources) == 2
    assert any("measured twice" in n for n in cand.curve.notes)


def test_a_results_file_for_another_model_is_refused(tmp_path):
    other = _write(tmp_path, "c.json", lambda d: d["labels"].update(model="llama-3.2-1b"))
    with pytest.raises(UserError, match="labels.model 'llama-3.2-1b' differs from 'gpt2-xl'"):
        load_candidates([str(SEED / "results" / "g6e.xlarge-int8_wo.json"), other])
