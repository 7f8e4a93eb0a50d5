"""One test per validation rule: the broken field is named, and what is allowed is said."""

import subprocess
import sys

import pytest

from fleetcast.config import ConfigError, load_config

from .conftest import DEFAULT, problems


def the_one(data) -> str:
    found = problems(data)
    assert len(found) == 1, found
    return found[0]


def test_default_config_is_valid():
    cfg = load_config(DEFAULT)
    assert cfg.model.id == "gpt2-xl"
    assert [r.region for r in cfg.regions] == ["ap-northeast-2", "us-east-1"]
    seoul_pool = cfg.regions[0].pools[0]
    assert seoul_pool.instance_type == "g6e.xlarge"
    assert cfg.engine_for(seoul_pool).precision.value == "int8_wo"
    assert any(c.cross_region for c in cfg.consumers)


def test_config_is_immutable():
    cfg = load_config(DEFAULT)
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="frozen"):
        cfg.model.id = "other"  # type: ignore[misc]


def test_fp8_on_a10g_is_refused(doc):
    doc["regions"][0]["pools"][0].update(instance_type="g5.xlarge", engine={"precision": "fp8"})
    msg = the_one(doc)
    assert msg.startswith("regions[0].pools[0].engine.precision:")
    assert "fp8 is not supported on g5.xlarge (A10G, sm86)" in msg and "int8_wo" in msg


def test_fleet_default_precision_is_blamed_when_the_pool_does_not_override(doc):
    doc["engine"]["precision"] = "nvfp4"
    for region in doc["regions"]:
        region["pools"][0]["engine"] = {}
    found = problems(doc)
    assert found and all(p.startswith("engine.precision:") for p in found)
    assert "nvfp4 is not supported on g6e.xlarge" in found[0]


def test_nvfp4_outside_blackwell_is_refused(doc):
    doc["regions"][0]["pools"][0]["engine"] = {"precision": "nvfp4"}
    assert "nvfp4 is not supported on g6e.xlarge (L40S, sm89)" in the_one(doc)


def test_smoothquant_on_pytorch_backend_model_is_refused(doc):
    doc["model"].update(id="llama-3.2-1b", family="llama", source="meta-llama/Llama-3.2-1B", context_length=8192)
    doc["engine"]["backend"] = "pytorch"
    for region in doc["regions"]:
        region["pools"][0]["engine"] = {"precision": "int8_sq"}
    found = problems(doc)
    assert len(found) == 2
    assert all("int8_sq is not available on the pytorch backend" in p for p in found)


def test_gpt2_on_pytorch_backend_is_refused(doc):
    doc["engine"]["backend"] = "pytorch"
    found = problems(doc)
    assert any(p.startswith("engine.backend:") and "tensorrt backend only" in p for p in found)


def test_calibrated_precision_needs_staged_calibration_data(doc):
    doc["regions"][0]["pools"][0]["engine"] = {"precision": "int8_sq", "kv_cache_dtype": "int8"}
    msg = the_one(doc)
    assert msg.startswith("regions[0].pools[0].engine.kv_cache_dtype:") and "calibration.dataset" in msg
    doc["calibration"] = {"dataset": "s3://staged-bucket/calibration/cnn_dailymail/"}
    assert problems(doc) == []


def test_instance_family_not_offered_in_region(doc):
    doc["regions"][0]["pools"][0].update(instance_type="g7e.2xlarge", engine={"precision": "fp8"})
    doc["model"].update(family="llama", id="llama-3.2-1b", source="meta-llama/Llama-3.2-1B-Instruct", context_length=8192)
    doc["engine"].update(backend="pytorch", precision="fp16")
    for region in doc["regions"]:  # drop the engine-flow precision overrides
        for pool in region["pools"][1 if region is doc["regions"][0] else 0:]:
            pool.get("engine", {}).pop("precision", None)  # the engine flow is refused on g7e (sm120) anyway
    msg = the_one(doc)
    assert msg.startswith("regions[0].pools[0].instance_type:")
    assert "g7e instances are not offered in ap-northeast-2" in msg and "us-east-1" in msg


def test_unknown_instance_type(doc):
    doc["regions"][0]["pools"][0]["instance_type"] = "p5.48xlarge"
    assert "not a supported GPU instance type" in the_one(doc)


def test_cross_region_between_unsupported_regions(doc):
    doc["regions"][0]["allowed_regions"] = ["us-west-2"]
    msg = the_one(doc)
    assert msg.startswith("regions[0].allowed_regions[0]:") and "not in the supported table" in msg


