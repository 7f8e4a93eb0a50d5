"""Several models on one fleet (issue 21, §1): the `models:` list, what each pool serves, and the
single-model form that keeps validating and deploying the same fleet."""

import copy
import json
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from fleetcast.config import load_config, parse_config
from fleetcast.config.impact import diff_configs, render_impact
from fleetcast.config.memory import GIB, plan_pool
from fleetcast.contract.errors import UserError
from fleetcast.contract.serving import process_slots

from .conftest import DEFAULT, problems

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "multi-model" / "fleet.yaml"

# The top-level keys and model keys of a one-model fleet's dump before `models:` existed: what its SSM
# config parameter, digests and so its templates are made of.
SINGLE_FORM_KEYS = ["version", "name", "provider", "model", "engine", "calibration", "slo", "network", "operations",
                    "regions", "consumers", "tags"]
SINGLE_FORM_MODEL_KEYS = ["id", "family", "source", "revision", "context_length", "max_input_len", "max_output_len",
                          "hub_token_secret", "stage_patterns"]


@pytest.fixture(scope="module")
def example_doc() -> dict:
    return YAML(typ="safe").load(EXAMPLE.read_text())


@pytest.fixture
def multi(example_doc) -> dict:
    return copy.deepcopy(example_doc)


def as_list_form(doc: dict) -> dict:
    """The same fleet written with `models:` (what the README tells users to do)."""
    doc = copy.deepcopy(doc)
    model = doc.pop("model")
    calibration = doc.pop("calibration", None)
    if calibration is not None:
        model["calibration"] = calibration
    doc["models"] = [model]
    return doc


# ---------------------------------------------------------------- the single-model form


def test_the_single_model_form_is_a_one_model_list(doc):
    cfg = parse_config(doc)
    assert [m.id for m in cfg.models] == ["gpt2-xl"]
    assert cfg.model is cfg.models[0]
    pool = cfg.regions[0].pools[0]
    (served,) = cfg.served_by(pool)
    assert (served.model.id, served.copies, served.kv_cache_bytes) == ("gpt2-xl", 1, None)
    assert served.engine == cfg.engine_for(pool, "gpt2-xl") == cfg.engine_for(pool)


def test_a_one_model_fleet_dumps_as_before_the_list_existed(doc):
    data = parse_config(doc).model_dump(mode="json")
    assert list(data) == SINGLE_FORM_KEYS
    assert list(data["model"]) == SINGLE_FORM_MODEL_KEYS
    assert all("serves" not in p for r in data["regions"] for p in r["pools"])


def test_moving_to_the_list_form_rolls_nothing_and_changes_no_template_input(doc):
    doc["calibration"] = {"dataset": "s3://staged-bucket/calibration/lambada/"}
    single, listed = parse_config(doc), parse_config(as_list_form(doc))
    assert single == listed
    assert single.model_dump_json() == listed.model_dump_json()  # the SSM config parameter's value
    assert single.digest() == listed.digest()
    for region in single.regions:
        for pool in region.pools:
            assert single.instance_digest(region.region, pool.name) == listed.instance_digest(region.region, pool.name)
    assert listed.model.calibration.dataset == "s3://staged-bucket/calibration/lambada/"
    assert diff_configs(single, listed).changes == []


def test_config_show_prints_the_list_form_of_a_single_model_file(capsys):
    out, _ = _show(DEFAULT, capsys)
    data = YAML(typ="safe").load(out)
    assert "model" not in data and "calibration" not in data
    assert [m["id"] for m in data["models"]] == ["gpt2-xl"]
    assert data["models"][0]["calibration"] is None and data["models"][0]["consumers"] is None
    # The printed form reads back as the same fleet (engine.precision, which both pools set, is left out).
    printed, original = parse_config(data), load_config(DEFAULT)
    assert printed.model_copy(update={"engine": original.engine}) == original
    assert all(printed.engine_for(p) == original.engine_for(p) for r in original.regions for p in r.pools)


def test_model_and_models_together_are_refused(doc, example_doc):
    doc["models"] = example_doc["models"]
    (msg,) = problems(doc)
    assert "both `model:` and `models:`" in msg


