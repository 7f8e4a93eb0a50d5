"""The region's network: the VPC (created or imported by ids, never looked up) and its VPC endpoints."""

from __future__ import annotations

from aws_cdk import CfnResource, Stack, aws_ec2 as ec2, aws_logs as logs
from constructs import Construct

from fleetcast.config import EgressMode, ExistingVpc, Region
from fleetcast.config.subnets import FLEET_SUBNET_MASK, PUBLIC_SUBNET_MASK
from fleetcast.contract.network import PROVIDER_INTERFACE_ENDPOINTS

from . import nag

INTERFACE_ENDPOINTS = {name: ec2.InterfaceVpcEndpointAwsService(service)
                       for name, service in PROVIDER_INTERFACE_ENDPOINTS.items()}


class FleetNetwork(Construct):
    """VPC with private subnets in the configured AZs, flow logs, and the endpoints `egress: none` needs.

    `subnets` selects the fleet's private subnets (instances, NLB, endpoints).
    AZ names come from the config, pinned on purpose: they must be the AZ IDs
    the consumers' endpoints sit in, which a lookup could not guarantee.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        region: Region,
        egress: EgressMode,
        flow_log_group: logs.ILogGroup,
    ) -> None:
        super().__init__(scope, construct_id)
        az_names = [az.name for az in region.availability_zones]
        self.created = not isinstance(region.vpc, ExistingVpc)

        if self.created:
            nat = egress == EgressMode.NAT
            subnet_configuration = [
                ec2.SubnetConfiguration(
                    name="fleet",
                    subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS if nat else ec2.SubnetType.PRIVATE_ISOLATED,
                    cidr_mask=FLEET_SUBNET_MASK,
                )
            ]
            if nat:
                subnet_configuration.insert(
                    0, ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=PUBLIC_SUBNET_MASK)
                )
            vpc = ec2.Vpc(
                self,
                "Vpc",
                ip_addresses=ec2.IpAddresses.cidr(region.vpc.cidr),
                availability_zones=az_names,
                subnet_configuration=subnet_configuration,
                nat_gateways=len(az_names) if nat else 0,
                restrict_default_security_group=True,
            )
            vpc.add_flow_log(
                "FlowLog",
                destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
                traffic_type=ec2.FlowLogTrafficType.ALL,
            )
            nag.acknowledge(
                vpc,
                "CloudFormation-Validate::W3010",
                "AZ names are pinned from the config on purpose: they must match the AZ IDs the consumers' "
                "endpoints use, so they cannot float with a lookup.",
            )
            self.subnets = ec2.SubnetSelection(subnet_group_name="fleet")
            _quiet_cdk_redundant_depends_on(Stack.of(self))
        else:
            existing = region.vpc
            route_tables = existing.route_table_ids
            vpc = ec2.Vpc.from_vpc_attributes(
                self,
                "Vpc",
                vpc_id=existing.vpc_id,
                vpc_cidr_block=existing.cidr,
                availability_zones=az_names,
            )
            subnets = [
                ec2.Subnet.from_subnet_attributes(
                    self,
                    f"Subnet{i + 1}",
                    subnet_id=subnet_id,
                    availability_zone=az_names[i % len(az_names)],
                    # Fewer route tables than subnets means they share the last one.
                    route_table_id=route_tables[min(i, len(route_tables) - 1)],
                )
                for i, subnet_id in enumerate(existing.subnet_ids)
            ]
            self.subnets = ec2.SubnetSelection(subnets=subnets)
        self.vpc = vpc
        self.cidr = region.vpc.cidr
        self.endpoints: dict[str, ec2.IVpcEndpoint] = {}

        wants_endpoints = egress == EgressMode.NONE and (self.created or region.vpc.create_endpoints)
        if wants_endpoints:
            self._add_endpoints()

    def _add_endpoints(self) -> None:
        self.endpoint_security_group = ec2.SecurityGroup(
            self,
            "EndpointSecurityGroup",
            vpc=self.vpc,
            description="VPC interface endpoints: HTTPS from inside the fleet VPC only",
            allow_all_outbound=False,
        )
        self.endpoint_security_group.add_ingress_rule(
            ec2.Peer.ipv4(self.cidr), ec2.Port.tcp(443), "HTTPS from the fleet VPC"
        )
        self.endpoints["S3"] = self.vpc.add_gateway_endpoint(
            "S3", service=ec2.GatewayVpcEndpointAwsService.S3, subnets=[self.subnets]
        )
        for name, service in INTERFACE_ENDPOINTS.items():
            self.endpoints[name] = self.vpc.add_interface_endpoint(
                name,
                service=service,
                subnets=self.subnets,
                private_dns_enabled=True,
                security_groups=[self.endpoint_security_group],
                open=False,
            )


def _quiet_cdk_redundant_depends_on(stack: Stack) -> None:
    """CDK's provider for `restrict_default_security_group` writes a DependsOn that its GetAtt already implies.

    cfn-lint flags that (W3005); the ignore is scoped to CDK's handler resource, not the repo.
    """
    provider = stack.node.try_find_child("Custom::VpcRestrictDefaultSGCustomResourceProvider")
    handler = provider.node.try_find_child("Handler") if provider else None
    if isinstance(handler, CfnResource):
        handler.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3005"]}})
