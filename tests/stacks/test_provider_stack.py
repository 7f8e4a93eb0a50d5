"""What the provider stacks must guarantee, asserted on the synthesized templates of config/fleet.yaml
(and of a variant config exercising the other branches: imported VPC, TLS, `latest` AMI, two pools)."""

from __future__ import annotations

import copy
import json

import pytest
from aws_cdk.assertions import Match

from fleetcast.contract import telemetry
from fleetcast.staging.image import image_tag
from stacks.gpu_fleet import DLAMI_SSM_PARAMETER
from stacks.network import INTERFACE_ENDPOINTS
from stacks.runtime_bundle import SERVING, bundle_files

from .synthesized import default_doc, default_fleet, synthesize, variant_fleet

SEOUL = "fleetcast-provider-ap-northeast-2"
VIRGINIA = "fleetcast-provider-us-east-1"
PROVIDERS = (SEOUL, VIRGINIA)


@pytest.fixture(scope="module")
def fleet():
    return default_fleet()


@pytest.fixture(scope="module")
def variant():
    return variant_fleet()


def only(resources: dict) -> dict:
    assert len(resources) == 1, f"expected exactly one resource, got {list(resources)}"
    return next(iter(resources.values()))["Properties"]


def region_of(stack_name: str) -> str:
    return stack_name.removeprefix("fleetcast-provider-")


# ---------------------------------------------------------------- endpoint service


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_endpoint_service_requires_acceptance_and_names_principals(fleet, stack_name):
    region = fleet.cfg.region(region_of(stack_name))
    assert only(fleet.resources(stack_name, "AWS::EC2::VPCEndpointService"))["AcceptanceRequired"] is True
    permissions = only(fleet.resources(stack_name, "AWS::EC2::VPCEndpointServicePermissions"))
    assert permissions["AllowedPrincipals"] == list(region.allowed_principals)
    assert not any("*" in p for p in permissions["AllowedPrincipals"])


def test_supported_regions_only_where_cross_region_consumers_are_allowed(fleet):
    assert only(fleet.resources(VIRGINIA, "AWS::EC2::VPCEndpointService"))["SupportedRegions"] == ["us-west-2"]
    assert "SupportedRegions" not in only(fleet.resources(SEOUL, "AWS::EC2::VPCEndpointService"))


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_connection_requests_notify_the_encrypted_topic(fleet, stack_name):
    notification = only(fleet.resources(stack_name, "AWS::EC2::VPCEndpointConnectionNotification"))
    assert sorted(notification["ConnectionEvents"]) == ["Accept", "Connect", "Delete", "Reject"]
    topic_id = next(iter(fleet.resources(stack_name, "AWS::SNS::Topic")))
    assert notification["ConnectionNotificationArn"] == {"Ref": topic_id}


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_outputs_publish_service_name_and_id(fleet, stack_name):
    outputs = fleet.template_json(stack_name)["Outputs"]
    assert {"EndpointServiceName", "EndpointServiceId", "ModelBucketName", "ImageRepositoryUri"} <= set(outputs)


# ---------------------------------------------------------------- NLB, listener, target group


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_nlb_is_internal_cross_zone_with_its_own_security_group(fleet, stack_name):
    nlb = only(fleet.resources(stack_name, "AWS::ElasticLoadBalancingV2::LoadBalancer"))
    assert nlb["Type"] == "network" and nlb["Scheme"] == "internal"
    assert {"Key": "load_balancing.cross_zone.enabled", "Value": "true"} in nlb["LoadBalancerAttributes"]
    assert len(nlb["SecurityGroups"]) == 1


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_tcp_listener_and_one_shared_target_group_on_the_serving_port(fleet, stack_name):
    port = fleet.cfg.engine.port
    template = fleet.template(stack_name)
    template.has_resource_properties("AWS::ElasticLoadBalancingV2::Listener", {"Port": port, "Protocol": "TCP"})
    tg = only(fleet.resources(stack_name, "AWS::ElasticLoadBalancingV2::TargetGroup"))
    assert (tg["Port"], tg["Protocol"], tg["TargetType"]) == (port, "TCP", "instance")
    attributes = {a["Key"]: a["Value"] for a in tg["TargetGroupAttributes"]}
    # Consumer identity (VPC endpoint id) reaches the gateway only through proxy protocol v2.
    assert attributes["proxy_protocol_v2.enabled"] == "true"
    assert attributes["deregistration_delay.timeout_seconds"] == str(fleet.cfg.operations.drain_timeout_s)
    assert attributes["deregistration_delay.connection_termination.enabled"] == "false"
    assert (tg["HealthCheckProtocol"], tg["HealthCheckPath"], tg["HealthCheckPort"]) == ("HTTP", "/health", "traffic-port")