def test_top_level_calibration_needs_the_single_model_form(multi):
    multi["calibration"] = {"dataset": "s3://staged-bucket/calibration/lambada/"}
    (msg,) = problems(multi)
    assert "models[].calibration" in msg


def test_errors_in_a_single_model_file_name_its_own_paths(doc):
    doc["model"]["max_output_len"] = 512
    (msg,) = problems(doc)
    assert msg.startswith("model.max_output_len:")


# ---------------------------------------------------------------- the list form


def test_the_example_validates_with_three_models_two_packings_and_one_restricted_consumer():
    cfg = load_config(EXAMPLE)
    assert [m.id for m in cfg.models] == ["gpt2-xl", "qwen2.5-0.5b", "qwen2.5-3b"]
    l40s, l4 = cfg.regions[0].pools
    assert [(s.model.id, s.copies) for s in cfg.served_by(l40s)] == [("gpt2-xl", 1), ("qwen2.5-0.5b", 2),
                                                                     ("qwen2.5-3b", 1)]
    assert [s.kv_cache_bytes for s in cfg.served_by(l40s)] == [8 * GIB, 4 * GIB, 4 * GIB]
    assert cfg.models_for("analytics") == ("gpt2-xl", "qwen2.5-0.5b")
    assert cfg.models_for("voice-app") == ("gpt2-xl", "qwen2.5-0.5b", "qwen2.5-3b")
    # The L4 pool gives no budgets: the instance plans them; validate counts an equal share for each copy,
    # and the processes fill the usable memory.
    assert [s.kv_cache_bytes for s in cfg.served_by(l4)] == [None, None, None]
    plan = plan_pool(cfg, l4)
    shares = {p.kv_bytes for p in plan.processes}
    assert len(shares) == 1 and shares.pop() > 2 * GIB  # 22.49 GiB x 0.9 less weights and overheads, by 3
    assert plan.fits and plan.usable_bytes - plan.planned_bytes < 8  # rounding only


def test_a_model_a_person_names_is_found_or_refused_naming_where_and_listing_the_models():
    cfg = load_config(EXAMPLE)
    assert cfg.model_named("qwen2.5-3b").id == "qwen2.5-3b"
    with pytest.raises(UserError) as refused:
        cfg.model_named("llama", "--model")
    assert str(refused.value) == ("--model 'llama' is not a model of the config; allowed: gpt2-xl, qwen2.5-0.5b, "
                                  "qwen2.5-3b")
    assert refused.value.exit_code == 2  # the command line itself


def test_engine_precedence_is_fleet_then_model_then_pool(multi):
    multi["engine"]["max_batch_size"] = 16
    multi["models"][1]["engine"]["max_batch_size"] = 48
    multi["regions"][0]["pools"][0]["engine"] = {"max_batch_size": 8}
    del multi["models"][0]["engine"]["max_batch_size"]
    cfg = parse_config(multi)
    l40s, l4 = cfg.regions[0].pools
    assert cfg.engine_for(l4, "gpt2-xl").max_batch_size == 16  # fleet default
    assert cfg.engine_for(l4, "qwen2.5-0.5b").max_batch_size == 48  # the model's
    assert cfg.engine_for(l40s, "qwen2.5-0.5b").max_batch_size == 8  # the pool's, for every model it serves
    assert cfg.engine_for(l4, "qwen2.5-0.5b").backend.value == "pytorch"
    with pytest.raises(UserError, match="serves 3 models"):
        cfg.engine_for(l4)


def test_without_serves_a_pool_runs_one_copy_of_every_model(multi):
    multi["regions"][0]["pools"] = multi["regions"][0]["pools"][1:]
    del multi["regions"][0]["pools"][0]["serves"]
    cfg = parse_config(multi)
    assert [(s.model.id, s.copies) for s in cfg.served_by(cfg.regions[0].pools[0])] == [
        ("gpt2-xl", 1), ("qwen2.5-0.5b", 1), ("qwen2.5-3b", 1)]


