"""Consumer DNS failover (issue 36, section 2, "Home region down"), on examples/spill/fleet.yaml: `checkout` has a
failover_region, so its stack probes the home endpoint from inside its VPC, alarms on the probe's metric, and a
Route 53 health check on that alarm decides a failover CNAME pair in a private hosted zone on its VPC. `reports`
has none and gets none of it. The templates pass cdk-nag (synthesis would raise) and cfn-lint
(tests/stacks/test_spill_stacks.py lints every template of this fleet).

Sources, each checked below where it is a fact the stacks rely on:
- Route 53 Developer Guide, "Configuring failover in a private hosted zone"
  (https://docs.aws.amazon.com/Route53/latest/DeveloperGuide/dns-failover-private-hosted-zones.html), and the same
  text in the Route 53 API's CreateHealthCheck documentation (botocore's route53 service model, read here): Route 53
  health checkers are outside the VPC; for a private resource, a health check on a CloudWatch alarm.
- Route 53 API, HealthCheckConfig (botocore route53 model): Type CLOUDWATCH_METRIC follows the alarm's state (OK
  healthy, ALARM unhealthy, otherwise InsufficientDataHealthStatus); InsufficientDataHealthStatus LastKnownStatus
  keeps the last status and starts a new check healthy; AlarmIdentifier.Name: standard-resolution metrics only,
  statistics Average, Minimum, Maximum, Sum, SampleCount; AlarmIdentifier.Region: the CloudWatchRegion list.
- CloudFormation resource schemas (the ones cfn-lint 1.58 ships, cfnlint/data/schemas/providers/us-east-1.json):
  AWS::Route53::HealthCheck HealthCheckConfig.Type / AlarmIdentifier {Name, Region} / InsufficientDataHealthStatus;
  AWS::Route53::RecordSet Failover {PRIMARY, SECONDARY}, SetIdentifier, HealthCheckId, TTL, ResourceRecords;
  AWS::Route53::HostedZone VPCs [{VPCId, VPCRegion}] (https://docs.aws.amazon.com/AWSCloudFormation/latest/
  TemplateReference/aws-resource-route53-healthcheck.html, ...-route53-recordset.html, ...-route53-hostedzone.html).
- PrivateLink Guide, "CloudWatch metrics for AWS PrivateLink" (https://docs.aws.amazon.com/vpc/latest/privatelink/
  privatelink-cloudwatch-metrics.html): endpoint metrics report only while traffic flows and (docs.amazonaws.cn
  edition) are not published for consumers using cross-Region access; why the stack probes instead.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import botocore.session
import pytest

from fleetcast.contract import failover as f, telemetry
from fleetcast.contract.nlb import HEALTH_PATH
from fleetcast.contract.outputs import ConsumerOutput
from stacks.consumer_failover import INSUFFICIENT_DATA_HEALTH_STATUS, dns_failover_skip_reason

from .synthesized import default_fleet, spill_fleet

CHECKOUT = "spillfleet-consumer-checkout"
REPORTS = "spillfleet-consumer-reports"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fleet():
    return spill_fleet()


@pytest.fixture(scope="module")
def route53_model():
    return botocore.session.get_session().get_service_model("route53")


def schema(resource_type: str) -> dict:
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER

    return PROVIDER_SCHEMA_MANAGER.get_resource_schema("us-east-1", resource_type).schema


def props(resource: dict) -> dict:
    return resource["Properties"]


def ref_id(value: dict) -> str:
    return value["Ref"] if "Ref" in value else value["Fn::GetAtt"][0]


def one(fleet, stack: str, resource_type: str) -> tuple[str, dict]:
    (item,) = fleet.resources(stack, resource_type).items()
    return item[0], props(item[1])


def endpoint_ids(fleet) -> tuple[str, str, str]:
    """The logical ids of the home, failover and monitoring endpoints of checkout's stack."""
    endpoints = fleet.resources(CHECKOUT, "AWS::EC2::VPCEndpoint")
    monitoring = next(k for k, r in endpoints.items() if "monitoring" in json.dumps(props(r)["ServiceName"]))
    failover = next(k for k, r in endpoints.items() if props(r).get("ServiceRegion") == "us-west-2")
    home = next(k for k in endpoints if k not in (monitoring, failover))
    return home, failover, monitoring


