"""Which peer key a gateway reads on an instance, and whether it looks for peers (issue 36, section 1): in a region
with several pools the gateway balances even when nothing spills, so it reads that region's own balancing key from
Secrets Manager (fleetcast.contract.spill.peer_secret_of, the secret the stack generates: tests/stacks/
test_peer_key.py) and discovers its peers; in a region of one pool without spill it reads nothing and discovers
nothing. Secrets Manager is moto on loopback."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
from ruamel.yaml import YAML

from fleetcast.config import parse_config
from fleetcast.contract.spill import balance_secret_name, peer_secret_name
from runtime.gateway.__main__ import PeerKeyMissing, build_parser, discovers, spill_setup

ROOT = Path(__file__).resolve().parents[2]
KEY = "b" * 64


def args_for(region: str, pool: str, *extra: str):
    return build_parser().parse_args(["--listen", "127.0.0.1:1", "--upstream", "127.0.0.1:2", "--region", region,
                                      "--pool", pool, "--peer-discovery", "asg", *extra])


def load(path: Path):
    return parse_config(YAML(typ="safe").load(path.read_text()), str(path))


def test_a_gateway_in_a_region_of_several_pools_reads_its_balancing_key_and_discovers(fresh_aws):
    cfg = load(ROOT / "examples" / "multi-model" / "fleet.yaml")
    region = cfg.regions[0]
    assert len(region.pools) >= 2 and not any(c.spill_regions for c in cfg.consumers)
    boto3.client("secretsmanager", region_name=region.region).create_secret(
        Name=balance_secret_name(cfg.name), SecretString=KEY)
    args = args_for(region.region, region.pools[0].name)
    assert discovers(cfg, args)
    setup = spill_setup(cfg, args)
    assert setup is not None and setup.key == KEY.encode()
    assert setup.policy is None  # balancing only: no region to spill to


def test_the_balancing_key_not_there_yet_is_a_missing_key_the_gateway_waits_for(fresh_aws):
    """The spill key of another fleet layout is not taken instead: the name is the region's own."""
    cfg = load(ROOT / "examples" / "multi-model" / "fleet.yaml")
    region = cfg.regions[0]
    boto3.client("secretsmanager", region_name=region.region).create_secret(
        Name=peer_secret_name(cfg.name), SecretString=KEY)
    with pytest.raises(PeerKeyMissing, match="ResourceNotFoundException"):
        spill_setup(cfg, args_for(region.region, region.pools[0].name))


def test_a_gateway_in_a_region_of_one_pool_without_spill_reads_no_key_and_does_not_discover(fresh_aws):
    cfg = load(ROOT / "config" / "fleet.yaml")
    for region in cfg.regions:
        assert len(region.pools) == 1
        args = args_for(region.region, region.pools[0].name)
        assert not discovers(cfg, args)
        assert spill_setup(cfg, args) is None
    # A --peer named there by hand needs a key file: the region has no secret to read.
    region = cfg.regions[0]
    with pytest.raises(PeerKeyMissing, match="holds no peer key"):
        spill_setup(cfg, args_for(region.region, region.pools[0].name, "--peer", f"127.0.0.2:9={region.pools[0].name}"))