def test_process_slots_follow_the_serves_order_with_copies_together():
    cfg = load_config(EXAMPLE)
    slots = process_slots(cfg.served_by(cfg.regions[0].pools[0]))
    assert [(s.model_id, s.copy_index, s.port) for s in slots] == [
        ("gpt2-xl", 0, 8001), ("qwen2.5-0.5b", 0, 8002), ("qwen2.5-0.5b", 1, 8003), ("qwen2.5-3b", 0, 8004)]
    assert all(s.address.startswith("127.0.0.1:") for s in slots)


def test_a_one_model_fleet_keeps_its_engine_port():
    cfg = load_config(DEFAULT)
    (slot,) = process_slots(cfg.served_by(cfg.regions[0].pools[0]))
    assert slot.port == cfg.engine.port + 1  # where the single engine process has always listened


# ---------------------------------------------------------------- validation


def test_model_and_adapter_ids_are_unique(multi):
    multi["models"][2]["id"] = "gpt2-xl"
    found = problems(multi)
    assert any(p.startswith("models[2].id:") and "already the id of model gpt2-xl" in p for p in found), found


def test_an_adapter_id_may_not_reuse_a_model_id(multi):
    multi["models"][1]["adapters"] = [{"id": "qwen2.5-3b", "source": "org/qwen-lora"}]
    found = problems(multi)
    assert any(p.startswith("models[2].id:") and "an adapter of qwen2.5-0.5b" in p for p in found), found


def test_a_model_id_must_be_a_plain_openai_model_name(multi):
    multi["models"][0]["id"] = "gpt2 xl/v1"
    (msg,) = [p for p in problems(multi) if p.startswith("models[0].id")]
    assert "is not a model id: 1-64 of letters, digits and . _ - : /" in msg


def rename(doc: dict, old: str, new: str) -> dict:
    """`doc` with model `old` called `new` wherever the config names it."""
    for model in doc["models"]:
        if model["id"] == old:
            model["id"] = new
    for region in doc["regions"]:
        for pool in region["pools"]:
            for serve in pool.get("serves", []):
                if serve["model"] == old:
                    serve["model"] = new
    return doc


def test_hub_and_fine_tune_ids_are_model_ids(multi):
    # What OpenAI and vLLM users name models: org/name (the hub's) and ft:base:org::id (OpenAI's fine-tunes).
    rename(multi, "qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct")
    rename(multi, "gpt2-xl", "ft:gpt-3.5-turbo:acme::8abc1234")
    multi["models"][2]["adapters"] = [{"id": "acme/qwen-3b:support", "source": "org/qwen-lora"}]
    multi["consumers"][1]["limits"] = {"models": {"Qwen/Qwen2.5-0.5B-Instruct": {"max_concurrency": 4}}}
    cfg = parse_config(multi)
    assert cfg.models_for("voice-app") == ("ft:gpt-3.5-turbo:acme::8abc1234", "Qwen/Qwen2.5-0.5B-Instruct",
                                           "qwen2.5-3b", "acme/qwen-3b:support")


def test_a_model_alarm_name_past_cloudwatchs_limit_is_refused_naming_the_model(multi):
    long_id = "a" + ":" * 63  # 64 characters, 63 of them escaped to 3 each in the alarm name
    rename(multi, "qwen2.5-0.5b", long_id)
    multi["regions"][0]["pools"][0]["name"] = "l40s-pool-with-a-long-name-xxxxx"
    (msg,) = problems(multi)
    assert msg.startswith("models[1].id:") and "CloudWatch alarm names hold at most 255" in msg


def test_entitlements_name_existing_consumers(multi):
    multi["models"][2]["consumers"] = ["voice-app", "billing"]
    (msg,) = problems(multi)
    assert msg.startswith("models[2].consumers[1]:") and "'billing' is not a consumer" in msg
    assert "voice-app, analytics" in msg


def test_an_empty_entitlement_list_means_nobody(multi):
    multi["models"][2]["consumers"] = []
    cfg = parse_config(multi)
    assert "qwen2.5-3b" not in cfg.models_for("voice-app")
    assert cfg.model_dump(mode="json")["models"][2]["consumers"] == []


