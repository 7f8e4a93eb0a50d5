"""Reviewing endpoint connections: list, approve, reject, sync.

`Reviewer` owns the decisions; `Access` (aws.py) owns the calls. Every command
first reads the current state of each endpoint service in scope, then builds
a plan (one decision per connection), and only then changes anything:

- the safety rule comes first: a plan that would accept an account the config
  does not allow, without both --force and --reason, is refused as a whole and
  nothing changes;
- connections already in the wanted state cost no call (repeated runs are
  idempotent);
- --dry-run prints the plan, audits it as dry_run, and asks EC2 itself
  (DryRun=True) whether the caller holds the permission for the real call;
- otherwise a person confirms (unless --yes), then one Accept/Reject call per
  service carries the batch and every outcome is audited.
"""

from __future__ import annotations

import builtins
import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO

from fleetcast.config import FleetConfig
from fleetcast.contract.connections import ACCOUNT_ID, allowed_accounts, consumer_vpcs
from fleetcast.contract.errors import EXIT_AWS_SERVICE, EXIT_INVALID, EXIT_REFUSED, UserError
from fleetcast.contract.names import FLEET_TAG, provider_stack_name
from fleetcast.contract.outputs import ProviderOutput

from .audit import AuditLog, AuditRecord
from .aws import Access, AwsCallError, PermissionDenied

ENDPOINT_ID = re.compile(r"^vpce-[0-9a-f]{8}([0-9a-f]{9})?$")
SERVICE_ID = re.compile(r"^vpce-svc-[0-9a-f]{8}([0-9a-f]{9})?$")

# Output key through which the provider stack makes its endpoint service findable (with FLEET_TAG).
SERVICE_ID_OUTPUT = ProviderOutput.ENDPOINT_SERVICE_ID.value

PENDING = "pendingAcceptance"
AVAILABLE = "available"
REJECTED = "rejected"
# EC2 documents these values capitalized but returns them camel-cased; compare folded.
_STATES = {s.lower(): s for s in (PENDING, "pending", AVAILABLE, "deleting", "deleted", REJECTED, "failed",
                                   "expired", "partial")}

BATCH = 50  # endpoint ids per Accept/Reject call


@dataclass(frozen=True)
class ServiceRef:
    """One region's endpoint service and how it was found."""

    region: str
    service_id: str
    found_by: str


@dataclass(frozen=True)
class Connection:
    """One endpoint connection, with the config's verdict on its account."""

    region: str
    service_id: str
    endpoint_id: str
    account: str
    state: str
    created: datetime | None
    endpoint_region: str | None
    allowed: bool
    config_vpcs: tuple[str, ...] = ()

    @property
    def pending(self) -> bool:
        return self.state == PENDING

    def as_json(self) -> dict[str, object]:
        return {
            "region": self.region, "service_id": self.service_id, "endpoint_id": self.endpoint_id,
            "account": self.account, "state": self.state,
            "created": self.created.isoformat() if self.created else None,
            "endpoint_region": self.endpoint_region, "allowed": self.allowed,
            "config_vpcs": list(self.config_vpcs),
        }


@dataclass(frozen=True)
class Step:
    """The decision about one connection, and the call it needs (None: no call)."""

    connection: Connection
    decision: str
    action: str | None = None  # "accept" | "reject"
    forced: bool = False
    note: str = ""


@dataclass
class Outcome:
    steps: list[Step] = field(default_factory=list)
    failed: list[tuple[Step, str]] = field(default_factory=list)


def terminal_confirm(question: str) -> bool:
    """Ask on the terminal; without one, refuse instead of waiting for input that never comes."""
    if sys.stdin is None or not sys.stdin.isatty():
        raise UserError("this change needs confirmation and stdin is not a terminal: check it with --dry-run, "
                        "then re-run with --yes", EXIT_REFUSED)
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


