"""A stubbed AWS for the connections tests: real botocore clients, Stubber underneath.

Stubber checks every request against the real API model (parameter names,
types, required members) and every canned response against the output shape,
so a test fails if the code calls EC2 in a way EC2 would reject. Expectations
are ordered per client, and each (service, region) has its own client.
"""

from __future__ import annotations

from datetime import UTC, datetime

import boto3
from botocore.stub import Stubber

from fleetcast.connections import Access

CALLER = "arn:aws:sts::111122223333:assumed-role/PlatformAdmin/jdoe"
SEOUL, VIRGINIA = "ap-northeast-2", "us-east-1"
SVC = {SEOUL: "vpce-svc-0a1b2c3d4e5f60718", VIRGINIA: "vpce-svc-0f1e2d3c4b5a69788"}
ENCODED = "5cqZg9FtZbp3n7xG0Yv8E2kB-EXAMPLE-encoded-authorization-message"


def connection(endpoint_id: str, account: str, state: str = "pendingAcceptance", *, service_id: str,
               minute: int = 0, endpoint_region: str | None = None) -> dict:
    item = {
        "ServiceId": service_id, "VpcEndpointId": endpoint_id, "VpcEndpointOwner": account,
        "VpcEndpointState": state,
        "CreationTimestamp": datetime(2026, 11, 29, 9, minute, tzinfo=UTC),
    }
    if endpoint_region:
        item["VpcEndpointRegion"] = endpoint_region
    return item


_BOTOCORE = None


def _shared_botocore_session():
    """One botocore session for all tests: its loader caches the (large) EC2 model after the first client."""
    global _BOTOCORE
    if _BOTOCORE is None:
        import botocore.session

        _BOTOCORE = botocore.session.Session()
        _BOTOCORE.set_credentials("testing", "testing", "testing")
    return _BOTOCORE


class StubbedAws:
    """Owns an Access whose clients are stubbed; tests queue expected calls on it."""

    def __init__(self, sleeps: list[float] | None = None):
        session = boto3.Session(botocore_session=_shared_botocore_session(), region_name=SEOUL)
        self.sleeps = sleeps if sleeps is not None else []
        self.access = Access(boto_session=session, sleep=self.sleeps.append, jitter=lambda: 0.0)
        self.stubbers: dict[tuple[str, str], Stubber] = {}

    def stub(self, service: str, region: str) -> Stubber:
        key = (service, region)
        if key not in self.stubbers:
            stubber = Stubber(self.access.client(service, region))
            stubber.activate()
            self.stubbers[key] = stubber
        return self.stubbers[key]

    def done(self) -> None:
        for stubber in self.stubbers.values():
            stubber.assert_no_pending_responses()

    # -- canned calls

    def caller(self, region: str = SEOUL) -> None:
        self.stub("sts", region).add_response(
            "get_caller_identity", {"UserId": "AROAEXAMPLE:jdoe", "Account": "111122223333", "Arn": CALLER}, {})

    def stack_output(self, region: str, service_id: str | None = None, fleet: str = "fleetcast") -> None:
        self.stub("cloudformation", region).add_response("describe_stacks", {"Stacks": [{
            "StackName": f"{fleet}-provider-{region}", "CreationTime": datetime(2026, 11, 1, tzinfo=UTC),
            "StackStatus": "UPDATE_COMPLETE",
            "Outputs": [
                {"OutputKey": "EndpointServiceName",
                 "OutputValue": f"com.amazonaws.vpce.{region}.{service_id or SVC[region]}"},
                {"OutputKey": "EndpointServiceId", "OutputValue": service_id or SVC[region]},
            ],
        }]}, {"StackName": f"{fleet}-provider-{region}"})

    def no_stack(self, region: str, fleet: str = "fleetcast") -> None:
        self.stub("cloudformation", region).add_client_error(
            "describe_stacks", service_error_code="ValidationError", http_status_code=400,
            service_message=f"Stack with id {fleet}-provider-{region} does not exist",
            expected_params={"StackName": f"{fleet}-provider-{region}"})

    def tagged_services(self, region: str, service_ids: list[str], fleet: str = "fleetcast") -> None:
        self.stub("ec2", region).add_response("describe_vpc_endpoint_service_configurations", {
            "ServiceConfigurations": [{"ServiceId": s, "ServiceType": [{"ServiceType": "Interface"}]}
                                      for s in service_ids]},
            {"Filters": [{"Name": "tag:fleetcast:fleet", "Values": [fleet]}]})

    def connections(self, region: str, pages: list[list[dict]], service_id: str | None = None) -> None:
        """Queue DescribeVpcEndpointConnections, one response per page, chained by NextToken."""
        service_id = service_id or SVC[region]
        for i, items in enumerate(pages):
            response: dict = {"VpcEndpointConnections": items}
            if i < len(pages) - 1:
                response["NextToken"] = f"page-{i + 2}-token"
            expected: dict = {"Filters": [{"Name": "service-id", "Values": [service_id]}]}
            if i:
                expected["NextToken"] = f"page-{i + 1}-token"
            self.stub("ec2", region).add_response("describe_vpc_endpoint_connections", response, expected)

    def change(self, operation: str, region: str, endpoint_ids: list[str], *, unsuccessful: dict[str, str] | None = None,
               dry_run: bool = False, service_id: str | None = None) -> None:
        """Queue Accept/RejectVpcEndpointConnections (operation: 'accept' or 'reject')."""
        method = f"{operation}_vpc_endpoint_connections"
        expected: dict = {"ServiceId": service_id or SVC[region], "VpcEndpointIds": endpoint_ids}
        if dry_run:
            expected = {"DryRun": True, **expected}
            self.stub("ec2", region).add_client_error(
                method, service_error_code="DryRunOperation", http_status_code=412,
                service_message="Request would have succeeded, but DryRun flag is set.", expected_params=expected)
            return
        self.stub("ec2", region).add_response(method, {"Unsuccessful": [
            {"ResourceId": rid, "Error": {"Code": code, "Message": f"{code} for {rid}"}}
            for rid, code in (unsuccessful or {}).items()]}, expected)

    def error(self, service: str, region: str, method: str, code: str, message: str = "", status: int = 400,
              expected: dict | None = None) -> None:
        self.stub(service, region).add_client_error(method, service_error_code=code, service_message=message,
                                                    http_status_code=status, expected_params=expected)


