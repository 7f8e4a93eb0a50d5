"""Messages for common mistakes (issue 14 item 12, issue 15 item 5): the key is named, the fix is said."""

import pytest

from .conftest import problems


def the_one(data) -> str:
    found = problems(data)
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("where,key,known", [
    ((), "Tags", "tags"),
    (("regions", 0, "pools", 0), "Instance_Type", "instance_type"),
    (("consumers", 0), "Limits", "limits"),
    (("regions", 0, "vpc"), "CIDR", "cidr"),
    (("engine",), "max_batchsize", "max_batch_size"),
])
def test_unknown_key_is_named_with_the_known_key_it_resembles(doc, where, key, known):
    node = doc
    for part in where:
        node = node[part]
    node[key] = node.pop(known) if known in node else 1
    found = problems(doc)
    mine = [p for p in found if f"unknown key {key!r}" in p]
    assert len(mine) == 1, found
    dotted = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in where).lstrip(".")
    assert mine[0].startswith(f"{dotted}.{key}:" if dotted else f"{key}:")
    assert f"did you mean {known!r}?" in mine[0]


def test_underscore_key_is_named_and_told_to_be_a_comment(doc):
    doc["regions"][0]["_comment"] = "seoul first"
    msg = the_one(doc)
    assert msg.startswith("regions[0]._comment: unknown key '_comment'")
    assert "use a YAML comment (# ...)" in msg and "allowed here: allowed_principals" in msg


def test_unknown_key_without_a_near_match_lists_what_is_allowed(doc):
    doc["operations"]["zzz"] = 1
    msg = the_one(doc)
    assert msg.startswith("operations.zzz: unknown key 'zzz'") and "did you mean" not in msg
    assert "allowed here: alarm_email, auto_approve_connections" in msg


def test_unquoted_account_id(doc):
    doc["provider"]["account"] = 111122223333  # what YAML reads from `account: 111122223333`
    msg = the_one(doc)
    assert msg.startswith("provider.account:") and "quote it: account ids are strings of 12 digits" in msg


def test_bad_cidr_of_a_new_vpc_is_the_one_error(doc):
    doc["regions"][0]["vpc"]["cidr"] = "10.40.0.0/33"
    msg = the_one(doc)  # not also vpc_id / subnet_ids / route_table_ids "required" of the other VPC form
    assert msg.startswith("regions[0].vpc.cidr:") and "10.40.0.0/33" in msg


def test_existing_vpc_is_recognised_by_its_vpc_id(doc):
    doc["regions"][0]["vpc"] = {"vpc_id": "vpc-0123456789abcdef0", "cidr": "10.40.0.0/16"}
    found = problems(doc)
    assert sorted(found) == [
        "regions[0].vpc.route_table_ids: required field is missing: Route tables of those subnets (for the S3 "
        "gateway endpoint)",
        "regions[0].vpc.subnet_ids: required field is missing: Private subnets, one per AZ, same order as "
        "availability_zones"]


def test_endpoint_service_of_another_region_is_refused(doc):
    doc["consumers"][1]["endpoint_service_name"] = "com.amazonaws.vpce.us-west-2.vpce-svc-0f1e2d3c4b5a69788"
    msg = the_one(doc)
    assert msg.startswith("consumers[1].endpoint_service_name:") and "service_region is us-east-1" in msg


def test_a_value_no_form_accepts_is_one_error_naming_each_form(doc):
    doc["regions"][0]["ami"]["id"] = "ami-xyz"
    msg = the_one(doc)
    assert msg == ("regions[0].ami.id: 'ami-xyz' is not allowed; it must match ^ami-[0-9a-f]{8}([0-9a-f]{9})?$ "
                   "or be 'latest'")


# ---------------------------------------------------------------- issue 32: say how to fix, name the field


def test_a_tab_indent_says_to_indent_with_spaces(tmp_path):
    from fleetcast.config import ConfigError, load_config

    path = tmp_path / "fleet.yaml"
    path.write_text('version: 1\nname: tabbed\nprovider:\n\taccount: "111122223333"\n')
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    (issue,) = exc.value.issues
    assert "line 4, column 1: a tab indents this line; YAML indents with spaces only" in issue.message
    assert "cannot start any token" not in issue.message