def test_every_pool_registers_in_the_one_target_group(variant):
    tg_id = next(iter(variant.resources(SEOUL, "AWS::ElasticLoadBalancingV2::TargetGroup")))
    groups = variant.resources(SEOUL, "AWS::AutoScaling::AutoScalingGroup")
    assert len(groups) == 2
    for group in groups.values():
        assert group["Properties"]["TargetGroupARNs"] == [{"Ref": tg_id}]


def test_tls_listener_with_the_configured_certificate(variant):
    arn = variant.cfg.network.tls_certificate_arns["ap-northeast-2"]
    variant.template(SEOUL).has_resource_properties("AWS::ElasticLoadBalancingV2::Listener", {
        "Protocol": "TLS", "Port": variant.cfg.engine.port, "Certificates": [{"CertificateArn": arn}],
        "SslPolicy": Match.string_like_regexp("TLS13"),
    })
    # The other region has no certificate configured: plain TCP.
    variant.template(VIRGINIA).has_resource_properties("AWS::ElasticLoadBalancingV2::Listener", {"Protocol": "TCP"})


# ---------------------------------------------------------------- security groups on the PrivateLink path


def _security_groups(fleet, stack_name):
    return fleet.resources(stack_name, "AWS::EC2::SecurityGroup")


def _nlb_sg_id(fleet, stack_name):
    nlb = only(fleet.resources(stack_name, "AWS::ElasticLoadBalancingV2::LoadBalancer"))
    return nlb["SecurityGroups"][0]["Fn::GetAtt"][0]


def _instance_sg_id(fleet, stack_name):
    lt = next(iter(fleet.resources(stack_name, "AWS::EC2::LaunchTemplate").values()))["Properties"]
    return lt["LaunchTemplateData"]["NetworkInterfaces"][0]["Groups"][0]["Fn::GetAtt"][0]


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_nlb_admits_exactly_its_consumers_cidrs_on_the_port(fleet, stack_name):
    port = fleet.cfg.engine.port
    nlb_sg = _security_groups(fleet, stack_name)[_nlb_sg_id(fleet, stack_name)]["Properties"]
    expected = sorted(cidr for c in fleet.cfg.consumers_of(region_of(stack_name)) for cidr in c.cidrs)
    assert expected, "each default region has at least one consumer"
    ingress = nlb_sg["SecurityGroupIngress"]
    assert sorted(rule["CidrIp"] for rule in ingress) == expected
    assert all((r["IpProtocol"], r["FromPort"], r["ToPort"]) == ("tcp", port, port) for r in ingress)
    # Inbound-rule enforcement for PrivateLink traffic stays on (the default): it sees consumer IPs.
    nlb = only(fleet.resources(stack_name, "AWS::ElasticLoadBalancingV2::LoadBalancer"))
    assert "EnforceSecurityGroupInboundRulesOnPrivateLinkTraffic" not in nlb


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_nlb_reaches_instances_sg_to_sg_on_the_port_only(fleet, stack_name):
    port = fleet.cfg.engine.port
    nlb_sg, instance_sg = _nlb_sg_id(fleet, stack_name), _instance_sg_id(fleet, stack_name)
    egress = [r["Properties"] for r in fleet.resources(stack_name, "AWS::EC2::SecurityGroupEgress").values()
              if r["Properties"]["GroupId"] == {"Fn::GetAtt": [nlb_sg, "GroupId"]}]
    assert len(egress) == 1, "the NLB group's only way out is to the instances"
    assert egress[0]["DestinationSecurityGroupId"] == {"Fn::GetAtt": [instance_sg, "GroupId"]}
    assert (egress[0]["IpProtocol"], egress[0]["FromPort"], egress[0]["ToPort"]) == ("tcp", port, port)
    assert "SecurityGroupEgress" not in _security_groups(fleet, stack_name)[nlb_sg]["Properties"] or all(
        r["CidrIp"] == "255.255.255.255/32" for r in _security_groups(fleet, stack_name)[nlb_sg]["Properties"]["SecurityGroupEgress"])
    ingress = [r["Properties"] for r in fleet.resources(stack_name, "AWS::EC2::SecurityGroupIngress").values()
               if r["Properties"]["GroupId"] == {"Fn::GetAtt": [instance_sg, "GroupId"]}]
    assert len(ingress) == 1
    assert ingress[0]["SourceSecurityGroupId"] == {"Fn::GetAtt": [nlb_sg, "GroupId"]}
    assert (ingress[0]["IpProtocol"], ingress[0]["FromPort"], ingress[0]["ToPort"]) == ("tcp", port, port)
    # The instance group itself has no inline ingress: the NLB is the only way in (no SSH).
    assert "SecurityGroupIngress" not in _security_groups(fleet, stack_name)[instance_sg]["Properties"]


