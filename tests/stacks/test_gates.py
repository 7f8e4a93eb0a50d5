"""Quality gates on the synthesized fleet: cdk-nag, cfn-lint (the real `cdk synth` offline: test_cdk_cli.py).

cdk-nag 3 reports through CDK policy validation: a finding fails synthesis and
lands in the cloud assembly's validation report (not in Annotations, where a
check would pass vacuously). So the gate is "synthesis succeeded with the
AwsSolutions pack registered", backed by a test that shows it does fail.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from aws_cdk import App, CfnResource, Environment, Stack, aws_ec2 as ec2

from stacks import nag

from .synthesized import (
    ROOT,
    default_doc,
    default_fleet,
    fleet_app,
    multi_model_fleet,
    nat_fleet,
    spot_fleet,
    synthesize,
    variant_fleet,
)

# ---------------------------------------------------------------- cdk-nag


def test_cdk_nag_passes_with_zero_unacknowledged_findings():
    for fleet in (default_fleet(), variant_fleet(), nat_fleet(), spot_fleet(), multi_model_fleet()):  # each synthesized with AwsSolutions registered
        report_path = fleet.outdir / nag.REPORT_FILE
        report = json.loads(report_path.read_text()) if report_path.exists() else {"pluginReports": []}
        nag_reports = [r for r in report["pluginReports"] if r["pluginName"] == "AwsSolutions"]
        assert all(r["conclusion"] == "success" and not r["violations"] for r in nag_reports)
        other = [v for r in report["pluginReports"] for v in r["violations"]]
        assert not other, f"template validation findings: {other}"


def test_the_gated_fleets_report_cdks_builtin_template_validation(tmp_path):
    """The fleets whose reports the gates read ran aws-cdk-lib's built-in CloudFormation validation, which the
    other in-process syntheses leave out (tests/stacks/synthesized.py): `validated` is what puts its findings, a
    property CloudFormation does not define (its F3002) here, in the report."""
    assert all(fleet.validated for fleet in (default_fleet(), variant_fleet(), nat_fleet(), spot_fleet(),
                                             multi_model_fleet()))
    reported = {}
    for validated in (True, False):
        app = fleet_app(tmp_path / str(validated), validated=validated)
        stack = Stack(app, "Odd", env=Environment(account="111122223333", region="ap-northeast-2"))
        CfnResource(stack, "Topic", type="AWS::SNS::Topic", properties={"NoSuchProperty": 1})
        app.synth()  # its findings are warnings: synthesis goes on
        report_path = tmp_path / str(validated) / nag.REPORT_FILE
        report = json.loads(report_path.read_text()) if report_path.exists() else {"pluginReports": []}
        reported[validated] = {(r["pluginName"], v["ruleName"]) for r in report["pluginReports"] for v in r["violations"]}
    assert ("CloudFormation Validate", "F3002") in reported[True]
    assert not reported[False]


def test_cdk_nag_gate_fails_synthesis_on_an_unacknowledged_finding(tmp_path):
    app = App(outdir=str(tmp_path))
    nag.enable(app)
    stack = Stack(app, "Bad", env=Environment(account="111122223333", region="ap-northeast-2"))
    vpc = ec2.Vpc.from_vpc_attributes(stack, "Vpc", vpc_id="vpc-0123456789abcdef0",
                                      availability_zones=["ap-northeast-2a"], vpc_cidr_block="10.0.0.0/16")
    open_to_world = ec2.SecurityGroup(stack, "OpenToTheWorld", vpc=vpc)
    open_to_world.add_ingress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(22))
    with pytest.raises(Exception, match="Validation ?[Ff]ailed"):
        app.synth()
    report = json.loads((tmp_path / nag.REPORT_FILE).read_text())
    violations = {v["ruleName"]: [c["constructPath"] for c in v["violatingConstructs"]]
                  for r in report["pluginReports"] if r["pluginName"] == "AwsSolutions" for v in r["violations"]}
    assert "Bad/OpenToTheWorld/Resource" in violations["AwsSolutions-EC23"]


def _findings(report: dict) -> set[tuple[str, str]]:
    found = set()
    for plugin in report["pluginReports"]:
        for violation in plugin["violations"]:
            rule = violation["ruleName"]
            if plugin["pluginName"] != "AwsSolutions":
                rule = f"CloudFormation-Validate::{rule}"
            for construct in violation["violatingConstructs"]:
                found.add((construct["constructPath"], rule))
    return found


# (findings, acknowledgments recorded) per config synthesized that way: test_spill_stacks and test_consumer_failover
# ask it of the same spill example, and a synthesis costs seconds of CPU.
_unacknowledged: dict[str, tuple[frozenset[tuple[str, str]], tuple[tuple[str, str], ...]]] = {}


def unacknowledged_findings(monkeypatch: pytest.MonkeyPatch, doc: dict, name: str) -> set[tuple[str, str]]:
    """Synthesize `doc` with cdk-nag's acknowledgments recorded (nag.RECORDED, which holds them for the rest of the
    test) but not applied: every finding, as (construct path, rule). Once per config per run."""
    key = json.dumps(doc, sort_keys=True)
    if key not in _unacknowledged:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(nag, "APPLY_ACKNOWLEDGMENTS", False)
            patch.setattr(nag, "RECORDED", [])
            with pytest.raises(Exception, match="Validation ?[Ff]ailed") as failure:
                synthesize(doc, name, validated=True)
            recorded = tuple(nag.RECORDED)
        with open(re.search(r"found in: (\S+)", str(failure.value)).group(1)) as report:
            _unacknowledged[key] = frozenset(_findings(json.load(report))), recorded
    findings, recorded = _unacknowledged[key]
    monkeypatch.setattr(nag, "RECORDED", list(recorded))
    return set(findings)


def uncovered_and_stale(findings: set[tuple[str, str]], acknowledged: set[tuple[str, str]]
                        ) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """Findings no acknowledgment covers (its path or a parent, the same rule), and acknowledgments no finding
    matches."""
    uncovered = {(path, rule) for path, rule in findings
                 if not any(path == p or path.startswith(p + "/") for p, r in acknowledged if r == rule)}
    stale = {(p, r) for p, r in acknowledged
             if not any(rule == r and (path == p or path.startswith(p + "/")) for path, rule in findings)}
    return uncovered, stale


def test_every_acknowledgment_matches_a_real_finding_and_covers_it(monkeypatch):
    """Synthesize with acknowledgments recorded but not applied: the findings must be exactly those
    acknowledged, so no finding hides behind a broad acknowledgment and none is stale."""
    findings = unacknowledged_findings(monkeypatch, default_doc(), "unacknowledged")
    acknowledged = set(nag.RECORDED)
    assert acknowledged, "the fleet acknowledges some findings"
    uncovered, stale = uncovered_and_stale(findings, acknowledged)
    assert not uncovered, f"findings without an acknowledgment: {sorted(uncovered)}"
    assert not stale, f"acknowledgments that match no finding: {sorted(stale)}"


def test_no_unacknowledged_construct_warnings_or_errors():
    for fleet in (default_fleet(), variant_fleet(), nat_fleet(), spot_fleet(), multi_model_fleet()):
        for metadata_file in fleet.outdir.glob("*.metadata.json"):
            entries = [(path, e["type"], e.get("data")) for path, items in json.loads(metadata_file.read_text()).items()
                       for e in items if e["type"] in ("aws:cdk:warning", "aws:cdk:error")]
            assert not entries, f"{metadata_file.name}: {entries}"


def test_no_variant_needs_a_context_lookup():
    for fleet in (default_fleet(), variant_fleet(), nat_fleet(), spot_fleet(), multi_model_fleet()):
        manifest = json.loads((fleet.outdir / "manifest.json").read_text())
        assert not manifest.get("missing"), manifest.get("missing")


def test_acknowledgments_carry_reasons():
    with pytest.raises(ValueError, match="real reason"):
        nag.acknowledge(Stack(App(), "S"), "AwsSolutions-S1", "ok")


# ---------------------------------------------------------------- cfn-lint


CFN_LINT = ROOT / ".venv" / "bin" / "cfn-lint"


# A template with one of each: an unknown property (E3002), a malformed value (E3031), a pinned
# availability zone (W3010, which .cfnlintrc.yaml ignores) and an IAM statement scoped to a resource its action
# cannot be scoped to (I3510, which .cfnlintrc.yaml includes: SetInstanceHealth takes an autoScalingGroup ARN,
# Service Authorization Reference, "Actions, resources, and condition keys for Amazon EC2 Auto Scaling").
BROKEN_TEMPLATE = {
    "Resources": {
        "Role": {"Type": "AWS::IAM::Role", "Properties": {"AssumeRolePolicyDocument": {
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                                                    "Action": "sts:AssumeRole"}]}}},
        "Policy": {"Type": "AWS::IAM::Policy", "Properties": {"PolicyName": "p", "Roles": [{"Ref": "Role"}],
                                                             "PolicyDocument": {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "autoscaling:SetInstanceHealth", "Resource": "arn:aws:s3:::bucket/*"}]}}},
        "Subnet": {"Type": "AWS::EC2::Subnet", "Properties": {
            "VpcId": "vpc-0123456789abcdef0", "CidrBlock": "10.0.0.0/24", "AvailabilityZone": "ap-northeast-2a"}},
        "Group": {"Type": "AWS::AutoScaling::AutoScalingGroup", "Properties": {
            "MinSize": "lots", "MaxSize": "1", "NoSuchProperty": 1,
            "VPCZoneIdentifier": [{"Ref": "Subnet"}],
            "LaunchTemplate": {"LaunchTemplateId": "lt-0123456789abcdef0", "Version": "1"}}},
    },
}


@pytest.fixture(scope="module")
def cli_lint(tmp_path_factory):
    """One run of the real cfn-lint CLI from the repo root (so .cfnlintrc.yaml applies) over BROKEN_TEMPLATE: the
    rule ids it reports, which the in-process runs that lint the synthesized templates must report too.
    Returns (broken path, rule ids reported per file)."""
    if not CFN_LINT.exists():
        pytest.skip("cfn-lint is installed by `make test`")
    broken = tmp_path_factory.mktemp("lint") / "broken.template.json"
    broken.write_text(json.dumps(BROKEN_TEMPLATE))
    result = subprocess.run([str(CFN_LINT), "--format", "parseable", str(broken)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    rules: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():  # file:line:column:end line:end column:rule:message
        path, *_, rule, _message = line.split(":", 6)
        rules.setdefault(path, []).append(rule)
    return broken, {path: sorted(ids) for path, ids in rules.items()}


def test_cfn_lint_reports_nothing_on_any_template():
    """Every default template, the provider templates whose shape the variants change and every template of the
    multi-model example, linted as the CLI lints them (tests/cfn_lint.py, checked against the CLI below): each
    template once per run, however many tests lint it (a CLI run over these ten cost 26 s of CPU, most of it
    spent again on the templates other tests lint in process)."""
    from tests.cfn_lint import lint

    templates = [*default_fleet().template_files(), *(
        f.outdir / "fleetcast-provider-ap-northeast-2.template.json" for f in (variant_fleet(), nat_fleet(),
                                                                              spot_fleet())),
        *multi_model_fleet().template_files()]
    assert len(templates) == 10  # 7 of the default and its variants, the multi-model example's provider + 2 consumers
    assert lint(*templates) == []


def test_in_process_cfn_lint_reports_what_the_cli_reports(cli_lint, tmp_path):
    """tests/cfn_lint.py stands in for the CLI in the template tests: it reports the CLI's rules on a broken
    template, and applies .cfnlintrc.yaml (W3010 is ignored there, reported from elsewhere)."""
    from tests.cfn_lint import _rule_sets, lint

    broken, rules = cli_lint
    assert set(rules) == {str(broken)}
    assert {"E3002", "E3031", "I3510"} <= set(rules[str(broken)]) and "W3010" not in rules[str(broken)]
    assert sorted(p.split()[0] for p in lint(broken)) == rules[str(broken)]
    without_rc = {p.split()[0] for p in lint(broken, cwd=tmp_path)}
    assert "W3010" in without_rc and "I3510" not in without_rc  # what .cfnlintrc.yaml ignores and includes
    assert len(_rule_sets) == 1  # both runs, with their own settings, on the one rule set loaded (as the CLI's)


def test_in_process_cfn_lint_reads_a_changed_template_again(tmp_path):
    """tests/cfn_lint.py keeps what a run reported by the bytes it read: the same file rewritten is linted again."""
    from tests.cfn_lint import lint

    path = tmp_path / "t.template.json"
    path.write_text(json.dumps({"AWSTemplateFormatVersion": "2010-09-09",
                                "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}}))
    assert lint(path) == []
    path.write_text(json.dumps(BROKEN_TEMPLATE))
    assert {"E3002", "E3031"} <= {p.split()[0] for p in lint(path)}


def test_in_process_cfn_lint_reports_each_template_under_its_own_name(tmp_path):
    """A template's findings are its own, whatever else a run names and whatever its file is called: the same
    bytes under another name, linted once, are reported under that name."""
    from tests.cfn_lint import lint

    clean, broken, copy = tmp_path / "clean.template.json", tmp_path / "a.template.json", tmp_path / "b.template.json"
    clean.write_text(json.dumps({"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}}))
    broken.write_text(json.dumps(BROKEN_TEMPLATE))
    copy.write_text(json.dumps(BROKEN_TEMPLATE))
    together = lint(clean, broken)
    assert together and all(f"({broken}:" in line for line in together)
    assert [line.replace(str(copy), str(broken)) for line in lint(copy)] == together
    assert lint(clean) == []


def test_cfn_lint_ignores_are_each_explained():
    lines = (ROOT / ".cfnlintrc.yaml").read_text().splitlines()
    rules = [i for i, line in enumerate(lines) if re.match(r"^\s*-\s*[EWI]\d{4}\b", line)]
    assert rules, "the config lists its ignored rules"
    for i in rules:
        assert lines[i - 1].strip().startswith("#"), f"{lines[i].strip()} has no reason above it"
