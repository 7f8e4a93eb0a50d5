"""`fleetcast connections` against a stubbed EC2/CloudFormation/STS (requests checked against the real API model)."""

from __future__ import annotations

import json

import pytest

from fleetcast.connections import allowed_accounts, iam_action
from fleetcast.contract.errors import EXIT_AWS_ACCESS, EXIT_AWS_SERVICE, EXIT_INVALID, EXIT_REFUSED

from .stubs import CALLER, ENCODED, SEOUL, SVC, VIRGINIA, connection

ALLOWED_SEOUL = "444455556666"  # config/fleet.yaml: ap-northeast-2 allowed_principals
ALLOWED_VIRGINIA = "777788889999"
STRANGER = "999988887777"
E1, E2, E3, E4 = "vpce-0aaaaaaaaaaaaaaa1", "vpce-0bbbbbbbbbbbbbbb2", "vpce-0ccccccccccccccc3", "vpce-0ddddddddddddddd4"


def seoul(*items):
    return [connection(eid, acct, state, service_id=SVC[SEOUL], minute=i) for i, (eid, acct, state) in enumerate(items)]


def test_config_allows_the_accounts_of_its_principals(cfg):
    assert allowed_accounts(cfg, SEOUL) == {ALLOWED_SEOUL}
    assert allowed_accounts(cfg, VIRGINIA) == {ALLOWED_VIRGINIA}


# ------------------------------------------------------------------ list


def test_list_shows_every_region_pending_first_with_the_config_verdict(aws, cli):
    aws.stack_output(SEOUL)
    aws.stack_output(VIRGINIA)
    aws.connections(SEOUL, [seoul((E1, ALLOWED_SEOUL, "available"), (E2, STRANGER, "pendingAcceptance"))])
    aws.connections(VIRGINIA, [[connection(E3, ALLOWED_VIRGINIA, "pendingAcceptance", service_id=SVC[VIRGINIA],
                                           endpoint_region="us-west-2")]])
    result = cli("list")
    assert result.code == 0, result.err
    rows = [line.split() for line in result.out.splitlines() if line.startswith("vpce-")]
    assert [r[0] for r in rows] == [E2, E3, E1]  # pending first
    assert rows[0][3:5] == [STRANGER, "pendingAcceptance"] and "NO" in rows[0]
    assert rows[1][2] == "us-west-2"  # cross-region consumer: where the endpoint lives
    assert "vpc-0a1b2c3d4e5f60718" in rows[2]  # the VPC the config lists for that consumer
    assert "1 pending from accounts the config does not allow" in result.out
    assert result.audit == []  # listing decides nothing


def test_list_json_and_pagination_across_pages(aws, cli):
    aws.stack_output(SEOUL)
    aws.connections(SEOUL, [seoul((E1, ALLOWED_SEOUL, "available")), seoul((E2, STRANGER, "pendingAcceptance")),
                            seoul((E3, ALLOWED_SEOUL, "rejected"))])
    result = cli("list", "--region", SEOUL, "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["services"] == [{"region": SEOUL, "service_id": SVC[SEOUL],
                                "found_by": f"stack fleetcast-provider-{SEOUL} output EndpointServiceId"}]
    assert [(c["endpoint_id"], c["allowed"]) for c in doc["connections"]] == [(E2, False), (E1, True), (E3, True)]


def test_service_found_by_tag_when_there_is_no_stack(aws, cli):
    aws.no_stack(SEOUL)
    aws.tagged_services(SEOUL, [SVC[SEOUL]])
    aws.connections(SEOUL, [[]])
    result = cli("list", "--region", SEOUL)
    assert result.code == 0, result.err
    assert "tag fleetcast:fleet=fleetcast" in result.out and "no endpoint connections" in result.out


def test_no_service_anywhere_is_a_clear_error(aws, cli):
    aws.no_stack(SEOUL)
    aws.tagged_services(SEOUL, [])
    result = cli("list", "--region", SEOUL)
    assert result.code == EXIT_AWS_SERVICE
    assert "no stack fleetcast-provider-ap-northeast-2" in result.err and "--service-id" in result.err
    assert "Traceback" not in result.err


