"""A platform team's own app-level tags (`Tags.of(app).add(...)`) never reach Fleetcast's launch template data.

CDK's tag aspect reaches every taggable construct below the scope it is added to, ec2.LaunchTemplate included,
which renders its tags into LaunchTemplateData.TagSpecifications (instance, volume): aws-cdk-lib 2.275.0,
core/lib/tag-aspect.ts (Tag.applyTag) and aws-ec2/lib/launch-template.ts (`tagsToken`). Launch template data is
its version, and a new version starts an instance refresh (CloudFormation, AWS::AutoScaling::AutoScalingGroup
UpdatePolicy: "When properties that trigger an instance refresh change (such as LaunchTemplate ...)"), so
before the fix every tag change of the team's app replaced every pool's instances. The tags still reach the
instances through the groups (PropagateAtLaunch: EC2 Auto Scaling API reference, Tag: "Determines whether the
tag is added to new instances as they are launched in the group") and still tag the launch templates themselves
(their own TagSpecifications, which update with "No interruption": CloudFormation reference,
AWS::EC2::LaunchTemplate LaunchTemplateTagSpecification).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from aws_cdk import App, Tags

from fleetcast.config import parse_config
from fleetcast.contract.names import provider_stack_name
from stacks.fleet import add_fleet

from .synthesized import default_doc, default_fleet

TEAM_TAG = ("cost-center", "ml-platform-4711")


@pytest.fixture(scope="module")
def team_app() -> Path:
    """A team's app: its own app-wide tag, then the fleet's provider stacks added with the construct API."""
    cfg = parse_config(default_doc(), "<team>")
    outdir = Path(tempfile.mkdtemp(prefix="fleetcast-team-tags-"))
    # CDK's built-in CloudFormation validation off: no test reads this app's report, and it never fails a synthesis
    # (tests/stacks/synthesized.py)
    app = App(outdir=str(outdir), builtin_cloud_formation_validation=False)
    Tags.of(app).add(*TEAM_TAG)
    add_fleet(app, cfg, accounts={cfg.provider.account}, report=lambda _: None)
    app.synth()
    return outdir


def _of_type(template: dict, type_: str) -> dict[str, dict]:
    return {k: v["Properties"] for k, v in template["Resources"].items() if v["Type"] == type_}


def test_a_team_tag_leaves_every_launch_template_s_data_as_fleetcast_synthesizes_it(team_app):
    fleet = default_fleet()
    for region in fleet.cfg.regions:
        name = provider_stack_name(fleet.cfg.name, region.region)
        team = _of_type(json.loads((team_app / f"{name}.template.json").read_text()), "AWS::EC2::LaunchTemplate")
        own = _of_type(fleet.template_json(name), "AWS::EC2::LaunchTemplate")
        assert team and {k: v["LaunchTemplateData"] for k, v in team.items()} == \
            {k: v["LaunchTemplateData"] for k, v in own.items()}
        assert TEAM_TAG[0] not in json.dumps([v["LaunchTemplateData"] for v in team.values()])


def test_a_team_tag_still_reaches_instances_through_the_groups_and_tags_the_launch_templates(team_app):
    fleet = default_fleet()
    key, value = TEAM_TAG
    for region in fleet.cfg.regions:
        template = json.loads((team_app / f"{provider_stack_name(fleet.cfg.name, region.region)}.template.json")
                              .read_text())
        for group in _of_type(template, "AWS::AutoScaling::AutoScalingGroup").values():
            assert {"Key": key, "Value": value, "PropagateAtLaunch": True} in group["Tags"]
        for launch_template in _of_type(template, "AWS::EC2::LaunchTemplate").values():
            [own] = launch_template["TagSpecifications"]
            assert own["ResourceType"] == "launch-template" and {"Key": key, "Value": value} in own["Tags"]
