"""Property: no sequence of `fleetcast connections` commands accepts an account the config does not allow,
unless that very command carried --force and a non-blank --reason.

Commands run through the real CLI (argument parsing included) against a stateful fake of EC2's
endpoint-connection API behind real botocore clients (requests validated against the EC2 model).
"""

from __future__ import annotations

import functools

import boto3
from hypothesis import HealthCheck, given, settings, strategies as st

from fleetcast.connections import Access

from .conftest import run_cli
from .stubs import SEOUL, SVC, VIRGINIA, FakeEc2World, _shared_botocore_session

ALLOWED = {SEOUL: "444455556666", VIRGINIA: "777788889999"}  # config/fleet.yaml
# Each region's allowed account is a stranger in the other region; two accounts are strangers everywhere.
ACCOUNTS = ["444455556666", "777788889999", "999988887777", "123456789012"]
STATES = ["pendingAcceptance", "available", "rejected", "deleted"]
REGIONS = [SEOUL, VIRGINIA]


def endpoint_id(region: str, i: int) -> str:
    return f"vpce-{REGIONS.index(region)}{i:016x}"


worlds = st.fixed_dictionaries({
    region: st.lists(st.tuples(st.sampled_from(ACCOUNTS), st.sampled_from(STATES)), min_size=1, max_size=5)
    for region in REGIONS
})
reasons = st.sampled_from([None, "", "   ", "ticket NET-42"])
common = st.fixed_dictionaries({
    "region": st.sampled_from([None, SEOUL, VIRGINIA]),
    "dry_run": st.sampled_from([False, False, True]),
    "yes": st.sampled_from([True, True, True, False]),
})


def commands(ids: list[str]):
    """Commands that name connections that exist (mostly), so they reach the decision logic."""
    targets = st.lists(st.sampled_from(ids + ["vpce-0ffffffffffffffff"]), max_size=3, unique=True)
    accounts = st.lists(st.sampled_from(ACCOUNTS), max_size=2, unique=True)
    return st.one_of(
        st.tuples(st.just("approve"), common, targets, accounts, st.booleans(), reasons),
        st.tuples(st.just("reject"), common, targets, accounts, st.just(False), reasons),
        st.tuples(st.just("sync"), common, st.just([]), st.just([]), st.booleans(), reasons),
    )


def argv_of(command) -> list[str]:
    name, opts, ids, accounts, flag, reason = command
    argv = [name]
    if opts["region"]:
        argv += ["--region", opts["region"]]
    if opts["dry_run"]:
        argv.append("--dry-run")
    if opts["yes"]:
        argv.append("--yes")
    if name in ("approve", "reject"):
        argv += ids
        for account in accounts:
            argv += ["--account", account]
    if name == "approve" and flag:
        argv.append("--force")
    if name == "sync" and flag:
        argv.append("--reject-unknown")
    if reason is not None:
        argv += ["--reason", reason]
    return argv


@functools.cache
def fake_world() -> tuple[Access, FakeEc2World]:
    """One Access and one fake for every example: `reset` gives each example its own connections, and the
    Access holds nothing between commands but its clients."""
    access = Access(boto_session=boto3.Session(botocore_session=_shared_botocore_session(), region_name=SEOUL),
                    sleep=lambda s: None)
    return access, FakeEc2World(access, "fleetcast", dict(SVC), {})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=worlds, data=st.data())
def test_no_command_sequence_accepts_a_disallowed_account_without_force_and_reason(world, data):
    access, fake = fake_world()
    fake.reset({
        region: {endpoint_id(region, i): {"account": a, "state": s} for i, (a, s) in enumerate(items)}
        for region, items in world.items()
    })
    ids = [endpoint_id(r, i) for r, items in world.items() for i in range(len(items))]
    for command in data.draw(st.lists(commands(ids), min_size=1, max_size=6), label="commands"):
        argv = argv_of(command)
        before = len(fake.accepted)
        result = run_cli(access, *argv)
        assert "Traceback" not in result.err
        forced_with_reason = "--force" in argv and command[5] is not None and command[5].strip() != ""
        for region, eid, account in fake.accepted[before:]:
            if account != ALLOWED[region]:
                assert forced_with_reason, f"{argv} accepted {eid} of {account} in {region}"
                [record] = [r for r in result.audit if r["endpoint_id"] == eid]
                assert record["forced"] is True and record["reason"] == command[5].strip()
        if result.code == 0 and fake.accepted[before:]:
            assert command[0] in ("approve", "sync") and not command[1]["dry_run"]
