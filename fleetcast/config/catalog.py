"""Shipped, dated facts the validator and the planner share.

GPU specs, instance prices, regional availability, cross-region PrivateLink
regions and the inter-region latency matrix live in `data/*.yaml`, each with an
`as_of` date. They are data, not truth: every table can be overridden by a file
of the same shape (environment variable or CLI flag), and the precision matrix
below is the one place that says which precision runs on which GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from .model import Backend, KvCacheDtype, ModelFamily, Precision

DATA_DIR = Path(__file__).with_name("data")

# Which precision runs on which GPU architecture (TensorRT-LLM 1.2.x).
# sm86 (A10G) has no FP8; sm120 (Blackwell RTX PRO 6000) INT8/INT4 modes are
# unverified, so they stay refused until measured.
PRECISIONS_BY_ARCH: dict[str, frozenset[Precision]] = {
    "sm86": frozenset({Precision.FP16, Precision.BF16, Precision.INT8_WEIGHT_ONLY, Precision.INT8_SMOOTHQUANT, Precision.INT4_WEIGHT_ONLY}),
    "sm89": frozenset({Precision.FP16, Precision.BF16, Precision.INT8_WEIGHT_ONLY, Precision.INT8_SMOOTHQUANT, Precision.INT4_WEIGHT_ONLY, Precision.FP8}),
    "sm90": frozenset({Precision.FP16, Precision.BF16, Precision.INT8_WEIGHT_ONLY, Precision.INT8_SMOOTHQUANT, Precision.INT4_WEIGHT_ONLY, Precision.FP8}),
    "sm120": frozenset({Precision.FP16, Precision.BF16, Precision.FP8, Precision.NVFP4}),
}
KV_CACHE_BY_ARCH: dict[str, frozenset[KvCacheDtype]] = {
    "sm86": frozenset({KvCacheDtype.AUTO, KvCacheDtype.INT8}),
    "sm89": frozenset({KvCacheDtype.AUTO, KvCacheDtype.INT8, KvCacheDtype.FP8}),
    "sm90": frozenset({KvCacheDtype.AUTO, KvCacheDtype.INT8, KvCacheDtype.FP8}),
    "sm120": frozenset({KvCacheDtype.AUTO, KvCacheDtype.FP8}),
}

# Which serving flow each family runs on. GPT-2 exists only in the engine flow;
# the PyTorch backend serves modern SLMs but has no INT8 SmoothQuant/weight-only
# path, and FP8/NVFP4 there need a pre-quantized checkpoint.
BACKENDS_BY_FAMILY: dict[ModelFamily, frozenset[Backend]] = {
    ModelFamily.GPT2: frozenset({Backend.TENSORRT}),
    ModelFamily.LLAMA: frozenset({Backend.PYTORCH}),
    ModelFamily.PHI3: frozenset({Backend.PYTORCH}),
    ModelFamily.QWEN2: frozenset({Backend.PYTORCH}),
}
PRECISIONS_BY_BACKEND: dict[Backend, frozenset[Precision]] = {
    Backend.TENSORRT: frozenset({Precision.FP16, Precision.BF16, Precision.INT8_WEIGHT_ONLY, Precision.INT8_SMOOTHQUANT, Precision.INT4_WEIGHT_ONLY, Precision.FP8}),
    Backend.PYTORCH: frozenset({Precision.FP16, Precision.BF16, Precision.FP8, Precision.NVFP4}),
}


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: str
    arch: str
    memory_gib: float
    bandwidth_gbps: float
    fp16_tflops: float
    int8_tops: float


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


def _read_yaml(path: Path) -> dict[str, Any]:
    with path.open() as handle:
        return YAML(typ="safe").load(handle) or {}


def _table(name: str, env: str | None = None) -> dict[str, Any]:
    override = os.environ.get(env) if env else None
    return _read_yaml(Path(override) if override else DATA_DIR / name)


@lru_cache(maxsize=None)
def instance_catalog() -> dict[str, InstanceType]:
    raw = _table("instances.yaml", "FLEETCAST_INSTANCES")
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


def gpu_by_name(name: str) -> Gpu:
    for instance in instance_catalog().values():
        if instance.gpu.name == name:
            return instance.gpu
    raw = _table("instances.yaml", "FLEETCAST_INSTANCES")
    if name in raw["gpus"]:
        return Gpu(name=name, **raw["gpus"][name])
    raise KeyError(name)


@lru_cache(maxsize=None)
def availability() -> dict[str, frozenset[str]]:
    raw = _table("availability.yaml", "FLEETCAST_AVAILABILITY")
    return {family: frozenset(regions) for family, regions in raw["families"].items()}


def availability_as_of() -> str:
    return str(_table("availability.yaml", "FLEETCAST_AVAILABILITY").get("as_of", "unknown"))


@lru_cache(maxsize=None)
def privatelink_cross_region() -> frozenset[str]:
    return frozenset(_table("privatelink_regions.yaml", "FLEETCAST_PRIVATELINK_REGIONS")["regions"])


def cross_region_supported(consumer_region: str, service_region: str) -> bool:
    regions = privatelink_cross_region()
    return consumer_region in regions and service_region in regions


def precision_supported(arch: str, precision: Precision) -> bool:
    return precision in PRECISIONS_BY_ARCH.get(arch, frozenset())


def supported_precisions(arch: str) -> list[str]:
    return sorted(p.value for p in PRECISIONS_BY_ARCH.get(arch, frozenset()))


def arch_for_compute_capability(cc: str) -> str:
    major, minor = cc.split(".")
    return f"sm{major}{minor}"
