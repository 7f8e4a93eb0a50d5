"""Private DNS failover between a consumer's home endpoint and its failover endpoint (consumers[].failover_region).

Route 53's health checkers run outside the VPC, so they cannot call an interface endpoint's private addresses; for
private resources the Route 53 Developer Guide ("Configuring failover in a private hosted zone") has a health check
on the data stream of a CloudWatch alarm. The chain, all in the consumer's stack and account:

  schedule (every minute) -> probe Lambda in the consumer's subnets -> GET /health through the home endpoint
  -> HomeEndpointHealthy (1/0) through this stack's `monitoring` interface endpoint -> alarm
  -> Route 53 health check (CLOUDWATCH_METRIC) -> private hosted zone on the consumer's VPC:
     endpoint.<consumer>.<fleet>.fleetcast.internal  CNAME  PRIMARY  home endpoint (with the health check)
                                                     CNAME  SECONDARY failover endpoint

Why a probe and not the endpoint's own metrics (AWS/PrivateLinkEndpoints): they count connections and bytes only
while traffic flows ("Reporting criteria: The endpoint received traffic during the one-minute period"), say nothing
about whether the service behind answers, and are not published for consumers that use cross-Region access
(PrivateLink Guide, "CloudWatch metrics for AWS PrivateLink"); a quiet consumer would look the same as a dead region.

Timing and its worst case: fleetcast/contract/failover.py. Least privilege: the function may write its own log
group, PutMetricData into the Fleetcast namespace only, and manage its network interfaces; its security group
reaches the consumer's CIDRs (where the endpoints' network interfaces are) on the serving port and on 443, nothing
else; the endpoints' security group admits it by id, the monitoring endpoint admits only it, and its policy allows only that role's PutMetricData.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from aws_cdk import (
    CfnOutput,
    Duration,
    Fn,
    RemovalPolicy,
    aws_cloudwatch as cloudwatch,
    aws_ec2 as ec2,
    aws_events as events,
    aws_events_targets as targets,
    aws_iam as iam,
    aws_lambda as lambda_,
    aws_route53 as route53,
)
from constructs import Construct

from fleetcast.config import Consumer, FleetConfig
from fleetcast.contract import failover as f, telemetry
from fleetcast.contract.nlb import HEALTH_PATH
from fleetcast.contract.outputs import ConsumerOutput

from . import nag
from .function import function_log_group, function_role, grant_own_logs, grant_vpc_network_interfaces, python_function

if TYPE_CHECKING:
    from .consumer import ConsumerEndpoint

HANDLER_DIR = Path(__file__).resolve().parent / "lambdas" / "endpoint_health"
# When CloudWatch cannot tell OK from ALARM (no probe value reached it), keep the last decision: a gap in the probe's
# own path (the monitoring endpoint, Lambda) is no evidence about the home region, so it neither fails over nor
# fails back. A new health check starts healthy (the home endpoint), which is also what LastKnownStatus gives it.
INSUFFICIENT_DATA_HEALTH_STATUS = "LastKnownStatus"


def dns_failover_skip_reason(cfg: FleetConfig, consumer: Consumer) -> str | None:
    """Why a consumer with a failover endpoint gets no DNS failover, or None."""
    tls = sorted({consumer.service_region, consumer.failover_region} & set(cfg.network.tls_certificate_arns))
    if tls:
        return (f"consumer {consumer.name} gets no DNS failover: {', '.join(tls)} serve(s) TLS "
                "(network.tls_certificate_arns), whose certificate names the provider's domain, not the private "
                "failover name; its clients choose between the two endpoints themselves")
    return None


def first_dns_name(endpoint: ec2.InterfaceVpcEndpoint) -> str:
    """The endpoint's regional DNS name: DnsEntries holds "hosted-zone-id:dns-name" pairs, the regional one first."""
    return Fn.select(1, Fn.split(":", Fn.select(0, endpoint.vpc_endpoint_dns_entries)))


