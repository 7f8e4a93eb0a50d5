"""The region's PrivateLink service: internal NLB, the shared target group, and the endpoint service.

The PrivateLink path, hop by hop, and the rule that lets each hop through:
  consumer VPC -> interface endpoint -> NLB   (NLB SG: consumer CIDRs on the port;
                                               inbound-rule enforcement for PrivateLink
                                               stays on and sees the consumers' IPs)
  NLB -> instance gateway                      (NLB SG egress and instance SG ingress,
                                               SG to SG on the port; health checks too)
"""

from __future__ import annotations

from aws_cdk import (
    CfnOutput,
    Duration,
    aws_ec2 as ec2,
    aws_elasticloadbalancingv2 as elbv2,
    aws_iam as iam,
    aws_s3 as s3,
    aws_sns as sns,
)
from constructs import Construct

from fleetcast.config import FleetConfig, Region
from fleetcast.contract import nlb as nlb_contract
from fleetcast.contract.outputs import ProviderOutput
from fleetcast.contract.spill import failover_consumers, spill_sources

CONNECTION_EVENTS = ("Connect", "Accept", "Reject", "Delete")


class EndpointService(Construct):
    """Internal NLB (own SG, cross-zone) + one instance target group + VPC endpoint service.

    One target group per region, shared by every pool: consumers see one
    service, and pools of different GPUs serve the same API. Proxy protocol v2
    carries each consumer's VPC endpoint id to the gateway on the instance.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cfg: FleetConfig,
        region: Region,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
        instance_security_group: ec2.ISecurityGroup,
        topic: sns.ITopic,
        access_logs: s3.IBucket,
    ) -> None:
        super().__init__(scope, construct_id)
        port = cfg.engine.port
        # Consumers served here, and those whose failover endpoint connects here (fleetcast/contract/spill.py).
        failover = failover_consumers(cfg, region.region)
        consumers = [c for c in cfg.consumers if c.service_region == region.region or c in failover]

        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description=f"{cfg.name} NLB: consumer CIDRs in on {port}, out only to the fleet instances",
            allow_all_outbound=False,
        )
        for consumer in consumers:
            for cidr in consumer.cidrs:
                self.security_group.add_ingress_rule(
                    ec2.Peer.ipv4(cidr), ec2.Port.tcp(port), f"consumer {consumer.name} via PrivateLink"
                )
        for home in spill_sources(cfg, region.region):
            # The provider's own spill endpoint in `home` connects from that region's VPC (stacks/spill.py).
            self.security_group.add_ingress_rule(
                ec2.Peer.ipv4(cfg.region(home).vpc.cidr), ec2.Port.tcp(port), f"spill from {home} via PrivateLink"
            )
        self.security_group.add_egress_rule(
            instance_security_group, ec2.Port.tcp(port), "to the instance gateways (traffic and health checks)"
        )
        # add_targets() adds no rule on the instances' side.
        instance_security_group.add_ingress_rule(
            self.security_group, ec2.Port.tcp(port), "from the NLB (traffic and health checks)"
        )

        self.nlb = elbv2.NetworkLoadBalancer(
            self,
            "Nlb",
            vpc=vpc,
            vpc_subnets=subnets,
            internet_facing=False,
            cross_zone_enabled=True,
            security_groups=[self.security_group],
        )
        # Only TLS listeners write NLB access logs; enabling them keeps a TLS setup logged.
        self.nlb.log_access_logs(access_logs, prefix="nlb")

        self.target_group = elbv2.NetworkTargetGroup(
            self,
            "Targets",
            vpc=vpc,
            port=port,
            protocol=elbv2.Protocol.TCP,
            target_type=elbv2.TargetType.INSTANCE,
            proxy_protocol_v2=True,
            # In-flight streams finish on the open connection during the delay;
            # cutting them at deregistration would drop answers mid-token.
            connection_termination=False,
            deregistration_delay=Duration.seconds(cfg.operations.drain_timeout_s),
            health_check=elbv2.HealthCheck(
                protocol=elbv2.Protocol.HTTP,
                path=nlb_contract.HEALTH_PATH,
                port="traffic-port",
                interval=Duration.seconds(nlb_contract.HEALTH_INTERVAL_S),
                healthy_threshold_count=nlb_contract.HEALTHY_THRESHOLD,
                unhealthy_threshold_count=nlb_contract.UNHEALTHY_THRESHOLD,
            ),
        )
        # A draining gateway answers /health 503 while the target is still registered (a Spot notice, a
        # rebalance): the NLB would reset its open streams once the target turns unhealthy. Keep them for the
        # drain, as deregistration does.
        for key, value in nlb_contract.unhealthy_drain_attributes(cfg.operations.drain_timeout_s).items():
            self.target_group.set_attribute(key, value)

        certificate = cfg.network.tls_certificate_arns.get(region.region)
        if certificate:
            self.listener = self.nlb.add_listener(
                "Listener",
                port=port,
                protocol=elbv2.Protocol.TLS,
                certificates=[elbv2.ListenerCertificate.from_arn(certificate)],
                ssl_policy=elbv2.SslPolicy.RECOMMENDED_TLS,
                default_target_groups=[self.target_group],
            )
        else:
            self.listener = self.nlb.add_listener(
                "Listener", port=port, protocol=elbv2.Protocol.TCP, default_target_groups=[self.target_group]
            )

        self.endpoint_service = ec2.VpcEndpointService(
            self,
            "Service",
            vpc_endpoint_service_load_balancers=[self.nlb],
            acceptance_required=True,
            allowed_principals=[iam.ArnPrincipal(arn) for arn in region.allowed_principals],
            allowed_regions=list(region.allowed_regions) or None,
        )
        ec2.CfnVPCEndpointConnectionNotification(
            self,
            "ConnectionNotification",
            service_id=self.endpoint_service.vpc_endpoint_service_id,
            connection_events=list(CONNECTION_EVENTS),
            connection_notification_arn=topic.topic_arn,
        )

        # Stable output keys: deploy and connection tooling read them by name.
        CfnOutput(self, "ServiceName", value=self.endpoint_service.vpc_endpoint_service_name,
                  description="endpoint_service_name for this region's consumers in the config"
                  ).override_logical_id(ProviderOutput.ENDPOINT_SERVICE_NAME.value)
        CfnOutput(self, "ServiceId", value=self.endpoint_service.vpc_endpoint_service_id,
                  description="Endpoint service id (fleetcast connections approve/reject)"
                  ).override_logical_id(ProviderOutput.ENDPOINT_SERVICE_ID.value)