def test_two_tagged_services_need_an_explicit_choice(aws, cli):
    aws.no_stack(SEOUL)
    aws.tagged_services(SEOUL, [SVC[SEOUL], "vpce-svc-0123456789abcdef0"])
    result = cli("list", "--region", SEOUL)
    assert result.code == EXIT_INVALID and "pass --region with --service-id" in result.err


def test_service_id_override_skips_discovery(aws, cli):
    other = "vpce-svc-0123456789abcdef0"
    aws.connections(SEOUL, [[]], service_id=other)
    assert cli("list", "--region", SEOUL, "--service-id", other).code == 0


@pytest.mark.parametrize("argv, names", [
    (("list", "--service-id", "vpce-svc-0123456789abcdef0"), "--region"),
    (("list", "--region", "eu-west-1"), "--region eu-west-1"),
    (("list", "--region", SEOUL, "--service-id", "svc-1"), "--service-id"),
    (("approve", "--region", SEOUL, "--service-id", SVC[SEOUL], "vpce-xyz"), "'vpce-xyz'"),
    (("approve", "--region", SEOUL, "--service-id", SVC[SEOUL], "--account", "12345"), "--account '12345'"),
    (("approve", "--region", SEOUL, "--service-id", SVC[SEOUL]), "--account ACCOUNT_ID"),
])
def test_bad_input_names_the_argument(aws, cli, argv, names):
    if argv[0] == "approve":
        aws.connections(SEOUL, [[]])
    result = cli(*argv)
    assert result.code == EXIT_INVALID and names in result.err and "Traceback" not in result.err


# ------------------------------------------------------------------ approve


def test_approve_allowed_pending_accepts_and_audits(aws, cli):
    aws.stack_output(SEOUL)
    aws.connections(SEOUL, [seoul((E1, ALLOWED_SEOUL, "pendingAcceptance"))])
    aws.caller()
    aws.change("accept", SEOUL, [E1])
    result = cli("approve", "--region", SEOUL, E1, "--yes")
    assert result.code == 0, result.err
    [record] = result.audit
    assert record["decision"] == "accepted" and record["endpoint_id"] == E1 and record["account"] == ALLOWED_SEOUL
    assert record["caller"] == CALLER and record["region"] == SEOUL and record["service_id"] == SVC[SEOUL]
    assert record["dry_run"] is False and record["forced"] is False and record["time"].endswith("Z")


def test_approve_is_idempotent_already_accepted_makes_no_call(aws, cli):
    aws.stack_output(SEOUL)
    aws.connections(SEOUL, [seoul((E1, ALLOWED_SEOUL, "available"))])
    aws.caller()
    result = cli("approve", "--region", SEOUL, "--account", ALLOWED_SEOUL, "--yes")
    assert result.code == 0, result.err
    assert "already accepted" in result.err and "no change needed" in result.err
    assert [r["decision"] for r in result.audit] == ["already-accepted"]
    # aws.done() (fixture teardown) proves no Accept call was queued or made


def test_approve_refuses_an_account_the_config_does_not_allow(aws, cli):
    aws.stack_output(SEOUL)
    aws.connections(SEOUL, [seoul((E1, ALLOWED_SEOUL, "pendingAcceptance"), (E2, STRANGER, "pendingAcceptance"))])
    aws.caller()
    result = cli("approve", "--region", SEOUL, E1, E2, "--yes")
    assert result.code == EXIT_REFUSED
    assert "nothing changed" in result.err and STRANGER in result.err
    assert [(r["endpoint_id"], r["decision"]) for r in result.audit] == [(E2, "refused")]
    # E1 is allowed, but a refused plan changes nothing at all: no Accept call is queued.


@pytest.mark.parametrize("extra", [("--force",), ("--force", "--reason", "   ")])
def test_force_without_a_reason_is_refused_before_any_aws_call(aws, cli, extra):
    result = cli("approve", "--region", SEOUL, E2, "--yes", *extra)
    assert result.code == EXIT_REFUSED and "--force needs --reason" in result.err
    # nothing was queued on the stubs: any AWS call would have failed the test