class FakeEc2World:
    """A stateful stand-in for EC2's endpoint-connection API behind real botocore clients.

    For property tests, where the sequence of calls is not known in advance
    (Stubber needs it). Requests still pass botocore's own validation against
    the real model before reaching the fake; answers follow EC2's documented
    behavior: accept works on pending requests, reject on pending or available
    ones, anything else comes back in `Unsuccessful`.
    """

    PAGE = 2  # small pages so every listing paginates

    def __init__(self, access: Access, fleet: str, services: dict[str, str], conns: dict[str, dict[str, dict]]):
        self.fleet = fleet
        self.services = services  # region -> service id
        self.reset(conns)
        for region in services:
            for service in ("ec2", "cloudformation", "sts"):
                events = access.client(service, region).meta.events
                events.register_first("before-parameter-build.*.*", self._remember)
                events.register_first("before-call.*.*", self._answer(region))

    def reset(self, conns: dict[str, dict[str, dict]]) -> None:
        """A new world behind the same clients (building EC2 clients is most of a property example's cost)."""
        self.conns = conns  # region -> endpoint id -> {"account":..., "state":...}
        self.accepted: list[tuple[str, str, str]] = []  # (region, endpoint id, account)
        self._params: dict = {}

    def _remember(self, params: dict, model, **_: object) -> None:
        self._params = dict(params)

    def _answer(self, region: str):
        def handler(model, **_: object):
            answer = getattr(self, "_" + model.name)(region, self._params)
            status, parsed = answer if isinstance(answer, tuple) else (200, answer)
            # botocore raises ClientError itself for a status >= 300, as with a real answer.
            return (type("Http", (), {"status_code": status, "headers": {}})(), parsed)
        return handler

    def _GetCallerIdentity(self, region: str, p: dict) -> dict:
        return {"UserId": "AROAEXAMPLE:prop", "Account": "111122223333", "Arn": CALLER}

    def _DescribeStacks(self, region: str, p: dict) -> dict:
        return {"Stacks": [{"StackName": p["StackName"], "CreationTime": datetime(2026, 11, 1, tzinfo=UTC),
                            "StackStatus": "CREATE_COMPLETE",
                            "Outputs": [{"OutputKey": "EndpointServiceId", "OutputValue": self.services[region]}]}]}

    def _DescribeVpcEndpointConnections(self, region: str, p: dict) -> dict:
        assert p["Filters"] == [{"Name": "service-id", "Values": [self.services[region]]}]
        items = sorted(self.conns[region].items())
        start = int(p.get("NextToken", "0"))
        page = items[start:start + self.PAGE]
        out: dict = {"VpcEndpointConnections": [
            connection(eid, c["account"], c["state"], service_id=self.services[region]) for eid, c in page]}
        if start + self.PAGE < len(items):
            out["NextToken"] = str(start + self.PAGE)
        return out

    def _change(self, region: str, p: dict, allowed_from: tuple[str, ...], to: str) -> dict:
        if p.get("DryRun"):
            return 412, {"Error": {"Code": "DryRunOperation", "Message": "Request would have succeeded, but "
                                                                        "DryRun flag is set."}}
        assert p["ServiceId"] == self.services[region]
        unsuccessful = []
        for eid in p["VpcEndpointIds"]:
            conn = self.conns[region].get(eid)
            if conn is None or conn["state"] not in allowed_from:
                unsuccessful.append({"ResourceId": eid, "Error": {"Code": "InvalidState", "Message": "wrong state"}})
                continue
            conn["state"] = to
            if to == "available":
                self.accepted.append((region, eid, conn["account"]))
        return {"Unsuccessful": unsuccessful}

    def _AcceptVpcEndpointConnections(self, region: str, p: dict) -> dict:
        return self._change(region, p, ("pendingAcceptance",), "available")

    def _RejectVpcEndpointConnections(self, region: str, p: dict) -> dict:
        return self._change(region, p, ("pendingAcceptance", "available"), "rejected")
