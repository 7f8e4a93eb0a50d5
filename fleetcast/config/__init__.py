"""The fleet config: one typed, immutable model validated once at load."""

from .loader import ConfigError, config_from_json, json_schema, load_config, parse_config
from .model import (
    Backend,
    Consumer,
    EgressMode,
    EngineSpec,
    ExistingVpc,
    FleetConfig,
    GpuSharing,
    KvCacheDtype,
    ModelFamily,
    NewVpc,
    Pool,
    Precision,
    Region,
)
from .rules import ConfigIssue

__all__ = [
    "Backend", "ConfigError", "ConfigIssue", "Consumer", "EgressMode", "EngineSpec", "ExistingVpc",
    "FleetConfig", "GpuSharing", "KvCacheDtype", "ModelFamily", "NewVpc", "Pool", "Precision", "Region",
    "config_from_json", "json_schema", "load_config", "parse_config",
]
