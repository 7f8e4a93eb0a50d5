"""Routing: the body's `model` -> the local engine processes that serve it.

Each served model has one process per copy, each on its own loopback port
(fleetcast.contract.serving); a LoRA adapter is served by its base model's
processes, selected per request by the `lora_request` field TensorRT-LLM's
OpenAI server reads. Among a model's copies a request goes to the one with the
fewest requests in flight from this gateway (ties in turn), so a copy stuck on
long generations stops taking new ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .identity import Refusal
from .upstream import UpstreamPool

if TYPE_CHECKING:  # annotations only: the config package is imported where a config is loaded
    from fleetcast.config import Consumer, FleetConfig, Pool


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter: its base model and the `lora_request` the base model's processes get."""

    id: str
    base: str
    lora_int_id: int
    path: str

    @property
    def lora_request(self) -> dict[str, Any]:
        return {"lora_name": self.id, "lora_int_id": self.lora_int_id, "lora_path": self.path}


@dataclass(frozen=True)
class Target:
    """What one `model` value resolves to."""

    id: str  # the value the consumer sent: a model id or an adapter id
    base: str  # the model whose processes serve it
    pools: tuple[UpstreamPool, ...]
    adapter: Adapter | None = None


# How OpenAI names a JSON value's type in "Invalid type for 'x': expected a string, but got <kind> instead."
_JSON_KINDS = ((bool, "a boolean"), (int, "an integer"), (float, "a decimal number"), (list, "an array"),
               (dict, "an object"))


def invalid_model(body: Mapping[str, Any]) -> Refusal | None:
    """A request whose `model` is no string, answered as OpenAI answers it: 400, not model_not_found.

    Missing: "you must provide a model parameter", param and code null (OpenAI's reply as quoted in
    danielmiessler/Fabric#239 and lss233/kirara-ai#800). Null or another type: "Invalid type for 'model':
    expected a string, but got an integer instead.", param "model", code "invalid_type" (OpenAI's wording
    for a mistyped member, e.g. the error library page portkey.ai/error-library/type-validation-error-10531).
    """
    if "model" not in body:
        return Refusal(400, None, "you must provide a model parameter", "invalid_request_error")
    value = body["model"]
    if isinstance(value, str):
        return None
    kind = "null" if value is None else next((name for t, name in _JSON_KINDS if isinstance(value, t)), "a value")
    return Refusal(400, "invalid_type", f"Invalid type for 'model': expected a string, but got {kind} instead.",
                   "invalid_request_error", param="model")


class Router:
    def __init__(self, processes: Mapping[str, Sequence[tuple[str, int]]], adapters: Sequence[Adapter] = (),
                 max_idle: int = 256):
        """`processes`: model id -> the (host, port) of each of its copies, in config order."""
        if not processes or not all(processes.values()):
            raise ValueError("routing needs at least one model and one process per model")
        self._targets: dict[str, Target] = {}
        for model_id, addresses in processes.items():
            pools = tuple(UpstreamPool(address, max_idle) for address in addresses)
            self._targets[model_id] = Target(model_id, model_id, pools)
        for adapter in adapters:
            if adapter.base not in processes:
                raise ValueError(f"adapter {adapter.id} names base model {adapter.base}, which no process serves")
            if adapter.id in self._targets:
                raise ValueError(f"adapter id {adapter.id} is also a model id")
            self._targets[adapter.id] = Target(adapter.id, adapter.base, self._targets[adapter.base].pools, adapter)
        self.default = next(iter(self._targets.values())).pools[0]  # non-inference paths (/version, ...)
        self._turn = 0

    @classmethod
    def single(cls, model_id: str, upstream: tuple[str, int], max_idle: int = 256) -> Router:
        return cls({model_id: [upstream]}, max_idle=max_idle)

    @property
    def ids(self) -> tuple[str, ...]:
        """Every model and adapter id, models first, each in config order."""
        return tuple(self._targets)

    @property
    def pools(self) -> tuple[UpstreamPool, ...]:
        return tuple(dict.fromkeys(pool for target in self._targets.values() for pool in target.pools))

    def resolve(self, model: Any) -> Target | None:
        return self._targets.get(model) if isinstance(model, str) else None

    def pick(self, target: Target) -> UpstreamPool:
        """The copy with the fewest requests in flight; ties go round in turn."""
        pools = target.pools
        if len(pools) == 1:
            return pools[0]
        self._turn += 1
        n = len(pools)
        best = pools[self._turn % n]
        for i in range(1, n):
            pool = pools[(self._turn + i) % n]
            if pool.in_flight < best.in_flight:
                best = pool
        return best

    def close(self) -> None:
        for pool in self.pools:
            pool.close()


def router_for(cfg: FleetConfig, pool: Pool, upstream: tuple[str, int], local_root: str, max_idle: int = 256) -> Router:
    """The routes of one instance of `pool` (of its own region: pool names repeat across regions, each with its own
    serves): each served model's processes, each adapter on its base.

    `upstream` is the first process's address; the others follow from the pool's `serves`
    (fleetcast.contract.serving.process_slots).
    """
    from fleetcast.contract.adapters import adapter_dir, lora_int_ids
    from fleetcast.contract.serving import process_slots

    served = cfg.served_by(pool)
    processes: dict[str, list[tuple[str, int]]] = {}
    for slot in process_slots(served, base=upstream[1]):
        processes.setdefault(slot.model_id, []).append((upstream[0], slot.port))
    numbers = lora_int_ids(cfg.models)
    adapters = [Adapter(a.id, s.model.id, numbers[a.id], adapter_dir(local_root, s.model.id, a.id))
                for s in served for a in s.model.adapters]
    return Router(processes, adapters, max_idle)


def entitlements(cfg: FleetConfig, consumers: Sequence[Consumer], router: Router) -> dict[str, tuple[str, ...]]:
    """consumer -> the ids it may call that this instance routes (config `models[].consumers`; absent: all)."""
    routed = set(router.ids)
    return {c.name: tuple(i for i in cfg.models_for(c.name) if i in routed) for c in consumers}