def first_dns_name_of(value) -> str:
    """The endpoint a {"Fn::Select": [1, {"Fn::Split": [":", {"Fn::Select": [0, DnsEntries]}]}]} names."""
    select = value["Fn::Select"]
    assert select[0] == 1 and select[1]["Fn::Split"][0] == ":"
    inner = select[1]["Fn::Split"][1]["Fn::Select"]
    assert inner[0] == 0 and inner[1]["Fn::GetAtt"][1] == "DnsEntries"
    return inner[1]["Fn::GetAtt"][0]


def test_route53_health_checkers_cannot_reach_the_vpc_so_the_check_follows_an_alarm(route53_model):
    doc = route53_model.operation_model("CreateHealthCheck").documentation
    assert "Route 53 health checkers are outside the VPC" in doc
    assert "create a health check that is based on the state of the alarm" in doc
    type_doc = route53_model.shape_for("HealthCheckConfig").members["Type"].documentation
    assert "CLOUDWATCH_METRIC" in type_doc and "If the state of the alarm is <code>OK</code>" in type_doc


def test_the_health_check_is_a_cloudwatch_metric_check_on_the_probe_alarm_in_the_consumers_region(fleet, route53_model):
    _, check = one(fleet, CHECKOUT, "AWS::Route53::HealthCheck")
    config = check["HealthCheckConfig"]
    alarm_id, _ = one(fleet, CHECKOUT, "AWS::CloudWatch::Alarm")
    assert config["Type"] == "CLOUDWATCH_METRIC"
    assert config["AlarmIdentifier"] == {"Name": {"Ref": alarm_id}, "Region": "us-east-1"}  # Ref: the alarm's name
    assert config["InsufficientDataHealthStatus"] == INSUFFICIENT_DATA_HEALTH_STATUS == "LastKnownStatus"
    # Against the CloudFormation schema: the names and values exist as written.
    hc = schema("AWS::Route53::HealthCheck")
    assert set(config) <= set(hc["properties"]["HealthCheckConfig"]["properties"])
    assert config["Type"] in hc["properties"]["HealthCheckConfig"]["properties"]["Type"]["enum"]
    assert config["InsufficientDataHealthStatus"] in (
        hc["properties"]["HealthCheckConfig"]["properties"]["InsufficientDataHealthStatus"]["enum"])
    assert set(hc["definitions"]["AlarmIdentifier"]["required"]) == set(config["AlarmIdentifier"])
    # And against the Route 53 API: the alarm's region is one Route 53 reads alarms in, and LastKnownStatus keeps
    # the last decision (a new check starts healthy: the home endpoint).
    assert "us-east-1" in route53_model.shape_for("CloudWatchRegion").enum
    doc = route53_model.shape_for("HealthCheckConfig").members["InsufficientDataHealthStatus"].documentation
    assert "For new health checks that have no last known status, the default status for the health check is " \
           "healthy" in doc


def test_the_alarm_is_one_route53_can_read_and_fires_after_the_contracts_failing_minutes(fleet, route53_model):
    _, alarm = one(fleet, CHECKOUT, "AWS::CloudWatch::Alarm")
    name_doc = route53_model.shape_for("AlarmIdentifier").members["Name"].documentation
    assert "High-resolution metrics aren't supported" in name_doc
    assert alarm["Statistic"] in re.search(r"Statistics: ([^.]*)\.", re.sub(r"<[^>]+>", "", name_doc)).group(1)
    assert "ExtendedStatistic" not in alarm and "Metrics" not in alarm  # no percentiles, no metric math
    assert (alarm["Namespace"], alarm["MetricName"]) == (telemetry.NAMESPACE, telemetry.HOME_ENDPOINT_HEALTHY)
    assert sorted(alarm["Dimensions"], key=lambda d: d["Name"]) == [
        {"Name": telemetry.DIM_CONSUMER, "Value": "checkout"}, {"Name": telemetry.DIM_FLEET, "Value": "spillfleet"}]
    assert alarm["Statistic"] == "Minimum" and alarm["Period"] == f.ALARM_PERIOD_S == 60
    assert (alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]) == (f.EVALUATION_PERIODS, f.DATAPOINTS_TO_ALARM)
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("LessThanThreshold", 1)  # 0 = failed probe
    assert alarm["TreatMissingData"] == "missing"