class FailoverDns(Construct):
    """Probe, metric path, alarm, health check, private hosted zone and failover record pair for one consumer."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, consumer: Consumer,
                 endpoint: ConsumerEndpoint) -> None:
        super().__init__(scope, construct_id)
        assert endpoint.failover_endpoint is not None and consumer.failover_region is not None
        port = cfg.engine.port
        vpc, subnets = endpoint.vpc, ec2.SubnetSelection(subnets=endpoint.subnets)

        self.security_group = ec2.SecurityGroup(
            self, "ProbeSecurityGroup", vpc=vpc, allow_all_outbound=False,
            description=f"{cfg.name} failover probe for {consumer.name}: the endpoints on {port}, CloudWatch on 443")
        # Egress as inline CIDR rules (the endpoints' network interfaces live in the consumer's CIDRs, as for the
        # bench probe): an inline rule is what replaces the security group's default allow-all egress. The
        # endpoints' own groups admit this group by id.
        for cidr in consumer.cidrs:
            self.security_group.add_egress_rule(ec2.Peer.ipv4(cidr), ec2.Port.tcp(port), "/health via the endpoints")
            self.security_group.add_egress_rule(ec2.Peer.ipv4(cidr), ec2.Port.tcp(443), "the CloudWatch endpoint")
        endpoint.security_group.add_ingress_rule(self.security_group, ec2.Port.tcp(port), "the failover probe")

        self.role = function_role(self, f"{cfg.name} failover probe for {consumer.name}: publish the home "
                                        "endpoint's health")
        self.role.add_to_policy(iam.PolicyStatement(
            sid="PublishHomeEndpointHealth", actions=["cloudwatch:PutMetricData"], resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": telemetry.NAMESPACE}}))
        grant_vpc_network_interfaces(self.role)
        nag.acknowledge(
            self.role, "AwsSolutions-IAM5[Resource::*]",
            "cloudwatch:PutMetricData and the Lambda VPC network-interface actions have no resource-level "
            "permissions in IAM; PutMetricData is held to the Fleetcast namespace by condition.")

        self.monitoring = self._monitoring_endpoint(cfg, consumer, vpc, subnets)
        self.log_group = function_log_group(self, cfg, RemovalPolicy.DESTROY)
        grant_own_logs(self.role, self.log_group)
        dimensions = {telemetry.DIM_FLEET: cfg.name, telemetry.DIM_CONSUMER: consumer.name}
        self.function = python_function(
            self,
            description=f"{cfg.name}: {consumer.name}'s probe of its {consumer.service_region} endpoint for DNS failover",
            code=lambda_.Code.from_asset(str(HANDLER_DIR), exclude=["__pycache__", "*.pyc", "__init__.py"]),
            role=self.role,
            log_group=self.log_group,
            timeout_s=f.PROBE_FUNCTION_TIMEOUT_S,
            memory_mb=128,
            vpc=vpc,
            vpc_subnets=subnets,
            security_groups=[self.security_group],
            environment={
                "HEALTH_URL": Fn.join("", ["http://", first_dns_name(endpoint.endpoint), f":{port}{HEALTH_PATH}"]),
                "MONITORING_URL": Fn.join("", ["https://", first_dns_name(self.monitoring)]),
                "NAMESPACE": telemetry.NAMESPACE,
                "METRIC": telemetry.HOME_ENDPOINT_HEALTHY,
                "DIMENSIONS": json.dumps(dimensions),
                "ATTEMPTS": str(f.PROBE_ATTEMPTS),
                "TIMEOUT_S": str(f.PROBE_TIMEOUT_S),
                "PAUSE_S": str(f.PROBE_PAUSE_S),
            },
        )
        self.schedule = events.Rule(self, "Schedule", schedule=events.Schedule.expression(f.PROBE_SCHEDULE),
                                    description=f"{cfg.name}: probe {consumer.name}'s home endpoint")
        # No retry: the next minute's probe is the retry.
        self.schedule.add_target(targets.LambdaFunction(self.function, retry_attempts=0))

        self.alarm = cloudwatch.Alarm(
            self, "HomeEndpointAlarm",
            alarm_description=f"{cfg.name}: {consumer.name}'s {consumer.service_region} endpoint failed its /health "
                              f"probe for {f.DATAPOINTS_TO_ALARM} minutes; its failover name answers with "
                              f"{consumer.failover_region}",
            metric=cloudwatch.Metric(namespace=telemetry.NAMESPACE, metric_name=telemetry.HOME_ENDPOINT_HEALTHY,
                                     dimensions_map=dimensions, statistic="Minimum",
                                     period=Duration.seconds(f.ALARM_PERIOD_S)),
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=f.EVALUATION_PERIODS,
            datapoints_to_alarm=f.DATAPOINTS_TO_ALARM,
            # A missing minute (a late schedule, the probe's own path down) is no evidence either way; with every
            # minute missing the alarm turns INSUFFICIENT_DATA and the health check keeps its last status.
            treat_missing_data=cloudwatch.TreatMissingData.MISSING,
        )
        self.health_check = route53.CfnHealthCheck(
            self, "HealthCheck",
            health_check_config=route53.CfnHealthCheck.HealthCheckConfigProperty(
                type="CLOUDWATCH_METRIC",
                alarm_identifier=route53.CfnHealthCheck.AlarmIdentifierProperty(
                    name=self.alarm.alarm_name, region=consumer.region),
                insufficient_data_health_status=INSUFFICIENT_DATA_HEALTH_STATUS,
            ),
            health_check_tags=[route53.CfnHealthCheck.HealthCheckTagProperty(
                key="Name", value=f"{cfg.name}-{consumer.name}-home-endpoint")],
        )

        self.record_name = f.record_name(cfg.name, consumer.name)
        self.zone = route53.PrivateHostedZone(
            self, "Zone", zone_name=f.zone_name(cfg.name, consumer.name), vpc=vpc,
            comment=f"{cfg.name}: {consumer.name}'s failover name, on its VPC only")
        self.primary = self._record("Primary", "PRIMARY", f"home-{consumer.service_region}", endpoint.endpoint,
                                    self.health_check.attr_health_check_id)
        self.secondary = self._record("Secondary", "SECONDARY", f"failover-{consumer.failover_region}",
                                      endpoint.failover_endpoint, None)
        CfnOutput(
            self, "RecordName", value=self.record_name,
            description=f"call http://{self.record_name}:{port}/v1/completions: the {consumer.service_region} "
                        f"endpoint while its probe passes, the {consumer.failover_region} endpoint when it fails",
        ).override_logical_id(ConsumerOutput.FAILOVER_RECORD_NAME.value)

    def _record(self, construct_id: str, role: str, set_identifier: str, target: ec2.InterfaceVpcEndpoint,
                health_check_id: str | None) -> route53.CfnRecordSet:
        return route53.CfnRecordSet(
            self, construct_id,
            hosted_zone_id=self.zone.hosted_zone_id,
            name=f"{self.record_name}.",
            type="CNAME",
            ttl=str(f.RECORD_TTL_S),
            failover=role,
            set_identifier=set_identifier,
            health_check_id=health_check_id,
            resource_records=[first_dns_name(target)],
        )

    def _monitoring_endpoint(self, cfg: FleetConfig, consumer: Consumer, vpc: ec2.IVpc,
                             subnets: ec2.SubnetSelection) -> ec2.InterfaceVpcEndpoint:
        """CloudWatch's API inside the VPC, reached by the endpoint-specific DNS name (private DNS off: the consumer's
        VPC may already hold a `monitoring` endpoint with private DNS, and a second one could not turn it on)."""
        security_group = ec2.SecurityGroup(
            self, "MonitoringSecurityGroup", vpc=vpc, allow_all_outbound=False,
            description=f"{cfg.name} CloudWatch endpoint for the {consumer.name} failover probe: 443 from it only")
        security_group.add_ingress_rule(self.security_group, ec2.Port.tcp(443), "PutMetricData from the probe")
        monitoring = ec2.InterfaceVpcEndpoint(
            self, "MonitoringEndpoint", vpc=vpc,
            service=ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_MONITORING,
            subnets=subnets, security_groups=[security_group], open=False, private_dns_enabled=False,
        )
        monitoring.add_to_policy(iam.PolicyStatement(
            principals=[iam.ArnPrincipal(self.role.role_arn)], actions=["cloudwatch:PutMetricData"],
            resources=["*"]))
        return monitoring