def _all_ingress(template: dict):
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::EC2::SecurityGroup":
            yield from resource["Properties"].get("SecurityGroupIngress", [])
        elif resource["Type"] == "AWS::EC2::SecurityGroupIngress":
            yield resource["Properties"]


@pytest.mark.parametrize("which", ["default", "variant"])
def test_no_security_group_anywhere_admits_the_internet(which, fleet, variant):
    synthesized = fleet if which == "default" else variant
    rules = [rule for path in synthesized.template_files()
             for rule in _all_ingress(json.loads(path.read_text()))]
    assert rules, "templates carry ingress rules to check"
    assert not [r for r in rules if r.get("CidrIp") == "0.0.0.0/0" or r.get("CidrIpv6") == "::/0"]


# ---------------------------------------------------------------- notifications: KMS key and topic


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_topic_key_lets_vpce_cloudwatch_and_events_publish(fleet, stack_name):
    topic = only(fleet.resources(stack_name, "AWS::SNS::Topic"))
    key_id = topic["KmsMasterKeyId"]["Fn::GetAtt"][0]
    key = fleet.template_json(stack_name)["Resources"][key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    def services(statement):
        service = statement.get("Principal", {}).get("Service", [])
        return [service] if isinstance(service, str) else service

    def actions(statement):
        return {statement["Action"]} if isinstance(statement["Action"], str) else set(statement["Action"])

    allowed = {svc for s in key["KeyPolicy"]["Statement"] if s["Effect"] == "Allow"
               and {"kms:GenerateDataKey*", "kms:Decrypt"} <= actions(s) for svc in services(s)}
    assert {"vpce.amazonaws.com", "cloudwatch.amazonaws.com", "events.amazonaws.com"} <= allowed
    # Nothing but those publishers (and the account root, CDK's default admin statement) is in the policy.
    others = [s for s in key["KeyPolicy"]["Statement"] if not services(s)]
    assert all("AWS" in s["Principal"] and ":root" in json.dumps(s["Principal"]) for s in others)


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_topic_policy_lets_services_of_this_account_publish_and_requires_tls(fleet, stack_name):
    policy = only(fleet.resources(stack_name, "AWS::SNS::TopicPolicy"))["PolicyDocument"]["Statement"]
    allows = [s for s in policy if s["Effect"] == "Allow"]
    assert all(s["Action"] == "sns:Publish" and "Service" in s["Principal"] for s in allows)
    vpce = [s for s in allows if "vpce.amazonaws.com" in s["Principal"]["Service"]]
    assert len(vpce) == 1
    assert vpce[0]["Condition"] == {"StringEquals": {"aws:SourceAccount": fleet.cfg.provider.account}}
    assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in policy)


# ---------------------------------------------------------------- model bucket


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_model_bucket_is_encrypted_private_versioned_logged_and_tls_only(fleet, stack_name):
    buckets = fleet.resources(stack_name, "AWS::S3::Bucket")
    assert len(buckets) == 2  # the model bucket and its access-log bucket
    for bucket_id, bucket in buckets.items():
        props = bucket["Properties"]
        assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"]
        assert props["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
        assert props["VersioningConfiguration"] == {"Status": "Enabled"}
        policies = [p["Properties"]["PolicyDocument"]["Statement"]
                    for p in fleet.resources(stack_name, "AWS::S3::BucketPolicy").values()
                    if p["Properties"]["Bucket"] == {"Ref": bucket_id}]
        assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
                   for statements in policies for s in statements), bucket_id
    model_bucket = [b["Properties"] for b in buckets.values() if "LoggingConfiguration" in b["Properties"]]
    assert len(model_bucket) == 1