def test_a_private_hosted_zone_on_the_consumers_vpc_holds_a_failover_cname_pair(fleet):
    zone_id, zone = one(fleet, CHECKOUT, "AWS::Route53::HostedZone")
    consumer = next(c for c in fleet.cfg.consumers if c.name == "checkout")
    assert zone["VPCs"] == [{"VPCId": consumer.vpc_id, "VPCRegion": consumer.region}]
    assert zone["Name"] == f.zone_name("spillfleet", "checkout") + "."
    assert set(schema("AWS::Route53::HostedZone")["definitions"]["VPC"]["required"]) == set(zone["VPCs"][0])

    home, failover, _ = endpoint_ids(fleet)
    check_id, _ = one(fleet, CHECKOUT, "AWS::Route53::HealthCheck")
    records = {props(r)["Failover"]: props(r) for r in fleet.resources(CHECKOUT, "AWS::Route53::RecordSet").values()}
    assert set(records) == {"PRIMARY", "SECONDARY"}
    assert set(records) <= set(schema("AWS::Route53::RecordSet")["definitions"]["Failover"]["enum"])
    name = f.record_name("spillfleet", "checkout") + "."
    for record in records.values():
        assert (record["Name"], record["Type"], record["TTL"]) == (name, "CNAME", str(f.RECORD_TTL_S))
        assert record["HostedZoneId"] == {"Ref": zone_id}
        assert set(record) <= set(schema("AWS::Route53::RecordSet")["properties"])
    assert records["PRIMARY"]["SetIdentifier"] != records["SECONDARY"]["SetIdentifier"]
    # PRIMARY: the home endpoint, with the health check; SECONDARY: the failover endpoint, without one.
    assert records["PRIMARY"]["HealthCheckId"] == {"Fn::GetAtt": [check_id, "HealthCheckId"]}
    assert "HealthCheckId" not in records["SECONDARY"]
    assert [first_dns_name_of(v) for v in records["PRIMARY"]["ResourceRecords"]] == [home]
    assert [first_dns_name_of(v) for v in records["SECONDARY"]["ResourceRecords"]] == [failover]
    output = fleet.template_json(CHECKOUT)["Outputs"][ConsumerOutput.FAILOVER_RECORD_NAME.value]
    assert output["Value"] + "." == name


def test_the_probe_runs_in_the_consumers_subnets_every_minute_and_calls_health_through_the_home_endpoint(fleet):
    home, _, monitoring = endpoint_ids(fleet)
    _, function = one(fleet, CHECKOUT, "AWS::Lambda::Function")
    consumer = next(c for c in fleet.cfg.consumers if c.name == "checkout")
    assert sorted(function["VpcConfig"]["SubnetIds"]) == sorted(s.id for s in consumer.subnets)
    env = function["Environment"]["Variables"]
    scheme, dns, tail = env["HEALTH_URL"]["Fn::Join"][1]
    assert (scheme, first_dns_name_of(dns), tail) == ("http://", home, f":{fleet.cfg.engine.port}{HEALTH_PATH}")
    scheme, dns = env["MONITORING_URL"]["Fn::Join"][1]
    assert (scheme, first_dns_name_of(dns)) == ("https://", monitoring)
    assert (env["NAMESPACE"], env["METRIC"]) == (telemetry.NAMESPACE, telemetry.HOME_ENDPOINT_HEALTHY)
    assert json.loads(env["DIMENSIONS"]) == {telemetry.DIM_FLEET: "spillfleet", telemetry.DIM_CONSUMER: "checkout"}
    assert function["Timeout"] > f.PROBE_MAX_S  # every attempt may time out and the value still goes out
    _, rule = one(fleet, CHECKOUT, "AWS::Events::Rule")
    assert rule["ScheduleExpression"] == f.PROBE_SCHEDULE == "rate(1 minute)"
    # Private DNS off on the monitoring endpoint: the consumer's own one may hold it; the probe calls this by name.
    endpoint = props(fleet.resources(CHECKOUT, "AWS::EC2::VPCEndpoint")[monitoring])
    assert endpoint["PrivateDnsEnabled"] is False
    assert json.dumps(endpoint["ServiceName"]).count(".monitoring") == 1


