"""The consumer side: one interface endpoint into a provider region's service, in the consumer's VPC."""

from __future__ import annotations

from aws_cdk import CfnOutput, Fn, Stack, aws_ec2 as ec2
from constructs import Construct

from fleetcast.config import Consumer, FleetConfig
from fleetcast.contract.outputs import ConsumerOutput
from fleetcast.contract.spill import service_name_of

from . import feature_flags, nag
from .consumer_failover import FailoverDns, dns_failover_skip_reason
from .consumer_probe import ConsumerBenchProbe, probe_enabled


class ConsumerEndpoint(Construct):
    """Interface VPC endpoint to the fleet's endpoint service, open only on the serving port from the consumer's CIDRs.

    The consumer's VPC and subnets are imported by id (no lookup). Subnets are
    chosen by AZ ID, the identity of a zone across accounts; the AZ ID stands in
    for the AZ name CDK wants, which only serves to keep one subnet per zone.
    """

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, consumer: Consumer) -> None:
        super().__init__(scope, construct_id)
        if consumer.endpoint_service_name is None:
            raise ValueError(f"consumer {consumer.name} has no endpoint_service_name yet")
        port = cfg.engine.port
        az_ids = [s.az_id for s in consumer.subnets]
        self.vpc = vpc = ec2.Vpc.from_vpc_attributes(
            self, "Vpc", vpc_id=consumer.vpc_id, availability_zones=az_ids, vpc_cidr_block=consumer.cidrs[0]
        )
        self.subnets = subnets = [
            ec2.Subnet.from_subnet_attributes(self, f"Subnet{i + 1}", subnet_id=s.id, availability_zone=s.az_id)
            for i, s in enumerate(consumer.subnets)
        ]
        for subnet in subnets:
            nag.acknowledge_warning(
                subnet,
                "@aws-cdk/aws-ec2:noSubnetRouteTableId",
                "An interface endpoint takes subnet ids only; nothing here reads the subnets' route tables.",
            )
        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description=f"{cfg.name} endpoint for {consumer.name}: port {port} from the consumer CIDRs only",
            allow_all_outbound=False,
        )
        for cidr in consumer.cidrs:
            self.security_group.add_ingress_rule(ec2.Peer.ipv4(cidr), ec2.Port.tcp(port), f"{consumer.name} clients")

        self.endpoint = ec2.InterfaceVpcEndpoint(
            self,
            "Endpoint",
            vpc=vpc,
            service=ec2.InterfaceVpcEndpointService(consumer.endpoint_service_name, port),
            subnets=ec2.SubnetSelection(subnets=subnets),
            security_groups=[self.security_group],
            open=False,
            # The service publishes no private DNS name; clients use the endpoint's DNS names.
            private_dns_enabled=False,
            service_region=consumer.service_region if consumer.cross_region else None,
        )
        self.failover_endpoint = self._failover_endpoint(cfg, consumer, port)
        # Stable output keys: smoke tests and consumer tooling read them by name.
        CfnOutput(self, "EndpointId", value=self.endpoint.vpc_endpoint_id).override_logical_id(ConsumerOutput.ENDPOINT_ID.value)
        CfnOutput(
            self,
            "EndpointDnsNames",
            value=Fn.join(",", self.endpoint.vpc_endpoint_dns_entries),
            description=f"hosted-zone-id:dns-name pairs; call http://<dns-name>:{port}/v1/completions",
        ).override_logical_id(ConsumerOutput.ENDPOINT_DNS_ENTRIES.value)
        if self.failover_endpoint is not None:
            CfnOutput(
                self,
                "FailoverEndpointDnsNames",
                value=Fn.join(",", self.failover_endpoint.vpc_endpoint_dns_entries),
                description=f"hosted-zone-id:dns-name pairs of the endpoint to {consumer.failover_region}; "
                "call it when the service_region endpoint fails",
            ).override_logical_id(ConsumerOutput.FAILOVER_ENDPOINT_DNS_ENTRIES.value)

    def _failover_endpoint(self, cfg: FleetConfig, consumer: Consumer, port: int) -> ec2.InterfaceVpcEndpoint | None:
        """A second endpoint, in the same subnets behind the same security group, to the failover region's
        service (cross-region where that is not the consumer's own region). The private DNS name that moves between
        the two is stacks/consumer_failover.py's."""
        region = consumer.failover_region
        service_name = None if region is None else service_name_of(cfg, region)
        if region is None or service_name is None:
            return None
        return ec2.InterfaceVpcEndpoint(
            self,
            "FailoverEndpoint",
            vpc=self.vpc,
            service=ec2.InterfaceVpcEndpointService(service_name, port),
            subnets=ec2.SubnetSelection(subnets=self.subnets),
            security_groups=[self.security_group],
            open=False,
            private_dns_enabled=False,
            service_region=region if region != consumer.region else None,
        )


class ConsumerStack(Stack):
    """One consumer account's endpoint stack (deployed by that account)."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, consumer: Consumer, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        feature_flags.pin(self)
        self.endpoint = ConsumerEndpoint(self, "Endpoint", cfg=cfg, consumer=consumer)
        self.failover_dns = None
        if self.endpoint.failover_endpoint is not None and dns_failover_skip_reason(cfg, consumer) is None:
            self.failover_dns = FailoverDns(self, "FailoverDns", cfg=cfg, consumer=consumer, endpoint=self.endpoint)
        if probe_enabled(self):
            # `-c bench=true`: the same sweep through this endpoint, to split out the network share (issue 6).
            self.bench_probe = ConsumerBenchProbe(self, "BenchProbe", cfg=cfg, consumer=consumer,
                                                  endpoint=self.endpoint)