def test_context_length_exceeded(doc):
    doc["model"]["max_output_len"] = 512
    msg = the_one(doc)
    assert msg.startswith("model.max_output_len:") and "1280" in msg and "1024" in msg


@pytest.mark.parametrize(
    "path,value,expected",
    [
        (("consumers", 0, "account"), "12345", "consumers[0].account"),
        (("regions", 0, "region"), "Seoul", "regions[0].region"),
        (("regions", 0, "vpc", "cidr"), "10.40.0.0/33", "regions[0].vpc.cidr"),
        (("consumers", 0, "cidrs"), ["10.60.0.1/16"], "consumers[0].cidrs"),
        (("consumers", 0, "subnets", 0, "id"), "subnet-xyz", "consumers[0].subnets[0].id"),
        (("regions", 0, "availability_zones", 0, "id"), "apne2az1", "regions[0].availability_zones[0].id"),
        (("consumers", 0, "vpc_id"), "vpc-123", "consumers[0].vpc_id"),
    ],
)
def test_malformed_identifiers(doc, path, value, expected):
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    found = problems(doc)
    assert any(p.startswith(expected + ":") for p in found), found


def test_open_cidr_is_refused(doc):
    doc["consumers"][0]["cidrs"] = ["0.0.0.0/0"]
    assert "0.0.0.0/0 is not allowed" in the_one(doc)


def test_wildcard_principal_is_refused(doc):
    doc["regions"][0]["allowed_principals"] = ["*"]
    found = problems(doc)
    assert any(p.startswith("regions[0].allowed_principals:") and "wildcard" in p for p in found)


def test_empty_principals_are_refused(doc):
    doc["regions"][0]["allowed_principals"] = []
    assert any("allowed_principals is empty" in p for p in problems(doc))


def test_fewer_than_two_azs(doc):
    doc["regions"][0]["availability_zones"] = doc["regions"][0]["availability_zones"][:1]
    msg = the_one(doc)
    assert msg.startswith("regions[0].availability_zones:") and "at least 2" in msg


def test_az_id_of_another_region(doc):
    doc["regions"][0]["availability_zones"][1]["id"] = "use1-az3"
    assert "not an AZ ID of ap-northeast-2" in the_one(doc)


def test_consumer_az_ids_must_overlap_the_provider(doc):
    for subnet, az_id in zip(doc["consumers"][0]["subnets"], ("apne2-az2", "apne2-az4")):
        subnet["az_id"] = az_id
    msg = the_one(doc)
    assert msg.startswith("consumers[0].subnets:") and "apne2-az1" in msg


def test_duplicate_regions(doc):
    doc["regions"][1] = dict(doc["regions"][0])
    assert any("appears 2 times" in p for p in problems(doc))


def test_duplicate_pools(doc):
    pools = doc["regions"][0]["pools"]
    pools.append(dict(pools[0]))
    assert "pool name 'l40s' is used twice" in the_one(doc)


def test_consumer_aimed_at_region_without_service(doc):
    doc["consumers"][0]["service_region"] = "eu-west-1"
    msg = the_one(doc)
    assert msg.startswith("consumers[0].service_region:") and "ap-northeast-2, us-east-1" in msg


def test_cross_region_consumer_needs_provider_permission(doc):
    doc["regions"][1]["allowed_regions"] = []
    msg = the_one(doc)
    assert msg.startswith("consumers[1].region:") and "allowed_regions" in msg


def test_consumer_account_must_be_an_allowed_principal(doc):
    doc["regions"][0]["allowed_principals"] = ["arn:aws:iam::999999999999:root"]
    assert "account 444455556666 is not among" in the_one(doc)


@pytest.mark.parametrize("capacity", [{"min": 3, "desired": 2, "max": 6}, {"min": 1, "desired": 7, "max": 6}])
def test_capacity_out_of_order(doc, capacity):
    doc["regions"][0]["pools"][0]["capacity"] = capacity
    msg = the_one(doc)
    assert msg.startswith("regions[0].pools[0].capacity.desired:") and "min <= desired <= max" in msg


def test_unknown_key_is_rejected_not_ignored(doc):
    doc["engine"]["precison"] = "fp16"
    msg = the_one(doc)
    assert msg.startswith("engine.precison:") and "unknown key" in msg


def test_every_error_is_reported_at_once(doc):
    doc["engine"]["max_batch_size"] = 0
    doc["consumers"][0]["account"] = "abc"
    doc["regions"][0]["pools"][0]["capacity"] = {"min": 2, "desired": 1, "max": 1}
    assert len(problems(doc)) == 3


