"""The value of the `/<fleet>/config` SSM parameter: how the validated config travels to instances.

One home for the encoding (written by stacks/bootstrap.py, read through
`config_from_json` by the runtime, the gateway and `config diff --deployed`) and for
Parameter Store's size limits, which `fleetcast config validate` checks so that synth
never meets them first.

Limits (AWS Systems Manager API Reference, PutParameter, `Value` and `Tier`): "Standard
parameters have a value limit of 4 KB. Advanced parameters have a value limit of 8 KB."
Up to 8 KB the value is the plain JSON (readable in the console), as before: on the free
standard tier up to 4 KB, on the advanced tier above. Beyond 8 KB it is zlib-compressed and
base64-encoded behind COMPRESSED_PREFIX: the JSON of a fleet repeats itself (every consumer
and region has the same keys), so eight regions or twenty consumers compress to a fraction
of the limit. The tier follows the plain JSON's size, not the compressed one: "But you can't
revert an advanced parameter to a standard parameter" (same reference, `Tier`), so a fleet that
grew past 4 KB must not flip back to standard the day compression starts. Validate refuses
a config whose value fits no tier, naming the limit.
"""

from __future__ import annotations

import base64
import zlib
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .model import FleetConfig

STANDARD_TIER_LIMIT = 4096
ADVANCED_TIER_LIMIT = 8192
COMPRESSED_PREFIX = "fleetcast-zlib-base64:"
# A delivered config is decompressed into at most this many bytes (a guard against a bomb).
MAX_DECOMPRESSED = 4 * 1024 * 1024

Tier = Literal["Standard", "Advanced"]


def encode_parameter(config_json: str) -> str:
    """The parameter value for a config's JSON: the JSON itself up to the advanced tier's limit, else compressed."""
    if len(config_json.encode()) <= ADVANCED_TIER_LIMIT:
        return config_json
    packed = base64.b64encode(zlib.compress(config_json.encode(), 9)).decode("ascii")
    return COMPRESSED_PREFIX + packed


def decode_parameter(value: str) -> str:
    """The JSON inside a parameter value (plain or compressed); ValueError when it is neither."""
    if not value.startswith(COMPRESSED_PREFIX):
        return value
    try:
        packed = base64.b64decode(value[len(COMPRESSED_PREFIX):], validate=True)
        inflater = zlib.decompressobj()
        data = inflater.decompress(packed, MAX_DECOMPRESSED)
    except (ValueError, zlib.error) as exc:
        raise ValueError(f"the compressed config parameter is corrupt: {exc}") from None
    if inflater.unconsumed_tail:
        raise ValueError(f"the compressed config parameter inflates beyond {MAX_DECOMPRESSED} bytes")
    return data.decode("utf-8")


def config_parameter(cfg: FleetConfig) -> tuple[str, Tier | None]:
    """The parameter value for `cfg` and its tier (None: the value fits no tier)."""
    config_json = cfg.model_dump_json()
    value = encode_parameter(config_json)
    if len(value.encode()) > ADVANCED_TIER_LIMIT:
        return value, None
    return value, "Standard" if len(config_json.encode()) <= STANDARD_TIER_LIMIT else "Advanced"
