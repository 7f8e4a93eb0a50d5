"""Benchmark mode, consumer side (`cdk synth -c bench=true`): one small CPU
instance in the consumer's subnets that runs the same sweep as the provider's
bench instances (stacks/bench_fleet.py), but through the consumer's interface
endpoint, uploads the results to a results bucket in the consumer account and
scales its own group to zero. `fleetcast bench network-share` then compares the
two files to split the network's share out of TTFT and E2E.

The probe is a plain Amazon Linux 2023 instance (no GPU image, no docker): Python
3.11 from the AL2023 repositories, the fleetcast code and its few third-party
wheels in one bundle asset of this stack (`fleetcast bench probe-wheels`), so it
reads nothing from the provider account. The consumer VPC must reach S3 (a
gateway endpoint or NAT) and the Auto Scaling API (an interface endpoint or NAT);
SSM endpoints only for Session Manager (docs/bench.md, "network share").

Context knobs (all optional): the bench_fleet ones (bench_run, bench_concurrency,
bench_requests, bench_input_tokens, bench_output_tokens), plus
bench_probe (false: no probe), bench_probe_instance_type (c7i.large),
bench_probe_wheels (wheelhouse directory, default build/probe-wheels) and, for
consumers with `api_keys: true`, bench_api_key_secret (a Secrets Manager secret
in the consumer account holding one of the consumer's keys; default
<fleet>/bench/<consumer>/api-key).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from aws_cdk import (
    ArnFormat,
    CfnOutput,
    Duration,
    Fn,
    Stack,
    aws_autoscaling as autoscaling,
    aws_ec2 as ec2,
    aws_iam as iam,
    aws_s3 as s3,
    aws_s3_assets as s3_assets,
)
from constructs import Construct

from fleetcast.config import Consumer, FleetConfig
from fleetcast.contract.bench import KNOB_DEFAULTS, PROBE_KNOB_DEFAULTS
from fleetcast.contract.bucket import probe_model_key, probe_results_key as results_key_of
from fleetcast.contract.context import Context, is_true
from fleetcast.contract.errors import UserError
from fleetcast.contract.instance_env import Var
from fleetcast.contract.outputs import ConsumerOutput
from fleetcast.contract.probe_wheels import check_wheelhouse

from . import nag
from .bench_fleet import bench_enabled, bench_knobs
from .gpu_fleet import asg_arn, pin_launched_tags
from .instance_userdata import render_probe_user_data
from .runtime_bundle import PROBE, REPO_ROOT, stage_bundle
from .session_manager import WILDCARD_REASON, grant_session_manager
from .storage import private_bucket

ROOT_VOLUME_GIB = 16


def probe_enabled(scope: Construct) -> bool:
    return bench_enabled(scope) and is_true(scope.node.try_get_context(Context.BENCH_PROBE.value), default=True)


def probe_results_key(run: str, consumer: Consumer) -> str:
    return results_key_of(run, consumer.service_region, consumer.name)


def probe_group_name(cfg: FleetConfig, consumer: Consumer) -> str:
    return f"{cfg.name}-{consumer.name}-bench-probe"


def api_key_secret_name(scope: Construct, cfg: FleetConfig, consumer: Consumer) -> str | None:
    """The secret the probe reads its API key from, for consumers whose gateway requires keys."""
    if not consumer.api_keys:
        return None
    name = str(scope.node.try_get_context(Context.BENCH_API_KEY_SECRET.value) or f"{cfg.name}/bench/{consumer.name}/api-key")
    if not re.fullmatch(r"[A-Za-z0-9/_+=.@-]{1,512}", name):
        raise UserError(f"-c bench_api_key_secret={name!r}: a Secrets Manager name uses only A-Z a-z 0-9 / _ + = . @ -")
    return name


def _stage_probe_bundle(outdir: str, wheels: list[Path]) -> Path:
    """The probe's modules (runtime_bundle.PROBE) plus wheels/, in one directory for the asset."""
    staging = stage_bundle(outdir, PROBE)
    (staging / "wheels").mkdir(exist_ok=True)
    for wheel in wheels:
        shutil.copy2(wheel, staging / "wheels" / wheel.name)
    return staging