def test_image_tag_must_match_the_pinned_version(doc):
    doc["engine"]["image"] = "nvcr.io/nvidia/tensorrt-llm/release:1.1.0"
    assert "does not match tensorrt_llm_version" in the_one(doc)


def test_malformed_yaml_reports_its_line(tmp_path):
    bad = tmp_path / "fleet.yaml"
    bad.write_text("version: 1\nname: x\nmodel: [unclosed\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert "malformed YAML at line" in err.value.render()


def test_errors_carry_yaml_line_numbers(tmp_path):
    text = DEFAULT.read_text().replace("max_output_len: 256", "max_output_len: 999")
    bad = tmp_path / "fleet.yaml"
    bad.write_text(text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "max_output_len: 999" in ln)
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert f"model.max_output_len (line {line})" in err.value.render()


def test_cli_validate_exit_codes(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "scripts.cli", "config", "validate", str(DEFAULT)],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    broken = tmp_path / "fleet.yaml"
    broken.write_text(DEFAULT.read_text().replace("instance_type: g6e.xlarge", "instance_type: g6e.hugemongous", 1))
    bad = subprocess.run([sys.executable, "-m", "scripts.cli", "config", "validate", str(broken)],
                         capture_output=True, text=True)
    assert bad.returncode == 1
    assert "regions[0].pools[0].instance_type" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_schema_export_is_json_schema(capsys):
    import json

    from scripts.cli import main

    assert main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "FleetConfig" and "regions" in schema["properties"]
    import jsonschema
    from ruamel.yaml import YAML
    jsonschema.validate(YAML(typ="safe").load(DEFAULT.read_text()), schema)


def test_digest_changes_with_the_config(doc):
    from fleetcast.config import parse_config
    a = parse_config(doc).digest()
    doc["engine"]["max_batch_size"] = 32
    assert parse_config(doc).digest() != a


def _pool_digests(cfg) -> dict[str, str]:
    return {f"{r.region}/{p.name}": cfg.instance_digest(r.region, p.name) for r in cfg.regions for p in r.pools}


def test_instance_digest_leaves_consumers_and_group_settings_out(doc):
    """Onboarding a consumer, resizing a pool or tuning its scaling, warm pool and rollout, the
    SLOs or the alarm address must not roll a GPU fleet: instances do not read them."""
    from fleetcast.config import parse_config
    base = parse_config(doc)
    doc["consumers"][0]["limits"]["max_concurrency"] += 1
    doc["consumers"].append({**doc["consumers"][0], "name": "late-joiner", "account": "123412341234"})
    seoul = next(r for r in doc["regions"] if r["region"] == doc["consumers"][0]["service_region"])
    seoul["allowed_principals"].append("arn:aws:iam::123412341234:root")
    pool = seoul["pools"][0]
    pool["capacity"] = {"min": 3, "max": 9}
    pool["scaling"] = {"metric": "active_requests", "target": 20}
    pool["warm_pool"] = {"size": 2}
    doc["slo"]["ttft_p99_ms"] = 450
    doc.setdefault("operations", {})["alarm_email"] = "oncall@example.com"
    more = parse_config(doc)
    assert more.digest() != base.digest()
    assert _pool_digests(more) == _pool_digests(base)


def test_instance_digest_follows_what_a_pool_is_built_from_and_nothing_else(doc):
    import copy

    from fleetcast.config import parse_config
    base = _pool_digests(parse_config(doc))
    fleet_wide = copy.deepcopy(doc)
    fleet_wide["engine"]["max_batch_size"] = 32  # every pool builds from it: every pool rolls
    changed = _pool_digests(parse_config(fleet_wide))
    assert all(changed[k] != base[k] for k in base)
    one_pool = copy.deepcopy(doc)
    virginia = next(r for r in one_pool["regions"] if r["region"] == "us-east-1")
    virginia["pools"][0]["engine"]["max_batch_size"] = 16  # that pool's override: only that pool rolls
    changed = _pool_digests(parse_config(one_pool))
    assert changed["us-east-1/l40s"] != base["us-east-1/l40s"]
    assert changed["ap-northeast-2/l40s"] == base["ap-northeast-2/l40s"]


def test_a_cache_group_is_a_name_and_its_error_says_where(doc):
    doc["consumers"][0]["cache_group"] = "Team A"
    (problem,) = problems(doc)
    assert problem.startswith("consumers[0].cache_group") and "Team A" in problem