def test_the_probe_reaches_only_the_endpoints_port_and_cloudwatch_and_may_only_publish_its_metric(fleet):
    port = fleet.cfg.engine.port
    _, function = one(fleet, CHECKOUT, "AWS::Lambda::Function")
    (probe_sg,) = [ref_id(s) for s in function["VpcConfig"]["SecurityGroupIds"]]
    home, _, monitoring = endpoint_ids(fleet)
    endpoints = fleet.resources(CHECKOUT, "AWS::EC2::VPCEndpoint")
    (endpoint_sg,) = [ref_id(s) for s in props(endpoints[home])["SecurityGroupIds"]]
    (monitoring_sg,) = [ref_id(s) for s in props(endpoints[monitoring])["SecurityGroupIds"]]
    sgs = fleet.resources(CHECKOUT, "AWS::EC2::SecurityGroup")
    consumer = next(c for c in fleet.cfg.consumers if c.name == "checkout")
    # Inline egress only (an inline rule replaces the default allow-all; CloudFormation, AWS::EC2::SecurityGroup,
    # SecurityGroupEgress), to the consumer's CIDRs where the endpoints' interfaces are.
    egress = sorted((e["CidrIp"], e["IpProtocol"], e["FromPort"], e["ToPort"])
                    for e in props(sgs[probe_sg])["SecurityGroupEgress"])
    assert egress == sorted([(c, "tcp", p, p) for c in consumer.cidrs for p in (port, 443)])
    assert not [r for r in fleet.resources(CHECKOUT, "AWS::EC2::SecurityGroupEgress").values()
                if ref_id(props(r)["GroupId"]) == probe_sg]
    for target, target_port in ((endpoint_sg, port), (monitoring_sg, 443)):
        ingress = [(ref_id(props(r)["SourceSecurityGroupId"]), props(r)["FromPort"], props(r)["ToPort"])
                   for r in fleet.resources(CHECKOUT, "AWS::EC2::SecurityGroupIngress").values()
                   if ref_id(props(r)["GroupId"]) == target]
        assert ingress == [(probe_sg, target_port, target_port)]
    assert "SecurityGroupIngress" not in props(sgs[monitoring_sg])  # nothing but the probe

    statements = [s for p in fleet.resources(CHECKOUT, "AWS::IAM::Policy").values()
                  for s in props(p)["PolicyDocument"]["Statement"]]
    (put,) = [s for s in statements if "cloudwatch:PutMetricData" in json.dumps(s["Action"])]
    assert put["Condition"] == {"StringEquals": {"cloudwatch:namespace": telemetry.NAMESPACE}}
    actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert actions <= {"cloudwatch:PutMetricData", "logs:CreateLogStream", "logs:PutLogEvents",
                       "ec2:CreateNetworkInterface", "ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets",
                       "ec2:DeleteNetworkInterface", "ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses"}
    (role_id,) = fleet.resources(CHECKOUT, "AWS::IAM::Role")
    (policy,) = props(endpoints[monitoring])["PolicyDocument"]["Statement"]
    assert policy["Action"] == "cloudwatch:PutMetricData" and role_id in json.dumps(policy["Principal"])


