"""The fleet config: typed, immutable, validated once at load.

Every model forbids unknown keys (a typo is an error, not a silently ignored
field) and is frozen, so what the stacks, the runtime and the CLIs receive is
exactly what was validated. Field descriptions double as the config reference
(`fleetcast config schema`, docs/config.md).

Rules that span several fields or need the shipped data tables (precision per
GPU, regional availability, cross-region PrivateLink pairs, AZ overlap) live in
`fleetcast.config.rules`, so that each rule can name the YAML path it blames.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    StringConstraints,
    Tag,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from fleetcast.contract import support
from fleetcast.contract.isolation import salt_group
from fleetcast.contract.model_ids import MODEL_ID_PATTERN, model_id_problem
from fleetcast.contract.serving import GIB

from .schedule import schedule_problem, unix_cron_problem
from .strict import scalar_problem

# ---------------------------------------------------------------- scalar types

AccountId = Annotated[
    str,
    StringConstraints(pattern=r"^[0-9]{12}$"),
    Field(description="12-digit AWS account id, quoted in YAML so leading zeros survive."),
]
RegionName = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z]{2}(-gov)?-[a-z]+-[0-9]$"),
    Field(description="AWS region code, e.g. ap-northeast-2."),
]
AzName = Annotated[str, StringConstraints(pattern=r"^[a-z]{2}(-gov)?-[a-z]+-[0-9][a-z]$")]
AzId = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z]{2,5}[0-9]?-az[0-9]{1,2}$"),
    Field(description="AZ ID such as apne2-az1: the same physical zone in every account."),
]
VpcId = Annotated[str, StringConstraints(pattern=r"^vpc-[0-9a-f]{8}([0-9a-f]{9})?$")]
SubnetId = Annotated[str, StringConstraints(pattern=r"^subnet-[0-9a-f]{8}([0-9a-f]{9})?$")]
AmiId = Annotated[str, StringConstraints(pattern=r"^ami-[0-9a-f]{8}([0-9a-f]{9})?$")]
S3_URI_PATTERN = r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?$"
S3Uri = Annotated[str, StringConstraints(pattern=S3_URI_PATTERN)]
Name = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z][a-z0-9-]{0,30}[a-z0-9]$"),
    Field(description="Lower-case letters, digits and dashes; used in stack and resource names."),
]


def full_match(pattern: str, value: str) -> bool:
    """The whole value, in ASCII classes: `re.match(...$)` lets a trailing newline through and `\\d` matches
    any Unicode digit, neither of which AWS accepts (tests/config/test_patterns.py walks every pattern)."""
    return re.fullmatch(pattern, value, re.ASCII) is not None


# IAM principal ARNs an endpoint service may allow: an account root, a role or a user (IAM User Guide,
# "IAM identifiers": names of letters, digits and +=,.@_- with / paths).
PRINCIPAL_ARN_PATTERN = r"^arn:aws[a-z-]*:iam::[0-9]{12}:(root|role/[A-Za-z0-9_+=,.@/-]+|user/[A-Za-z0-9_+=,.@/-]+)$"

# VPC endpoint service names: com.amazonaws.vpce.<region>.vpce-svc-<17 hex> (the EndpointServiceName output).
ENDPOINT_SERVICE_NAME_PATTERN = r"^com\.amazonaws\.vpce\.[a-z0-9-]+\.vpce-svc-[0-9a-f]{17}$"

# Secrets Manager secret names: 1-512 of ASCII letters, digits and /_+=.@- (CreateSecret, Name).
SECRET_NAME_PATTERN = r"^[A-Za-z0-9/_+=.@-]{1,512}$"

_CIDR = re.compile(r"([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})/([0-9]{1,2})", re.ASCII)


def _check_cidr(value: str) -> str:
    import ipaddress

    if not _CIDR.fullmatch(value):
        raise ValueError(f"{value!r} is not an IPv4 CIDR such as 10.40.0.0/16")
    try:
        net = ipaddress.IPv4Network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a valid IPv4 network: {exc}") from None
    if net.prefixlen == 0:
        raise ValueError("0.0.0.0/0 is not allowed: name the consumer networks")
    return value


class FieldProblem(ValueError):
    """A model validator's refusal that names the field it blames, relative to the model (("image",),
    ("engine", "port")). Pydantic locates a model validator's error at the model itself; the loader appends
    `field` to that location, so the message names engine.image rather than engine."""

    def __init__(self, field: str | tuple[str | int, ...], message: str):
        super().__init__(message)
        self.field = (field,) if isinstance(field, str) else tuple(field)


class Frozen(BaseModel):
    """Base for every config model: immutable, unknown keys rejected."""

    # No float field means infinity or NaN (`.inf` would pass every `gt=` bound).
    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _strict_scalars(cls, value: object, info: ValidationInfo) -> object:
        if info.field_name is None:  # set for every field validator; None only where a model validator runs
            return value
        problem = scalar_problem(cls.model_fields[info.field_name].annotation, value)
        if problem:
            raise ValueError(problem)
        return value


# ---------------------------------------------------------------- enums


class Precision(str, Enum):
    """Weight/activation precision of the served model."""

    FP16 = "fp16"
    BF16 = "bf16"
    INT8_WEIGHT_ONLY = "int8_wo"  # W8A16, no calibration
    INT8_SMOOTHQUANT = "int8_sq"  # W8A8, calibrated
    FP8 = "fp8"  # sm89+, calibrated (engine flow) or pre-quantized (PyTorch backend)
    INT4_WEIGHT_ONLY = "int4_wo"  # W4A16
    NVFP4 = "nvfp4"  # Blackwell only, pre-quantized

    @property
    def calibrated(self) -> bool:
        return self in (Precision.INT8_SMOOTHQUANT, Precision.FP8, Precision.NVFP4)


class KvCacheDtype(str, Enum):
    AUTO = "auto"  # same as the activations
    INT8 = "int8"  # calibrated
    FP8 = "fp8"  # calibrated, sm89+


class Backend(str, Enum):
    TENSORRT = "tensorrt"  # legacy engine flow: convert_checkpoint.py + trtllm-build
    PYTORCH = "pytorch"  # trtllm-serve <hf dir>, no engine build


class ModelFamily(str, Enum):
    GPT2 = "gpt2"
    LLAMA = "llama"
    PHI3 = "phi3"
    QWEN2 = "qwen2"


class GpuSharing(str, Enum):
    """How the engine processes of one instance share its GPU (docs/runtime.md, "GPU sharing")."""

    TIME_SLICING = "time_slicing"  # each process its own CUDA context; the GPU switches between them
    MPS = "mps"  # one MPS control daemon per GPU; the processes' kernels run side by side, faults are shared


class EgressMode(str, Enum):
    NONE = "none"  # VPC endpoints only; nothing on the instance reaches the internet
    NAT = "nat"  # one NAT gateway per AZ for instance egress


# ---------------------------------------------------------------- model & engine


# A TensorRT-LLM release as its NGC image tags and PyPI versions write it (1.2.1, 1.2.0rc4, 0.21.0.post1).
TAG_RELEASE_PATTERN = r"[0-9]+\.[0-9]+\.[0-9]+[a-z0-9.]*"


class EngineSpec(Frozen):
    """How TensorRT-LLM builds and serves the model: the fleet-wide default."""

    tensorrt_llm_version: str = Field(
        default="1.2.1", pattern=rf"^{TAG_RELEASE_PATTERN}$",
        description="TensorRT-LLM release; part of the engine cache key.",
    )
    image: str = Field(
        default="nvcr.io/nvidia/tensorrt-llm/release:1.2.1",
        description="Upstream serving image. Instances run the derived image built on it (docker/Dockerfile) "
                    "from the region's private ECR, with either egress.",
    )
    image_digest: str | None = Field(
        default=None, pattern=r"^sha256:[0-9a-f]{64}$",
        description="Digest pinned by `fleetcast stage image`; instances pull by digest once set.",
    )
    backend: Backend = Field(default=Backend.TENSORRT, description="tensorrt (engine flow) or pytorch.")
    precision: Precision = Field(default=Precision.FP16, description="fp16, bf16, int8_wo, int8_sq, fp8, int4_wo, nvfp4.")
    kv_cache_dtype: KvCacheDtype = Field(default=KvCacheDtype.AUTO, description="auto, int8 or fp8 (engine flow: calibrated; pytorch backend: auto or fp8).")
    max_batch_size: int = Field(default=64, ge=1, le=2048, description="trtllm-build --max_batch_size.")
    max_num_tokens: int = Field(default=8192, ge=64, le=1_048_576, description="trtllm-build --max_num_tokens.")
    kv_cache_free_gpu_memory_fraction: float = Field(
        default=0.9, gt=0.0, le=0.98, description="Share of free GPU memory given to the KV cache."
    )
    port: int = Field(default=8000, ge=1024, le=65535, description="Port the NLB listens on and the gateway serves.")

    @model_validator(mode="after")
    def _image_pins_version(self) -> EngineSpec:
        reference = self.image.partition("@")[0]
        tag = reference.rsplit(":", 1)[-1] if ":" in reference.rsplit("/", 1)[-1] else ""
        # The release the tag names, whole: 1.2.1rc1 is another release than 1.2.1 (its engines are cached
        # under the version, so a prefix match would file rc engines as the release's).
        release = re.match(TAG_RELEASE_PATTERN, tag, re.ASCII)
        if release and release.group(0) != self.tensorrt_llm_version:
            raise FieldProblem(
                "image", f"image tag {tag!r} is TensorRT-LLM {release.group(0)}, which does not match tensorrt_llm_version "
                f"{self.tensorrt_llm_version!r}: engines are tied to the TensorRT-LLM version that built them; "
                "allowed: a tag naming the same release, or a non-release tag pinned by image_digest"
            )
        return self


# Engine settings one fleet shares: one TensorRT-LLM version and image (one image per instance), one port.
FLEET_WIDE_ENGINE_FIELDS = ("tensorrt_llm_version", "image", "image_digest", "port")


class EngineOverride(Frozen):
    """Changes to the fleet-wide engine, per model (`models[].engine`) or per pool (`pools[].engine`)."""

    backend: Backend | None = None
    precision: Precision | None = None
    kv_cache_dtype: KvCacheDtype | None = None
    max_batch_size: int | None = Field(default=None, ge=1, le=2048)
    max_num_tokens: int | None = Field(default=None, ge=64, le=1_048_576)
    kv_cache_free_gpu_memory_fraction: float | None = Field(default=None, gt=0.0, le=0.98)


class CalibrationSpec(Frozen):
    """Staged calibration data for calibrated precisions (SmoothQuant, INT8/FP8 KV cache, FP8)."""

    dataset: S3Uri = Field(description="Staged calibration dataset (instances cannot download it).")
    samples: int = Field(default=512, ge=16, le=65536, description="Calibration samples.")


class Slo(Frozen):
    """Service-level objectives used by alarms, scaling and the planner."""

    ttft_p99_ms: float = Field(gt=0, le=120_000, description="P99 time to first token, milliseconds.")
    itl_p99_ms: float = Field(gt=0, le=10_000, description="P99 inter-token latency, milliseconds.")
    error_rate: float = Field(default=0.01, ge=0, lt=1, description="Highest tolerated share of failed requests.")


# A model or adapter id is what consumers send as the OpenAI `model` value (hub-style org/name and fine-tune
# ids with colons included); every name derived from it (S3 prefixes, the engine cache key, alarm names)
# takes its slug: fleetcast/contract/model_ids.py, the one home of both.
def _check_model_id(value: str) -> str:
    problem = model_id_problem(value)
    if problem:
        raise ValueError(problem)
    return value


ModelId = Annotated[str, AfterValidator(_check_model_id), Field(json_schema_extra={"pattern": MODEL_ID_PATTERN})]


def _check_weights_source(value: str) -> str:
    if value.startswith("s3://"):
        if not full_match(S3_URI_PATTERN, value):
            raise ValueError(f"{value!r} is not an S3 URI such as s3://bucket/models/gpt2-xl/")
        return value
    if not full_match(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*", value):
        raise ValueError(f"{value!r} is neither an s3:// URI nor a hub id such as openai-community/gpt2-xl")
    return value


class AdapterSpec(Frozen):
    """A LoRA adapter served by its base model's processes (PyTorch-backend families only)."""

    id: ModelId = Field(description="The OpenAI `model` value that selects this adapter; unique among models and "
                                    "adapters.")
    source: str = Field(description="Where `fleetcast stage adapter` takes the adapter (a PEFT LoRA directory: "
                                    "adapter_config.json and adapter_model.safetensors or .bin) from: a hub id "
                                    "(org/name) or an s3:// URI. Instances read the staged copy in their region's "
                                    "bucket.")
    revision: str = Field(
        default="main", min_length=1, max_length=64,
        description="Pinned revision (hub commit sha or tag) of a hub source; for an s3:// source, a label of "
                    "yours for the copy staged (change it to stage new content). Names the staged prefix "
                    "models/<model id>/<model revision>/adapters/<id>/<revision>/.")

    @field_validator("source")
    @classmethod
    def _source_shape(cls, value: str) -> str:
        return _check_weights_source(value)


