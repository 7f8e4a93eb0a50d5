"""`fleetcast config diff`: before a deploy, which pools a config change rolls and which it leaves alone."""

from __future__ import annotations

import copy
import json

from fleetcast.config import parse_config
from fleetcast.config.impact import diff_configs, render_impact
from scripts.cli import main as cli

SEOUL, VIRGINIA = "ap-northeast-2", "us-east-1"


def onboard(doc: dict) -> dict:
    """A new consumer account in Seoul, its principal allowed, and the Seoul pool resized."""
    doc = copy.deepcopy(doc)
    seoul = next(r for r in doc["regions"] if r["region"] == SEOUL)
    seoul["allowed_principals"].append("arn:aws:iam::123412341234:root")
    seoul["pools"][0]["capacity"] = {"min": 3, "max": 8}
    doc["consumers"].append({**copy.deepcopy(doc["consumers"][0]), "name": "newcomer", "account": "123412341234"})
    return doc


def outcomes(impact) -> dict[str, str]:
    return {f"{p.region}/{p.pool}": p.outcome for p in impact.pools}


def test_onboarding_and_resizing_roll_nothing_and_name_the_consumer(doc):
    impact = diff_configs(parse_config(doc), parse_config(onboard(doc)))
    assert outcomes(impact) == {f"{SEOUL}/l40s": "kept", f"{VIRGINIA}/l40s": "kept"}
    assert impact.consumers_changed == ["newcomer"]
    paths = {c.path: c.kind for c in impact.changes}
    assert paths["consumers[newcomer]"] == "added"
    assert paths[f"regions[{SEOUL}].pools[l40s].capacity.min"] == "changed"
    assert f"regions[{SEOUL}].allowed_principals" in paths


def test_an_engine_override_rolls_only_its_pool(doc):
    changed = copy.deepcopy(doc)
    virginia = next(r for r in changed["regions"] if r["region"] == VIRGINIA)
    virginia["pools"][0]["engine"]["max_batch_size"] = 16
    impact = diff_configs(parse_config(doc), parse_config(changed))
    assert outcomes(impact) == {f"{SEOUL}/l40s": "kept", f"{VIRGINIA}/l40s": "rolls"}
    (change,) = impact.changes
    assert (change.path, change.before, change.after) == (f"regions[{VIRGINIA}].pools[l40s].engine.max_batch_size",
                                                         None, 16)


def test_adding_calibration_rolls_only_pools_whose_precision_reads_it(doc):
    # The shipped pools are INT8 weight-only, which never calibrates (contract/support.py needs_calibration).
    calibrated = copy.deepcopy(doc)
    calibrated["calibration"] = {"dataset": "s3://fleetcast-staging/calibration/traffic/"}
    assert outcomes(diff_configs(parse_config(doc), parse_config(calibrated))) == {
        f"{SEOUL}/l40s": "kept", f"{VIRGINIA}/l40s": "kept"}
    # With an FP8 pool in Virginia, a new set rolls that pool only: its build reads the set.
    fp8 = copy.deepcopy(calibrated)
    next(r for r in fp8["regions"] if r["region"] == VIRGINIA)["pools"][0]["engine"]["precision"] = "fp8"
    resampled = copy.deepcopy(fp8)
    resampled["calibration"] = {"dataset": "s3://fleetcast-staging/calibration/traffic-v2/"}
    assert outcomes(diff_configs(parse_config(fp8), parse_config(resampled))) == {
        f"{SEOUL}/l40s": "kept", f"{VIRGINIA}/l40s": "rolls"}


def test_a_tag_change_retags_and_replaces_no_instance(doc, tmp_path, capsys):
    retagged = copy.deepcopy(doc)
    retagged["tags"] = {**retagged.get("tags", {}), "owner": "inference-team", "cost-center": "cc-42"}
    impact = diff_configs(parse_config(doc), parse_config(retagged))
    assert outcomes(impact) == {f"{SEOUL}/l40s": "kept", f"{VIRGINIA}/l40s": "kept"}
    assert impact.tags_changed
    text = render_impact(impact)
    assert "ROLLS" not in text
    # What a tag change does, as EC2 Auto Scaling documents it (API reference, TagDescription.PropagateAtLaunch:
    # "If you change a tag, the changed tag will be applied to all instances launched after you made the change").
    assert "Tags changed" in text and "instances launched from now on" in text and "running instances keep" in text


def test_reordering_named_items_is_no_change_and_a_new_pool_is_new(doc):
    reordered = copy.deepcopy(doc)
    reordered["consumers"].reverse()
    reordered["regions"].reverse()
    assert diff_configs(parse_config(doc), parse_config(reordered)).changes == []
    grown = copy.deepcopy(doc)
    seoul = next(r for r in grown["regions"] if r["region"] == SEOUL)
    seoul["pools"].append({**copy.deepcopy(seoul["pools"][0]), "name": "second"})
    assert outcomes(diff_configs(parse_config(doc), parse_config(grown)))[f"{SEOUL}/second"] == "new"


def test_cli_prints_the_plan_and_guards_pipelines_with_fail_on_roll(doc, tmp_path, capsys):
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(json.dumps(doc))  # JSON is YAML
    new.write_text(json.dumps(onboard(doc)))
    assert cli(["config", "diff", str(old), str(new), "--fail-on-roll"]) == 0
    out = capsys.readouterr().out
    assert f"{SEOUL}/l40s: kept: no instance replaced" in out and "Consumers changed (newcomer)" in out

    rolled = copy.deepcopy(doc)
    rolled["engine"]["max_batch_size"] = 32
    new.write_text(json.dumps(rolled))
    assert cli(["config", "diff", str(old), str(new), "--fail-on-roll", "--json"]) == 3
    report = json.loads(capsys.readouterr().out)
    assert report["rolls"] is True and {p["outcome"] for p in report["pools"]} == {"rolls"}
    assert report["changes"] == [{"path": "engine.max_batch_size", "kind": "changed", "before": 64, "after": 32}]


