"""The optional auto-approver: its Lambda handler (against stubbed EC2/SNS) and its CDK construct."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import boto3
import pytest
from botocore.stub import Stubber

from stacks.lambdas.connection_approver import handler as approver

from .stubs import SEOUL, SVC, _shared_botocore_session, connection

ALLOWED, STRANGER = "444455556666", "999988887777"
TOPIC = "arn:aws:sns:ap-northeast-2:111122223333:fleetcast-operations"
E1, E2 = "vpce-0aaaaaaaaaaaaaaa1", "vpce-0bbbbbbbbbbbbbbb2"
DESCRIBE = {"Filters": [{"Name": "service-id", "Values": [SVC[SEOUL]]},
                        {"Name": "vpc-endpoint-state", "Values": ["pendingAcceptance"]}]}
NOTIFICATION = json.dumps({"endpointId": E2, "serviceId": SVC[SEOUL], "notificationType": "Connect"})


@pytest.fixture
def lam(monkeypatch):
    monkeypatch.setenv("SERVICE_ID", SVC[SEOUL])
    monkeypatch.setenv("ALLOWED_ACCOUNTS", json.dumps([ALLOWED]))
    monkeypatch.setenv("TOPIC_ARN", TOPIC)
    monkeypatch.setenv("AWS_REGION", SEOUL)
    session = boto3.Session(botocore_session=_shared_botocore_session(), region_name=SEOUL)
    clients = {name: session.client(name) for name in ("ec2", "sns")}
    stubs = {name: Stubber(client) for name, client in clients.items()}
    for stub in stubs.values():
        stub.activate()
    monkeypatch.setattr(approver, "_CLIENTS", clients)
    yield SimpleNamespace(ec2=stubs["ec2"], sns=stubs["sns"])
    for stub in stubs.values():
        stub.assert_no_pending_responses()


def event(*messages: str) -> dict:
    return {"Records": [{"EventSource": "aws:sns", "Sns": {"Message": m, "TopicArn": TOPIC}} for m in messages]}


def test_accepts_allowed_accounts_and_reports_the_rest(lam, capsys):
    lam.ec2.add_response("describe_vpc_endpoint_connections", {"VpcEndpointConnections": [
        connection(E1, ALLOWED, service_id=SVC[SEOUL]), connection(E2, STRANGER, service_id=SVC[SEOUL])]}, DESCRIBE)
    lam.ec2.add_response("accept_vpc_endpoint_connections", {"Unsuccessful": []},
                         {"ServiceId": SVC[SEOUL], "VpcEndpointIds": [E1]})
    lam.sns.add_response("publish", {"MessageId": "m-1"}, {
        "TopicArn": TOPIC, "Subject": "fleetcast: endpoint connection requests need review",
        "Message": _any_containing(E2, STRANGER, "does not allow"),
        "MessageAttributes": {"fleetcast_notice": {"DataType": "String", "StringValue": "connection-review"}},
    })
    result = approver.handler(event(NOTIFICATION))
    assert result == {"accepted": [E1], "left_pending": [E2], "failed": []}
    logged = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {(r["endpoint_id"], r["decision"]) for r in logged} == {(E1, "accepted"), (E2, "left-pending")}


def test_never_accepts_a_stranger_and_never_rejects(lam):
    lam.ec2.add_response("describe_vpc_endpoint_connections", {"VpcEndpointConnections": [
        connection(E2, STRANGER, service_id=SVC[SEOUL])]}, DESCRIBE)
    lam.sns.add_response("publish", {"MessageId": "m-2"})
    # No accept/reject is queued: any such call would fail the stub.
    assert approver.handler(event("{}")) == {"accepted": [], "left_pending": [E2], "failed": []}


def test_pending_requests_across_pages_are_all_seen(lam):
    lam.ec2.add_response("describe_vpc_endpoint_connections", {"VpcEndpointConnections": [
        connection(E1, ALLOWED, service_id=SVC[SEOUL])], "NextToken": "t2"}, DESCRIBE)
    lam.ec2.add_response("describe_vpc_endpoint_connections", {"VpcEndpointConnections": [
        connection(E2, ALLOWED, service_id=SVC[SEOUL])]}, {**DESCRIBE, "NextToken": "t2"})
    lam.ec2.add_response("accept_vpc_endpoint_connections", {"Unsuccessful": []},
                         {"ServiceId": SVC[SEOUL], "VpcEndpointIds": [E1, E2]})
    assert approver.handler(event(NOTIFICATION))["accepted"] == [E1, E2]


def test_a_failed_accept_is_reported(lam):
    lam.ec2.add_response("describe_vpc_endpoint_connections", {"VpcEndpointConnections": [
        connection(E1, ALLOWED, service_id=SVC[SEOUL])]}, DESCRIBE)
    lam.ec2.add_response("accept_vpc_endpoint_connections", {"Unsuccessful": [
        {"ResourceId": E1, "Error": {"Code": "InvalidState", "Message": "not pending"}}]})
    lam.sns.add_response("publish", {"MessageId": "m-3"})
    assert approver.handler(event(NOTIFICATION)) == {"accepted": [], "left_pending": [], "failed": [E1]}


def test_alarm_messages_on_the_shared_topic_cost_no_ec2_call(lam):
    alarm = json.dumps({"AlarmName": "fleetcast-ttft-p99", "NewStateValue": "ALARM"})
    assert approver.handler(event(alarm))["skipped"] == "not a connection notification"


class _any_containing(str):  # noqa: N801 - reads as a matcher in expected params
    """Matches any string containing every given fragment (Stubber compares expected params with ==)."""

    def __new__(cls, *fragments: str):
        obj = super().__new__(cls, " ... ".join(fragments))
        obj.fragments = fragments
        return obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and all(f in other for f in self.fragments)

    def __ne__(self, other: object) -> bool:  # Stubber compares with !=
        return not self.__eq__(other)

    __hash__ = str.__hash__


# ------------------------------------------------------------------ the construct


@pytest.fixture(scope="module")
def fixture_template():
    """The construct in a small env-bound stack, synthesized with cdk-nag (a finding fails synthesis)."""
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "1")
    from aws_cdk import App, Environment, Stack, aws_ec2 as ec2
    from aws_cdk.assertions import Template

    from fleetcast.config import load_config
    from stacks import nag
    from stacks.app_builder import cdk_json_context
    from stacks.connection_approver import ConnectionApprover
    from stacks.notifications import NotificationTopic

    from .conftest import CONFIG

    cfg = load_config(CONFIG)
    app = App(context=cdk_json_context())
    stack = Stack(app, "Fixture", env=Environment(account=cfg.provider.account, region=SEOUL))
    service = ec2.CfnVPCEndpointService(stack, "Service", acceptance_required=True, network_load_balancer_arns=[
        f"arn:aws:elasticloadbalancing:{SEOUL}:{cfg.provider.account}:loadbalancer/net/fleet/0123456789abcdef"])
    notifications = NotificationTopic(stack, "Notifications", fleet=cfg.name)
    ConnectionApprover(stack, "Approver", cfg=cfg, region=cfg.region(SEOUL),
                       endpoint_service=SimpleNamespace(vpc_endpoint_service_id=service.ref),
                       topic=notifications.topic)
    nag.enable(app)
    app.synth()  # raises on any unacknowledged cdk-nag finding
    return Template.from_stack(stack).to_json()


def _of_type(template: dict, type_: str) -> list[dict]:
    return [r["Properties"] for r in template["Resources"].values() if r["Type"] == type_]


def test_function_gets_exactly_the_accounts_the_config_allows(fixture_template):
    [fn] = [f for f in _of_type(fixture_template, "AWS::Lambda::Function") if f.get("Handler") == "handler.handler"]
    env = fn["Environment"]["Variables"]
    assert json.loads(env["ALLOWED_ACCOUNTS"]) == [ALLOWED]
    assert env["SERVICE_ID"] == {"Ref": "Service"}


def test_role_is_least_privilege(fixture_template):
    [policy] = [p for p in _of_type(fixture_template, "AWS::IAM::Policy") if "Approver" in p["PolicyName"]]
    statements = {s["Sid"]: s for s in policy["PolicyDocument"]["Statement"]}
    accept = statements["AcceptOnThisServiceOnly"]
    assert accept["Action"] == "ec2:AcceptVpcEndpointConnections"
    assert accept["Resource"] == {"Fn::Join": ["", [
        f"arn:aws:ec2:{SEOUL}:111122223333:vpc-endpoint-service/", {"Ref": "Service"}]]}
    actions = [a for s in statements.values() for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])]
    assert not any("Reject" in a or a.endswith("*") for a in actions)
    wildcard = [s["Action"] for s in statements.values() if s["Resource"] == "*"]
    assert wildcard == ["ec2:DescribeVpcEndpointConnections"]  # no resource-level permissions exist for it
    roles = _of_type(fixture_template, "AWS::IAM::Role")
    assert all("ManagedPolicyArns" not in r for r in roles)


def test_own_notices_do_not_trigger_the_function(fixture_template):
    [sub] = [s for s in _of_type(fixture_template, "AWS::SNS::Subscription") if s["Protocol"] == "lambda"]
    assert sub["FilterPolicy"] == {approver.NOTICE_ATTRIBUTE: [{"exists": False}]}