# ---------------------------------------------------------------- instances: launch template, ASG, hook


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_launch_template_requires_imdsv2_and_has_no_public_ip_or_key(fleet, stack_name):
    lt = only(fleet.resources(stack_name, "AWS::EC2::LaunchTemplate"))["LaunchTemplateData"]
    assert lt["MetadataOptions"] == {"HttpTokens": "required", "HttpPutResponseHopLimit": 2, "InstanceMetadataTags": "enabled"}
    assert [ni["AssociatePublicIpAddress"] for ni in lt["NetworkInterfaces"]] == [False]
    assert "KeyName" not in lt


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_root_volume_is_encrypted_gp3_of_the_configured_size(fleet, stack_name):
    pool = fleet.cfg.region(region_of(stack_name)).pools[0]
    lt = only(fleet.resources(stack_name, "AWS::EC2::LaunchTemplate"))["LaunchTemplateData"]
    assert lt["BlockDeviceMappings"] == [{"DeviceName": "/dev/xvda", "Ebs": {
        "DeleteOnTermination": True, "Encrypted": True, "VolumeSize": pool.root_volume_gib, "VolumeType": "gp3"}}]


def test_instance_type_and_root_size_per_pool(variant):
    pools = {p.instance_type: p for p in variant.cfg.region("ap-northeast-2").pools}
    templates = [lt["Properties"]["LaunchTemplateData"] for lt in variant.resources(SEOUL, "AWS::EC2::LaunchTemplate").values()]
    assert sorted(lt["InstanceType"] for lt in templates) == sorted(pools) == ["g5.2xlarge", "g6e.xlarge"]
    for lt in templates:
        assert lt["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == pools[lt["InstanceType"]].root_volume_gib


def test_latest_ami_by_default_resolves_the_dlami_parameter_and_a_pinned_id_is_used_as_is(fleet, variant):
    # The default config ships `latest`: CloudFormation resolves the public DLAMI parameter at deploy time.
    assert fleet.cfg.region("ap-northeast-2").ami.id == "latest"
    lt = only(fleet.resources(SEOUL, "AWS::EC2::LaunchTemplate"))["LaunchTemplateData"]
    parameters = fleet.template_json(SEOUL)["Parameters"]
    ssm = [name for name, p in parameters.items() if p.get("Default") == DLAMI_SSM_PARAMETER]
    assert len(ssm) == 1 and parameters[ssm[0]]["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
    assert lt["ImageId"] == {"Ref": ssm[0]}
    pinned = variant.cfg.region("ap-northeast-2").ami.id
    assert all(lt["Properties"]["LaunchTemplateData"]["ImageId"] == pinned
               for lt in variant.resources(SEOUL, "AWS::EC2::LaunchTemplate").values())
    assert not [p for p in variant.template_json(SEOUL)["Parameters"].values() if p.get("Default") == DLAMI_SSM_PARAMETER]


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_asg_uses_elb_health_checks_and_an_explicit_name(fleet, stack_name):
    region = fleet.cfg.region(region_of(stack_name))
    pool = region.pools[0]
    asg = only(fleet.resources(stack_name, "AWS::AutoScaling::AutoScalingGroup"))
    assert asg["HealthCheckType"] == "ELB" and int(asg["HealthCheckGracePeriod"]) > 0
    assert asg["AutoScalingGroupName"] == f"fleetcast-{region.region}-{pool.name}"
    assert (asg["MinSize"], asg["MaxSize"]) == (str(pool.capacity.min), str(pool.capacity.max))
    # No desired in the config: none in the template, so a deploy never resets a scaled-out group.
    assert pool.capacity.desired is None and "DesiredCapacity" not in asg
    assert len(asg["VPCZoneIdentifier"]) == len(region.availability_zones)


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_config_tags_reach_instances_through_the_group_not_the_launch_template(fleet, stack_name):
    """A tag in launch template data is part of the template version, and a new version starts an instance
    refresh ("When properties that trigger an instance refresh change (such as LaunchTemplate or
    MixedInstancesPolicy), CloudFormation starts an instance refresh": CDK API reference,
    CfnAutoScalingInstanceRefresh / AWS::AutoScaling::AutoScalingGroup UpdatePolicy). Group tags update
    with "No interruption" and PropagateAtLaunch copies them to each instance the group launches (CloudFormation
    reference, AWS::AutoScaling::AutoScalingGroup TagProperty; EC2 Auto Scaling API reference, Tag:
    "Determines whether the tag is added to new instances as they are launched in the group"). So a tag change
    re-tags the groups and replaces nothing."""
    assert fleet.cfg.tags
    for template in fleet.resources(stack_name, "AWS::EC2::LaunchTemplate").values():
        text = json.dumps(template)
        assert not [key for key in fleet.cfg.tags if f'"Key": "{key}"' in text], text
    for group in fleet.resources(stack_name, "AWS::AutoScaling::AutoScalingGroup").values():
        tags = {t["Key"]: (t["Value"], t["PropagateAtLaunch"]) for t in group["Properties"]["Tags"]}
        assert {k: tags.get(k) for k in fleet.cfg.tags} == {k: (v, True) for k, v in fleet.cfg.tags.items()}


def test_a_fixed_desired_capacity_is_set_only_where_the_config_asks(variant):
    groups = {g["AutoScalingGroupName"]: g for g in variant.resources(SEOUL, "AWS::AutoScaling::AutoScalingGroup")
              .values() for g in [g["Properties"]]}
    assert groups["fleetcast-ap-northeast-2-a10g"]["DesiredCapacity"] == "1"  # the variant fixes it
    assert "DesiredCapacity" not in groups["fleetcast-ap-northeast-2-l40s"]


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_launch_hook_abandons_instances_that_never_report_healthy(fleet, stack_name):
    hooks = only(fleet.resources(stack_name, "AWS::AutoScaling::AutoScalingGroup"))["LifecycleHookSpecificationList"]
    assert {
        "LifecycleHookName": telemetry.LAUNCH_HOOK,
        "LifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING",
        "DefaultResult": "ABANDON",
        "HeartbeatTimeout": fleet.cfg.operations.launch_hook_timeout_s,
    } in hooks


def _user_data(synthesized, stack_name) -> list:
    return [lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
            for lt in synthesized.resources(stack_name, "AWS::EC2::LaunchTemplate").values()]


def _env_lines(parts: list) -> str:
    return "".join(p if isinstance(p, str) else "<ref>" for p in parts)


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_user_data_carries_the_config_digest_and_instance_contract(fleet, stack_name):
    text = _env_lines(_user_data(fleet, stack_name)[0])
    assert f"FLEETCAST_CONFIG_DIGEST={fleet.cfg.instance_digest(region_of(stack_name), 'l40s')}\n" in text
    for key in ("FLEETCAST_FLEET=fleetcast", f"FLEETCAST_REGION={region_of(stack_name)}", "FLEETCAST_POOL=l40s",
                "FLEETCAST_BUCKET=<ref>", "FLEETCAST_CONFIG_PARAM=<ref>", "FLEETCAST_LOG_GROUP=<ref>",
                "FLEETCAST_RUNTIME_BUNDLE=s3://"):
        assert key in text
    # egress none: the image comes from the region's private ECR repository, under the tag
    # `fleetcast stage image` pushes the derived serving image as (until it pins a digest).
    assert ".dkr.ecr." in text and f"/<ref>:{image_tag(fleet.cfg, derived=True)}\n" in text


def test_a_config_change_changes_the_launch_template(fleet, variant):
    assert fleet.cfg.instance_digest("us-east-1", "l40s") != variant.cfg.instance_digest("us-east-1", "l40s")
    before = _env_lines(_user_data(fleet, VIRGINIA)[0])
    after = _env_lines(_user_data(variant, VIRGINIA)[0])
    assert before != after
    assert f"FLEETCAST_CONFIG_DIGEST={variant.cfg.instance_digest('us-east-1', 'l40s')}" in after


def test_onboarding_a_consumer_and_resizing_a_pool_leave_every_launch_template_as_it_was(fleet):
    """A new consumer account (principal allowed, limits set) and a resized pool must not roll a
    GPU fleet: running gateways pick consumers up from the config parameter
    (runtime/gateway/reload.py); the group's size is the group's own setting."""
    doc = default_doc()
    seoul = doc["regions"][0]
    seoul["pools"][0]["capacity"] = {"min": 3, "max": 8}
    seoul["allowed_principals"].append("arn:aws:iam::123412341234:root")
    newcomer = {**copy.deepcopy(doc["consumers"][0]), "name": "newcomer", "account": "123412341234"}
    newcomer["limits"] = {"max_concurrency": 8, "requests_per_minute": 120}
    doc["consumers"].append(newcomer)
    onboarded = synthesize(doc, "onboarded")
    assert onboarded.cfg.digest() != fleet.cfg.digest()
    for stack_name in PROVIDERS:
        def launch_templates(synthesized):
            return {k: v["Properties"]["LaunchTemplateData"]
                    for k, v in synthesized.resources(stack_name, "AWS::EC2::LaunchTemplate").items()}  # noqa: B023 - called only within this iteration
        assert launch_templates(onboarded) == launch_templates(fleet)
    # ...while the group is resized and the endpoint service does let the new account in.
    (group,) = onboarded.resources(PROVIDERS[0], "AWS::AutoScaling::AutoScalingGroup").values()
    assert (group["Properties"]["MinSize"], group["Properties"]["MaxSize"]) == ("3", "8")
    permissions = onboarded.resources(PROVIDERS[0], "AWS::EC2::VPCEndpointServicePermissions")
    assert any("arn:aws:iam::123412341234:root" in p["Properties"]["AllowedPrincipals"] for p in permissions.values())


# ---------------------------------------------------------------- instance role


def _policy_statements(synthesized, stack_name) -> list[dict]:
    policies = synthesized.resources(stack_name, "AWS::IAM::Policy").values()
    return [s for p in policies if any("InstanceRole" in r["Ref"] for r in p["Properties"]["Roles"])
            for s in p["Properties"]["PolicyDocument"]["Statement"]]


def _actions(statement) -> list[str]:
    return statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_instance_role_is_least_privilege(fleet, stack_name):
    statements = _policy_statements(fleet, stack_name)
    assert statements
    for statement in statements:
        assert all(not a.endswith(":*") and a != "*" for a in _actions(statement)), statement
    by_sid = {s.get("Sid"): s for s in statements}
    wildcard = [s for s in statements if s["Resource"] == "*"]
    # Only actions without resource-level permissions get "*", and metrics are namespace-bound.
    from stacks.session_manager import SESSION_MANAGER_ACTIONS

    # ...and Session Manager's agent actions, on "*" as AWS documents them (stacks/session_manager.py).
    assert sorted(a for s in wildcard for a in _actions(s)) == sorted([
        "cloudwatch:PutMetricData", "ec2:DescribeVpcEndpointConnections", "ecr:GetAuthorizationToken",
        *SESSION_MANAGER_ACTIONS])
    assert by_sid["FleetcastMetricsOnly"]["Condition"] == {"StringEquals": {"cloudwatch:namespace": telemetry.NAMESPACE}}
    hook = by_sid["OwnLifecycleHook"]
    asg_name = only(fleet.resources(stack_name, "AWS::AutoScaling::AutoScalingGroup"))["AutoScalingGroupName"]
    assert hook["Resource"].endswith(f":autoScalingGroupName/{asg_name}")
    writes = by_sid["EngineCacheLocksAndFailures"]
    prefixes = sorted(r["Fn::Join"][1][-1] for r in writes["Resource"])
    assert prefixes == ["/engines/*", "/failures/*", "/locks/*"]
    reads = sorted(r["Fn::Join"][1][-1] for r in by_sid["ReadStagedModelsAndCalibration"]["Resource"])
    assert reads == ["/calibration/*", "/models/*"]
    assert _actions(by_sid["ReadStagedModelsAndCalibration"]) == ["s3:GetObject"]


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_session_manager_instead_of_ssh(fleet, stack_name):
    roles = [r["Properties"] for r in fleet.resources(stack_name, "AWS::IAM::Role").values()
             if r["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"].get("Service") == "ec2.amazonaws.com"]
    assert len(roles) == 1
    from stacks.session_manager import SESSION_MANAGER_ACTIONS

    # Session Manager's minimum inline (test_ssm_access.py), no managed policy that reads every parameter.
    assert "ManagedPolicyArns" not in roles[0]
    by_sid = {s.get("Sid"): s for s in _policy_statements(fleet, stack_name)}
    assert sorted(_actions(by_sid["SessionManagerOnly"])) == sorted(SESSION_MANAGER_ACTIONS)


# ---------------------------------------------------------------- network


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_created_vpc_has_flow_logs_isolated_subnets_in_the_configured_azs(fleet, stack_name):
    region = fleet.cfg.region(region_of(stack_name))
    assert only(fleet.resources(stack_name, "AWS::EC2::VPC"))["CidrBlock"] == region.vpc.cidr
    subnets = fleet.resources(stack_name, "AWS::EC2::Subnet").values()
    assert sorted(s["Properties"]["AvailabilityZone"] for s in subnets) == sorted(az.name for az in region.availability_zones)
    assert all(s["Properties"]["MapPublicIpOnLaunch"] is False for s in subnets)
    assert not fleet.resources(stack_name, "AWS::EC2::InternetGateway")
    assert not fleet.resources(stack_name, "AWS::EC2::NatGateway")
    flow_log = only(fleet.resources(stack_name, "AWS::EC2::FlowLog"))
    assert flow_log["TrafficType"] == "ALL" and flow_log["LogDestinationType"] == "cloud-watch-logs"


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_egress_none_gets_every_endpoint_the_instances_need(fleet, stack_name):
    endpoints = [e["Properties"] for e in fleet.resources(stack_name, "AWS::EC2::VPCEndpoint").values()]
    gateway = [e for e in endpoints if e.get("VpcEndpointType") == "Gateway"]
    interface = [e for e in endpoints if e.get("VpcEndpointType") == "Interface"]
    assert len(gateway) == 1 and "s3" in json.dumps(gateway[0]["ServiceName"])
    assert len(interface) == len(INTERFACE_ENDPOINTS)
    names = json.dumps([e["ServiceName"] for e in interface])
    for service in ("ecr.api", "ecr.dkr", ".ssm", "ssmmessages", "ec2messages", ".logs", "monitoring",
                    "autoscaling", ".sts", ".ec2", "secretsmanager"):
        assert service in names, service
    assert all(e["PrivateDnsEnabled"] is True for e in interface)


def test_imported_vpc_is_never_looked_up_and_hosts_the_endpoints(variant):
    assert not variant.resources(SEOUL, "AWS::EC2::VPC")
    existing = variant.cfg.region("ap-northeast-2").vpc
    endpoints = [e["Properties"] for e in variant.resources(SEOUL, "AWS::EC2::VPCEndpoint").values()]
    assert endpoints and all(e["VpcId"] == existing.vpc_id for e in endpoints)
    gateway = [e for e in endpoints if e.get("VpcEndpointType") == "Gateway"][0]
    assert sorted(gateway["RouteTableIds"]) == sorted(existing.route_table_ids)
    for asg in variant.resources(SEOUL, "AWS::AutoScaling::AutoScalingGroup").values():
        assert asg["Properties"]["VPCZoneIdentifier"] == list(existing.subnet_ids)


# ---------------------------------------------------------------- what instances read at boot


@pytest.mark.parametrize("stack_name", PROVIDERS)
def test_config_parameter_holds_the_validated_config_the_instances_revalidate(fleet, stack_name):
    from fleetcast.config import config_from_json

    parameter = only(fleet.resources(stack_name, "AWS::SSM::Parameter"))
    assert parameter["Name"] == f"/{fleet.cfg.name}/config"
    assert config_from_json(parameter["Value"]) == fleet.cfg
    assert parameter["Tier"] == ("Advanced" if len(parameter["Value"]) > 4096 else "Standard")


def test_runtime_bundle_holds_only_the_packages_instances_run(fleet):
    assets = json.loads((fleet.outdir / f"{SEOUL}.assets.json").read_text())["files"]
    (bundle,) = [a for a in assets.values() if a.get("displayName", "").endswith("Bootstrap/RuntimeBundle")]
    root = fleet.outdir / bundle["source"]["path"]
    assert sorted(p.name for p in root.iterdir()) == ["fleetcast", "runtime"]
    # Exactly the serving bundle (tests/stacks/test_runtime_bundle.py says what that holds and why).
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == \
        [str(p) for p in bundle_files(SERVING)]
    assert not list(root.rglob("__pycache__"))


def test_imported_vpc_that_has_its_endpoints_gets_none_added(variant):
    assert not variant.resources(VIRGINIA, "AWS::EC2::VPC")
    assert not variant.resources(VIRGINIA, "AWS::EC2::VPCEndpoint")
    existing = variant.cfg.region("us-east-1").vpc
    (asg,) = variant.resources(VIRGINIA, "AWS::AutoScaling::AutoScalingGroup").values()
    assert asg["Properties"]["VPCZoneIdentifier"] == list(existing.subnet_ids)
