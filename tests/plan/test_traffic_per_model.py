"""A traffic profile of a fleet of several models carries one entry per (consumer region, model).

Interface 2 of issue 23: `consumers[].model` names the model (a `models[].id` of the config) whose arrivals
and lengths the entry gives; absent, the entry is the config's only model's.
"""

import pytest
from pydantic import ValidationError

from fleetcast.contract.errors import UserError
from fleetcast.plan.run import PlanOptions, build_packing
from fleetcast.plan.traffic import TrafficProfile, load_traffic

from .conftest import ROOT, SEED

ENTRY = {"region": "ap-northeast-2", "rate_rps": [10.0] * 24, "input_tokens": 256, "output_tokens": 128}


def _profile(*entries: dict) -> TrafficProfile:
    return TrafficProfile.model_validate({"schema": "fleetcast.traffic/v1", "name": "p", "consumers": list(entries)})


def test_one_region_may_carry_one_entry_per_model():
    p = _profile({**ENTRY, "model": "gpt2-xl"}, {**ENTRY, "model": "qwen2.5-1.5b", "rate_rps": [3.0] * 24})
    assert p.models == ("gpt2-xl", "qwen2.5-1.5b")
    assert [c.hourly_rps()[0] for c in p.for_model("qwen2.5-1.5b").consumers] == [3.0]
    assert p.checked_against(("gpt2-xl", "qwen2.5-1.5b")) is p


def test_the_same_region_and_model_twice_is_refused_naming_both():
    with pytest.raises(ValidationError, match=r"ap-northeast-2 \(model gpt2-xl\).*one entry per region and model"):
        _profile({**ENTRY, "model": "gpt2-xl"}, {**ENTRY, "model": "gpt2-xl"})


def test_a_one_model_profile_keeps_one_entry_per_region():
    with pytest.raises(ValidationError, match="listed twice: ap-northeast-2;"):
        _profile(ENTRY, ENTRY)
    assert _profile(ENTRY).models == ()
    assert _profile(ENTRY).for_model("gpt2-xl").consumers == _profile(ENTRY).consumers


def test_entries_with_and_without_model_do_not_mix():
    with pytest.raises(ValidationError, match=r"consumers\[\]\.model is set on some entries but not on those of "
                                              r"us-east-1.*one of gpt2-xl"):
        _profile({**ENTRY, "model": "gpt2-xl"}, {**ENTRY, "region": "us-east-1"})


def test_against_a_config_of_several_models_an_entry_without_model_names_the_field_and_the_models():
    with pytest.raises(UserError, match=r"--traffic: consumers\[0\]\.model is missing \(region ap-northeast-2\): the "
                                        r"config serves 2 models; allowed: gpt2-xl, qwen2.5-1.5b"):
        _profile(ENTRY).checked_against(("gpt2-xl", "qwen2.5-1.5b"))


def test_a_model_the_config_does_not_serve_is_refused_listing_the_allowed():
    with pytest.raises(UserError, match=r"consumers\[1\]\.model 'llama' is not a model of the config; allowed: gpt2-xl$"):
        _profile({**ENTRY, "model": "gpt2-xl"}, {**ENTRY, "region": "us-east-1", "model": "llama"}
                 ).checked_against(("gpt2-xl",))


def test_the_planner_checks_the_profile_against_the_config_it_loads(tmp_path):
    text = (SEED / "traffic-seoul.yaml").read_text().replace("  - region: ap-northeast-2",
                                                           "  - region: ap-northeast-2\n    model: llama-3-8b")
    assert "model: llama-3-8b" in text
    path = tmp_path / "traffic.yaml"
    path.write_text(text)
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(path), config=str(ROOT / "config" / "fleet.yaml"))
    with pytest.raises(UserError, match=r"consumers\[0\]\.model 'llama-3-8b' is not a model of the config; "
                                        r"allowed: gpt2-xl"):
        build_packing(opts)


def test_naming_the_only_model_plans_exactly_as_leaving_it_out(tmp_path):
    plain = load_traffic(SEED / "traffic-seoul.yaml")
    named = plain.model_copy(update={"consumers": [c.model_copy(update={"model": "gpt2-xl"}) for c in plain.consumers]})
    config = str(ROOT / "config" / "fleet.yaml")
    a, _, _ = build_packing(PlanOptions(results=[str(SEED / "results")], traffic=None, config=config,
                                        traffic_profile=plain))
    b, _, _ = build_packing(PlanOptions(results=[str(SEED / "results")], traffic=None, config=config,
                                        traffic_profile=named))
    assert all(p.winner is not None for p in a.regions)
    assert [(p.winner.label, round(p.winner.cost_per_hour, 6)) for p in a.regions] == \
        [(p.winner.label, round(p.winner.cost_per_hour, 6)) for p in b.regions]