class ModelSpec(Frozen):
    """One served model: its weights, length limits, engine settings and who may call it."""

    id: ModelId = Field(description="The OpenAI `model` value consumers send, e.g. gpt2-xl, Qwen/Qwen2.5-0.5B-Instruct "
                                "or ft:gpt-3.5-turbo:acme::8abc1234: letters, digits and . _ - : /, at most 64. "
                                "Its slug (other characters as !hex) names its cache keys and staged prefix. Unique "
                                "among models and adapters.")
    family: ModelFamily = Field(description="Architecture family; decides which TensorRT-LLM flow can serve it.")
    source: str = Field(
        description="Where staging takes the weights from: a hub id (org/name) or an s3:// URI. Instances never "
        "read it: they read the copy `fleetcast stage model` put in their region's bucket under "
        "models/<id slug>/<revision>/.",
    )
    revision: str = Field(
        description="Pinned revision (hub commit sha or tag) of the weights; part of the engine cache key.",
        min_length=1,
        max_length=64,
    )
    context_length: int = Field(description="The model's maximum positions (1024 for GPT-2 XL).", gt=0, le=1_048_576)
    max_input_len: int = Field(description="Longest prompt in tokens accepted by the engine.", gt=0)
    max_output_len: int = Field(description="Longest completion in tokens.", gt=0)
    hub_token_secret: str | None = Field(
        default=None,
        pattern=SECRET_NAME_PATTERN,
        description="Secrets Manager secret name holding a hub token for gated models (read by staging only).",
    )
    stage_patterns: tuple[Annotated[str, StringConstraints(min_length=1, max_length=200)], ...] = Field(
        default=(),
        description="Files `fleetcast stage model` stages besides what the build reads (top-level *.safetensors, "
        "config and tokenizer files): fnmatch patterns on the repository path, e.g. '*.bin' for a model "
        "published without safetensors. Read by staging only.",
    )

    parameters_b: float | None = Field(
        default=None, gt=0, le=2000,
        description="Parameters in billions (e.g. 1.56 for GPT-2 XL), for the GPU memory check "
        "(fleetcast/config/memory.py); required where a pool runs several engine processes or sets kv_cache_gb. "
        "Read by validate, and by the instances of a pool of several processes (each process's overhead in their "
        "KV budgets and MPS memory limits).",
    )
    engine: EngineOverride = Field(
        default_factory=EngineOverride,
        description="This model's engine settings over the fleet `engine` defaults (a pool's `engine` overrides "
        "both). The TensorRT-LLM version, image and port are fleet-wide.",
    )
    calibration: CalibrationSpec | None = Field(
        default=None, description="Staged calibration data, where this model's precision or KV-cache dtype needs it.")
    slo: Slo | None = Field(default=None, description="This model's SLO, over the fleet `slo`.")
    consumers: tuple[Name, ...] | None = Field(
        default=None,
        description="Consumers (by name) that may call this model and its adapters; absent: every consumer.",
    )
    adapters: tuple[AdapterSpec, ...] = Field(
        default=(), description="LoRA adapters served by this model's processes (PyTorch-backend families only).")

    @model_validator(mode="before")
    @classmethod
    def _fleet_wide_engine_keys(cls, data: object) -> object:
        engine = data.get("engine") if isinstance(data, dict) else None
        if isinstance(engine, dict):
            shared = [k for k in FLEET_WIDE_ENGINE_FIELDS if k in engine]
            if shared:
                raise FieldProblem(("engine", shared[0]), f"engine.{shared[0]} is fleet-wide (one TensorRT-LLM version and image per fleet, "
                                 f"one port): set it in the top-level engine, not per model")
        return data

    @field_validator("source")
    @classmethod
    def _source_shape(cls, value: str) -> str:
        return _check_weights_source(value)

    @property
    def staged(self) -> bool:
        return self.source.startswith("s3://")