def test_a_reason_without_force_does_not_accept_a_stranger(aws, cli):
    aws.stack_output(SEOUL)
    aws.connections(SEOUL, [seoul((E2, STRANGER, "pendingAcceptance"))])
    aws.caller()
    result = cli("approve", "--region", SEOUL, E2, "--yes", "--reason", "trust me")
    assert result.code == EXIT_REFUSED
    assert [(r["decision"], r["reason"]) for r in result.audit] == [("refused", "trust me")]


def test_force_with_reason_accepts_and_records_both(aws, cli):
    aws.stack_output(SEOUL)
    aws.connections(SEOUL, [seoul((E2, STRANGER, "pendingAcceptance"))])
    aws.caller()
    aws.change("accept", SEOUL, [E2])
    result = cli("approve", "--region", SEOUL, E2, "--yes", "--force", "--reason", "pilot for ticket NET-42")
    assert result.code == 0, result.err
    [record] = result.audit
    assert record["decision"] == "accepted" and record["forced"] is True
    assert record["reason"] == "pilot for ticket NET-42" and record["allowed"] is False


def test_dry_run_checks_the_permission_with_ec2_and_changes_nothing(aws, cli):
    aws.stack_output(SEOUL)
    aws.connections(SEOUL, [seoul((E1, ALLOWED_SEOUL, "pendingAcceptance"))])
    aws.caller()
    aws.change("accept", SEOUL, [E1], dry_run=True)  # EC2 answers DryRunOperation: the call would be allowed
    result = cli("approve", "--region", SEOUL, E1, "--dry-run")
    assert result.code == 0, result.err
    assert "would accept" in result.err and "nothing changed" in result.err
    assert [(r["decision"], r["dry_run"]) for r in result.audit] == [("accepted", True)]


def test_without_yes_and_without_a_terminal_it_refuses_instead_of_waiting(aws, cli):
    aws.stack_output(SEOUL)
    aws.connections(SEOUL, [seoul((E1, ALLOWED_SEOUL, "pendingAcceptance"))])
    result = cli("approve", "--region", SEOUL, E1)  # pytest's stdin is not a terminal
    assert result.code == EXIT_REFUSED and "stdin is not a terminal" in result.err and "--yes" in result.err
    assert result.audit == []


def test_a_declined_prompt_changes_nothing(aws, cfg):
    import io

    from fleetcast.connections import AuditLog, Reviewer

    aws.stack_output(SEOUL)
    aws.connections(SEOUL, [seoul((E1, ALLOWED_SEOUL, "pendingAcceptance"))])
    asked = []
    reviewer = Reviewer(cfg, aws.access, AuditLog(io.StringIO()), out=io.StringIO(), err=io.StringIO(),
                        confirm=lambda q: asked.append(q) or False)
    from fleetcast.contract.errors import UserError
    with pytest.raises(UserError) as exc:
        reviewer.approve([SEOUL], [E1], [])
    assert exc.value.exit_code == EXIT_REFUSED and asked == ["approve: make 1 change(s) listed above?"]


def test_partial_failure_is_audited_and_exits_nonzero(aws, cli):
    aws.stack_output(SEOUL)
    aws.connections(SEOUL, [seoul((E1, ALLOWED_SEOUL, "pendingAcceptance"), (E3, ALLOWED_SEOUL, "pendingAcceptance"))])
    aws.caller()
    aws.change("accept", SEOUL, [E1, E3], unsuccessful={E3: "InvalidVpcEndpointId.NotFound"})
    result = cli("approve", "--region", SEOUL, "--account", ALLOWED_SEOUL, "--yes")
    assert result.code == EXIT_AWS_SERVICE and "InvalidVpcEndpointId.NotFound" in result.err
    assert {r["endpoint_id"]: r["decision"] for r in result.audit} == {E1: "accepted", E3: "failed"}


def test_audit_log_file_is_appended_across_runs(aws, cli, tmp_path):
    log = tmp_path / "audit" / "connections.jsonl"
    for _ in range(2):
        aws.stack_output(SEOUL)
        aws.connections(SEOUL, [seoul((E1, ALLOWED_SEOUL, "available"))])
    aws.caller()
    aws.caller()
    for _ in range(2):
        result = cli("approve", "--region", SEOUL, E1, "--yes", "--audit-log", str(log))
        assert result.code == 0 and result.out == ""
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["decision"] for r in lines] == ["already-accepted", "already-accepted"]


