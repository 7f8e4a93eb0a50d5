"""KV-cache isolation facts: who shares a salt, which paths carry it to which engine, when block reuse is safe.

TensorRT-LLM facts are checked against tests/runtime/trtllm_1_2_cache_salt.py, which cites the 1.2.x sources
(tensorrt_llm/serve/openai_protocol.py, tensorrt_llm/executor/base_worker.py,
cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp).
"""

from __future__ import annotations

import pytest

from fleetcast.contract import isolation as iso
from tests.runtime import trtllm_1_2_cache_salt as trt

KEY = bytes(range(32))


def test_every_consumer_alone_gets_its_own_salt_and_a_group_shares_one():
    a, b = iso.salt_group("voice-app", None), iso.salt_group("analytics", None)
    assert iso.cache_salt(KEY, a) != iso.cache_salt(KEY, b)
    assert iso.salt_group("voice-app", "shared") == iso.salt_group("analytics", "shared")
    assert iso.cache_salt(KEY, a) == iso.cache_salt(KEY, iso.salt_group("voice-app", None))


def test_a_group_named_like_a_consumer_does_not_share_that_consumers_salt():
    assert iso.salt_group("analytics", None) != iso.salt_group("voice-app", "analytics")


def test_salts_are_opaque_without_the_key():
    group = iso.salt_group("voice-app", None)
    salt = iso.cache_salt(KEY, group)
    assert "voice-app" not in salt and len(salt) == 64  # 256 bits, hex: no consumer name reaches the engine
    assert iso.cache_salt(iso.new_key(), group) != salt  # another gateway start, another salt
    assert iso.new_key() != iso.new_key() and len(iso.new_key()) == iso.KEY_BYTES


def test_tensorrt_llm_salts_exactly_the_paths_whose_request_model_has_the_field():
    """openai_protocol.py: ChatCompletionRequest.cache_salt; CompletionRequest has none and forbids extras,
    so the gateway must not send one there (a 400), and that path is unsalted."""
    assert trt.REQUEST_MODELS_FORBID_EXTRA
    salted = {path for path, has in trt.CACHE_SALT_FIELD_BY_PATH.items() if has}
    assert iso.salted_paths("tensorrt-llm") == salted, trt.PROTOCOL_SOURCE
    assert iso.salted_paths("trtllm") == salted  # runtime/backends.py's other name for it
    assert set(trt.CACHE_SALT_FIELD_BY_PATH) == iso.INFERENCE_PATHS
    # Both engine backends carry the salt into the KV block keys, so one answer serves both.
    assert all(trt.SALT_REACHES_BLOCK_KEYS.values()), (trt.WORKER_SOURCE, trt.BLOCK_KEY_SOURCE)


def test_the_reference_backend_salts_every_inference_path():
    assert iso.salted_paths("reference") == iso.INFERENCE_PATHS


@pytest.mark.parametrize("backend,groups,reuse", [
    ("reference", None, True),  # every path salted: reuse is isolated per group
    ("reference", {"consumer:a", "consumer:b"}, True),
    ("tensorrt-llm", None, False),  # open to every consumer, /v1/completions unsalted
    ("tensorrt-llm", {"consumer:a", "consumer:b"}, False),
    ("tensorrt-llm", {"group:g"}, True),  # one group only: nobody else to learn from the cache
    ("tensorrt-llm", set(), True),
    ("some-new-backend", {"consumer:a", "consumer:b"}, False),  # salts nothing as far as we know
])
def test_block_reuse_only_where_every_path_is_salted_or_one_group_is_served(backend, groups, reuse):
    assert iso.block_reuse(backend, groups) is reuse