def test_an_invalid_new_config_is_refused_naming_the_field(doc, tmp_path, capsys):
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(json.dumps(doc))
    broken = copy.deepcopy(doc)
    broken["engine"]["max_batch_size"] = 0
    new.write_text(json.dumps(broken))
    assert cli(["config", "diff", str(old), str(new)]) == 1
    err = capsys.readouterr().err
    assert "engine.max_batch_size" in err and "Traceback" not in err


def test_deployed_compares_with_what_each_region_runs_now(doc, tmp_path, capsys, aws_env):
    """--deployed reads each provider region's config parameter (moto on loopback): Seoul runs the
    default config, Virginia was never deployed."""
    import boto3

    deployed = parse_config(doc)
    boto3.client("ssm", region_name=SEOUL).put_parameter(
        Name=deployed.config_parameter_name, Value=deployed.model_dump_json(), Type="String", Overwrite=True)
    rolled = copy.deepcopy(doc)
    rolled["engine"]["max_batch_size"] = 32
    new = tmp_path / "new.yaml"
    new.write_text(json.dumps(rolled))
    assert cli(["config", "diff", "--deployed", str(new), "--fail-on-roll"]) == 3
    out = capsys.readouterr().out
    assert f"== {SEOUL}: deployed config {deployed.digest()[:12]}" in out
    assert f"{SEOUL}/l40s: ROLLS" in out and f"{VIRGINIA}/l40s" not in out.split(f"== {VIRGINIA}")[0].split(
        f"== {SEOUL}")[1]
    assert f"== {VIRGINIA}: not deployed yet (no /fleetcast/config parameter)" in out

    new.write_text(json.dumps(onboard(doc)))
    assert cli(["config", "diff", "--deployed", str(new), "--region", SEOUL, "--json", "--fail-on-roll"]) == 0
    (region,) = json.loads(capsys.readouterr().out)
    assert region["region"] == SEOUL and region["rolls"] is False and region["consumers_changed"] == ["newcomer"]


def test_diff_arguments_are_checked(doc, tmp_path, capsys):
    one = tmp_path / "one.yaml"
    one.write_text(json.dumps(doc))
    assert cli(["config", "diff", str(one)]) == 2
    assert "OLD NEW" in capsys.readouterr().err
    assert cli(["config", "diff", "--deployed", str(one), str(one)]) == 2
    assert "takes one CONFIG" in capsys.readouterr().err
    assert cli(["config", "diff", "--deployed", str(one), "--region", "eu-west-9"]) == 2
    assert "not a provider region" in capsys.readouterr().err


def test_a_new_fleet_name_is_a_second_fleet_beside_the_old_one_not_a_rollout(doc, tmp_path, capsys):
    """Every stack is named after the fleet (contract/names.py provider_stack_name, consumer_stack_name), so a
    renamed config updates none of the old fleet's stacks: CloudFormation creates the new names as new stacks."""
    renamed = copy.deepcopy(doc)
    renamed["name"] = "voice"
    impact = diff_configs(parse_config(doc), parse_config(renamed))
    assert impact.renamed == ("fleetcast", "voice") and not impact.rolls
    assert outcomes(impact) == {f"{SEOUL}/l40s": "parallel", f"{VIRGINIA}/l40s": "parallel"}
    text = render_impact(impact)
    assert "ROLLS" not in text and "instance refresh" not in text
    assert "second, parallel fleet" in text and "fleet fleetcast keeps running" in text
    assert f"fleetcast-provider-{SEOUL} -> voice-provider-{SEOUL}" in text and "endpoint service names" in text

    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(json.dumps(doc))
    new.write_text(json.dumps(renamed))
    assert cli(["config", "diff", str(old), str(new), "--json", "--fail-on-roll"]) == 3
    report = json.loads(capsys.readouterr().out)
    assert report["parallel_fleet"] is True and report["renamed"] == {"before": "fleetcast", "after": "voice"}


def test_deployed_names_the_fleet_a_renamed_config_would_start_beside(doc, tmp_path, capsys, fresh_aws):
    """--deployed finds no parameter under the new name; the region's other provider stack is named instead."""
    from tests.deploy.fleet_stacks import create_provider_stack

    create_provider_stack("fleetcast", SEOUL)
    renamed = copy.deepcopy(doc)
    renamed["name"] = "voice"
    new = tmp_path / "new.yaml"
    new.write_text(json.dumps(renamed))
    assert cli(["config", "diff", "--deployed", str(new), "--region", SEOUL]) == 0
    out = capsys.readouterr().out
    assert f"The region runs fleetcast-provider-{SEOUL}: if this config renames that fleet" in out
    assert cli(["config", "diff", "--deployed", str(new), "--region", SEOUL, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["other_fleets"] == [f"fleetcast-provider-{SEOUL}"]


def test_a_cache_group_change_rolls_nothing_running_gateways_apply_it(doc):
    """Salts are the gateway's (docs/gateway.md, KV-cache isolation): regrouping consumers replaces no instance."""
    grouped = copy.deepcopy(doc)
    grouped["consumers"][0]["cache_group"] = "one-team"
    impact = diff_configs(parse_config(doc), parse_config(grouped))
    assert outcomes(impact) == {f"{SEOUL}/l40s": "kept", f"{VIRGINIA}/l40s": "kept"}
    assert impact.consumers_changed == [doc["consumers"][0]["name"]]