def test_adapters_only_on_the_pytorch_backend(multi):
    multi["models"][0]["adapters"] = [{"id": "gpt2-xl-support", "source": "org/gpt2-lora"}]
    found = problems(multi)
    assert found and all(p.startswith("models[0].adapters:") for p in found)
    assert "tensorrt backend" in found[0] and "pytorch" in found[0]


def test_adapters_on_a_pytorch_model_are_entitled_with_it(multi):
    multi["models"][2]["adapters"] = [{"id": "qwen2.5-3b-support", "source": "s3://staged-bucket/adapters/support/"}]
    cfg = parse_config(multi)
    assert cfg.models_for("voice-app")[-2:] == ("qwen2.5-3b", "qwen2.5-3b-support")
    assert "qwen2.5-3b-support" not in cfg.models_for("analytics")


def test_an_adapter_revision_stays_inside_its_staged_prefix(multi):
    multi["models"][2]["adapters"] = [{"id": "qwen2.5-3b-support", "source": "org/lora", "revision": "../main"}]
    (msg,) = problems(multi)
    assert msg.startswith("models[2].adapters[0].revision:") and "cannot be a revision" in msg
    multi["models"][2]["adapters"][0]["revision"] = "0123abcd"
    assert parse_config(multi).models[2].adapters[0].revision == "0123abcd"


@pytest.mark.parametrize("key", ["tensorrt_llm_version", "image", "image_digest", "port"])
def test_one_tensorrt_llm_version_and_image_per_fleet(multi, key):
    multi["models"][1]["engine"][key] = {"port": 9000, "tensorrt_llm_version": "1.3.0"}.get(
        key, "nvcr.io/nvidia/tensorrt-llm/release:1.3.0")
    (msg,) = problems(multi)
    assert msg.startswith("models[1]") and f"engine.{key} is fleet-wide" in msg


def test_each_model_precision_is_checked_on_each_pool_gpu(multi):
    multi["models"][1]["engine"]["precision"] = "int8_wo"  # not on the pytorch backend
    found = problems(multi)
    assert len(found) == 2 and all(p.startswith("models[1].engine.precision:") for p in found)
    assert "int8_wo is not available on the pytorch backend" in found[0] and "(model qwen2.5-0.5b)" in found[0]


def test_a_pool_engine_override_is_blamed_for_every_model_it_breaks(multi):
    multi["regions"][0]["pools"][1]["engine"] = {"precision": "int8_wo"}
    found = problems(multi)
    assert found and all(p.startswith("regions[0].pools[1].engine.precision:") for p in found)
    assert {p.split("(model ")[1] for p in found} == {"qwen2.5-0.5b)", "qwen2.5-3b)"}


def test_serves_names_known_models_once(multi):
    serves = multi["regions"][0]["pools"][1]["serves"]
    serves.append({"model": "llama-3.2-1b"})
    serves.append({"model": "gpt2-xl"})
    found = problems(multi)
    assert any(p.startswith("regions[0].pools[1].serves[3].model:") and "not a model" in p for p in found), found
    assert any(p.startswith("regions[0].pools[1].serves[4].model:") and "listed twice" in p for p in found), found


def test_the_pools_of_a_region_serve_the_same_models(multi):
    multi["regions"][0]["pools"][1]["serves"].pop()
    (msg,) = problems(multi)
    assert msg.startswith("regions[0].pools[1].serves:") and "load balancer" in msg


def test_what_a_pool_serves_must_fit_its_gpu_with_the_arithmetic(multi):
    multi["regions"][0]["pools"][0]["serves"][2]["kv_cache_gb"] = 16
    (msg,) = problems(multi)
    assert msg.startswith("regions[0].pools[0].serves:")
    assert "qwen2.5-3b 1 x (weights 5.76 GiB at bf16 + overhead 2.21 GiB (1.17 GiB measured, activations 0.84 GiB " \
        "estimated, 32 CUDA graphs 0.20 GiB from source) + KV 16.00 GiB)" in msg
    assert "= 48.73 GiB; the L40S has 44.99 GiB usable (nvidia-smi), 40.49 GiB after 10% headroom" in msg
    assert "at most 40.49 GiB" in msg