def test_a_region_without_pools_says_what_a_pool_needs(doc):
    doc["regions"][0]["pools"] = []
    assert the_one(doc) == ("regions[0].pools: an empty list; needs at least 1 item(s), each with name, "
                            "instance_type, capacity")
    del doc["regions"][0]["pools"]
    assert the_one(doc) == "regions[0].pools: required field is missing; a list of entries, each with name, " \
                           "instance_type, capacity"


def test_a_number_out_of_bounds_names_the_range_not_pydantics_words(doc):
    doc["regions"][0]["pools"][0]["serves"] = [{"model": "gpt2-xl", "kv_cache_gb": -1}]
    assert the_one(doc) == "regions[0].pools[0].serves[0].kv_cache_gb: got -1; allowed: above 0 and at most 4096"
    doc["regions"][0]["pools"][0]["serves"] = [{"model": "gpt2-xl", "copies": 0}]
    assert the_one(doc) == "regions[0].pools[0].serves[0].copies: got 0; allowed: at least 1 and at most 64"


@pytest.mark.parametrize("change,where", [
    # A model validator's refusal is located at the field it names, not at the model that holds it.
    (lambda d: d["engine"].update(image="nvcr.io/nvidia/tensorrt-llm/release:1.2.1rc1"), "engine.image"),
    (lambda d: d["regions"][0]["pools"][0]["capacity"].update(min=5, max=4), "regions[0].pools[0].capacity.max"),
    (lambda d: d["regions"][0]["pools"][0]["capacity"].update(desired=9), "regions[0].pools[0].capacity.desired"),
    (lambda d: d["regions"][0]["pools"][0]["scaling"].update(slo_scale_in_ratio=0.9),
     "regions[0].pools[0].scaling.slo_scale_in_ratio"),
    (lambda d: d["regions"][0]["pools"][0].update(rollout={"min_healthy_percentage": 0, "max_healthy_percentage": 100}),
     "regions[0].pools[0].rollout.min_healthy_percentage"),
    (lambda d: d["regions"][0]["pools"][0].update(capacity_reservations_only=True),
     "regions[0].pools[0].capacity_reservations_only"),
    (lambda d: d["model"].update(engine={"port": 9000}), "model.engine.port"),
])
def test_errors_of_model_validators_name_their_field(doc, change, where):
    change(doc)
    assert the_one(doc).startswith(where + ":")


def test_an_oversized_config_is_blamed_on_what_makes_it_so(doc):
    import random
    import string

    rng = random.Random(32)
    doc["model"]["stage_patterns"] = ["".join(rng.choice(string.ascii_letters) for _ in range(200)) for _ in range(120)]
    msg = the_one(doc)
    assert msg.startswith("model.stage_patterns: the config is") and "SSM parameter" in msg


@pytest.mark.parametrize("text,expected", [
    ("tags: {true: yes}", "a key YAML reads as the boolean true"),
    ("tags:\n  owner: a\n  2024: b", "a key YAML reads as the number 2024"),
    ("tags: {~: b}", "a key YAML reads as null"),
])
def test_a_key_yaml_reads_as_a_boolean_number_or_null_is_refused_not_rewritten(tmp_path, text, expected):
    # YAML 1.2 core schema: unquoted true/false, numbers and ~ are not strings; str() made `true` a tag `True`.
    from fleetcast.config import ConfigError
    from fleetcast.config.loader import read_document

    path = tmp_path / "fleet.yaml"
    path.write_text(f"version: 1\nname: keys\n{text}\n")
    with pytest.raises(ConfigError) as exc:
        read_document(path)
    (issue,) = exc.value.issues
    assert issue.dotted == "tags" and expected in issue.message and "quote it" in issue.message
    path.write_text("version: 1\nname: keys\ntags: {'true': 'yes'}\n")
    assert read_document(path)[0]["tags"] == {"true": "yes"}
