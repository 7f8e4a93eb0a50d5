"""Auto-approver for PrivateLink endpoint connection requests (runs in AWS Lambda; boto3 + stdlib only).

Subscribed to the region's connection-notification topic. A notification only
says that something happened; what to do is decided from EC2's own answer:
every pending request to this service is read with DescribeVpcEndpointConnections,
requests from the accounts the config allows (ALLOWED_ACCOUNTS, computed at
synth by fleetcast.contract.connections) are accepted, and the rest are left
pending and reported to the topic for a person to review with
`fleetcast connections`. Nothing is ever rejected here.

Notices published by this function carry the message attribute
NOTICE_ATTRIBUTE; the subscription's filter policy drops them, so a notice
never triggers the function again. Each decision is logged as one JSON line
(the same fields as the CLI's audit log) to the function's log group.
"""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime

NOTICE_ATTRIBUTE = "fleetcast_notice"
PENDING = "pendingAcceptance"
_ENDPOINT = re.compile(r"\bvpce-(?!svc-)[0-9a-f]{8,17}\b")
_CLIENTS: dict = {}


def _client(name: str):
    # Created once per warm container; tests put stubbed clients here.
    if name not in _CLIENTS:
        import boto3

        _CLIENTS[name] = boto3.client(name)
    return _CLIENTS[name]


def _settings() -> tuple[str, frozenset[str], str, str]:
    return (os.environ["SERVICE_ID"], frozenset(json.loads(os.environ["ALLOWED_ACCOUNTS"])),
            os.environ["TOPIC_ARN"], os.environ.get("FLEET", "fleetcast"))


def _is_other_traffic(message: str) -> bool:
    """Alarm and EventBridge messages share the topic; they need no EC2 call."""
    try:
        body = json.loads(message)
    except ValueError:
        return False
    return isinstance(body, dict) and ("AlarmName" in body or "detail-type" in body)


def _pending(service_id: str) -> list[dict]:
    pages = _client("ec2").get_paginator("describe_vpc_endpoint_connections").paginate(Filters=[
        {"Name": "service-id", "Values": [service_id]},
        {"Name": "vpc-endpoint-state", "Values": [PENDING]},
    ])
    return [c for page in pages for c in page.get("VpcEndpointConnections", [])
            if c.get("VpcEndpointState", "").lower() == PENDING.lower()]


def _log(decision: str, conn: dict, service_id: str, error: str | None = None) -> None:
    print(json.dumps({
        "time": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "caller": "lambda:" + os.environ.get("AWS_LAMBDA_FUNCTION_NAME", "connection-approver"),
        "command": "auto-approve", "region": os.environ.get("AWS_REGION", ""), "service_id": service_id,
        "endpoint_id": conn.get("VpcEndpointId"), "account": conn.get("VpcEndpointOwner"), "state": PENDING,
        "decision": decision, "error": error, "dry_run": False, "forced": False,
        "reason": "account allowed by the config" if decision == "accepted" else None,
    }, sort_keys=True))


def handler(event: dict, context: object = None) -> dict:
    service_id, allowed, topic_arn, fleet = _settings()
    messages = [r.get("Sns", {}).get("Message", "") for r in event.get("Records", [])]
    if messages and all(_is_other_traffic(m) for m in messages):
        return {"accepted": [], "left_pending": [], "failed": [], "skipped": "not a connection notification"}
    mentioned = {e for m in messages for e in _ENDPOINT.findall(m)}

    pending = _pending(service_id)
    to_accept = [c for c in pending if c.get("VpcEndpointOwner") in allowed]
    # Report only the requests this notification is about (all pending ones when it names none),
    # so one stranger's request is not re-announced on every later event.
    strangers = [c for c in pending if c.get("VpcEndpointOwner") not in allowed
                 and (not mentioned or c.get("VpcEndpointId") in mentioned)]

    failed: dict[str, str] = {}
    if to_accept:
        answer = _client("ec2").accept_vpc_endpoint_connections(
            ServiceId=service_id, VpcEndpointIds=[c["VpcEndpointId"] for c in to_accept])
        for item in answer.get("Unsuccessful", []):
            err = item.get("Error", {})
            failed[item.get("ResourceId", "")] = f"{err.get('Code', 'Unknown')}: {err.get('Message', '')}"
    for c in to_accept:
        _log("failed" if c["VpcEndpointId"] in failed else "accepted", c, service_id, failed.get(c["VpcEndpointId"]))
    for c in strangers:
        _log("left-pending", c, service_id)

    if strangers or failed:
        lines = [f"Fleet {fleet}, endpoint service {service_id} in {os.environ.get('AWS_REGION', '')}:"]
        for c in strangers:
            lines.append(f"- {c['VpcEndpointId']} from account {c.get('VpcEndpointOwner')} is PENDING: the config "
                         "does not allow this account. Review with `fleetcast connections list`, then "
                         "`fleetcast connections reject` or `approve --force --reason`.")
        for endpoint_id, error in failed.items():
            lines.append(f"- {endpoint_id}: accepting it failed ({error}); retry with `fleetcast connections sync`.")
        _client("sns").publish(
            TopicArn=topic_arn,
            Subject=f"{fleet}: endpoint connection requests need review"[:100],
            Message="\n".join(lines),
            MessageAttributes={NOTICE_ATTRIBUTE: {"DataType": "String", "StringValue": "connection-review"}},
        )
    return {
        "accepted": [c["VpcEndpointId"] for c in to_accept if c["VpcEndpointId"] not in failed],
        "left_pending": [c["VpcEndpointId"] for c in strangers],
        "failed": sorted(failed),
    }
