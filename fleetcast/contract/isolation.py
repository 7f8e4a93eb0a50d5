"""KV-cache isolation between consumer accounts: one home for the gateway that salts requests and the runtime
that decides whether an engine process may reuse KV blocks across requests.

An engine that reuses KV blocks across requests with a common prefix lets one caller learn, by timing its own
requests, whether another caller sent that prefix. TensorRT-LLM mixes a request's `cache_salt` into the hash of
its first KV block (its KV cache manager's block key), so requests reuse each other's blocks only when their
salts are equal. The gateway knows the calling account from the PrivateLink endpoint, which the caller cannot
forge, and sets the salt from it on every inference request, over whatever the caller sent.

The salt group of a consumer is the consumer itself, or the explicit `cache_group` its config names: accounts
that trust each other (a common system prompt) share prefixes by sharing a group; without it no two consumers
share a salt. A salt is an HMAC of the group under a key the gateway draws at start and never writes anywhere:
the engine only compares salts, and a salt that cannot be computed outside the gateway cannot be guessed or
collided even where some path let a caller set one. A group name and a consumer name are kept apart by their
prefix, so a group called like a consumer never shares that consumer's salt.

Where a request path cannot carry the salt to the engine, block reuse across its requests is not isolated:
an engine process that may serve more than one salt group on such a path then runs with block reuse off.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable

SALT_FIELD = "cache_salt"  # the request body field (tensorrt_llm/serve/openai_protocol.py ChatCompletionRequest)
KEY_BYTES = 32

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"

# The inference paths on which each serving backend takes `cache_salt` into its KV block keys.
# TensorRT-LLM 1.2.x (tests/runtime/trtllm_1_2_cache_salt.py cites the sources): ChatCompletionRequest has
# `cache_salt`, passed to generate_async and on to the executor Request's cache_salt_id on both backends, which
# the KV cache manager mixes into the first block's hash; CompletionRequest has no such field and, like every
# request model there, forbids unknown fields, so a salted /v1/completions body would be refused with a 400.
# The reference backend (runtime/reference) salts both.
INFERENCE_PATHS = frozenset({CHAT_PATH, COMPLETIONS_PATH})  # what the gateway admits, limits and meters
SALTED_PATHS: dict[str, frozenset[str]] = {
    "tensorrt-llm": frozenset({CHAT_PATH}),
    "trtllm": frozenset({CHAT_PATH}),  # the same backend by its other name (runtime/backends.py)
    "reference": INFERENCE_PATHS,
}


def new_key() -> bytes:
    """A fresh salt key: drawn once per gateway start and shared by its workers (forked after it)."""
    return secrets.token_bytes(KEY_BYTES)


def salt_group(consumer: str, cache_group: str | None) -> str:
    """The group whose members share KV prefixes: the explicit cache group, else the consumer alone."""
    return f"group:{cache_group}" if cache_group else f"consumer:{consumer}"


def cache_salt(key: bytes, group: str) -> str:
    """The `cache_salt` of `group` under `key`: equal within a group, unequal across groups, opaque outside."""
    return hmac.new(key, group.encode(), hashlib.sha256).hexdigest()


def salted_paths(backend: str) -> frozenset[str]:
    """The inference paths on which `backend` honours the salt (none for a backend not known to)."""
    return SALTED_PATHS.get(backend, frozenset())


def block_reuse(backend: str, groups: Iterable[str] | None) -> bool:
    """Whether an engine process of `backend` may reuse KV blocks across requests.

    `groups`: the salt groups the process may serve; None where that set is open (a model without an explicit
    `consumers` list serves every consumer, including those a config refresh adds without a restart). Reuse is
    safe where every inference path is salted, or where the process can only ever serve one group.
    """
    if INFERENCE_PATHS <= salted_paths(backend):
        return True
    return groups is not None and len(set(groups)) <= 1