def test_a_consumer_without_failover_gets_no_probe_zone_or_health_check_and_provider_stacks_none(fleet):
    for stack in [REPORTS, "spillfleet-provider-us-east-1", "spillfleet-provider-us-west-2"]:
        for resource_type in ("AWS::Route53::HealthCheck", "AWS::Route53::HostedZone", "AWS::Route53::RecordSet"):
            assert not fleet.resources(stack, resource_type), (stack, resource_type)
    assert not fleet.resources(REPORTS, "AWS::Lambda::Function")
    assert ConsumerOutput.FAILOVER_RECORD_NAME.value not in fleet.template_json(REPORTS)["Outputs"]
    default = default_fleet()  # strict residency, no failover_region: none of it anywhere
    for path in default.template_files():
        types = {r["Type"] for r in json.loads(path.read_text())["Resources"].values()}
        assert not types & {"AWS::Route53::HealthCheck", "AWS::Route53::RecordSet"}, path.name


def test_the_failover_names_only_the_two_endpoints_the_config_allows(fleet):
    """Residency: the name moves only between the service_region endpoint and the failover_region one, the regions
    the consumer named itself; spill_regions stay the gateway's rule alone."""
    home, failover, _ = endpoint_ids(fleet)
    endpoints = fleet.resources(CHECKOUT, "AWS::EC2::VPCEndpoint")
    consumer = next(c for c in fleet.cfg.consumers if c.name == "checkout")
    assert props(endpoints[home])["ServiceName"] == consumer.endpoint_service_name
    assert props(endpoints[failover])["ServiceName"] == fleet.cfg.region(consumer.failover_region).endpoint_service_name
    targets = {first_dns_name_of(v) for r in fleet.resources(CHECKOUT, "AWS::Route53::RecordSet").values()
               for v in props(r)["ResourceRecords"]}
    assert targets == {home, failover}


def test_a_tls_listener_in_either_region_leaves_dns_failover_out_and_says_why(fleet):
    cfg = fleet.cfg
    consumer = next(c for c in cfg.consumers if c.name == "checkout")
    assert dns_failover_skip_reason(cfg, consumer) is None
    arn = "arn:aws:acm:us-west-2:111122223333:certificate/0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
    tls = cfg.model_copy(update={"network": cfg.network.model_copy(update={"tls_certificate_arns": {"us-west-2": arn}})})
    reason = dns_failover_skip_reason(tls, consumer)
    assert reason and "us-west-2" in reason and "network.tls_certificate_arns" in reason


def test_the_failover_timing_the_docs_state_is_the_contracts():
    """Worst case from the home endpoint failing to a resolver answering with the failover endpoint, without Route
    53's undocumented lag between the alarm and the health check: 60 s until the first failing probe, two failing
    minutes, a probe's 17 s, then the 30 s TTL."""
    assert f.PROBE_MAX_S == 17 and f.detection_worst_case_s() == 197 and f.failover_worst_case_s() == 227
    assert f.failback_worst_case_s() == 167
    docs = (ROOT / "docs" / "stacks.md").read_text()
    for figure in (f.detection_worst_case_s(), f.failover_worst_case_s(), f.failback_worst_case_s()):
        assert f"{figure} s" in docs, figure


def test_the_failover_dns_cdk_nag_findings_are_only_the_acknowledged_wildcard(monkeypatch):
    """Synthesized with acknowledgments recorded but not applied, the findings under FailoverDns are exactly
    AwsSolutions-IAM5 on the probe role's policy (PutMetricData and the Lambda network-interface actions take no
    resource-level permissions; stacks/consumer_failover.py says why), the one acknowledged there."""
    from ruamel.yaml import YAML

    from stacks import nag
    from tests.stacks.synthesized import SPILL_CONFIG
    from tests.stacks.test_gates import unacknowledged_findings

    findings = unacknowledged_findings(monkeypatch, YAML(typ="safe").load(SPILL_CONFIG.read_text()), "failover-unacknowledged")
    on_failover = {rule for path, rule in findings if "/FailoverDns/" in path}
    assert on_failover == {"AwsSolutions-IAM5[Resource::*]"}
    assert {r for p, r in nag.RECORDED if "/FailoverDns/" in p} == on_failover
