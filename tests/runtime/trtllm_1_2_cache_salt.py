"""Where TensorRT-LLM 1.2.x takes a request's `cache_salt` (extracted facts, not their code).

Read from NVIDIA/TensorRT-LLM with the search tools of this workplace (the repository, 2.5 GB, is over the
fetch limit, so the v1.2.1 tag itself could not be checked out). Each fact below holds in a stored version
from before 1.2.1 and in one from after it, so it holds in 1.2.1 between them:

- tensorrt_llm/serve/openai_protocol.py, index ids 1179858508 (the 1.1/1.2 line: Responses API, harmony
  reasoning, StreamOptions.continuous_usage_stats defaulting to True) and 71075524054 (2026 copyright header,
  embeddings and /_internal/tokenize): `OpenAIBaseModel.model_config = ConfigDict(extra="forbid", ...)`;
  `ChatCompletionRequest.cache_salt: Optional[str]` ("If specified, KV cache will be salted with the provided
  string to limit the kv cache reuse on with the requests having the same string"), whose field validator
  `check_cache_salt_support` refuses a value that is not a non-empty string; `CompletionRequest` has no
  `cache_salt` (nor does `ResponsesRequest`), so a /v1/completions body carrying one fails validation: 400.
  The field came in with PR #7106 "[TRTLLM-7398][feat] Support KV cache salting for secure KV cache reuse"
  (merged September 2025, before 1.2).
- tensorrt_llm/serve/openai_server.py (index id 51781230266): openai_chat passes
  `cache_salt=request.cache_salt` to `generate_async`.
- tensorrt_llm/executor/base_worker.py (index ids 34359500673 and 1131391427): `_enqueue_request` builds
  `tllm.Request(..., cache_salt_id=request.cache_salt_id)` for both backends (the PyTorch backend's
  executor_request_to_llm_request carries it on as LlmRequest.cache_salt_id).
- cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp (index id 126178160; also 46326808930, 56201282952):
  `BlockKeyHasher::hash` mixes `blockKey.cacheSaltID` into the seed only `if (parentHash == 0 &&
  blockKey.cacheSaltID)` ("Only hashing the cache salt ID for the first block in the sequence"); later
  blocks inherit it through parentHash, and `BlockKey::operator==` compares cacheSaltID. This is the KV cache
  manager both backends use in 1.2.x (the TensorRT backend's batch manager and the PyTorch backend's
  KVCacheManager over the same C++ manager).
- The Python KVCacheManagerV2 learnt the salt only with PR #13793 (May 2026, "KV cache salting
  (cache_salt_id) was already supported in the V1 manager ... This PR extends the same isolation guarantee to
  the V2 manager"), after 1.2.x; Fleetcast never selects it.
- KvCacheConfig.enable_block_reuse (tensorrt_llm/llmapi/llm_args.py, tests/runtime/trtllm_1_2_llm_args.py)
  is a field on both backends, default True.
"""

PROTOCOL_SOURCE = "tensorrt_llm/serve/openai_protocol.py"
BLOCK_KEY_SOURCE = "cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp BlockKeyHasher::hash"
WORKER_SOURCE = "tensorrt_llm/executor/base_worker.py _enqueue_request"

REQUEST_MODELS_FORBID_EXTRA = True  # OpenAIBaseModel: extra="forbid"
# The OpenAI route -> whether its request model has the `cache_salt` field.
CACHE_SALT_FIELD_BY_PATH = {
    "/v1/chat/completions": True,  # ChatCompletionRequest.cache_salt
    "/v1/completions": False,  # CompletionRequest: no such field
}
# Backends whose executor requests carry cache_salt_id into the salted KV block keys.
SALT_REACHES_BLOCK_KEYS = {"pytorch": True, "tensorrt": True}
