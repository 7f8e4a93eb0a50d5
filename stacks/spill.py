"""Cross-region spill, provider side: the home region's own interface endpoints to other regions' services.

For each remote region a consumer served here may spill to (consumers[].spill_regions, the pairs in
fleetcast/contract/spill.py), the home provider stack owns one interface VPC endpoint in its VPC whose
ServiceRegion is the remote region (cross-region PrivateLink): no peering, no transit gateway, no public
address. Its security group lets only the instances' security group in, on the serving port; the instances
reach it by the DNS name this construct writes to the spill parameter (`/<fleet>/spill/<remote>`), which their
role may read. Whether and when a request spills is the gateway's decision (docs/stacks.md, "Spill").

It also holds the peer key where the region's gateways forward requests at all (fleetcast.contract.spill.
peer_secret_of): the replicated spill key, or, in a region that only balances between its pools, a key of its own.

The hop, and the rule that lets each part of it through:
  home instance -> spill endpoint (home VPC)   instance SG egress and endpoint SG ingress, SG to SG on the port
  spill endpoint -> remote NLB                 the remote NLB SG: the home VPC's CIDR on the port
                                               (stacks/endpoint_service.py); the remote service allows the
                                               provider's account and the home region (validated:
                                               fleetcast/config/spill_rules.py)
"""

from __future__ import annotations

from collections.abc import Iterable

from aws_cdk import (
    ArnFormat,
    Fn,
    Stack,
    aws_ec2 as ec2,
    aws_iam as iam,
    aws_secretsmanager as secretsmanager,
    aws_ssm as ssm,
)
from constructs import Construct

from fleetcast.config import FleetConfig, Region
from fleetcast.contract.spill import (
    built_spill_targets,
    creates_peer_key,
    peer_regions,
    peer_secret_of,
    service_name_of,
    spill_endpoint_parameter,
)

from . import nag


class SpillEndpoints(Construct):
    """One interface endpoint, security group and spill parameter per remote region whose service name is
    published (`endpoints`, `parameters`: remote region -> resource)."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, region: Region, vpc: ec2.IVpc,
                 subnets: ec2.SubnetSelection, instance_security_group: ec2.ISecurityGroup,
                 instance_roles: Iterable[iam.IRole]) -> None:
        super().__init__(scope, construct_id)
        port = cfg.engine.port
        self.endpoints: dict[str, ec2.InterfaceVpcEndpoint] = {}
        self.parameters: dict[str, ssm.StringParameter] = {}
        self.security_groups: dict[str, ec2.SecurityGroup] = {}
        roles = list(instance_roles)
        for remote in built_spill_targets(cfg, region.region):
            service_name = service_name_of(cfg, remote)
            assert service_name is not None  # built_spill_targets keeps the published ones
            sg = ec2.SecurityGroup(
                self, f"SecurityGroup-{remote}", vpc=vpc, allow_all_outbound=False,
                description=f"{cfg.name} spill endpoint to {remote}: port {port} from the fleet instances only",
            )
            sg.add_ingress_rule(instance_security_group, ec2.Port.tcp(port), "from the fleet instances (spill)")
            instance_security_group.add_egress_rule(sg, ec2.Port.tcp(port), f"to the spill endpoint to {remote}")
            endpoint = ec2.InterfaceVpcEndpoint(
                self, f"Endpoint-{remote}", vpc=vpc,
                service=ec2.InterfaceVpcEndpointService(service_name, port),
                subnets=subnets, security_groups=[sg], open=False,
                # The service publishes no private DNS name; the gateway reads the endpoint's own name.
                private_dns_enabled=False,
                service_region=remote,
            )
            # DnsEntries: "hosted-zone-id:dns-name" pairs, the regional name first (AWS::EC2::VPCEndpoint).
            dns_name = Fn.select(1, Fn.split(":", Fn.select(0, endpoint.vpc_endpoint_dns_entries)))
            parameter = ssm.StringParameter(
                self, f"Parameter-{remote}", parameter_name=spill_endpoint_parameter(cfg.name, remote),
                string_value=dns_name,
                description=f"{cfg.name}: DNS name of {region.region}'s spill endpoint to the {remote} service",
            )
            for role in roles:
                role.add_to_principal_policy(iam.PolicyStatement(
                    sid=f"ReadSpillEndpoint{remote.replace('-', '').title()}",
                    actions=["ssm:GetParameter"], resources=[parameter.parameter_arn],
                ))
            self.security_groups[remote] = sg
            self.endpoints[remote] = endpoint
            self.parameters[remote] = parameter
        self.peer_key = self._peer_key(cfg, region, roles)

    def _peer_key(self, cfg: FleetConfig, region: Region, roles: list[iam.IRole]) -> secretsmanager.Secret | None:
        """The key a gateway signs a forwarded request's identity with and the receiving gateway checks it with
        (runtime/gateway/peer.py), where this region's gateways forward (peer_secret_of): generated here, never in a
        template or the config. The spill key is made in the first region that spills or is spilled to and
        replicated by Secrets Manager to the others, so both ends of a hop hold the same value; a region that only
        balances between its own pools gets a key of its own, replicated nowhere. Either is encrypted with the
        region's AWS managed key for Secrets Manager (no KmsKeyId; a replica uses its own region's). Returns the
        secret created in this stack, if any; this region's instance roles may read the one of their own region."""
        name = peer_secret_of(cfg, region.region)
        if name is None:
            return None
        peers = peer_regions(cfg)
        secret: secretsmanager.Secret | None = None
        if creates_peer_key(cfg, region.region):
            spill = region.region in peers
            secret = secretsmanager.Secret(
                # "PeerKey" is the spill key's construct id since it was first deployed: a new logical id would
                # replace a secret of the same name, which CloudFormation cannot create before the old is gone.
                self, "PeerKey" if spill else "BalanceKey", secret_name=name,
                description=(f"{cfg.name}: HMAC key of forwarded requests' identity between the gateways "
                             + ("(spill and balancing)" if spill else f"of {region.region}'s pools (balancing)")),
                generate_secret_string=secretsmanager.SecretStringGenerator(password_length=64,
                                                                            exclude_punctuation=True),
                replica_regions=[secretsmanager.ReplicaRegion(region=r) for r in peers[1:]] if spill else None,
            )
            nag.acknowledge(
                secret, "AwsSolutions-SMG4",
                "the peer key is a shared HMAC key the gateways read at start, not a credential of another service: "
                "a rotation is a new value and an instance refresh in every region holding it (docs/stacks.md, "
                "Peer key), which a Secrets Manager rotation function cannot order",
            )
        # Secrets Manager appends "-" and six random characters to a secret's ARN; the region is this stack's.
        arn = Stack.of(self).format_arn(service="secretsmanager", resource="secret", resource_name=f"{name}-??????",
                                        arn_format=ArnFormat.COLON_RESOURCE_NAME)
        for role in roles:
            role.add_to_principal_policy(iam.PolicyStatement(
                sid="ReadPeerKey", actions=["secretsmanager:GetSecretValue"], resources=[arn]))
        return secret