class ConsumerBenchProbe(Construct):
    """The probe's results bucket, bundle, security group, role, launch template and group of at most one."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, consumer: Consumer,
                 endpoint) -> None:
        super().__init__(scope, construct_id)
        knobs = bench_knobs(self, {**KNOB_DEFAULTS, **PROBE_KNOB_DEFAULTS})
        if not re.fullmatch(r"[a-z][a-z0-9-]*\.[a-z0-9]+", knobs["bench_probe_instance_type"]):
            raise UserError(f"-c bench_probe_instance_type={knobs['bench_probe_instance_type']!r}: "
                            "use an EC2 instance type such as c7i.large")
        if consumer.service_region in cfg.network.tls_certificate_arns:
            # The certificate names the provider's domain, not the endpoint's DNS name the probe calls.
            raise UserError(
                f"consumer {consumer.name}: the {consumer.service_region} service has a TLS listener "
                "(network.tls_certificate_arns), which the bench probe does not support yet; "
                "synth with -c bench_probe=false"
            )
        wheel_dir = Path(knobs["bench_probe_wheels"])
        if not wheel_dir.is_absolute():
            wheel_dir = REPO_ROOT / wheel_dir
        wheels = check_wheelhouse(wheel_dir)
        port = cfg.engine.port
        self.group_name = probe_group_name(cfg, consumer)
        self.results_key = probe_results_key(knobs["bench_run"], consumer)
        error_key = self.results_key.removesuffix(".json") + ".error.txt"
        # The base models this consumer may call (an adapter runs on its base model's processes). Several: the
        # probe measures each alone through the endpoint, one file each; which pool answered, and what else ran
        # there, is not known from the consumer side, so the files record no packing.
        callable_ids = cfg.models_for(consumer.name)  # the entitlement rule's one home
        self.models = [m.id for m in cfg.models if m.id in callable_ids]
        self.results_keys = ([self.results_key] if len(self.models) == 1 else
                             [probe_model_key(self.results_key, m) for m in self.models])

        self.results_bucket = private_bucket(
            self, "Results", lifecycle_rules=[s3.LifecycleRule(noncurrent_version_expiration=Duration.days(30))]
        )
        nag.acknowledge(
            self.results_bucket,
            "AwsSolutions-S1",
            "Benchmark figures only, written by one role to one key per run and read by the operator; a "
            "server-access-log bucket per consumer account would cost more than the data it protects.",
        )
        self.bundle = s3_assets.Asset(self, "Bundle", path=str(_stage_probe_bundle(Stack.of(self).node.root.outdir, wheels)))

        vpc, subnets = endpoint.vpc, endpoint.subnets
        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description=f"{cfg.name} bench probe for {consumer.name}: serving port to the consumer CIDRs, HTTPS out",
            allow_all_outbound=False,
        )
        for cidr in consumer.cidrs:
            # The interface endpoint's network interfaces live in these CIDRs.
            self.security_group.add_egress_rule(ec2.Peer.ipv4(cidr), ec2.Port.tcp(port), "the interface endpoint")
        # S3 (bundle, AL2023 repositories, results), Auto Scaling and SSM: through the consumer's
        # endpoints or NAT; their addresses are not known at synth.
        self.security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to AWS APIs and S3")

        self.api_key_secret = api_key_secret_name(self, cfg, consumer)
        self.role = self._role(error_key)
        dns_name = Fn.select(1, Fn.split(":", Fn.select(0, endpoint.endpoint.vpc_endpoint_dns_entries)))
        region_cfg = next((r for r in cfg.regions if r.region == consumer.service_region), None)
        labels = [f"region={consumer.region}", f"consumer={consumer.name}", "path=privatelink"]
        if len(self.models) == 1:
            labels.append(f"model={self.models[0]}")
        if region_cfg is not None and len({p.instance_type for p in region_cfg.pools}) == 1:
            # Only when the service has one instance type is it known which one answered (and, with one model,
            # which engine).
            pool = region_cfg.pools[0]
            labels.append(f"instance_type={pool.instance_type}")
            if len(self.models) == 1:
                engine = cfg.engine_for(pool, self.models[0])
                labels += [f"precision={engine.precision.value}", f"backend={engine.backend.value}"]
        env = {
            Var.FLEET.value: cfg.name,
            Var.REGION.value: consumer.region,
            Var.BUCKET.value: self.results_bucket.bucket_name,
            Var.PROBE_BUNDLE.value: self.bundle.s3_object_url,
            Var.BENCH_KEY.value: self.results_key,
            Var.BENCH_GROUP.value: self.group_name,
            Var.BENCH_ENDPOINT.value: f"http://{dns_name}:{port}",
            Var.BENCH_CONCURRENCY.value: knobs["bench_concurrency"],
            Var.BENCH_REQUESTS.value: knobs["bench_requests"],
            Var.BENCH_INPUT_TOKENS.value: knobs["bench_input_tokens"],
            Var.BENCH_OUTPUT_TOKENS.value: knobs["bench_output_tokens"],
            Var.BENCH_LABELS.value: ",".join(labels),
        }
        if len(self.models) > 1:
            env[Var.BENCH_PROBE_MODELS.value] = ",".join(self.models)
        if self.api_key_secret:
            env[Var.BENCH_API_KEY_SECRET.value] = self.api_key_secret
        self.launch_template = ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            instance_type=ec2.InstanceType(knobs["bench_probe_instance_type"]),
            machine_image=ec2.MachineImage.latest_amazon_linux2023(),
            role=self.role,
            security_group=self.security_group,
            user_data=ec2.UserData.custom(render_probe_user_data(env)),
            require_imdsv2=True,
            associate_public_ip_address=False,
            block_devices=[
                ec2.BlockDevice(
                    device_name="/dev/xvda",
                    volume=ec2.BlockDeviceVolume.ebs(ROOT_VOLUME_GIB, volume_type=ec2.EbsDeviceVolumeType.GP3,
                                                     encrypted=True, delete_on_termination=True),
                )
            ],
        )
        pin_launched_tags(self.launch_template)
        self.asg = autoscaling.AutoScalingGroup(
            self,
            "Group",
            auto_scaling_group_name=self.group_name,
            vpc=vpc,
            vpc_subnets=ec2.SubnetSelection(subnets=subnets),
            launch_template=self.launch_template,
            # The job sets desired to 0 when done; min 0 lets it, max 1 keeps it to one probe.
            min_capacity=0,
            desired_capacity=1,
            max_capacity=1,
        )
        nag.acknowledge_warning(
            self.asg,
            "@aws-cdk/aws-autoscaling:desiredCapacitySet",
            "Each deploy in bench mode starts one probe run on purpose; the probe sets desired to 0 when done.",
        )
        nag.acknowledge(
            self.asg,
            "AwsSolutions-AS3",
            "A one-shot benchmark probe that stops itself; its results or error note in the results bucket "
            "are the notification.",
        )
        CfnOutput(self, "BenchResultsBucketName", value=self.results_bucket.bucket_name).override_logical_id(
            ConsumerOutput.BENCH_RESULTS_BUCKET.value)

    def _asg_arn(self) -> str:
        return asg_arn(self, self.group_name)

    def _role(self, error_key: str) -> iam.Role:
        role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description=f"{self.group_name}: read its bundle, write its results, scale its own group to zero",
        )
        grant_session_manager(role)
        role.add_to_policy(iam.PolicyStatement(
            sid="ReadProbeBundle",
            actions=["s3:GetObject"],
            resources=[self.bundle.bucket.arn_for_objects(self.bundle.s3_object_key)],
        ))
        role.add_to_policy(iam.PolicyStatement(
            sid="UploadOwnBenchResults",
            actions=["s3:PutObject"],
            resources=[*(self.results_bucket.arn_for_objects(k) for k in self.results_keys),
                       self.results_bucket.arn_for_objects(error_key)],
        ))
        if self.api_key_secret:
            # Secrets Manager appends "-" and six random characters to a secret's ARN.
            role.add_to_policy(iam.PolicyStatement(
                sid="ReadBenchApiKey",
                actions=["secretsmanager:GetSecretValue"],
                resources=[Stack.of(self).format_arn(service="secretsmanager", resource="secret",
                                                     resource_name=f"{self.api_key_secret}-??????",
                                                     arn_format=ArnFormat.COLON_RESOURCE_NAME)],
            ))
        role.add_to_policy(iam.PolicyStatement(
            sid="ScaleOwnGroupToZero",
            actions=["autoscaling:SetDesiredCapacity"],
            resources=[self._asg_arn()],
        ))
        nag.acknowledge(
            role.node.find_child("DefaultPolicy"),
            "AwsSolutions-IAM5[Resource::*]",
            f"Only {WILDCARD_REASON} use '*'.",
        )
        nag.acknowledge(
            role.node.find_child("DefaultPolicy"),
            f"AwsSolutions-IAM5[Resource::{Stack.of(self).resolve(self._asg_arn())}]",
            "The ASG ARN embeds a group id unknown before creation; the explicit group name pins it to the probe.",
        )
        return role