def test_copies_count_in_the_memory_sum(multi):
    multi["regions"][0]["pools"][0]["serves"][1]["copies"] = 3
    (msg,) = problems(multi)
    assert "qwen2.5-0.5b 3 x (" in msg and "= 43.46 GiB" in msg


def test_several_processes_need_each_model_size(multi):
    del multi["models"][1]["parameters_b"]
    found = problems(multi)
    assert found and all(p.startswith("models[1].parameters_b:") for p in found)
    assert "engine processes on one L40S" in found[0]


def test_engine_ports_follow_the_gateway_port(multi):
    multi["engine"]["port"] = 9000
    cfg = parse_config(multi)
    assert [s.port for s in process_slots(cfg.served_by(cfg.regions[0].pools[0]))] == [9001, 9002, 9003, 9004]
    multi["engine"]["port"] = 65533
    found = problems(multi)
    assert any(p.startswith("engine.port:") and "l40s's 4 engine processes" in p and "65537" in p for p in found), found


def test_each_model_has_its_own_length_limits(multi):
    multi["models"][0]["max_output_len"] = 512
    (msg,) = problems(multi)
    assert msg.startswith("models[0].max_output_len:") and "1280 exceeds the model's context_length 1024" in msg


# ---------------------------------------------------------------- what a change rolls


def test_repacking_a_pool_rolls_that_pool_only_and_says_so(example_doc):
    after = copy.deepcopy(example_doc)
    after["regions"][0]["pools"][0]["serves"][1]["copies"] = 1
    impact = diff_configs(parse_config(example_doc), parse_config(after))
    by_pool = {p.pool: p for p in impact.pools}
    assert by_pool["l40s"].outcome == "rolls" and by_pool["l4"].outcome == "kept"
    assert by_pool["l40s"].models == ("re-packs qwen2.5-0.5b: copies 2 -> 1",)
    assert "    re-packs qwen2.5-0.5b: copies 2 -> 1" in render_impact(impact)
    assert [c.path for c in impact.changes] == ["regions[ap-northeast-2].pools[l40s].serves[qwen2.5-0.5b].copies"]


def test_adding_and_removing_a_model_rolls_the_pools_that_serve_it(example_doc):
    after = copy.deepcopy(example_doc)
    after["models"].pop(2)
    for pool in after["regions"][0]["pools"]:
        pool["serves"].pop(2)
    impact = diff_configs(parse_config(example_doc), parse_config(after))
    assert {(p.pool, p.outcome, p.models) for p in impact.pools} == {
        ("l40s", "rolls", ("removes qwen2.5-3b",)), ("l4", "rolls", ("removes qwen2.5-3b",))}
    back = diff_configs(parse_config(after), parse_config(example_doc))
    assert {p.models for p in back.pools} == {("adds qwen2.5-3b (1 copy)",)}


def test_a_model_served_in_another_region_rolls_nothing_here(example_doc):
    """Each pool's instance digest holds only the models it serves."""
    before = parse_config(example_doc)
    after = copy.deepcopy(example_doc)
    after["models"][1]["max_output_len"] = 256
    changed = parse_config(after)
    digests = {p.name: before.instance_digest("ap-northeast-2", p.name) for p in before.regions[0].pools}
    # Move qwen2.5-0.5b from both pools to another region: a change to it no longer reaches them.
    moved = []
    for doc in (copy.deepcopy(example_doc), after):
        for pool in doc["regions"][0]["pools"]:
            pool["serves"] = [s for s in pool["serves"] if s["model"] != "qwen2.5-0.5b"]
        moved.append(second_region(doc, ["qwen2.5-0.5b"]))
    a, b = (parse_config(d) for d in moved)
    assert all(a.instance_digest("ap-northeast-2", n) == b.instance_digest("ap-northeast-2", n) for n in digests)
    assert changed.instance_digest("ap-northeast-2", "l40s") != digests["l40s"]


