"""The contract layer's names and output keys are the ones the synthesized stacks carry: a CLI that reads
`ProviderOutput.X` from a deployed stack finds it, because the stack wrote exactly that key."""

from __future__ import annotations

from pathlib import Path

from fleetcast.contract.names import consumer_stack_name, provider_stack_name
from fleetcast.contract.outputs import ConsumerOutput, ProviderOutput

ROOT = Path(__file__).resolve().parents[2]


def test_every_provider_stack_writes_every_provider_output_key():
    # The CDK, imported where a test runs: not by every xdist worker collecting this module (12 s of import).
    from tests.stacks.synthesized import default_fleet

    fleet = default_fleet()
    for region in fleet.cfg.regions:
        outputs = fleet.template_json(provider_stack_name(fleet.cfg.name, region.region))["Outputs"]
        assert {key.value for key in ProviderOutput} <= set(outputs)


def test_every_consumer_stack_writes_its_endpoint_outputs():
    from tests.stacks.synthesized import default_fleet

    fleet = default_fleet()
    for consumer in fleet.cfg.consumers:
        outputs = fleet.template_json(consumer_stack_name(fleet.cfg.name, consumer.name))["Outputs"]
        assert {ConsumerOutput.ENDPOINT_ID.value, ConsumerOutput.ENDPOINT_DNS_ENTRIES.value} <= set(outputs)


def test_synthesized_stack_names_are_the_contract_names():
    from tests.stacks.synthesized import default_fleet

    fleet = default_fleet()
    expected = {provider_stack_name(fleet.cfg.name, r.region) for r in fleet.cfg.regions}
    expected |= {consumer_stack_name(fleet.cfg.name, c.name) for c in fleet.cfg.consumers}
    assert set(fleet.stacks) == expected


def test_no_second_definition_of_a_stack_name_or_a_substring_output_lookup():
    """Stack names are derived in one place; outputs are read by exact key (the old `pick_output` matched
    substrings, so a new output containing "bucket" would have broken staging)."""
    offenders = []
    for top in ("fleetcast", "stacks", "scripts", "runtime"):
        for path in (ROOT / top).rglob("*.py"):
            if path.parent.name == "contract":
                continue
            text = path.read_text()
            for needle in ('-provider-{', '-consumer-{', "def pick_output", "def provider_stack_name"):
                if needle in text:
                    offenders.append(f"{path.relative_to(ROOT)}: {needle}")
    assert offenders == []


def test_every_instance_variable_the_code_names_is_defined_in_the_contract():
    """One home for the `FLEETCAST_*` names: stacks render them, the runtime parses them, and a name that
    only one side spells is a setting silently lost."""
    import re

    from fleetcast.contract.instance_env import ENV_FILE_DELIMITER, KNOWN

    named = set()
    for top in ("fleetcast", "stacks", "scripts", "runtime", "docker"):
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and path.suffix in {".py", ".sh", ".service", ""} and path.parent.name != "contract":
                named |= set(re.findall(r"FLEETCAST_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="replace")))
    named.discard(ENV_FILE_DELIMITER)  # the user data's heredoc delimiter, not a variable
    assert sorted(named - KNOWN) == []