# ------------------------------------------------------------------ reject & sync


def test_reject_cuts_off_an_available_connection(aws, cli):
    aws.stack_output(SEOUL)
    aws.connections(SEOUL, [seoul((E1, ALLOWED_SEOUL, "available"), (E2, STRANGER, "rejected"))])
    aws.caller()
    aws.change("reject", SEOUL, [E1])
    result = cli("reject", "--region", SEOUL, E1, E2, "--yes", "--reason", "decommissioned")
    assert result.code == 0, result.err
    assert {r["endpoint_id"]: (r["decision"], r["reason"]) for r in result.audit} == {
        E1: ("rejected", "decommissioned"), E2: ("already-rejected", None)}


def test_sync_accepts_allowed_and_only_lists_the_rest(aws, cli):
    aws.stack_output(SEOUL)
    aws.connections(SEOUL, [seoul((E1, ALLOWED_SEOUL, "pendingAcceptance"), (E2, STRANGER, "pendingAcceptance"),
                                  (E3, ALLOWED_SEOUL, "available"))])
    aws.caller()
    aws.change("accept", SEOUL, [E1])
    result = cli("sync", "--region", SEOUL, "--yes")
    assert result.code == 0, result.err
    assert {r["endpoint_id"]: r["decision"] for r in result.audit} == {E1: "accepted", E2: "left-pending"}


def test_sync_reject_unknown_rejects_the_rest(aws, cli):
    aws.stack_output(SEOUL)
    aws.connections(SEOUL, [seoul((E1, ALLOWED_SEOUL, "pendingAcceptance"), (E2, STRANGER, "pendingAcceptance"),
                                  (E4, STRANGER, "available"))])
    aws.caller()
    aws.change("accept", SEOUL, [E1])
    aws.change("reject", SEOUL, [E2])
    result = cli("sync", "--region", SEOUL, "--yes", "--reject-unknown")
    assert result.code == 0, result.err
    assert {r["endpoint_id"]: r["decision"] for r in result.audit} == {
        E1: "accepted", E2: "rejected", E4: "left-available"}


# ------------------------------------------------------------------ throttling, pagination, permissions


def test_throttled_listing_is_retried_then_succeeds(aws, cli):
    aws.stack_output(SEOUL)
    aws.error("ec2", SEOUL, "describe_vpc_endpoint_connections", "RequestLimitExceeded", "Request limit exceeded.",
              503)
    aws.connections(SEOUL, [seoul((E1, ALLOWED_SEOUL, "available"))])
    result = cli("list", "--region", SEOUL)
    assert result.code == 0, result.err and E1 in result.out
    assert aws.sleeps == [1.0]  # one backoff (2 s base, jitter pinned to its floor)


def test_throttling_mid_pagination_resumes_from_the_next_token(aws, cli):
    aws.stack_output(SEOUL)
    filters = {"Filters": [{"Name": "service-id", "Values": [SVC[SEOUL]]}]}
    stub = aws.stub("ec2", SEOUL)
    stub.add_response("describe_vpc_endpoint_connections",
                      {"VpcEndpointConnections": seoul((E1, ALLOWED_SEOUL, "available")), "NextToken": "tok-2"},
                      filters)
    aws.error("ec2", SEOUL, "describe_vpc_endpoint_connections", "Throttling", "Rate exceeded", 400,
              {**filters, "NextToken": "tok-2"})
    stub.add_response("describe_vpc_endpoint_connections",
                      {"VpcEndpointConnections": seoul((E2, STRANGER, "pendingAcceptance"))},
                      {**filters, "NextToken": "tok-2"})
    result = cli("list", "--region", SEOUL, "--json")
    assert result.code == 0, result.err
    assert [c["endpoint_id"] for c in json.loads(result.out)["connections"]] == [E2, E1]  # each exactly once


def test_throttled_accept_is_retried(aws, cli):
    aws.stack_output(SEOUL)
    aws.connections(SEOUL, [seoul((E1, ALLOWED_SEOUL, "pendingAcceptance"))])
    aws.caller()
    aws.error("ec2", SEOUL, "accept_vpc_endpoint_connections", "RequestLimitExceeded", status=503,
              expected={"ServiceId": SVC[SEOUL], "VpcEndpointIds": [E1]})
    aws.change("accept", SEOUL, [E1])
    assert cli("approve", "--region", SEOUL, E1, "--yes").code == 0


