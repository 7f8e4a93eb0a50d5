"""The config parameter fits Parameter Store, or validate says why (issue 14 item 11).

Twenty consumers, or eight provider regions, used to validate and then fail synth ("an SSM
parameter holds at most 8192"): beyond 8 KB the value is now compressed, and a config that
fits no tier even then is refused by validate, naming the limit.
"""

import re

import botocore.loaders
import pytest

from fleetcast.config import ConfigError, config_from_json, load_config, parameter, parse_config

from .conftest import DEFAULT
from .helpers_large import with_consumers, with_regions


def test_tier_limits_are_parameter_stores():
    """AWS Systems Manager API Reference, PutParameter: Value and Tier (botocore's ssm model)."""
    model = botocore.loaders.Loader().load_service_model("ssm", "service-2")
    members = model["shapes"]["PutParameterRequest"]["members"]
    value_doc = re.sub(r"<[^>]+>", "", members["Value"]["documentation"])
    tier_doc = re.sub(r"<[^>]+>", "", members["Tier"]["documentation"])
    assert f"Standard parameters have a value limit of {parameter.STANDARD_TIER_LIMIT // 1024} KB" in value_doc
    assert f"Advanced parameters have a value limit of {parameter.ADVANCED_TIER_LIMIT // 1024} KB" in value_doc
    # Why the tier follows the plain JSON's size: a parameter never goes back to standard.
    assert "you can't revert an advanced parameter to a standard parameter" in tier_doc


def test_shipped_config_is_plain_json_on_the_standard_tier():
    cfg = load_config(DEFAULT)
    value, tier = parameter.config_parameter(cfg)
    assert value == cfg.model_dump_json() and tier == "Standard"


@pytest.mark.parametrize("make,label", [(lambda d: with_consumers(d, 20), "20 consumers"),
                                        (lambda d: with_regions(d, 8), "8 regions")])
def test_large_fleets_fit_compressed_and_read_back(doc, make, label):
    cfg = parse_config(make(doc))
    plain = cfg.model_dump_json()
    assert len(plain) > parameter.ADVANCED_TIER_LIMIT, label  # what synth used to refuse
    value, tier = parameter.config_parameter(cfg)
    assert value.startswith(parameter.COMPRESSED_PREFIX) and len(value) <= parameter.ADVANCED_TIER_LIMIT
    assert tier == "Advanced"  # plain JSON above 4 KB: stays advanced (no revert to standard)
    assert config_from_json(value) == cfg  # what the instance, the gateway and `diff --deployed` read


def test_between_4_and_8_kb_the_value_stays_plain_json_as_before(doc):
    cfg = parse_config(with_consumers(doc, 4))
    value, tier = parameter.config_parameter(cfg)
    assert parameter.STANDARD_TIER_LIMIT < len(value) <= parameter.ADVANCED_TIER_LIMIT
    assert value == cfg.model_dump_json() and tier == "Advanced"


def test_a_config_that_fits_no_tier_is_refused_by_validate(doc):
    with pytest.raises(ConfigError) as caught:
        parse_config(with_consumers(doc, 400))
    messages = [i.message for i in caught.value.issues]
    assert len(messages) == 1, messages
    assert "holds at most 8192 bytes (advanced tier" in messages[0] and "even compressed" in messages[0]


def test_a_corrupt_or_inflating_parameter_is_refused():
    import base64
    import zlib

    with pytest.raises(ValueError, match="corrupt"):
        parameter.decode_parameter(parameter.COMPRESSED_PREFIX + "not base64!")
    bomb = base64.b64encode(zlib.compress(b" " * (parameter.MAX_DECOMPRESSED + 1))).decode()
    with pytest.raises(ValueError, match="inflates beyond"):
        parameter.decode_parameter(parameter.COMPRESSED_PREFIX + bomb)