def test_entitlements_and_model_slos_roll_nothing(example_doc):
    after = copy.deepcopy(example_doc)
    after["models"][0]["slo"] = {"ttft_p99_ms": 200, "itl_p99_ms": 30}
    impact = diff_configs(parse_config(example_doc), parse_config(after))
    assert not impact.rolls  # read by the stacks (alarms) only
    after["models"][2]["consumers"] = ["voice-app", "analytics"]
    impact = diff_configs(parse_config(example_doc), parse_config(after))
    # Who may call which model reaches running gateways through their config refresh
    # (runtime/gateway/reload.py), as consumer changes do: no pool rolls, and the plan says so.
    assert not impact.rolls and all(p.models == () for p in impact.pools)
    assert impact.entitlements_changed == ["qwen2.5-3b"]
    assert "Entitlements changed (models[qwen2.5-3b].consumers): no rollout; gateways pick it up within 60 s." \
        in render_impact(impact)


def test_per_model_limits_name_a_model_the_consumer_may_call(multi):
    multi["consumers"][1]["limits"] = {"models": {"gpt2-xl": {"max_concurrency": 4}, "qwen2.5-3b": {}}}
    (msg,) = problems(multi)
    assert msg.startswith("consumers[1].limits.models.qwen2.5-3b:") and "analytics may not call" in msg
    del multi["consumers"][1]["limits"]["models"]["qwen2.5-3b"]
    cfg = parse_config(multi)
    assert cfg.consumers[1].limits.models["gpt2-xl"].max_concurrency == 4
    assert "models" not in parse_config(copy.deepcopy(multi) | {"consumers": multi["consumers"][:1]}).model_dump(
        mode="json")["consumers"][0]["limits"]  # absent per-model limits leave the stored config as it was


# ---------------------------------------------------------------- what no pool serves (issue 32, §2)


def second_region(doc: dict, serves: list[str]) -> dict:
    """`doc` with a us-east-1 region whose pool serves `serves`, and the analytics consumer moved there."""
    region = copy.deepcopy(doc["regions"][0])
    region.update(region="us-east-1", availability_zones=[{"name": "us-east-1a", "id": "use1-az1"},
                                                          {"name": "us-east-1b", "id": "use1-az2"}],
                  vpc={"cidr": "10.43.0.0/16"})
    region["pools"] = [dict(region["pools"][0], serves=[{"model": m, "kv_cache_gb": 4} for m in serves])]
    doc["regions"].append(region)
    consumer = doc["consumers"][1]
    consumer.update(region="us-east-1", service_region="us-east-1",
                    subnets=[{"id": "subnet-0f1e2d3c4b5a69781", "az_id": "use1-az1"}],
                    endpoint_service_name="com.amazonaws.vpce.us-east-1.vpce-svc-0f1e2d3c4b5a69788")
    return doc


def test_a_model_no_pool_serves_is_refused_once_with_its_adapters(multi):
    multi["models"][2]["adapters"] = [{"id": "qwen2.5-3b-support", "source": "org/qwen-lora"}]
    for pool in multi["regions"][0]["pools"]:
        pool["serves"] = [s for s in pool["serves"] if s["model"] != "qwen2.5-3b"]
    # One mistake, one problem: not also voice-app's entitlement to it, nor the adapter's id.
    (msg,) = problems(multi)
    assert msg.startswith("models[2].id:") and "no pool serves qwen2.5-3b (nor its adapters qwen2.5-3b-support)" in msg
    assert "allowed: add {model: qwen2.5-3b}" in msg


def test_a_consumer_entitled_to_a_model_its_region_does_not_serve_is_refused(multi):
    multi = second_region(multi, ["gpt2-xl", "qwen2.5-0.5b"])
    multi["models"][2]["consumers"] = ["voice-app", "analytics"]  # analytics now reaches us-east-1
    (msg,) = problems(multi)
    assert msg.startswith("models[2].consumers[1]:")
    assert "analytics reaches us-east-1 (its service_region), where no pool serves qwen2.5-3b" in msg
    multi["models"][2]["consumers"] = ["voice-app"]
    assert problems(multi) == []  # a model served in one region only, entitled to that region's consumers


