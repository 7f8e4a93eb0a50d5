"""KV-cache isolation at the gateway: each inference request's `cache_salt` comes from the caller's identity.

The consumer was established from the PROXY v2 header's VPC endpoint (identity.py), which the caller cannot
forge; its salt group (fleetcast.contract.isolation) decides the salt. On a path where the serving backend
takes the salt into its KV block keys the gateway writes it over whatever the caller sent; on a path where it
cannot reach the engine (TensorRT-LLM's /v1/completions has no such field), a caller's value is removed, and a
consumer outside the one salt group an engine process with block reuse was started for is refused there: that
process shares KV blocks across all its callers on that path (runtime/bootstrap.py decides its block reuse from
the same start-time config, so the two agree).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fleetcast.contract.isolation import (
    INFERENCE_PATHS,
    SALT_FIELD,
    block_reuse,
    cache_salt,
    salt_group,
    salted_paths,
)

from .identity import Refusal

if TYPE_CHECKING:  # annotations only
    from fleetcast.config import Consumer


class Salting:
    """Salts request bodies by consumer; `pinned`: model id -> the salt groups its reuse-on processes serve."""

    def __init__(self, key: bytes, backend: str, pinned: Mapping[str, frozenset[str]] | None = None):
        self._key = key
        self.paths = salted_paths(backend)
        self.pinned = dict(pinned or {})
        self._salts: dict[str, str] = {}  # salt group -> salt: one HMAC per group, not per request

    def salt_of(self, consumer: Consumer) -> str:
        group = salt_group(consumer.name, consumer.cache_group)
        salt = self._salts.get(group)
        if salt is None:
            salt = self._salts[group] = cache_salt(self._key, group)
        return salt

    def apply(self, path: str, consumer: Consumer, model: str, body: bytes,
              data: dict[str, Any]) -> tuple[bytes, dict[str, Any], dict[str, Any]] | Refusal:
        """(body, data, fields to set) for an inference request to `model`'s processes, or why it is refused."""
        if path in self.paths:
            return body, data, {SALT_FIELD: self.salt_of(consumer)}  # set over the caller's (meter.prepare_body)
        pinned = self.pinned.get(model)
        if pinned is not None and salt_group(consumer.name, consumer.cache_group) not in pinned:
            return Refusal(403, "cache_isolation", f"{path} of model {model} is served by engine processes that reuse "
                           "KV blocks across requests for another cache group; this consumer can be served there once "
                           "the instances are refreshed with the current config, or on /v1/chat/completions",
                           "permission_error")
        if SALT_FIELD in data:
            # The engine cannot take a salt here and would refuse the field; the caller's own is never passed on.
            data = {k: v for k, v in data.items() if k != SALT_FIELD}
            body = json.dumps(data, separators=(",", ":")).encode()
        return body, data, {}


def pinned_groups(groups_by_model: Mapping[str, frozenset[str] | None], backend: str) -> dict[str, frozenset[str]]:
    """The models whose processes start with block reuse on although a path of theirs is unsalted, each with the
    salt groups (at most one) it starts for: only those may use such a path until the processes restart.
    `groups_by_model`: FleetConfig.salt_groups_of for each model, from the config the processes started with."""
    if INFERENCE_PATHS <= salted_paths(backend):
        return {}
    return {m: groups for m, groups in groups_by_model.items() if groups is not None and block_reuse(backend, groups)}
