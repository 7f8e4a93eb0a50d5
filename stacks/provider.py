"""One region's provider stack: a thin composition of the constructs that make up the fleet."""

from __future__ import annotations

from aws_cdk import CfnOutput, Stack, Tags, aws_ec2 as ec2
from constructs import Construct

from fleetcast.config import EgressMode, FleetConfig, Region
from fleetcast.contract.capacity_hold import HELD_OUTPUT
from fleetcast.contract.image import image_reference, image_tag, instance_image_id
from fleetcast.contract.names import FLEET_TAG
from fleetcast.contract.outputs import ProviderOutput

from . import feature_flags
from .bootstrap import InstanceBootstrap
from .connection_approver import ConnectionApprover
from .endpoint_service import EndpointService
from .fleet_logs import FleetLogs
from .fleet_operations import FleetOperations
from .gpu_fleet import GpuFleet, InstanceInputs
from .image_mirror import ImageMirror
from .launch_order import capacity_held
from .network import FleetNetwork
from .notifications import NotificationTopic
from .plan_drift import PlanDriftCheck
from .spill import SpillEndpoints
from .storage import ImageRepository, ModelStore


class ProviderStack(Stack):
    """Network, storage, notifications, one GpuFleet per pool and the PrivateLink service of one region.

    Exposed for constructs layered on top (operations, connection approval):
    `fleets` (pool name -> GpuFleet), `service`, `notifications`, `model_store`,
    `image_repository`, `log_group`, `network`, `bootstrap`.
    """

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, region: Region, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        feature_flags.pin(self)
        self.cfg = cfg
        self.region_cfg = region

        self.logs = FleetLogs(self, "Logs", fleet=cfg.name, retention_days=cfg.operations.log_retention_days)
        self.log_group = self.logs.instance_log_group
        self.network = FleetNetwork(
            self, "Network", region=region, egress=cfg.network.egress, flow_log_group=self.logs.flow_log_group
        )
        self.notifications = NotificationTopic(self, "Notifications", fleet=cfg.name)
        self.model_store = ModelStore(self, "ModelStore")
        self.image_repository = ImageRepository(self, "Image", fleet=cfg.name)
        # Instances run the derived image (the release plus the runtime's dependencies) from this region's
        # ECR, whatever the egress; `fleetcast stage image` builds it there from inside AWS (issue 8).
        self.image_mirror = ImageMirror(
            self, "ImageMirror", repository=self.image_repository.repository, upstream_image=cfg.engine.image,
            image_tag=image_tag(cfg, derived=True), log_retention=self.logs.retention,
        )
        self.bootstrap = InstanceBootstrap(self, "Bootstrap", cfg=cfg)

        self.instance_security_group = ec2.SecurityGroup(
            self,
            "InstanceSecurityGroup",
            vpc=self.network.vpc,
            description=f"{cfg.name} GPU instances: serving port from the NLB only, HTTPS out",
            allow_all_outbound=False,
        )
        self._instance_egress(cfg)

        # What every instance of the region is given; bench groups (bench_fleet.py) reuse it.
        self.instance_inputs = inputs = InstanceInputs(
            model_store=self.model_store,
            repository=self.image_repository.repository,
            image_uri=self._image_uri(cfg),
            config_parameter=self.bootstrap.config_parameter,
            runtime_bundle=self.bootstrap.runtime_bundle,
            log_group=self.log_group,
        )
        self.fleets: dict[str, GpuFleet] = {
            pool.name: GpuFleet(
                self,
                f"Pool-{pool.name}",
                cfg=cfg,
                region=region,
                pool=pool,
                vpc=self.network.vpc,
                subnets=self.network.subnets,
                security_group=self.instance_security_group,
                inputs=inputs,
            )
            for pool in region.pools
        }
        self.service = EndpointService(
            self,
            "Service",
            cfg=cfg,
            region=region,
            vpc=self.network.vpc,
            subnets=self.network.subnets,
            instance_security_group=self.instance_security_group,
            topic=self.notifications.topic,
            access_logs=self.model_store.access_logs,
        )
        # The home side of cross-region spill: this region's own endpoints to other regions' services (issue 36).
        self.spill = SpillEndpoints(
            self, "Spill", cfg=cfg, region=region, vpc=self.network.vpc, subnets=self.network.subnets,
            instance_security_group=self.instance_security_group,
            instance_roles=[fleet.role for fleet in self.fleets.values()],
        )
        for fleet in self.fleets.values():
            fleet.asg.attach_to_network_target_group(self.service.target_group)
            if fleet.spot_asg is not None:  # the Spot tier serves behind the same target group
                fleet.spot_asg.attach_to_network_target_group(self.service.target_group)
        # Scaling, lifecycle, rollouts, alarms, events and dashboard on top of the pools (issue 4).
        self.operations = FleetOperations(
            self, "Operations", cfg=cfg, region=region, fleets=self.fleets, service=self.service,
            notifications=self.notifications,
        )
        # `fleetcast connections` finds the service by this tag when the stack output is unreadable.
        Tags.of(self.service.endpoint_service).add(FLEET_TAG, cfg.name)
        if cfg.operations.auto_approve_connections:
            # Accepts connection requests from the accounts the config allows; reports the rest (issue 5).
            self.connection_approver = ConnectionApprover(
                self, "ConnectionApprover", cfg=cfg, region=region,
                endpoint_service=self.service.endpoint_service, topic=self.notifications.topic,
            )
        if cfg.operations.plan_drift_check is not None:
            self._plan_drift_check(cfg, region)
        self._outputs()
        if capacity_held(self):
            # `fleetcast deploy` reads it: this region waits for staging before its fleets get capacity.
            CfnOutput(self, HELD_OUTPUT, value="true",
                      description="Every group of this region is held at zero instances until staging completes")

    def _plan_drift_check(self, cfg: FleetConfig, region: Region) -> None:
        """The scheduled drift check (docs/plan.md, Drift). Its notices need SNS: where the fleet's
        network has VPC endpoints (egress: none) it gets an SNS endpoint too, so nothing leaves the VPC."""
        if self.network.endpoints:
            self.network.endpoints["Sns"] = self.network.vpc.add_interface_endpoint(
                "SnsEndpoint", service=ec2.InterfaceVpcEndpointAwsService.SNS, subnets=self.network.subnets,
                private_dns_enabled=True, security_groups=[self.network.endpoint_security_group], open=False,
            )
        self.plan_drift_check = PlanDriftCheck(
            self, "PlanDriftCheck", cfg=cfg, region=region, vpc=self.network.vpc, subnets=self.network.subnets,
            bucket=self.model_store.bucket, topic=self.notifications.topic,
        )

    def _outputs(self) -> None:
        """Stable output keys for staging (`fleetcast stage`) and operators."""
        outputs = {
            ProviderOutput.MODEL_BUCKET: self.model_store.bucket.bucket_name,
            ProviderOutput.IMAGE_REPOSITORY: self.image_repository.repository.repository_uri,
            ProviderOutput.CONFIG_PARAMETER: self.bootstrap.config_parameter.parameter_name,
            ProviderOutput.NOTIFICATION_TOPIC: self.notifications.topic.topic_arn,
            ProviderOutput.INSTANCE_LOG_GROUP: self.log_group.log_group_name,
        }
        for key, value in outputs.items():
            CfnOutput(self, key.value, value=value)

    @property
    def availability_zones(self) -> list[str]:
        # Pinned from the config: an env-bound stack would otherwise look them up.
        return [az.name for az in self.region_cfg.availability_zones]

    def _image_uri(self, cfg: FleetConfig) -> str:
        """The derived serving image in this region's repository, with either egress: the public release lacks
        the runtime's Python dependencies (boto3, ruamel.yaml; docker/Dockerfile), so it cannot run
        runtime.bootstrap. Until `fleetcast stage image` pins a digest, the tag it pushes (immutable in ECR);
        `fleetcast stage status` checks this same reference (fleetcast/contract/image.py)."""
        return image_reference(self.image_repository.repository.repository_uri, instance_image_id(cfg))

    def _instance_egress(self, cfg: FleetConfig) -> None:
        """HTTPS out only. With `egress: none` the subnets have no route off the VPC, so HTTPS reaches
        only the interface endpoints and S3 through its gateway (whose prefix-list id differs per region
        and cannot be known without a lookup, hence no narrower destination)."""
        reason = (
            "HTTPS through NAT (egress: nat)"
            if cfg.network.egress == EgressMode.NAT
            else "HTTPS to VPC endpoints and the S3 gateway; no route leaves the VPC"
        )
        self.instance_security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), reason)
