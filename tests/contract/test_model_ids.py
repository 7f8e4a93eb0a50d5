"""Model ids as OpenAI-compatible servers take them, and the one slug every name derived from an id uses
(fleetcast/contract/model_ids.py)."""

from __future__ import annotations

import botocore.loaders
import pytest

from fleetcast.contract import adapters, bucket
from fleetcast.contract.model_ids import (
    MODEL_ID_MAX,
    MODEL_SLUG_MAX,
    SLUG_SAFE,
    model_id_of,
    model_id_problem,
    model_slug,
)
from fleetcast.contract.names import ALARM_NAME_MAX, model_alarm_name

HUB_ID = "Qwen/Qwen2.5-0.5B-Instruct"
FINE_TUNE = "ft:gpt-3.5-turbo:acme::8abc1234"  # OpenAI's fine-tuned model names: ft:<base>:<org>:<suffix>:<id>


@pytest.mark.parametrize("model_id", ["gpt2-xl", "qwen2.5-0.5b", HUB_ID, FINE_TUNE, "meta-llama/Llama-3.1-8B",
                                      "org_1/model_v2"])
def test_ids_users_send_are_accepted(model_id):
    assert model_id_problem(model_id) is None


@pytest.mark.parametrize("model_id", ["", "/gpt2", "gpt2/", "a//b", "a/../b", "a/./b", "gpt2 xl", "gpt2\n", "g" * 65,
                                      "model?x", "m#1", "ünï"])
def test_ids_that_name_nothing_or_break_a_path_are_refused(model_id):
    assert model_id_problem(model_id) is not None


def test_an_id_of_the_old_alphabet_is_its_own_slug():
    # Staged prefixes, engine cache keys and alarm names of fleets deployed before slashes were allowed stay put.
    for model_id in ("gpt2-xl", "qwen2.5-0.5b", "Model_V2.1"):
        assert model_slug(model_id) == model_id


@pytest.mark.parametrize("model_id", [HUB_ID, FINE_TUNE, "a/b", "a!2fb", "a:b/c"])
def test_the_slug_is_one_segment_of_s3_safe_characters_and_one_to_one(model_id):
    slug = model_slug(model_id) if model_id_problem(model_id) is None else None
    if slug is None:
        return
    # S3 User Guide, "Naming Amazon S3 objects", safe characters: 0-9 a-z A-Z ! - _ . * ' ( ).
    assert set(slug) <= SLUG_SAFE | {"!"} and "/" not in slug
    assert model_id_of(slug) == model_id


def test_two_ids_never_share_a_slug():
    ids = ["a/b", "a:b", "a_b", "a-b", "a.b", "ab", "a/b/c", "a/b:c"]
    assert len({model_slug(i) for i in ids}) == len(ids)
    # The nesting the slug prevents: model "a" at revision "b" and model "a/b" would share models/a/b/.
    assert not bucket.model_prefix("a/b", "main").startswith(bucket.model_prefix("a", "b"))


def test_every_name_derived_from_an_id_takes_the_slug():
    slug = model_slug(HUB_ID)
    assert bucket.model_prefix(HUB_ID, "main") == f"models/{slug}/main/"
    assert bucket.adapter_prefix(HUB_ID, "main", FINE_TUNE, "v1") == \
        f"models/{slug}/main/adapters/{model_slug(FINE_TUNE)}/v1/"
    assert adapters.adapter_dir("/opt/fleetcast", HUB_ID, FINE_TUNE) == \
        f"/opt/fleetcast/adapters/{slug}/{model_slug(FINE_TUNE)}"
    assert bucket.packed_model_key("bench/r/us-east-1/g6.xlarge/packed.json", HUB_ID, "bf16", True).endswith(
        f"/{slug}/bf16-mix.json")
    assert bucket.probe_model_key("bench/r/x/privatelink/app.json", FINE_TUNE).endswith(f"/{model_slug(FINE_TUNE)}.json")
    assert model_alarm_name("fleet", "us-east-1", "l4", HUB_ID, "ttft-p99") == f"fleet-us-east-1-l4-{slug}-ttft-p99"


def test_the_engine_cache_key_is_one_segment():
    from runtime.engine_cache import CacheInputs

    inputs = CacheInputs(model_id=HUB_ID, revision="main", backend="pytorch", precision="bf16", kv_cache_dtype="auto",
                         max_batch_size=8, max_num_tokens=8192, max_input_len=2048, max_output_len=512,
                         builder="tensorrt-llm", builder_version="1.2.1", compute_capability="8.9")
    assert inputs.key.startswith(model_slug(HUB_ID) + "-bf16-sm89-") and "/" not in inputs.key


def test_the_limits_are_the_api_models_and_a_path_segment():
    shapes = botocore.loaders.create_loader().load_service_model("cloudwatch", "service-2")["shapes"]
    assert shapes["AlarmName"]["max"] == ALARM_NAME_MAX
    # The Model dimension keeps the id itself: DimensionValue takes 1..1024 characters, any of them.
    assert shapes["DimensionValue"]["min"] == 1 and MODEL_ID_MAX <= shapes["DimensionValue"]["max"]
    assert "pattern" not in shapes["DimensionValue"]
    assert MODEL_SLUG_MAX == len(model_slug(":" * MODEL_ID_MAX)) <= 255  # NAME_MAX: one file or directory name
