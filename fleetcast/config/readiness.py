"""Deploy readiness: what a valid config may still hold that cannot work in a real account.

`fleetcast config validate --deploy` and `fleetcast deploy` (before any step runs) refuse

- example account ids from AWS documentation (111122223333, 444455556666, 777788889999,
  123456789012 and their kind: AWS's docs, e.g. the IAM User Guide's "IAM identifiers" page,
  write account ids this way), wherever they occur: provider and consumer accounts, principal
  ARNs, certificate ARNs;
- the placeholder resource ids of the example config and of AWS documentation (VPC, subnet,
  route table, endpoint service, AMI, capacity reservation ids built from runs such as
  `0a1b2c3d4e5f...` or `1234567890abcdef`);

and warn on a `latest` AMI (a new DLAMI rolls the fleet at the next deploy) and on a
`model.revision` that is not a 40-hex commit (a branch or tag can move under the staged copy).
With credentials for the provider account it also checks each configured AZ name -> AZ ID
pair against ec2:DescribeAvailabilityZones: AZ names map to different physical zones per
account, and consumers pick their subnets by AZ ID.

`make synth` never runs these checks: synthesis of the example config stays offline and green.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .model import FleetConfig
from .rules import ConfigIssue

# Account ids AWS documentation uses in examples. The aaaabbbbcccc shape (three runs of four equal
# digits) is AWS's own convention for example accounts; the rest are the sequences its older pages use.
EXAMPLE_ACCOUNT_IDS = frozenset({"111122223333", "444455556666", "777788889999", "123456789012",
                                 "012345678901", "210987654321", "098765432109"})
_RUNS_OF_FOUR = re.compile(r"^(\d)\1{3}(\d)\2{3}(\d)\3{3}$")
_ACCOUNT = re.compile(r"(?<!\d)(\d{12})(?!\d)")
_RESOURCE_ID = re.compile(r"\b(vpc|subnet|rtb|vpce-svc|ami|cr|sg)-([0-9a-f]{8,17})\b")
# Hex runs that documentation and the example config use for made-up ids; a real id is random hex.
PLACEHOLDER_RUNS = ("0a1b2c3d", "1a2b3c4d", "0f1e2d3c", "1234567890abcdef", "0123456789abcdef", "fedcba9876543210")
COMMIT = re.compile(r"^[0-9a-f]{40}$")


def is_example_account(account: str) -> bool:
    return account in EXAMPLE_ACCOUNT_IDS or bool(_RUNS_OF_FOUR.match(account)) or len(set(account)) == 1


def is_placeholder_id(hex_part: str) -> bool:
    return any(run in hex_part for run in PLACEHOLDER_RUNS)


@dataclass(frozen=True)
class Readiness:
    refusals: tuple[ConfigIssue, ...]
    warnings: tuple[ConfigIssue, ...]
    notes: tuple[str, ...] = ()

    @property
    def ready(self) -> bool:
        return not self.refusals

    def render(self, source: str, lines: dict[tuple, int] | None = None) -> str:
        def where(issue: ConfigIssue) -> str:
            path, line = tuple(issue.path), None
            while path and line is None:
                line = (lines or {}).get(path)
                path = path[:-1]
            return f"{issue.dotted} (line {line})" if line else issue.dotted

        head = (f"{source}: ready to deploy" if self.ready
                else f"{source}: not ready to deploy: {len(self.refusals)} problem(s)")
        out = [head + (f", {len(self.warnings)} warning(s)" if self.warnings else "")]
        out += [f"  - {where(i)}: {i.message}" for i in self.refusals]
        if self.warnings:
            out.append("warnings:")
            out += [f"  - {where(i)}: {i.message}" for i in self.warnings]
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


def _strings(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(value, path + (key,))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _strings(value, path + (i,))
    elif isinstance(node, str):
        yield path, node


def _account_advice(path: tuple) -> str:
    if path == ("provider", "account"):
        return "put the id of the account that runs the fleets (`aws sts get-caller-identity` there)"
    if path[:1] == ("consumers",):
        return "put the consumer's own account id (its owner runs `aws sts get-caller-identity`)"
    if "allowed_principals" in path:
        return "name a principal of the real consumer account, e.g. arn:aws:iam::<account>:root"
    return "replace it with the real account id"


def _id_advice(path: tuple, kind: str) -> str:
    if path[-1:] == ("endpoint_service_name",):
        return ("delete the value: `fleetcast deploy --step publish` writes the real name after the provider "
                "stack is deployed (synth skips the consumer until then)")
    if kind == "ami":
        return "use `latest` (the DLAMI's public SSM parameter) or `fleetcast ami pin` to write real ids"
    if path[:1] == ("consumers",):
        return f"put the consumer VPC's real {kind} id (`aws ec2 describe-{'vpcs' if kind == 'vpc' else 'subnets'}` in the consumer account)"
    return f"put the real {kind} id from the provider account, or drop the field to let Fleetcast create it"


def offline_findings(cfg: FleetConfig) -> Readiness:
    """Everything that needs no AWS call."""
    refusals: list[ConfigIssue] = []
    for path, value in _strings(cfg.model_dump(mode="json")):
        if path[:1] == ("tags",):
            continue
        # Accounts live in account fields and in ARNs; elsewhere (digests, names) a 12-digit run means nothing.
        for account in _ACCOUNT.findall(value) if value.startswith("arn:") or value.isdigit() else ():
            if is_example_account(account):
                refusals.append(ConfigIssue(path, f"{account} is an example account id from AWS documentation, "
                                                  f"not a real account; {_account_advice(path)}"))
        for kind, hex_part in _RESOURCE_ID.findall(value):
            if is_placeholder_id(hex_part):
                refusals.append(ConfigIssue(path, f"{kind}-{hex_part} is a placeholder id (example config / AWS "
                                                  f"documentation), not a resource of any account; "
                                                  f"{_id_advice(path, kind)}"))
    warnings: list[ConfigIssue] = []
    for i, region in enumerate(cfg.regions):
        if region.ami.id == "latest":
            warnings.append(ConfigIssue(("regions", i, "ami", "id"),
                                        "`latest`: each deploy resolves the DLAMI's public SSM parameter, so a new "
                                        "DLAMI release rolls this region's pools at the next deploy; "
                                        "`fleetcast ami pin` fixes the ids"))
    if not COMMIT.match(cfg.model.revision):
        warnings.append(ConfigIssue(("model", "revision"),
                                    f"{cfg.model.revision!r} is a branch or tag, not a 40-hex commit: the hub can move "
                                    "it, and engines are cached per revision; `fleetcast stage model` prints the "
                                    "commit it fetched, pin that"))
    return Readiness(tuple(refusals), tuple(warnings))


def zone_findings(cfg: FleetConfig, access: Any) -> tuple[list[ConfigIssue], list[str]]:
    """AZ name -> AZ ID pairs against DescribeAvailabilityZones in the provider account.

    Returns (refusals, notes). The check needs credentials for provider.account: AZ names are
    mapped per account, so another account's answer would prove nothing.
    """
    from fleetcast.connections.aws import AwsCallError

    first = cfg.regions[0].region
    try:
        caller = access.call("sts", first, "GetCallerIdentity")["Account"]
    except AwsCallError as exc:
        return [], [f"AZ name -> AZ ID pairs not checked: {exc}"]
    if caller != cfg.provider.account:
        return [], [f"AZ name -> AZ ID pairs not checked: the credentials are for account {caller}, not "
                    f"provider.account {cfg.provider.account} (AZ names map to zones per account)"]
    refusals: list[ConfigIssue] = []
    for i, region in enumerate(cfg.regions):
        try:
            zones = access.call("ec2", region.region, "DescribeAvailabilityZones")["AvailabilityZones"]
        except AwsCallError as exc:
            return refusals, [f"AZ name -> AZ ID pairs of {region.region} not checked: {exc}"]
        ids = {z["ZoneName"]: z["ZoneId"] for z in zones}
        for j, az in enumerate(region.availability_zones):
            path = ("regions", i, "availability_zones", j, "id")
            actual = ids.get(az.name)
            if actual is None:
                refusals.append(ConfigIssue(("regions", i, "availability_zones", j, "name"),
                                            f"{az.name} is not an available zone of {region.region} in account "
                                            f"{caller}; available: {', '.join(sorted(ids)) or 'none'}"))
            elif actual != az.id:
                refusals.append(ConfigIssue(path, f"in account {caller}, {az.name} is {actual}, not {az.id}: AZ "
                                                  f"names map to different zones per account; set id: {actual} "
                                                  "(or pick the name whose ID the consumers' subnets use)"))
    return refusals, []


def check_readiness(cfg: FleetConfig, access: Any | None) -> Readiness:
    """Offline findings, plus the AZ check when `access` has credentials (None: skip it)."""
    found = offline_findings(cfg)
    if access is None:
        return Readiness(found.refusals, found.warnings,
                         ("AZ name -> AZ ID pairs not checked: no AWS credentials (run with credentials for "
                          f"provider.account {cfg.provider.account}, e.g. --profile)",))
    refusals, notes = zone_findings(cfg, access)
    return Readiness(found.refusals + tuple(refusals), found.warnings, tuple(notes))


def line_index(path: str | Path) -> dict[tuple, int]:
    """YAML path -> line of a config file (empty when it cannot be read: lines are a courtesy)."""
    from ruamel.yaml import YAML

    from .loader import _line_index

    try:
        return _line_index(YAML(typ="rt").load(Path(path).read_text()))
    except Exception:  # noqa: BLE001 - the file was already validated; without lines the report still stands
        return {}


def access_with_credentials(profile: str | None, *, strict: bool = True) -> Any | None:
    """The command's `AwsSession` when the standard chain (or the profile) yields credentials, else None.
    `strict`: an unknown profile is the caller's mistake (exit 4); a dry run passes False and is told later
    that AWS access was not checked."""
    from fleetcast.aws_session import AwsSession
    from fleetcast.errors import FleetcastError

    aws = AwsSession(profile)
    try:
        aws.boto  # noqa: B018 - resolves the profile
    except FleetcastError:
        if strict:
            raise
        return None
    return None if aws.credentials_problem() else aws
