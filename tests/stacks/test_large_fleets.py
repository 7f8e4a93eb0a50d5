"""Fleets that used to validate and then fail synth (issue 14 item 11): eight provider regions, twenty consumers.

Both failed for one reason: the config parameter's JSON passed Parameter Store's 8 KB limit
(each region entry is ~1 KB with its defaults, each consumer ~0.4 KB). The parameter is now
compressed beyond 8 KB (fleetcast/config/parameter.py); these synthesize the real app.
"""

import pytest

from fleetcast.config import config_from_json
from fleetcast.config.parameter import COMPRESSED_PREFIX
from tests.config.helpers_large import with_consumers, with_regions

from .synthesized import default_doc, synthesize


def _config_parameter(fleet, stack_name):
    (parameter,) = fleet.resources(stack_name, "AWS::SSM::Parameter").values()
    return parameter["Properties"]

@pytest.mark.parametrize("label,make,stacks", [
    ("eight-regions", lambda d: with_regions(d, 8), 8 + 1),
    ("twenty-consumers", lambda d: with_consumers(d, 20), 2 + 21),
])
def test_large_fleet_synthesizes_with_a_compressed_config_parameter(label, make, stacks):
    fleet = synthesize(make(default_doc()), label)
    assert len(fleet.stacks) == stacks
    first = f"{fleet.cfg.name}-provider-{fleet.cfg.regions[0].region}"
    props = _config_parameter(fleet, first)
    assert props["Value"].startswith(COMPRESSED_PREFIX) and len(props["Value"]) <= 8192
    assert props["Tier"] == "Advanced"
    assert config_from_json(props["Value"]) == fleet.cfg