class Serve(Frozen):
    """One model a pool's instances serve: how many copies (processes) and each copy's KV-cache budget."""

    model: ModelId = Field(description="A `models[].id`.")
    copies: int = Field(default=1, ge=1, le=64, description="Engine processes of this model on each instance.")
    kv_cache_gb: float | None = Field(
        default=None, gt=0, le=4096,
        description="KV-cache budget of each copy in GiB (2^30 bytes, the unit of the GPU memory table). Default: "
        "an even share of what the GPU has left after every process's weights and overhead "
        "(fleetcast/config/memory.py).",
    )
    mps_active_thread_percentage: int | None = Field(
        default=None, ge=1, le=100,
        description="Pools with gpu_sharing: mps only. The share of the GPU's SMs each copy may use "
        "(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE). Unset: no cap. A cap is measured per packing, never a default: on an "
        "H200 a 50% cap on each of two reference-backend models cost 29% of their combined throughput "
        "(docs/runtime.md).",
    )

    @model_serializer(mode="wrap")
    def _omit_absent_cap(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Unset, it is left out of the dump: configs written before the field keep their digests and templates.
        data = handler(self)
        if self.mps_active_thread_percentage is None and isinstance(data, dict):
            data.pop("mps_active_thread_percentage", None)
        return data


# ---------------------------------------------------------------- regions & pools


class Capacity(Frozen):
    min: int = Field(ge=0, le=1000, description="Fewest instances; the group starts here and never scales below.")
    desired: int | None = Field(
        default=None, ge=0, le=1000,
        description="Optional fixed size that every deploy updating the group resets it to (also in the middle of "
                    "a busy day). Leave it out to let scaling own the size: the group starts at min.",
    )
    max: int = Field(ge=1, le=1000, description="Most instances scaling may reach.")

    @model_validator(mode="after")
    def _ordered(self) -> Capacity:
        if self.desired is None and self.min > self.max:
            raise FieldProblem("max", f"capacity must satisfy min <= max, got min={self.min} max={self.max}")
        if self.desired is not None and not (self.min <= self.desired <= self.max):
            raise FieldProblem(
                "desired", f"capacity must satisfy min <= desired <= max, got min={self.min} desired={self.desired} max={self.max}"
            )
        return self

    @property
    def baseline(self) -> int:
        """Instances the group holds without load: desired when fixed, else min."""
        return self.min if self.desired is None else self.desired

    def describe(self) -> str:
        fixed = "" if self.desired is None else f" desired {self.desired}"
        return f"min {self.min}{fixed} max {self.max}"


class ScalingSpec(Frozen):
    """Target tracking on a per-instance load metric published by the runtime."""

    metric: Literal["active_requests", "kv_cache_utilization"] = Field(
        default="active_requests", description="Per-instance metric to track."
    )
    target: float = Field(default=8.0, gt=0, description="Target value per instance (requests, or percent for KV cache).")
    scale_in_cooldown_s: int = Field(
        default=600, ge=0, le=86400,
        description="Least time between two scale-ins; each removes one instance, only while the remaining ones "
        "stay under target.",
    )
    scale_out_cooldown_s: int = Field(
        default=120, ge=0, le=86400,
        description="Estimated instance warmup: how long a new InService instance counts as capacity before "
        "its own metrics do.",
    )
    slo_protection: bool = Field(
        default=True,
        description="Scale on the SLO as well as on load: scale out when the pool's 1-minute P99 TTFT or ITL passes "
        "slo_scale_out_ratio of its SLO (even under the load target), and never scale in while it is above "
        "slo_scale_in_ratio (docs/runbook.md, Scaling).",
    )
    slo_scale_out_ratio: float = Field(
        default=0.8, gt=0, le=2,
        description="Scale out when max(P99 TTFT / slo.ttft_p99_ms, P99 ITL / slo.itl_p99_ms) over one minute "
        "exceeds this. P99 TTFT climbs steeply near a GPU's SLO-safe load: 0.8 reacts a minute or two before the "
        "SLO is crossed (make bench-scaling).",
    )
    slo_scale_in_ratio: float = Field(
        default=0.6, gt=0, le=1,
        description="Scale in only while that SLO ratio is at or below this (below slo_scale_out_ratio). At most 1: "
        "above it the pool would scale in while its P99 already misses the SLO.",
    )

    @model_validator(mode="after")
    def _slo_ratios_ordered(self) -> ScalingSpec:
        if self.slo_scale_in_ratio >= self.slo_scale_out_ratio:
            raise FieldProblem("slo_scale_in_ratio", "scaling.slo_scale_in_ratio must be below scaling.slo_scale_out_ratio (else the pool "
                             f"could scale in and out on the same reading), got {self.slo_scale_in_ratio:g} >= "
                             f"{self.slo_scale_out_ratio:g}")
        return self


class ScheduledCapacity(Frozen):
    """One step of a daily capacity profile (UTC cron)."""

    cron: str = Field(pattern=r"^([!-~]+ +){4}[!-~]+$", description="Five-field cron in UTC, e.g. '0 23 * * *'.")
    min: int = Field(ge=0, le=1000)
    max: int = Field(ge=1, le=1000)
    desired: int | None = Field(default=None, ge=0, le=1000)

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        problem = unix_cron_problem(value)
        if problem:
            raise ValueError(f"{value!r}: {problem}")
        return value


class WarmPoolSpec(Frozen):
    size: int = Field(default=0, ge=0, le=100, description="Stopped instances kept with the engine on disk (0: none).")
    reuse_on_scale_in: bool = Field(default=True, description="Return scaled-in instances to the warm pool.")


class RolloutSpec(Frozen):
    """Instance refresh when the launch template changes (engine, precision, image, AMI, instance type)."""

    min_healthy_percentage: int = Field(default=90, ge=0, le=100,
                                        description="Share of desired capacity kept in service during a refresh.")
    max_healthy_percentage: int = Field(
        default=110, ge=100, le=200,
        description="Share of desired capacity allowed in service or pending; above 100 launches replacements "
        "before terminating (needs spare GPU capacity). At most min_healthy_percentage + 100.",
    )
    checkpoint_percentages: tuple[int, ...] = Field(default=(50, 100),
                                                    description="Refresh pauses after replacing these shares.")
    checkpoint_delay_s: int = Field(default=900, ge=0, le=172800,
                                    description="Pause at each checkpoint while the rollback alarms watch the new instances.")
    bake_time_s: int = Field(default=600, ge=0, le=172800,
                             description="Alarm watch after the last replacement before the stack update succeeds.")
    instance_warmup_s: int = Field(default=300, ge=0, le=7200,
                                   description="Wait after a replacement is InService before the next one.")
    rollback_on_alarms: bool = Field(
        default=True,
        description="Fail (and so roll back) a refresh when the pool's SLO, error or build alarms fire. Turn off "
        "only to push a fix while those alarms are already firing (docs/runbook.md).",
    )

    @model_validator(mode="after")
    def _never_all_at_once(self) -> RolloutSpec:
        if self.max_healthy_percentage - self.min_healthy_percentage > 100:
            raise FieldProblem("max_healthy_percentage", "max_healthy_percentage may exceed min_healthy_percentage by at most 100 (an EC2 Auto "
                             f"Scaling rule), got {self.min_healthy_percentage}..{self.max_healthy_percentage}")
        if self.min_healthy_percentage == 0 and self.max_healthy_percentage == 100:
            raise FieldProblem("min_healthy_percentage", "min_healthy_percentage 0 with max_healthy_percentage 100 replaces every instance at "
                             "once: raise min_healthy_percentage or set max_healthy_percentage above 100")
        return self

    @field_validator("checkpoint_percentages")
    @classmethod
    def _increasing(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or list(value) != sorted(set(value)) or value[-1] != 100 or value[0] <= 0:
            raise ValueError("checkpoint_percentages must be strictly increasing, within 1..100, ending at 100")
        return value


# EC2 Auto Scaling's Spot allocation strategies (InstancesDistribution.SpotAllocationStrategy, "Allocation
# strategies for multiple instance types", EC2 Auto Scaling User Guide); checked in tests/config/test_spot.py.
SPOT_ALLOCATION_STRATEGIES = ("price-capacity-optimized", "capacity-optimized", "capacity-optimized-prioritized",
                              "lowest-price")
SpotAllocationStrategy = Literal["price-capacity-optimized", "capacity-optimized", "capacity-optimized-prioritized",
                                 "lowest-price"]


class SpotSpec(Frozen):
    """A Spot tier above the pool's On-Demand baseline (a sibling group with a mixed instances policy).

    EC2 Auto Scaling allows no warm pool on a group with a mixed instances policy or Spot, so the pool becomes
    two groups behind the same target group: the On-Demand group (baseline, warm pool, hooks, instance refresh)
    and the Spot group, which takes the load above the baseline (docs/runbook.md#spot-tier).
    """

    on_demand_base: int | None = Field(
        default=None, ge=0, le=1000,
        description="On-Demand instances the pool always keeps (the On-Demand group's min). Default: capacity.min.",
    )
    spot_percentage: int = Field(
        default=100, ge=1, le=100,
        description="Share (percent) of the capacity above on_demand_base that runs on Spot; the rest of the "
        "Spot group's capacity is On-Demand (OnDemandPercentageAboveBaseCapacity = 100 - this).",
    )
    instance_types: tuple[Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9]*\.[0-9a-z]+$")], ...] = Field(
        default=(),
        description="Instance types the Spot group may launch, all with the pool's GPU (same count), so the engine "
        "cache key stays the same: e.g. g6e.xlarge and g6e.2xlarge for L40S. Default: the pool's instance_type.",
    )
    allocation_strategy: SpotAllocationStrategy = Field(
        default="price-capacity-optimized",
        description="Spot allocation strategy: price-capacity-optimized, capacity-optimized, "
        "capacity-optimized-prioritized (instance_types in priority order) or lowest-price.",
    )
    capacity_rebalance: bool = Field(
        default=True,
        description="Capacity Rebalancing: the Spot group launches a replacement when EC2 recommends a rebalance, "
        "then terminates the at-risk instance through the terminate hook (a drain like a scale-in).",
    )
    drain_on_rebalance: bool = Field(
        default=False,
        description="The instance also starts its drain on the rebalance recommendation "
        "(events/recommendations/rebalance), not only on the two-minute interruption notice. Read at boot: "
        "a change reaches new instances.",
    )
    on_demand_fallback_max: int | None = Field(
        default=None, ge=0, le=1000,
        description="Most On-Demand instances when Spot capacity is unavailable: a capacity launch failure of the "
        "Spot group raises the On-Demand group's max up to this ceiling. Default: capacity.max; "
        "on_demand_base turns fallback off.",
    )
    allow_all_spot: bool = Field(
        default=False,
        description="Required for spot_percentage 100 with on_demand_base 0: every instance may be reclaimed at once.",
    )


class Pool(Frozen):
    """One Auto Scaling group of one instance type (engines are per GPU architecture)."""

    name: Name
    instance_type: str = Field(pattern=r"^[a-z][a-z0-9]*\.[0-9a-z]+$", description="e.g. g6e.xlarge.")
    capacity: Capacity
    engine: EngineOverride = Field(default_factory=EngineOverride, description="Overrides of the fleet engine.")
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    schedule: tuple[ScheduledCapacity, ...] = Field(default=(), description="Optional daily capacity profile.")
    warm_pool: WarmPoolSpec = Field(default_factory=WarmPoolSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    capacity_reservation_ids: tuple[Annotated[str, StringConstraints(pattern=r"^cr-[0-9a-f]{17}$")], ...] = Field(
        default=(), description="On-Demand Capacity Reservations (cr-...) the pool's group launches into first.",
    )
    capacity_reservations_only: bool = Field(
        default=False,
        description="Launch only into capacity_reservation_ids (fail when they are full) instead of falling back "
        "to On-Demand capacity.",
    )
    root_volume_gib: int = Field(default=200, ge=100, le=16384, description="Encrypted gp3 root volume size.")
    spot: SpotSpec | None = Field(
        default=None,
        description="Optional Spot tier above the On-Demand baseline; without it the pool is one On-Demand group.",
    )
    serves: tuple[Serve, ...] = Field(
        default=(),
        description="What each instance serves: models, copies and KV budgets, e.g. [{model: gpt2-xl, copies: 1, "
        "kv_cache_gb: 12}]. Empty: one copy of every model. Every pool of a region serves the same models.",
    )
    gpu_sharing: GpuSharing = Field(
        default=GpuSharing.TIME_SLICING,
        description="How the instance's engine processes share its GPU: time_slicing (each its own CUDA context) "
        "or mps (one MPS control daemon per GPU, each process a client with a device-memory limit of its planned "
        "share plus its part of the headroom; a fatal GPU fault in one restarts every process of that GPU "
        "together). Default time_slicing: on an H200 (reference backend only) MPS served two busy processes "
        "1.8-2.0x the time-sliced throughput, but a lone client ran 1-16% slower and one client's fault stopped "
        "every model on the GPU for 13-18 s; set mps for packed pools whose processes are busy together "
        "(docs/runtime.md, \"GPU sharing\").",
    )

    @property
    def family(self) -> str:
        return self.instance_type.split(".", 1)[0]

    @property
    def on_demand_base(self) -> int:
        """On-Demand instances held without load: the spot block's base, else the whole baseline."""
        if self.spot is not None and self.spot.on_demand_base is not None:
            return self.spot.on_demand_base
        return self.capacity.min

    @property
    def spot_instance_types(self) -> tuple[str, ...]:
        if self.spot is None:
            return ()
        return self.spot.instance_types or (self.instance_type,)

    @property
    def on_demand_fallback_max(self) -> int:
        """Ceiling of the On-Demand group while Spot capacity is unavailable."""
        if self.spot is None:
            return self.capacity.max
        ceiling = self.spot.on_demand_fallback_max
        return self.capacity.max if ceiling is None else ceiling

    @model_serializer(mode="wrap")
    def _omit_absent_spot(self, handler: SerializerFunctionWrapHandler) -> Any:
        # A pool without a spot tier dumps exactly as before the field existed: the config parameter,
        # the digests and so the templates of spot-less fleets stay byte-identical.
        data = handler(self)
        if self.spot is None and isinstance(data, dict):
            data.pop("spot", None)
        if not self.serves and isinstance(data, dict):
            data.pop("serves", None)  # likewise for pools that serve every model once
        if self.gpu_sharing is GpuSharing.TIME_SLICING and isinstance(data, dict):
            data.pop("gpu_sharing", None)  # and for pools that share their GPU as every pool did before the field
        return data

    @model_validator(mode="after")
    def _thread_cap_needs_mps(self) -> Pool:
        capped = [f"serves[{i}].mps_active_thread_percentage ({s.model})" for i, s in enumerate(self.serves)
                  if s.mps_active_thread_percentage is not None]
        if capped and self.gpu_sharing is not GpuSharing.MPS:
            raise ValueError(f"{', '.join(capped)} is set, but the pool shares its GPU by {self.gpu_sharing.value}: "
                             "an SM cap needs gpu_sharing: mps; set it or drop the cap")
        return self

    @model_validator(mode="after")
    def _reservations_only_needs_ids(self) -> Pool:
        if self.capacity_reservations_only and not self.capacity_reservation_ids:
            raise FieldProblem("capacity_reservations_only", "capacity_reservations_only is set but capacity_reservation_ids is empty: "
                             "name the reservations (cr-...) or drop capacity_reservations_only")
        return self


class AvailabilityZone(Frozen):
    name: AzName
    id: AzId


# "The allowed block size is between a /16 netmask (65,536 IP addresses) and /28 netmask (16 IP
# addresses)" (Amazon VPC User Guide, "VPC CIDR blocks"; EC2 API CreateVpc).
VPC_PREFIX_RANGE = (16, 28)


def _check_vpc_cidr(value: str) -> str:
    _check_cidr(value)
    prefix = int(value.rsplit("/", 1)[1])
    low, high = VPC_PREFIX_RANGE
    if not low <= prefix <= high:
        raise ValueError(f"{value!r}: a VPC CIDR is between /{low} and /{high} (Amazon VPC), got /{prefix}")
    return value


class NewVpc(Frozen):
    union_tag: ClassVar[str] = "new"

    cidr: str = Field(description="CIDR of the VPC Fleetcast creates, /16 to /28 and large enough for one /20 "
                                  "subnet per AZ (and a /24 public one per AZ with egress `nat`).")

    @field_validator("cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        return _check_vpc_cidr(value)


class ExistingVpc(Frozen):
    union_tag: ClassVar[str] = "existing"

    vpc_id: VpcId
    cidr: str = Field(description="The VPC's CIDR (opened to the NLB health checks).")
    subnet_ids: tuple[SubnetId, ...] = Field(min_length=2, description="Private subnets, one per AZ, same order as availability_zones.")
    route_table_ids: tuple[Annotated[str, StringConstraints(pattern=r"^rtb-[0-9a-f]{8,17}$")], ...] = Field(
        min_length=1, description="Route tables of those subnets (for the S3 gateway endpoint)."
    )
    create_endpoints: bool = Field(
        default=True,
        description="With egress `none`, create the S3 gateway and interface VPC endpoints the instances need. "
        "Set false when the VPC already has them (a second set with private DNS would fail to deploy).",
    )

    @field_validator("cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        return _check_vpc_cidr(value)


def _vpc_kind(value: object) -> str:
    """An entry with `vpc_id` imports a VPC; anything else is a new one (so a bad CIDR is the one error)."""
    if isinstance(value, dict):
        return ExistingVpc.union_tag if "vpc_id" in value else NewVpc.union_tag
    return ExistingVpc.union_tag if isinstance(value, ExistingVpc) else NewVpc.union_tag


VpcSpec = Annotated[
    Annotated[NewVpc, Tag(NewVpc.union_tag)] | Annotated[ExistingVpc, Tag(ExistingVpc.union_tag)],
    Discriminator(_vpc_kind),
]


class AmiSpec(Frozen):
    """Pinned DLAMI id (default), or `latest` from the public SSM parameter (rolls the fleet when AWS updates it)."""

    id: AmiId | Literal["latest"] = Field(description="ami-... pinned id, or 'latest'.")


class Region(Frozen):
    """One provider region: its network, its pools, and who may connect."""

    region: RegionName
    availability_zones: tuple[AvailabilityZone, ...] = Field(description="At least two; names and AZ IDs.")
    vpc: VpcSpec = Field(description="`cidr` alone: Fleetcast creates the VPC; with `vpc_id`: an existing VPC.")
    ami: AmiSpec
    allowed_principals: tuple[str, ...] = Field(description="IAM principal ARNs allowed to create endpoints.")
    allowed_regions: tuple[RegionName, ...] = Field(
        default=(), description="Consumer regions allowed to connect cross-region (SupportedRegions)."
    )
    pools: tuple[Pool, ...] = Field(min_length=1)
    endpoint_service_name: str | None = Field(
        default=None,
        pattern=ENDPOINT_SERVICE_NAME_PATTERN,
        description="This region's endpoint service (its provider stack's EndpointServiceName output), published "
        "after it deploys: other regions' spill endpoints and consumers' failover endpoints connect to it by this "
        "name; until it is set they are not built.",
    )

    @model_serializer(mode="wrap")
    def _omit_unpublished_service_name(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Regions without it dump as before the field existed (the config parameter stays the same).
        data = handler(self)
        if self.endpoint_service_name is None and isinstance(data, dict):
            data.pop("endpoint_service_name", None)
        return data

    def pool(self, name: str) -> Pool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"no pool {name!r} in {self.region}")

    @field_validator("allowed_principals")
    @classmethod
    def _explicit_principals(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("allowed_principals is empty: name each consumer account's principal")
        for arn in value:
            if "*" in arn:
                raise ValueError(f"{arn!r}: wildcard principals are not allowed; name each principal")
            if not full_match(PRINCIPAL_ARN_PATTERN, arn):
                raise ValueError(
                    f"{arn!r} is not an IAM principal ARN such as arn:aws:iam::111122223333:root or ...:role/name"
                )
        return value


# ---------------------------------------------------------------- consumers


class ConsumerSubnet(Frozen):
    id: SubnetId
    az_id: AzId


class ModelLimits(Frozen):
    """One consumer's limits on one model or adapter, on top of its own (per instance)."""

    max_concurrency: int = Field(default=32, ge=1, le=10_000)
    requests_per_minute: int = Field(default=600, ge=1, le=10_000_000)


class ConsumerLimits(ModelLimits):
    """Enforced at the instance gateway (per instance)."""

    models: dict[str, ModelLimits] = Field(
        default_factory=dict,
        description="Limits per model or adapter id (one the consumer may call), within the consumer's own.",
    )

    @model_serializer(mode="wrap")
    def _omit_absent_model_limits(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Consumers without per-model limits dump as before the field existed (the config parameter stays the same).
        data = handler(self)
        if not self.models and isinstance(data, dict):
            data.pop("models", None)
        return data


class AdmissionPriority(str, Enum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


class ConsumerAdmission(Frozen):
    """How the gateway orders this consumer's requests when an engine process is full (docs/gateway.md,
    "Fair admission"): per consumer queues, weighted fair queuing within a class, interactive before batch."""

    weight: float = Field(
        default=1.0, gt=0, le=1000,
        description="Share of a full engine process's admissions against the other consumers of the same class "
                    "(weighted fair queuing; equal weights by default).",
    )
    priority: AdmissionPriority = Field(
        default=AdmissionPriority.INTERACTIVE,
        description="interactive (default) or batch: a batch request waits while any interactive request of the "
                    "same engine process waits.",
    )
    max_queued: int = Field(
        default=64, ge=0, le=10_000,
        description="Requests this consumer may have waiting for an engine process per instance; beyond it a 429 "
                    "with Retry-After (0: none wait, a full engine process answers 429 at once).",
    )
    max_queue_wait_s: float = Field(
        default=30.0, gt=0, le=600,
        description="Longest wait for an engine process; past it a retryable 503 with Retry-After.",
    )


class Consumer(Frozen):
    """One consumer account's interface endpoint into a provider region's service."""

    name: Name
    account: AccountId
    region: RegionName = Field(description="Region of the consumer's VPC.")
    service_region: RegionName = Field(description="Provider region it reaches (cross-region when different).")
    vpc_id: VpcId
    subnets: tuple[ConsumerSubnet, ...] = Field(min_length=1)
    cidrs: tuple[str, ...] = Field(min_length=1, description="Consumer CIDRs allowed to the endpoint and the NLB.")
    endpoint_service_name: str | None = Field(
        default=None,
        pattern=ENDPOINT_SERVICE_NAME_PATTERN,
        description="Published after the provider deploys; a consumer without it is skipped by synth.",
    )
    limits: ConsumerLimits = Field(default_factory=ConsumerLimits)
    admission: ConsumerAdmission = Field(default_factory=ConsumerAdmission)
    api_keys: bool = Field(default=False, description="Require per-caller API keys (Secrets Manager).")
    api_key_secret: str | None = Field(
        default=None,
        pattern=SECRET_NAME_PATTERN,
        description="Secrets Manager secret holding this consumer's API keys (JSON {\"keys\": [...]}); "
        "default <fleet>/consumers/<consumer>/api-keys. The gateway accepts the AWSCURRENT and AWSPREVIOUS "
        "versions, so rotation needs no restart.",
    )
    cache_group: Name | None = Field(
        default=None,
        description="KV-cache salt group: consumers naming the same group share cached prompt prefixes (a common "
        "system prompt) on the engines they share; absent: this consumer shares them with no other account. The "
        "gateway salts each request by the group, so an account cannot time another's prefixes outside its group.",
    )

    spill_regions: tuple[RegionName, ...] = Field(
        default=(),
        description="Provider regions its home region (service_region) may send its requests to when home is "
        "full, through the provider's own cross-region PrivateLink endpoint; each must serve every model the "
        "consumer may call there. Empty (default): strict residency, its requests are served in service_region only.",
    )
    failover_region: RegionName | None = Field(
        default=None,
        description="A second provider region the consumer's stack connects to with a second interface endpoint "
        "(the FailoverEndpointDnsEntries output), for when service_region is down, and a private DNS name (the "
        "FailoverRecordName output) that moves to it when an in-VPC probe of the home endpoint fails (without TLS "
        "listeners); it must serve every model the consumer may call there and allow the consumer "
        "(allowed_principals, allowed_regions).",
    )

    @field_validator("cidrs")
    @classmethod
    def _cidrs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_check_cidr(v) for v in value)

    @model_serializer(mode="wrap")
    def _omit_default_admission(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Consumers with the default admission (and no spill or failover) dump as before those fields existed
        # (the config parameter stays the same).
        data = handler(self)
        if isinstance(data, dict):
            if self.admission == ConsumerAdmission():
                data.pop("admission", None)
            if not self.spill_regions:
                data.pop("spill_regions", None)
            if self.failover_region is None:
                data.pop("failover_region", None)
        return data

    @property
    def cross_region(self) -> bool:
        return self.region != self.service_region


# ---------------------------------------------------------------- top level


class Provider(Frozen):
    account: AccountId = Field(description="Account that owns the fleets and endpoint services.")


# An ACM certificate ARN (its region and account are checked against the key and provider.account by
# fleetcast/config/rules.py, which names both).
AcmCertificateArn = Annotated[str, StringConstraints(
    pattern=r"^arn:aws[a-z-]*:acm:[a-z]{2}(-gov)?-[a-z]+-[0-9]:[0-9]{12}:certificate/[0-9a-f-]{36}$")]


class Network(Frozen):
    egress: EgressMode = Field(default=EgressMode.NONE, description="none (VPC endpoints only) or nat.")
    tls_certificate_arns: dict[RegionName, AcmCertificateArn] = Field(
        default_factory=dict,
        description="ACM certificate ARN per provider region for a TLS listener; without one the "
        "listener is TCP and traffic stays on AWS's private network through PrivateLink.",
    )


class PlanDriftCheck(Frozen):
    """A scheduled `plan --check` in each provider region (docs/plan.md, "Drift")."""

    schedule: str = Field(
        default="rate(1 day)",
        description="EventBridge schedule expression: rate(N minutes|hours|days) or cron(...) (UTC).",
    )
    threshold: float = Field(
        default=0.2, gt=0, le=10,
        description="Relative change that counts as drift: the share of requests above the target may grow by this "
        "much, and cost per token may move by this fraction (0.2 = 20%).",
    )

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str) -> str:
        problem = schedule_problem(value)
        if problem:
            raise ValueError(f"{value!r}: {problem}")
        return value


class Operations(Frozen):
    log_retention_days: int = Field(default=30, description="CloudWatch Logs retention for instance logs.")
    drain_timeout_s: int = Field(default=300, ge=10, le=3600, description="Longest in-flight request allowed to finish on scale-in.")
    launch_hook_timeout_s: int = Field(default=3600, ge=30, le=7200, description="Heartbeat window of the launch hook.")
    build_failure_limit: int = Field(default=3, ge=1, le=100, description="Failed builds per cache key before the circuit breaker trips.")
    auto_approve_connections: bool = Field(default=False, description="Deploy the auto-approver Lambda for allowed accounts.")
    alarm_email: str | None = Field(default=None, pattern=r"^[!-?A-~]+@[!-?A-~]+\.[!-?A-~]+$")
    plan_drift_check: PlanDriftCheck | None = Field(
        default=None, description="Run the plan drift check on a schedule in each provider region (a Lambda in the "
        "provider stack): publishes PlanDrift and notifies the operations topic with the reason.")

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        allowed = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)
        if value not in allowed:
            raise ValueError(f"log_retention_days must be one of CloudWatch's values: {allowed}")
        return value


# What changes without new instances. Consumers and who may call which model (models[].consumers): running
# gateways re-read them (runtime/gateway/reload.py). The rest is read only by the stacks, never on an
# instance: the endpoint service's allow lists, the group's size, scaling, warm pool,
# schedule, reservations and rollout policy, the SLOs (alarms, scaling, plan) and
# the alarm/log/approver settings. Onboarding a consumer or resizing a pool must not
# roll a GPU fleet. Anything not listed here is treated as an instance input (a change
# rolls): the safe default for fields added later.
# Read only by pools whose build calibrates (contract/support.py needs_calibration): in their digest alone.
CALIBRATED_POOLS_ONLY = ("calibration",)
# A model's fields read only where its pool runs several engine processes (their KV budgets and MPS limits count
# each model's overhead, fleetcast/config/memory.served_overhead): in those pools' digests alone.
SEVERAL_PROCESS_POOLS_ONLY = ("parameters_b",)
NOT_IN_INSTANCE_DIGEST: dict[str, Any] = {
    "consumers": True,
    "slo": True,
    # Stack tags: the groups propagate them to the instances they launch, the launch template does not
    # carry them (stacks/app_builder.py), and no instance reads them.
    "tags": True,
    # stage_patterns: what staging copies (instances read the staged manifest). parameters_b: read by validate, and
    # by instances only in pools of several processes (SEVERAL_PROCESS_POOLS_ONLY puts it back in their digests).
    # consumers (who may call the model and its adapters): running gateways re-read them with the consumers
    # (runtime/gateway/reload.py), so an entitlement change rolls no pool.
    "models": {"__all__": {"stage_patterns", "slo", "parameters_b", "consumers"}},
    "operations": {"log_retention_days", "auto_approve_connections", "alarm_email", "plan_drift_check"},
    "regions": {"__all__": {
        "allowed_principals": True,
        "allowed_regions": True,
        # Read by the stacks (spill and failover endpoints) only; a gateway finds its spill endpoint's DNS name
        # in the spill parameter (fleetcast/contract/spill.py).
        "endpoint_service_name": True,
        # The spot tier is the groups' business: the instance reads drain_on_rebalance from the config it loads.
        "pools": {"__all__": {"capacity", "scaling", "schedule", "warm_pool", "rollout", "capacity_reservation_ids",
                              "capacity_reservations_only", "spot"}},
    }},
}


# What `fleetcast config show` passes to model_dump: the list form, even for a one-model fleet.
LIST_FORM: dict[str, Any] = {"models_as_list": True}
# ModelSpec fields the single-model dump leaves out while they hold their default (calibration moves to the top).
_SINGLE_FORM_OPTIONAL = ("parameters_b", "engine", "slo", "consumers", "adapters")


def _at_default(key: str, value: object) -> bool:
    if key == "engine":
        return isinstance(value, dict) and all(v is None for v in value.values())
    if key == "adapters":
        return not value
    return value is None  # consumers: [] (nobody may call it) is not the default


@dataclass(frozen=True)
class ServedModel:
    """One model an instance of a pool runs: its resolved engine, its copies and each copy's KV budget."""

    model: ModelSpec
    engine: EngineSpec
    copies: int
    kv_cache_bytes: int | None
    mps_active_thread_percentage: int | None = None  # the serve's cap, under gpu_sharing: mps


def _canonical_digest(data: dict[str, Any]) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class FleetConfig(Frozen):
    """A private TensorRT-LLM fleet: one provider stack per region, one consumer stack per consumer."""

    version: Literal[1] = Field(description="Config format version.")
    name: Name = Field(description="Fleet name; prefixes stack names.")
    provider: Provider
    models: tuple[ModelSpec, ...] = Field(
        min_length=1,
        description="The served models. The single-model form (`model:` with a top-level `calibration:`) is still "
        "read, as a one-model list.",
    )
    engine: EngineSpec = Field(
        default_factory=EngineSpec,
        description="Fleet-wide engine: the TensorRT-LLM version, image and port, and the defaults every model's "
        "`engine` and every pool's `engine` override.",
    )
    slo: Slo
    network: Network = Field(default_factory=Network)
    operations: Operations = Field(default_factory=Operations)
    regions: tuple[Region, ...] = Field(min_length=1)
    consumers: tuple[Consumer, ...] = Field(
        default=(),
        description="Consumer accounts. Not part of any instance digest: a change reaches running gateways "
                    "through their config refresh (60 s) and replaces no instance.",
    )
    tags: dict[Annotated[str, StringConstraints(min_length=1, max_length=128)], Annotated[str, StringConstraints(max_length=256)]] = Field(
        default_factory=dict, description="Tags applied to every resource of every stack except the launch templates; "
        "each Auto Scaling group propagates them to the instances it launches. A change re-tags in place and "
        "replaces no instance: running instances keep the tags they launched with, root volumes carry none."
    )

    @model_validator(mode="before")
    @classmethod
    def _single_model_form(cls, data: object) -> object:
        """`model:` (+ top-level `calibration:`), the form of one-model fleets, is a one-model `models:` list."""
        if not isinstance(data, dict):
            return data
        if "model" not in data:
            if "calibration" in data and "models" in data:
                raise FieldProblem("calibration", "top-level calibration belongs to the single-model form (`model:`); with `models:` "
                                 "set models[].calibration on each model that needs it")
            return data
        if "models" in data:
            raise FieldProblem("model", "the config has both `model:` and `models:`; give one: `model:` for a single model, "
                             "or a `models:` list (README, 'Several models on one fleet')")
        data = dict(data)
        model, calibration = data.pop("model"), data.pop("calibration", None)
        if isinstance(model, dict) and calibration is not None:
            if "calibration" in model:
                raise FieldProblem("calibration", "calibration is given twice: at the top level and under model; keep one")
            model = {**model, "calibration": calibration}
        data["models"] = [model]
        return data

    @model_serializer(mode="wrap")
    def _dump_single_model_form(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        # A fleet of one model that every pool serves once dumps in the single-model form, as before the list
        # existed: its config parameter, digests and so its templates stay byte-identical, and writing the same
        # fleet as a one-model list rolls nothing. `config show` asks for the list form (LIST_FORM).
        data = handler(self)
        context = info.context or {}
        if not isinstance(data, dict) or context.get("models_as_list") or "models" not in data \
                or len(self.models) != 1 or any(p.serves for r in self.regions for p in r.pools):
            return data
        (model,) = data["models"]
        model = dict(model)
        calibration = model.pop("calibration", None)
        for key in _SINGLE_FORM_OPTIONAL:
            if key in model and _at_default(key, model[key]):
                del model[key]
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key == "models":
                out["model"] = model
            elif key == "engine":
                out["engine"] = value
                out["calibration"] = calibration
            else:
                out[key] = value
        out.setdefault("calibration", calibration)
        return out

    # -- derived views (no state of their own) --

    @property
    def model(self) -> ModelSpec:
        """The fleet's only model, for the commands that handle one-model fleets (the planner, bench, smoke)."""
        if len(self.models) != 1:
            from fleetcast.contract.errors import UserError

            raise UserError(f"this fleet serves {len(self.models)} models ({', '.join(m.id for m in self.models)}); "
                            "this step handles one-model fleets only")
        return self.models[0]

    def model_by_id(self, model_id: str) -> ModelSpec:
        for model in self.models:
            if model.id == model_id:
                return model
        raise KeyError(f"no model {model_id!r} in models; known: {', '.join(m.id for m in self.models)}")

    def model_named(self, model_id: str, where: str = "--model") -> ModelSpec:
        """The model a person named (`where`: the flag or field they named it in), or a usage error that lists
        the models there are."""
        from fleetcast.contract.errors import EXIT_USAGE, UserError

        try:
            return self.model_by_id(model_id)
        except KeyError:
            pass
        raise UserError(f"{where} {model_id!r} is not a model of the config; allowed: "
                        f"{', '.join(m.id for m in self.models)}", EXIT_USAGE)

    def models_for(self, consumer_name: str) -> tuple[str, ...]:
        """The model and adapter ids `consumer_name` may call, in config order (models[].consumers; absent: all)."""
        out: list[str] = []
        for model in self.models:
            if model.consumers is None or consumer_name in model.consumers:
                out += [model.id, *(a.id for a in model.adapters)]
        return tuple(out)

    def salt_groups_of(self, model_id: str) -> frozenset[str] | None:
        """The KV-cache salt groups that may call `model_id` (fleetcast.contract.isolation); None when the set is
        open: a model without `consumers` serves every consumer, also those a config refresh adds later."""
        model = self.model_by_id(model_id)
        if model.consumers is None:
            return None
        groups = {c.name: salt_group(c.name, c.cache_group) for c in self.consumers}
        return frozenset(groups[name] for name in model.consumers if name in groups)

    def region(self, name: str) -> Region:
        for region in self.regions:
            if region.region == name:
                return region
        raise KeyError(f"no provider region {name!r} in the config")

    def engine_for(self, pool: Pool, model_id: str | None = None) -> EngineSpec:
        """What `pool` builds and serves for `model_id`: the fleet engine <- the model's engine <- the pool's.

        `model_id` may be left out in a one-model fleet only.
        """
        model = self.model if model_id is None else self.model_by_id(model_id)
        changes = {k: v for k, v in model.engine.model_dump().items() if v is not None}
        changes.update({k: v for k, v in pool.engine.model_dump().items() if v is not None})
        return self.engine.model_copy(update=changes) if changes else self.engine

    def unused_engine_defaults(self, pool: Pool | None = None) -> tuple[str, ...]:
        """Fields of the fleet `engine` that `pool` (None: every pool) builds with for none of the models it
        serves, since each model's or the pool's `engine` sets its own (engine_for). Fleet-wide fields (the
        TensorRT-LLM version, image, port) are always used."""
        pools = [pool] if pool is not None else [p for r in self.regions for p in r.pools]
        served = [(p, self.model_by_id(s.model)) for p in pools for s in self.serves_of(p)]
        return tuple(name for name in EngineOverride.model_fields
                     if all(getattr(m.engine, name) is not None or getattr(p.engine, name) is not None
                            for p, m in served))

    def serves_of(self, pool: Pool) -> tuple[Serve, ...]:
        """The pool's `serves`, or one copy of every model when it names none."""
        return pool.serves or tuple(Serve(model=m.id) for m in self.models)

    def served_by(self, pool: Pool) -> tuple[ServedModel, ...]:
        """What each of the pool's instances runs, one entry per served model in the order of its `serves`.

        kv_cache_bytes is each copy's KV budget from the pool's kv_cache_gb; None where the serve gives none:
        the instance then plans that copy's share from the memory actually free (runtime/kv_budget.py), or,
        for a pool of one process, keeps the engine's kv_cache_free_gpu_memory_fraction as before.
        """
        return tuple(ServedModel(self.model_by_id(s.model), self.engine_for(pool, s.model), s.copies,
                                 None if s.kv_cache_gb is None else int(s.kv_cache_gb * GIB),
                                 s.mps_active_thread_percentage)
                     for s in self.serves_of(pool))

    def consumers_of(self, region_name: str) -> tuple[Consumer, ...]:
        return tuple(c for c in self.consumers if c.service_region == region_name)

    @property
    def config_parameter_name(self) -> str:
        """The SSM parameter each provider region's stack writes the validated config to."""
        return f"/{self.name}/config"

    def asg_name_of(self, region_name: str, pool: Pool) -> str:
        """The pool's Auto Scaling group name, explicit so roles and reports can name it without a lookup."""
        return f"{self.name}-{region_name}-{pool.name}"

    def spot_asg_name_of(self, region_name: str, pool: Pool) -> str:
        """The Spot group of a pool with a spot tier: the On-Demand group's name plus `-spot`."""
        return f"{self.asg_name_of(region_name, pool)}-spot"

    def api_key_secret_of(self, consumer: Consumer) -> str:
        """Secrets Manager name of a consumer's API keys: read by the gateway, granted by the fleet stack."""
        return consumer.api_key_secret or f"{self.name}/consumers/{consumer.name}/api-keys"

    def digest(self) -> str:
        """Stable digest of the whole validated config (labels bench results, names the SSM parameter's version)."""
        return _canonical_digest(self.model_dump(mode="json"))

    def instance_digest(self, region_name: str, pool_name: str) -> str:
        """Digest of what one pool's instances are built from: its own region and pool entry (other
        regions and pools left out) and the fleet-wide fields, less NOT_IN_INSTANCE_DIGEST, less the fleet
        engine defaults the pool overrides for every model it serves (unused_engine_defaults), and less
        `calibration` where the pool's precision is not calibrated (CALIBRATED_POOLS_ONLY).

        The pool's launch template carries it, so a change here rolls that pool (and only the
        pools it concerns); onboarding a consumer or resizing a pool reaches the fleet through
        the gateways' config refresh or the group's own settings instead.
        """
        data = self.model_dump(mode="json", exclude=NOT_IN_INSTANCE_DIGEST)
        region = next((r for r in data["regions"] if r["region"] == region_name), None)
        if region is None:
            raise KeyError(f"no provider region {region_name!r} in the config")
        region["pools"] = [p for p in region["pools"] if p["name"] == pool_name]
        if not region["pools"]:
            raise KeyError(f"no pool {pool_name!r} in {region_name}")
        data["regions"] = [region]
        pool = self.region(region_name).pool(pool_name)
        # A fleet engine default that every model of the pool (or the pool) overrides builds nothing there.
        for name in self.unused_engine_defaults(pool):
            del data["engine"][name]

        def calibrates(model_id: str) -> bool:
            engine = self.engine_for(pool, model_id)
            return support.needs_calibration(engine.backend.value, engine.precision.value, engine.kv_cache_dtype.value)

        # Only a calibrated build reads the set (runtime/bootstrap.py): the other pools' instances stay.
        several_processes = sum(serve.copies for serve in self.serves_of(pool)) > 1
        if "models" in data:
            # A model the pool does not serve is no input of its instances: adding one elsewhere rolls nothing here.
            served = {s.model for s in self.serves_of(pool)}
            data["models"] = [m for m in data["models"] if m["id"] in served]
            for model in data["models"]:
                for name in SEVERAL_PROCESS_POOLS_ONLY if several_processes else ():
                    value = getattr(self.model_by_id(model["id"]), name)
                    if value is not None:  # unset reads as before: a config that never set it keeps its digest
                        model[name] = value
                if not calibrates(model["id"]):
                    for name in CALIBRATED_POOLS_ONLY:
                        model.pop(name, None)
        elif not calibrates(self.models[0].id):  # the single-model form: calibration at the top level
            for name in CALIBRATED_POOLS_ONLY:
                data.pop(name, None)
        return _canonical_digest(data)
