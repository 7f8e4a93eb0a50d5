"""Values whose shape is wrong in a way the schema alone did not check (issue 25, section 4).

Each was accepted before and cost a deploy or a relaunch loop: a calibration dataset given as a bucket or as
one file of the set (instances wait on a manifest that is not there), an SLO in seconds written as
milliseconds (the always-firing alarm blocks every refresh), a warm pool above the On-Demand group's ceiling
of a Spot pool, lax coercion (`max_concurrency: true` read as 1), an image tag of another release than
tensorrt_llm_version (1.2.1rc1 vs 1.2.1: its engines would be cached as 1.2.1), and an unknown region
reported as six other problems.
"""

from __future__ import annotations

import botocore.loaders
import pytest

from fleetcast.config import catalog
from fleetcast.contract.bucket import calibration_prefix

from .conftest import problems


def the_one(doc) -> str:
    found = problems(doc)
    assert len(found) == 1, found
    return found[0]


# ---------------------------------------------------------------- calibration.dataset is the staged prefix


@pytest.mark.parametrize("dataset,shown", [
    ("s3://staged-bucket", "the bucket alone"),
    ("s3://staged-bucket/", "the bucket alone"),
    ("s3://staged-bucket/calibration/lambada/train.jsonl", "the file 'train.jsonl'"),
    ("s3://staged-bucket/lambada/", "the prefix 'lambada/'"),
])
def test_a_calibration_dataset_that_is_not_a_staged_prefix_is_refused(doc, dataset, shown):
    doc["calibration"] = {"dataset": dataset}
    problem = the_one(doc)
    assert problem.startswith("calibration.dataset:") and shown in problem
    assert "fleetcast stage calibration" in problem and "calibration/" in problem


@pytest.mark.parametrize("dataset", ["s3://staged-bucket/calibration/lambada/", "s3://staged-bucket/calibration/lambada"])
def test_the_prefix_stage_calibration_writes_is_accepted(doc, dataset):
    assert calibration_prefix("lambada") == "calibration/lambada/"  # what `fleetcast stage calibration` writes
    doc["calibration"] = {"dataset": dataset}
    assert problems(doc) == []


# ---------------------------------------------------------------- SLOs in milliseconds


@pytest.mark.parametrize("field", ["ttft_p99_ms", "itl_p99_ms"])
def test_an_slo_below_a_millisecond_is_refused_as_seconds(doc, field):
    doc["slo"][field] = 0.3
    problem = the_one(doc)
    assert problem.startswith(f"slo.{field}:") and "0.3 s is 300 ms" in problem


# ---------------------------------------------------------------- warm pool of a Spot pool


def _spot_pool(doc, **spot):
    pool = doc["regions"][0]["pools"][0]
    pool["capacity"] = {"min": 1, "max": 8}
    pool["spot"] = {"on_demand_base": 1, **spot}
    return pool


def test_a_warm_pool_above_the_on_demand_ceiling_of_a_spot_pool_is_refused(doc):
    # The warm pool belongs to the On-Demand group, whose max is the fallback ceiling, here 2 (capacity.max 8).
    pool = _spot_pool(doc, on_demand_fallback_max=2)
    pool["warm_pool"] = {"size": 3}
    problem = the_one(doc)
    assert problem.startswith("regions[0].pools[0].warm_pool.size:") and "allowed: 0..2" in problem
    pool["warm_pool"] = {"size": 2}
    assert problems(doc) == []


# ---------------------------------------------------------------- strict scalars


@pytest.mark.parametrize("path,value,expected", [
    (("consumers", 0, "limits", "max_concurrency"), True, "got true; this field is a number"),
    (("regions", 0, "pools", 0, "capacity", "max"), "4", "got the text '4'; write the number without quotes"),
    (("regions", 0, "pools", 0, "capacity", "max"), 4.0, "this field is a whole number"),
    (("consumers", 0, "api_keys"), 1, "this field is true or false"),
    (("consumers", 0, "api_keys"), "yes", "this field is true or false"),
    (("slo", "ttft_p99_ms"), False, "got false; this field is a number"),
    (("version",), True, "got true; this field is a number"),
    (("regions", 0, "pools", 0, "rollout", "checkpoint_percentages"), [True, 100], "this field is a number"),
])
def test_lax_coercions_are_refused_naming_the_field(doc, path, value, expected):
    node = doc
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(key, str) and key not in node else node[key]
    node[path[-1]] = value
    problem = the_one(doc)
    dotted = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path).lstrip(".")
    assert problem.startswith(dotted + ":") and expected in problem, problem


def test_floats_still_take_whole_numbers(doc):
    doc["slo"]["ttft_p99_ms"] = 300
    doc["regions"][0]["pools"][0].setdefault("scaling", {})["target"] = 8
    assert problems(doc) == []


# ---------------------------------------------------------------- image tag names the whole release


@pytest.mark.parametrize("tag", ["1.2.1rc1", "1.2.10", "1.2.1.post1"])
def test_an_image_of_another_release_than_the_version_is_refused(doc, tag):
    doc["engine"]["image"] = f"nvcr.io/nvidia/tensorrt-llm/release:{tag}"
    problem = the_one(doc)
    assert f"TensorRT-LLM {tag}, which does not match tensorrt_llm_version '1.2.1'" in problem


def test_an_rc_image_with_the_rc_version_is_accepted(doc):
    doc["engine"].update(image="nvcr.io/nvidia/tensorrt-llm/release:1.2.1rc1", tensorrt_llm_version="1.2.1rc1")
    assert problems(doc) == []


# ---------------------------------------------------------------- unknown region, once


def test_an_unknown_region_is_one_problem_named_so(doc):
    doc["regions"][1]["region"] = "us-east-9"
    problem = the_one(doc)
    assert problem.startswith("regions[1].region:") and "unknown region" in problem and "us-east-2" in problem


def test_an_unknown_consumer_region_is_one_problem(doc):
    doc["consumers"][1]["region"] = "us-west-7"
    problem = the_one(doc)
    assert problem.startswith("consumers[1].region:") and "unknown region" in problem


def test_known_regions_are_botocores_partitions():
    # Source: botocore/data/endpoints.json, partitions[].regions (the SDK that deploys knows no other).
    data = botocore.loaders.create_loader().load_data("endpoints")
    aws = next(p for p in data["partitions"] if p["partition"] == "aws")
    assert set(aws["regions"]) <= catalog.known_regions()
    assert {"ap-northeast-2", "us-east-1", "us-west-2", "cn-north-1", "us-gov-west-1"} <= catalog.known_regions()