def test_a_per_model_slo_in_seconds_is_refused_by_the_fleet_slo_rule(multi):
    multi["models"][1]["slo"] = {"ttft_p99_ms": 0.15, "itl_p99_ms": 20}
    fleet = copy.deepcopy(multi)
    fleet["slo"]["ttft_p99_ms"] = 0.3
    (msg,) = problems(multi)
    assert msg.startswith("models[1].slo.ttft_p99_ms:") and "is it seconds? 0.15 s is 150 ms" in msg
    # The same words as the fleet-wide SLO's refusal: one rule.
    fleet_msg = [p for p in problems(fleet) if p.startswith("slo.ttft_p99_ms:")][0]
    assert fleet_msg.split(": ", 1)[1].replace("0.3", "X").replace("300", "Y") == \
        msg.split(": ", 1)[1].replace("0.15", "X").replace("150", "Y")


def test_a_misnamed_serve_is_one_problem_not_also_an_unserved_model_or_a_packing_mismatch(multi):
    multi["regions"][0]["pools"][1]["serves"][0]["model"] = "gpt2-xxl"
    (msg,) = problems(multi)
    assert msg.startswith("regions[0].pools[1].serves[0].model:") and "'gpt2-xxl' is not a model" in msg


def _show(path: Path, capsys) -> tuple[str, str]:
    from scripts.cli import main

    assert main(["config", "show", str(path)]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_config_show_prints_yaml_for_a_yaml_file_and_json_for_a_json_file(tmp_path, capsys):
    out, _ = _show(EXAMPLE, capsys)
    with pytest.raises(ValueError):
        json.loads(out)
    shown = YAML(typ="safe").load(out)
    assert [m["id"] for m in shown["models"]] == ["gpt2-xl", "qwen2.5-0.5b", "qwen2.5-3b"]
    as_json = tmp_path / "fleet.json"
    as_json.write_text(json.dumps(YAML(typ="safe").load(EXAMPLE.read_text())))
    assert json.loads(_show(as_json, capsys)[0]) == shown


def test_config_show_leaves_out_fleet_engine_defaults_that_every_model_sets(capsys):
    """examples/multi-model sets backend, precision, max_batch_size and max_num_tokens on every model: the fleet
    engine's values of them build nothing (FleetConfig.engine_for: fleet <- model <- pool)."""
    out, _ = _show(EXAMPLE, capsys)
    shown = YAML(typ="safe").load(out)
    overridden = {"backend", "precision", "max_batch_size", "max_num_tokens"}
    assert not overridden & set(shown["engine"])
    assert {"tensorrt_llm_version", "image", "port", "kv_cache_dtype", "kv_cache_free_gpu_memory_fraction"} <= \
        set(shown["engine"])
    assert out.startswith("# engine.backend, engine.precision, engine.max_batch_size, engine.max_num_tokens: left out")
    # What it prints builds every pool as the file does.
    original, printed = load_config(EXAMPLE), parse_config(shown)
    for region in original.regions:
        for pool in region.pools:
            assert printed.instance_digest(region.region, pool.name) == original.instance_digest(region.region, pool.name)
    # config/fleet.yaml: both pools set their precision, so the fleet's is the one default no pool builds with.
    assert set(load_config(DEFAULT).engine.model_dump()) - set(YAML(typ="safe").load(_show(DEFAULT, capsys)[0])["engine"]) \
        == {"precision"}


def test_config_diff_sets_apart_fleet_engine_changes_no_pool_builds_with(example_doc):
    changed = copy.deepcopy(example_doc)
    changed["engine"]["precision"] = "fp8"  # every model sets its own precision
    changed["engine"]["kv_cache_free_gpu_memory_fraction"] = 0.8  # no model does: every pool builds with it
    impact = diff_configs(parse_config(example_doc), parse_config(changed))
    assert [c.path for c in impact.changes] == ["engine.kv_cache_free_gpu_memory_fraction"]
    assert [(c.path, c.before, c.after) for c in impact.no_effect] == [("engine.precision", "fp16", "fp8")]
    assert "Without effect (engine.precision fp16 -> fp8)" in render_impact(impact)
    del changed["engine"]["kv_cache_free_gpu_memory_fraction"]
    impact = diff_configs(parse_config(example_doc), parse_config(changed))
    assert not impact.changes and not impact.rolls
    assert render_impact(impact).startswith("No change") and "Without effect" in render_impact(impact)