def test_throttled_past_every_retry_is_a_clear_error(aws, cli):
    aws.stack_output(SEOUL)
    for _ in range(aws.access.throttle_retries + 1):
        aws.error("ec2", SEOUL, "describe_vpc_endpoint_connections", "RequestLimitExceeded", status=503)
    result = cli("list", "--region", SEOUL)
    assert result.code == EXIT_AWS_SERVICE and "still throttled" in result.err
    assert aws.sleeps == [1.0, 2.0, 4.0, 8.0]


def test_unauthorized_accept_names_the_iam_action_and_how_to_decode(aws, cli):
    aws.stack_output(SEOUL)
    aws.connections(SEOUL, [seoul((E1, ALLOWED_SEOUL, "pendingAcceptance"))])
    aws.caller()
    aws.error("ec2", SEOUL, "accept_vpc_endpoint_connections", "UnauthorizedOperation",
              f"You are not authorized to perform this operation. Encoded authorization failure message: {ENCODED}",
              403)
    result = cli("approve", "--region", SEOUL, E1, "--yes")
    assert result.code == EXIT_AWS_ACCESS
    assert "ec2:AcceptVpcEndpointConnections" in result.err
    assert f"aws sts decode-authorization-message --encoded-message {ENCODED}" in result.err
    [record] = result.audit  # the denied attempt stays on the trail
    assert record["decision"] == "failed" and record["error"].startswith("UnauthorizedOperation")


def test_unauthorized_dry_run_fails_the_dry_run(aws, cli):
    aws.stack_output(SEOUL)
    aws.connections(SEOUL, [seoul((E1, ALLOWED_SEOUL, "pendingAcceptance"))])
    aws.error("ec2", SEOUL, "accept_vpc_endpoint_connections", "UnauthorizedOperation",
              f"You are not authorized to perform this operation. Encoded authorization failure message: {ENCODED}",
              403)
    result = cli("approve", "--region", SEOUL, E1, "--dry-run")
    assert result.code == EXIT_AWS_ACCESS and "ec2:AcceptVpcEndpointConnections" in result.err


def test_unauthorized_listing_names_describe_action(aws, cli):
    aws.error("ec2", SEOUL, "describe_vpc_endpoint_connections", "UnauthorizedOperation",
              f"You are not authorized to perform this operation. Encoded authorization failure message: {ENCODED}",
              403)
    result = cli("list", "--region", SEOUL, "--service-id", SVC[SEOUL])
    assert result.code == EXIT_AWS_ACCESS and "ec2:DescribeVpcEndpointConnections in ap-northeast-2" in result.err


def test_denied_stack_read_falls_back_to_the_tag(aws, cli):
    aws.error("cloudformation", SEOUL, "describe_stacks", "AccessDenied",
              "User is not authorized to perform: cloudformation:DescribeStacks", 403)
    aws.tagged_services(SEOUL, [SVC[SEOUL]])
    aws.connections(SEOUL, [[]])
    assert cli("list", "--region", SEOUL).code == 0


def test_iam_action_map_covers_every_call():
    assert iam_action("ec2", "RejectVpcEndpointConnections") == "ec2:RejectVpcEndpointConnections"
    assert iam_action("cloudformation", "DescribeStacks") == "cloudformation:DescribeStacks"


def test_unknown_profile_is_missing_access_in_one_line(cli):
    import contextlib
    import io

    from scripts import cli as fleetcast_cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = fleetcast_cli.main(["connections", "list", "--profile", "no-such-profile"])
    # An unknown profile is missing access like missing credentials: exit 4, the profile named.
    assert code == EXIT_AWS_ACCESS and "profile 'no-such-profile'" in err.getvalue()
    assert len(err.getvalue().strip().splitlines()) == 1


def test_no_credentials_is_a_clear_error(monkeypatch):
    import contextlib
    import io

    from scripts import cli as fleetcast_cli

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = fleetcast_cli.main(["connections", "list", "--region", SEOUL])
    assert code == EXIT_AWS_ACCESS and "no AWS credentials" in err.getvalue() and "--profile" in err.getvalue()