class Reviewer:
    """Runs the connections commands against one config and one Access."""

    def __init__(self, cfg: FleetConfig, access: Access, audit: AuditLog, *, out: IO[str] | None = None,
                 err: IO[str] | None = None, confirm: Callable[[str], bool] = terminal_confirm):
        self.cfg = cfg
        self.access = access
        self.audit = audit
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.confirm = confirm
        self._caller: str | None = None

    # ------------------------------------------------------------ scope

    def regions(self, requested: Iterable[str] | None) -> list[str]:
        known = [r.region for r in self.cfg.regions]
        if not requested:
            return known
        chosen = []
        for region in requested:
            if region not in known:
                raise UserError(f"--region {region}: not a provider region in the config (have: {', '.join(known)})",
                                EXIT_INVALID)
            if region not in chosen:
                chosen.append(region)
        return chosen

    def services(self, regions: list[str], service_id: str | None = None) -> list[ServiceRef]:
        if service_id is not None:
            if not SERVICE_ID.match(service_id):
                raise UserError(f"--service-id {service_id!r}: not an endpoint service id such as "
                                "vpce-svc-0123456789abcdef0", EXIT_INVALID)
            if len(regions) != 1:
                raise UserError("--service-id names one region's service: give --region too", EXIT_INVALID)
            return [ServiceRef(regions[0], service_id, "--service-id")]
        return [self.find_service(region) for region in regions]

    def find_service(self, region: str) -> ServiceRef:
        """The region's endpoint service: the provider stack's output, else the fleet tag."""
        stack = provider_stack_name(self.cfg.name, region)
        stack_problem = ""
        try:
            described = self.access.call("cloudformation", region, "DescribeStacks", StackName=stack)
            outputs = (described.get("Stacks") or [{}])[0].get("Outputs", [])
            # The provider stack's output by its key; any single endpoint-service-id output
            # as a fallback (stacks deployed by an older version, or a renamed output).
            ids = [o for o in outputs if SERVICE_ID.match(o.get("OutputValue", ""))]
            named = [o for o in ids if o.get("OutputKey") == SERVICE_ID_OUTPUT]
            chosen = named if len(named) == 1 else ids
            if len(chosen) == 1:
                return ServiceRef(region, chosen[0]["OutputValue"], f"stack {stack} output {chosen[0]['OutputKey']}")
            stack_problem = f"stack {stack} has no single endpoint service id output"
        except PermissionDenied as exc:
            stack_problem = f"cannot read stack {stack} ({exc.action} denied)"
        except AwsCallError as exc:
            if exc.code != "ValidationError":  # CloudFormation's answer for "stack does not exist"
                raise
            stack_problem = f"no stack {stack}"
        found = [
            svc["ServiceId"] for svc in self.access.paginate(
                "ec2", region, "DescribeVpcEndpointServiceConfigurations", "ServiceConfigurations",
                Filters=[{"Name": f"tag:{FLEET_TAG}", "Values": [self.cfg.name]}])
        ]
        if len(found) == 1:
            return ServiceRef(region, found[0], f"tag {FLEET_TAG}={self.cfg.name}")
        if not found:
            raise UserError(f"{region}: no endpoint service for fleet {self.cfg.name!r}: {stack_problem}, and none "
                            f"is tagged {FLEET_TAG}={self.cfg.name}; deploy the provider stack or pass "
                            "--region with --service-id", EXIT_AWS_SERVICE)
        raise UserError(f"{region}: {len(found)} endpoint services are tagged {FLEET_TAG}={self.cfg.name} "
                        f"({', '.join(found)}): pass --region with --service-id", EXIT_INVALID)

    def connections(self, svc: ServiceRef) -> list[Connection]:
        allowed = allowed_accounts(self.cfg, svc.region)
        vpcs = consumer_vpcs(self.cfg, svc.region)
        out = []
        for item in self.access.paginate("ec2", svc.region, "DescribeVpcEndpointConnections",
                                         "VpcEndpointConnections",
                                         Filters=[{"Name": "service-id", "Values": [svc.service_id]}]):
            account = item.get("VpcEndpointOwner", "")
            raw_state = item.get("VpcEndpointState", "")
            out.append(Connection(
                region=svc.region, service_id=svc.service_id, endpoint_id=item.get("VpcEndpointId", ""),
                account=account, state=_STATES.get(raw_state.lower(), raw_state),
                created=item.get("CreationTimestamp"), endpoint_region=item.get("VpcEndpointRegion"),
                allowed=account in allowed, config_vpcs=vpcs.get(account, ()),
            ))
        return out

    # ------------------------------------------------------------ list

    def list(self, regions: list[str], service_id: str | None = None, as_json: bool = False) -> int:
        services = self.services(regions, service_id)
        rows = [c for svc in services for c in self.connections(svc)]
        rows.sort(key=lambda c: (not c.pending, c.region, c.created.timestamp() if c.created else 0, c.endpoint_id))
        if as_json:
            self.out.write(json.dumps({
                "services": [{"region": s.region, "service_id": s.service_id, "found_by": s.found_by}
                             for s in services],
                "connections": [c.as_json() for c in rows],
            }, indent=2) + "\n")
            return 0
        for svc in services:
            self.out.write(f"# {svc.region}: {svc.service_id} ({svc.found_by})\n")
        if not rows:
            self.out.write("no endpoint connections\n")
            return 0
        header = ("ENDPOINT", "REGION", "FROM", "ACCOUNT", "STATE", "CREATED", "ALLOWED", "CONFIG VPC")
        table = [header] + [(
            c.endpoint_id, c.region, c.endpoint_region or c.region, c.account, c.state,
            c.created.strftime("%Y-%m-%d %H:%MZ") if c.created else "-",
            "yes" if c.allowed else "NO", ",".join(c.config_vpcs) or "-",
        ) for c in rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for row in table:
            self.out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n")
        pending = sum(c.pending for c in rows)
        unknown = sum(c.pending and not c.allowed for c in rows)
        self.out.write(f"{len(rows)} connection(s), {pending} pending, {unknown} pending from accounts the config "
                       "does not allow\n")
        return 0

    # ------------------------------------------------------------ approve / reject / sync

    def _targets(self, conns: builtins.list[Connection], endpoint_ids: builtins.list[str], accounts: builtins.list[str],
                 relevant_states: tuple[str, ...]) -> builtins.list[Connection]:
        for endpoint_id in endpoint_ids:
            if not ENDPOINT_ID.match(endpoint_id):
                raise UserError(f"{endpoint_id!r}: not a VPC endpoint id such as vpce-0123456789abcdef0", EXIT_INVALID)
        for account in accounts:
            if not ACCOUNT_ID.match(account):
                raise UserError(f"--account {account!r}: not a 12-digit AWS account id", EXIT_INVALID)
        if not endpoint_ids and not accounts:
            raise UserError("name the connections: endpoint ids (vpce-...) and/or --account ACCOUNT_ID", EXIT_INVALID)
        by_id = {c.endpoint_id: c for c in conns}
        chosen: dict[str, Connection] = {}
        for endpoint_id in endpoint_ids:
            if endpoint_id not in by_id:
                where = ", ".join(sorted({c.region for c in conns})) or "the regions in scope"
                raise UserError(f"{endpoint_id}: no such connection to the fleet's endpoint service in {where} "
                                "(see `fleetcast connections list`)", EXIT_INVALID)
            chosen[endpoint_id] = by_id[endpoint_id]
        for account in accounts:
            mine = [c for c in conns if c.account == account and c.state in relevant_states]
            if not mine:
                raise UserError(f"--account {account}: no connection in state {'/'.join(relevant_states)} "
                                "from that account", EXIT_INVALID)
            for c in mine:
                chosen.setdefault(c.endpoint_id, c)
        return list(chosen.values())

    def approve(self, regions: builtins.list[str], endpoint_ids: builtins.list[str], accounts: builtins.list[str], *,
                service_id: str | None = None, force: bool = False, reason: str | None = None, dry_run: bool = False,
                yes: bool = False) -> int:
        reason = _clean_reason(reason)
        if force and not reason:
            raise UserError("--force needs --reason TEXT: the reason for accepting an account the config does not "
                            "allow goes into the audit log", EXIT_REFUSED)
        conns = self._all(regions, service_id)
        steps = []
        for c in self._targets(conns, endpoint_ids, accounts, (PENDING, AVAILABLE)):
            if c.state == AVAILABLE:
                steps.append(Step(c, "already-accepted", note="already accepted"))
            elif c.state != PENDING:
                steps.append(Step(c, "not-actionable", note=f"state {c.state}: only pending requests are accepted"))
            elif c.allowed:
                steps.append(Step(c, "accepted", "accept"))
            elif force and reason:
                steps.append(Step(c, "accepted", "accept", forced=True,
                                  note="account NOT allowed by the config: accepted with --force"))
            else:
                steps.append(Step(c, "refused", note=f"account {c.account} is not allowed in {c.region} by the "
                                                     "config; add it to allowed_principals, or pass --force with "
                                                     "--reason TEXT"))
        return self._run("approve", steps, reason=reason, dry_run=dry_run, yes=yes)

    def reject(self, regions: builtins.list[str], endpoint_ids: builtins.list[str], accounts: builtins.list[str], *,
               service_id: str | None = None, reason: str | None = None, dry_run: bool = False, yes: bool = False) -> int:
        reason = _clean_reason(reason)
        conns = self._all(regions, service_id)
        steps = []
        for c in self._targets(conns, endpoint_ids, accounts, (PENDING, AVAILABLE, REJECTED)):
            if c.state == REJECTED:
                steps.append(Step(c, "already-rejected", note="already rejected"))
            elif c.state in (PENDING, AVAILABLE):
                note = "cuts off a connected consumer" if c.state == AVAILABLE else ""
                if c.allowed:
                    note = (note + "; " if note else "") + "the config allows this account"
                steps.append(Step(c, "rejected", "reject", note=note))
            else:
                steps.append(Step(c, "not-actionable", note=f"state {c.state}: nothing to reject"))
        return self._run("reject", steps, reason=reason, dry_run=dry_run, yes=yes)

    def sync(self, regions: builtins.list[str], *, service_id: str | None = None, reject_unknown: bool = False,
             reason: str | None = None, dry_run: bool = False, yes: bool = False) -> int:
        reason = _clean_reason(reason)
        if reject_unknown and not reason:
            reason = "sync --reject-unknown: account not allowed by the config"
        steps = []
        for c in self._all(regions, service_id):
            if c.pending and c.allowed:
                steps.append(Step(c, "accepted", "accept"))
            elif c.pending and reject_unknown:
                steps.append(Step(c, "rejected", "reject", note="account not allowed by the config"))
            elif c.pending:
                steps.append(Step(c, "left-pending", note="account not allowed by the config: review it, then "
                                                          "`approve --force --reason` or `reject`"))
            elif c.state == AVAILABLE and not c.allowed:
                steps.append(Step(c, "left-available", note="connected, but the config no longer allows this "
                                                            "account: `reject` it to cut it off"))
        return self._run("sync", steps, reason=reason, dry_run=dry_run, yes=yes)

    # ------------------------------------------------------------ execution

    def _all(self, regions: builtins.list[str], service_id: str | None) -> builtins.list[Connection]:
        return [c for svc in self.services(regions, service_id) for c in self.connections(svc)]

    @property
    def caller(self) -> str:
        if self._caller is None:
            region = self.cfg.regions[0].region
            self._caller = self.access.call("sts", region, "GetCallerIdentity")["Arn"]
        return self._caller

    def _record(self, command: str, step: Step, reason: str | None, dry_run: bool, decision: str | None = None,
                error: str | None = None) -> None:
        c = step.connection
        self.audit.write(AuditRecord(
            time=self.audit.now(), caller=self.caller, command=command, region=c.region, service_id=c.service_id,
            endpoint_id=c.endpoint_id, account=c.account, state=c.state, allowed=c.allowed,
            decision=decision or step.decision, reason=reason if step.action or step.decision == "refused" else None,
            forced=step.forced, dry_run=dry_run, error=error,
        ))

    def _say(self, text: str) -> None:
        self.err.write(text + "\n")

    def _run(self, command: str, steps: builtins.list[Step], *, reason: str | None, dry_run: bool, yes: bool) -> int:
        refused = [s for s in steps if s.decision == "refused"]
        if refused:
            for s in refused:
                self._say(f"refused  {s.connection.endpoint_id}  {s.connection.region}  {s.note}")
                self._record(command, s, reason, dry_run)
            raise UserError(f"refused {len(refused)} connection(s) from accounts the config does not allow; "
                            "nothing changed", EXIT_REFUSED)
        changes = [s for s in steps if s.action]
        for s in steps:
            c = s.connection
            verb = {"accept": "accept", "reject": "reject"}.get(s.action or "", s.decision)
            self._say(f"{'would ' if dry_run and s.action else ''}{verb:<16} {c.endpoint_id}  {c.region}  "
                      f"account {c.account}  {c.state}{'  -- ' + s.note if s.note else ''}")
        if not steps:
            self._say("nothing to review")
        for s in steps:
            if not s.action:
                self._record(command, s, reason, dry_run)
        if not changes:
            if steps:
                self._say("no change needed")
            return 0
        if dry_run:
            self._check_permission(changes)
            for s in changes:
                self._record(command, s, reason, dry_run=True)
            self._say(f"dry run: {len(changes)} change(s) planned, nothing changed")
            return 0
        if not yes and not self.confirm(f"{command}: make {len(changes)} change(s) listed above?"):
            raise UserError("not confirmed; nothing changed", EXIT_REFUSED)
        outcome = self._apply(command, changes, reason)
        done = len(changes) - len(outcome.failed)
        self._say(f"{done} change(s) made" + (f", {len(outcome.failed)} failed" if outcome.failed else ""))
        if outcome.failed:
            raise UserError("; ".join(f"{s.connection.endpoint_id}: {e}" for s, e in outcome.failed), EXIT_AWS_SERVICE)
        return 0

    @staticmethod
    def _batches(changes: builtins.list[Step]) -> builtins.list[tuple[str, str, str, builtins.list[Step]]]:
        groups: dict[tuple[str, str, str], list[Step]] = {}
        for s in changes:
            groups.setdefault((s.connection.region, s.connection.service_id, s.action or ""), []).append(s)
        out = []
        for (region, service_id, action), group in groups.items():
            for i in range(0, len(group), BATCH):
                out.append((region, service_id, action, group[i:i + BATCH]))
        return out

    def _check_permission(self, changes: builtins.list[Step]) -> None:
        """EC2's DryRun: DryRunOperation means the real call would be authorized."""
        for region, service_id, action, group in self._batches(changes):
            operation = "AcceptVpcEndpointConnections" if action == "accept" else "RejectVpcEndpointConnections"
            try:
                self.access.call("ec2", region, operation, DryRun=True, ServiceId=service_id,
                                 VpcEndpointIds=[s.connection.endpoint_id for s in group])
            except PermissionDenied:
                raise
            except AwsCallError as exc:
                if exc.code != "DryRunOperation":
                    raise
            self._say(f"permission check: ec2:{operation} on {service_id} in {region} is allowed")

    def _apply(self, command: str, changes: builtins.list[Step], reason: str | None) -> Outcome:
        outcome = Outcome()
        for region, service_id, action, group in self._batches(changes):
            operation = "AcceptVpcEndpointConnections" if action == "accept" else "RejectVpcEndpointConnections"
            try:
                answer = self.access.call("ec2", region, operation, ServiceId=service_id,
                                          VpcEndpointIds=[s.connection.endpoint_id for s in group])
            except AwsCallError as exc:
                # The attempt is part of the trail: who tried what, and why it did not happen.
                for s in group:
                    self._record(command, s, reason, False, decision="failed", error=f"{exc.code}: {exc}")
                raise
            unsuccessful = {u.get("ResourceId"): u.get("Error", {}) for u in answer.get("Unsuccessful", [])}
            for s in group:
                error = unsuccessful.get(s.connection.endpoint_id)
                if error is not None:
                    text = f"{error.get('Code', 'Unknown')}: {error.get('Message', '')}".strip()
                    outcome.failed.append((s, text))
                    self._say(f"FAILED   {s.connection.endpoint_id}  {text}")
                    self._record(command, s, reason, False, decision="failed", error=text)
                else:
                    outcome.steps.append(s)
                    self._record(command, s, reason, False)
        return outcome


def _clean_reason(reason: str | None) -> str | None:
    if reason is None:
        return None
    reason = " ".join(reason.split())
    return reason or None
