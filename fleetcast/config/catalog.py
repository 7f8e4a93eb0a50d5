"""Shipped, dated facts the validator and the planner share.

GPU specs, instance prices, regional availability, cross-region PrivateLink
regions and the inter-region latency matrix live in `data/*.yaml`, each with an
`as_of` date. They are data, not truth: every table can be overridden by a file
of the same shape (environment variable or CLI flag). Which precision runs on
which GPU is decided in fleetcast/contract/support.py, not here.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from fleetcast.contract import support
from fleetcast.contract.instance_env import Var

from .model import Backend, KvCacheDtype, ModelFamily, Precision

DATA_DIR = Path(__file__).with_name("data")

# The support matrix has one home, fleetcast/contract/support.py; these are its
# tables in the config's enum types for the code that enumerates candidates.
PRECISIONS_BY_ARCH: dict[str, frozenset[Precision]] = {
    arch: frozenset(Precision(p) for p in ps) for arch, ps in support.PRECISIONS_BY_ARCH.items()}
KV_CACHE_BY_ARCH: dict[str, frozenset[KvCacheDtype]] = {
    arch: frozenset(KvCacheDtype(k) for k in ks) for arch, ks in support.KV_CACHE_BY_ARCH.items()}
BACKENDS_BY_FAMILY: dict[ModelFamily, frozenset[Backend]] = {
    ModelFamily(f): frozenset(Backend(b) for b in bs) for f, bs in support.BACKENDS_BY_FAMILY.items()}
PRECISIONS_BY_BACKEND: dict[Backend, frozenset[Precision]] = {
    Backend(b): frozenset(Precision(p) for p in ps) for b, ps in support.PRECISIONS_BY_BACKEND.items()}


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: str
    arch: str
    memory_gib: float
    bandwidth_gbps: float
    fp16_tflops: float
    int8_tops: float
    # What CUDA is offered (nvidia-smi's total), below the listed memory_gib; None in an override table that
    # predates it (the memory check then falls back to the listed size and says so).
    usable_memory_mib: float | None = None


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpu: Gpu
    gpus: int
    vcpus: int
    memory_gib: float
    price_per_hour: dict[str, float]

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]


_PARSED: dict[str, Any] = {}  # YAML text -> what it parses to (every plan reads the same shipped tables, many times)


def parse_yaml(text: str) -> Any:
    """YAML(typ="safe").load(text), each distinct text parsed once per process (the pure-Python parser takes about
    30 ms for instances.yaml, read by each plan and by each lookup of a GPU no instance type has); the caller owns
    a copy, as from a fresh parse. Keyed by the text, so an edited file or an override table is parsed anew."""
    if text not in _PARSED:
        if len(_PARSED) > 64:
            _PARSED.clear()
        _PARSED[text] = YAML(typ="safe").load(text)
    return copy.deepcopy(_PARSED[text])


def _read_yaml(path: Path) -> dict[str, Any]:
    return parse_yaml(path.read_text()) or {}


def _table(name: str, env: Var | None = None) -> dict[str, Any]:
    override = os.environ.get(env) if env else None
    return _read_yaml(Path(override) if override else DATA_DIR / name)


@cache
def instance_catalog() -> dict[str, InstanceType]:
    raw = _table("instances.yaml", Var.INSTANCES)
    gpus = {name: Gpu(name=name, **spec) for name, spec in raw["gpus"].items()}
    return {
        name: InstanceType(
            name=name,
            gpu=gpus[spec["gpu"]],
            gpus=spec["gpus"],
            vcpus=spec["vcpus"],
            memory_gib=spec["memory_gib"],
            price_per_hour=dict(spec.get("price", {})),
        )
        for name, spec in raw["instances"].items()
    }


@cache
def shipped_spot_prices() -> dict[str, Any]:
    """The shipped Spot price snapshot (data/spot_prices.yaml: as_of, source, prices[type][region]); the planner
    lays `--spot-prices FILE` over it (fleetcast/plan/spot.py), the gateway prices a Spot peer with it."""
    return _read_yaml(DATA_DIR / "spot_prices.yaml")


def spot_price(instance_type: str, region: str) -> float | None:
    price = shipped_spot_prices().get("prices", {}).get(instance_type, {}).get(region)
    return None if price is None else float(price)


def gpu_by_name(name: str) -> Gpu:
    for instance in instance_catalog().values():
        if instance.gpu.name == name:
            return instance.gpu
    raw = _table("instances.yaml", Var.INSTANCES)
    if name in raw["gpus"]:
        return Gpu(name=name, **raw["gpus"][name])
    raise KeyError(name)


@cache
def availability() -> dict[str, frozenset[str]]:
    raw = _table("availability.yaml", Var.AVAILABILITY)
    return {family: frozenset(regions) for family, regions in raw["families"].items()}


def availability_as_of() -> str:
    return str(_table("availability.yaml", Var.AVAILABILITY).get("as_of", "unknown"))


@cache
def privatelink_cross_region() -> frozenset[str]:
    return frozenset(_table("privatelink_regions.yaml", Var.PRIVATELINK_REGIONS)["regions"])


def cross_region_supported(consumer_region: str, service_region: str) -> bool:
    regions = privatelink_cross_region()
    return consumer_region in regions and service_region in regions


def precision_supported(arch: str, precision: Precision) -> bool:
    return precision in PRECISIONS_BY_ARCH.get(arch, frozenset())


def supported_precisions(arch: str) -> list[str]:
    return sorted(p.value for p in PRECISIONS_BY_ARCH.get(arch, frozenset()))


arch_for_compute_capability = support.arch_for_compute_capability


@cache
def known_regions() -> frozenset[str]:
    """Every region of every AWS partition, from botocore's endpoint data (botocore/data/endpoints.json,
    `partitions[].regions`): the SDK that deploys the fleet knows no other. A region launched after the
    installed botocore is missing until botocore is upgraded, which the message says."""
    import botocore.loaders

    data = botocore.loaders.create_loader().load_data("endpoints")
    return frozenset(region for partition in data["partitions"] for region in partition["regions"])
