"""Deploy readiness: what a valid config may still hold that cannot work in a real account.

`fleetcast config validate --deploy` and `fleetcast deploy` (before any step; a dry run exits 1) refuse
the placeholders of AWS documentation and of `fleetcast config init`, recognized by rule (below):
example account ids wherever they occur (account fields, principal ARNs, certificate ARNs), made-up
resource ids (VPC, subnet, route table, endpoint service, AMI, capacity reservation), AWS's example
bucket names, documentation mail domains and documentation CIDRs;

and warn on a `latest` AMI (a new DLAMI rolls the fleet at the next deploy) and on a
`model.revision` that is not a 40-hex commit (a branch or tag can move under the staged copy).
With credentials for the provider account it also checks each configured AZ name -> AZ ID pair
against ec2:DescribeAvailabilityZones (AZ names map to different physical zones per account, and
consumers pick their subnets by AZ ID) and each pinned AMI id against ec2:DescribeImages in its own
region (AMI ids are regional); without them it warns when two regions pin the same AMI id.

`make synth` never runs these checks: synthesis of the example config stays offline and green.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .model import FleetConfig
from .rules import DOCUMENTATION_NETWORKS, ConfigIssue

# Placeholders are recognized by rule where one exists, so a new example in AWS's pages or in init's output is
# caught without a list to keep:
# - accounts: AWS's example convention of three runs of four equal digits (111122223333, 444455556666), one digit
#   twelve times, or a run of consecutive digits (123456789012, 210987654321), as older pages write them;
# - resource ids (vpc-, subnet-, ami-, ...): a real id is random hex; documentation and `fleetcast config init`
#   write a run of seven or more equal or consecutive hex digits (init: vpc-00000000000000000; AWS:
#   ami-0abcdef1234567890, vpc-1234567890abcdef0) or two interleaved counting runs (vpc-1a2b3c4d, 0f1e2d3c);
#   of 10^6 random 17-digit ids, 4 look like that (tests/config/test_readiness.py measures it);
# - buckets: AWS's documentation names (amzn-s3-demo-..., the older doc-example-..., examplebucket);
# - e-mail: the domains reserved for documentation (RFC 2606: example.com/.net/.org, .example, .test,
#   .invalid, .localhost);
# - CIDRs: the IPv4 blocks reserved for documentation (RFC 5737: 192.0.2.0/24, 198.51.100.0/24,
#   203.0.113.0/24), which `fleetcast config init` writes for the consumer ranges it cannot know.
_ACCOUNT = re.compile(r"(?<![0-9])([0-9]{12})(?![0-9])", re.ASCII)
_RESOURCE_ID = re.compile(r"\b(vpc|subnet|rtb|vpce-svc|ami|cr|sg)-([0-9a-f]{8,17})\b", re.ASCII)
_BUCKET = re.compile(r"s3://([a-z0-9][a-z0-9.-]*)", re.ASCII)
COMMIT = re.compile(r"[0-9a-f]{40}", re.ASCII)
PLACEHOLDER_RUN = 7
HEX = "0123456789abcdef"
EXAMPLE_BUCKET_PREFIXES = ("amzn-s3-demo-", "doc-example-")
EXAMPLE_BUCKETS = frozenset({"examplebucket", "example-bucket", "amzn-s3-demo-bucket"})
DOCUMENTATION_DOMAINS = ("example.com", "example.net", "example.org")
DOCUMENTATION_TLDS = ("example", "test", "invalid", "localhost")


def _steps(text: str, alphabet: str, modulo: int) -> list[int]:
    return [(alphabet.index(b) - alphabet.index(a)) % modulo for a, b in zip(text, text[1:])]


def _longest_run(steps: list[int], allowed: set[int] | frozenset[int]) -> int:
    """Characters in the longest stretch whose every step is one of `allowed`, all the same step."""
    best = run = 1
    previous = None
    for step in steps:
        if step in allowed:
            run = run + 1 if step == previous else 2
        else:
            run = 1
        if run > best:
            best = run
        previous = step
    return best


def is_example_account(account: str) -> bool:
    if not (len(account) == 12 and account.isascii() and account.isdigit()):
        return False
    runs_of_four = all(len(set(account[i:i + 4])) == 1 for i in (0, 4, 8))
    return runs_of_four or _longest_run(_steps(account, "0123456789", 10), {0, 1, 9}) == 12


_HEX_RUN_STEPS = frozenset({0, 1, 15})
_DECIMAL_RUN_STEPS = frozenset({1})


def is_placeholder_id(hex_part: str) -> bool:
    hex_part = hex_part.lower()
    digits = [HEX.index(c) for c in hex_part]
    steps = [(b - a) % 16 for a, b in zip(digits, digits[1:])]  # _steps(hex_part, HEX, 16)
    # Equal or counting digits, in hex order or decimal order (1234567890: 9 -> 0 counts on).
    if max(_longest_run(steps, _HEX_RUN_STEPS),
           _longest_run([s if a + b != "90" else 1 for s, a, b in zip(steps, hex_part, hex_part[1:])],
                        _DECIMAL_RUN_STEPS)) >= PLACEHOLDER_RUN:
        return True
    # Two interleaved counting runs of four or more each: 1a2b3c4d, 0f1e2d3c. In each window of eight, the even and
    # the odd digits each make three equal steps of +1 or -1; a step between digits two apart is read once: each
    # start's three equal skips are found once (`counting`), each window reads two neighbouring starts.
    skips = [(b - a) % 16 for a, b in zip(digits, digits[2:])]
    counting = [a == b == c in (1, 15) for a, b, c in zip(skips, skips[2:], skips[4:])]
    return any(counting[start] and counting[start + 1] for start in range(len(hex_part) - 7))


def is_example_bucket(bucket: str) -> bool:
    return bucket in EXAMPLE_BUCKETS or bucket.startswith(EXAMPLE_BUCKET_PREFIXES)


def is_documentation_domain(domain: str) -> bool:
    domain = domain.lower().rstrip(".")
    return any(domain == d or domain.endswith("." + d) for d in DOCUMENTATION_DOMAINS) \
        or domain.rsplit(".", 1)[-1] in DOCUMENTATION_TLDS


def is_documentation_network(cidr: str) -> bool:
    network = ipaddress.IPv4Network(cidr, strict=False)
    return any(network.subnet_of(doc) for doc in DOCUMENTATION_NETWORKS)


@dataclass(frozen=True)
class Readiness:
    refusals: tuple[ConfigIssue, ...]
    warnings: tuple[ConfigIssue, ...]
    notes: tuple[str, ...] = ()

    @property
    def ready(self) -> bool:
        return not self.refusals

    def render(self, source: str, lines: dict[tuple[Any, ...], int] | None = None) -> str:
        from .loader import single_form_path

        # A file in the single-model form is told its own paths (model.revision, not models[0].revision).
        single = any(k[:1] == ("model",) for k in lines or {}) and not any(k[:1] == ("models",) for k in lines or {})

        def where(issue: ConfigIssue) -> str:
            if single:
                issue = ConfigIssue(single_form_path(tuple(issue.path)), issue.message)
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


def _strings(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(value, path + (key,))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _strings(value, path + (i,))
    elif isinstance(node, str):
        yield path, node


def _account_advice(path: tuple[Any, ...]) -> str:
    if path == ("provider", "account"):
        return "put the id of the account that runs the fleets (`aws sts get-caller-identity` there)"
    if path[:1] == ("consumers",):
        return "put the consumer's own account id (its owner runs `aws sts get-caller-identity`)"
    if "allowed_principals" in path:
        return "name a principal of the real consumer account, e.g. arn:aws:iam::<account>:root"
    return "replace it with the real account id"


def _id_advice(path: tuple[Any, ...], kind: str) -> str:
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
        for bucket in _BUCKET.findall(value):
            if is_example_bucket(bucket):
                refusals.append(ConfigIssue(path, f"{bucket} is a bucket name of AWS's documentation examples, not "
                                                  "your bucket; put the bucket that holds the data"))
    for i, consumer in enumerate(cfg.consumers):
        for j, cidr in enumerate(consumer.cidrs):
            if is_documentation_network(cidr):
                refusals.append(ConfigIssue(("consumers", i, "cidrs", j),
                    f"{cidr} is reserved for documentation (RFC 5737; `fleetcast config init` writes it where it "
                    "cannot know the consumer's ranges); put the consumer's client CIDRs"))
    email = cfg.operations.alarm_email
    if email and is_documentation_domain(email.rpartition("@")[2]):
        refusals.append(ConfigIssue(("operations", "alarm_email"),
            f"{email} is at a domain reserved for documentation (RFC 2606); no alarm would reach anyone: put a "
            "mailbox your on-call reads"))
    warnings: list[ConfigIssue] = []
    for i, region in enumerate(cfg.regions):
        if region.ami.id == "latest":
            warnings.append(ConfigIssue(("regions", i, "ami", "id"),
                                        "`latest`: each deploy resolves the DLAMI's public SSM parameter, so a new "
                                        "DLAMI release rolls this region's pools at the next deploy; "
                                        "`fleetcast ami pin` fixes the ids"))
    for i, model in enumerate(cfg.models):
        if not COMMIT.fullmatch(model.revision):
            warnings.append(ConfigIssue(("models", i, "revision"),
                                        f"{model.revision!r} is a branch or tag, not a 40-hex commit: the hub can move "
                                        "it, and engines are cached per revision; `fleetcast stage model` prints the "
                                        "commit it fetched, pin that"))
    return Readiness(tuple(refusals), tuple(warnings))


def provider_caller(cfg: FleetConfig, access: Any) -> tuple[str | None, str | None]:
    """(provider.account, None) when `access` has that account's credentials, else (None, why not)."""
    from fleetcast.connections.aws import AwsCallError

    try:
        caller = access.call("sts", cfg.regions[0].region, "GetCallerIdentity")["Account"]
    except AwsCallError as exc:
        return None, f"AZ name -> AZ ID pairs and pinned AMIs not checked: {exc}"
    if caller != cfg.provider.account:
        return None, (f"AZ name -> AZ ID pairs and pinned AMIs not checked: the credentials are for account "
                      f"{caller}, not provider.account {cfg.provider.account} (AZ names map to zones per account, "
                      "and an image shared with the provider account may be invisible to another)")
    return caller, None


def zone_findings(cfg: FleetConfig, access: Any, caller: str) -> tuple[list[ConfigIssue], list[str]]:
    """AZ name -> AZ ID pairs against DescribeAvailabilityZones in the provider account (`caller`).

    Returns (refusals, notes). The check needs credentials for provider.account: AZ names are
    mapped per account, so another account's answer would prove nothing.
    """
    from fleetcast.connections.aws import AwsCallError

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


# DescribeImages answers an id it does not know, or one that is not an id, with these codes (Amazon EC2 API
# Reference, "Error codes for the Amazon EC2 API").
AMI_NOT_FOUND_CODES = ("InvalidAMIID.NotFound", "InvalidAMIID.Unavailable", "InvalidAMIID.Malformed")


def ami_findings(cfg: FleetConfig, access: Any) -> tuple[list[ConfigIssue], list[str]]:
    """Each pinned AMI id against DescribeImages in its own region: AMI ids are regional, so an id copied from
    another region's entry names no image there and every launch would fail."""
    from fleetcast.connections.aws import AwsCallError

    refusals: list[ConfigIssue] = []
    notes: list[str] = []
    for i, region in enumerate(cfg.regions):
        ami = region.ami.id
        if ami == "latest":
            continue
        try:
            images = access.call("ec2", region.region, "DescribeImages", ImageIds=[ami])["Images"]
        except AwsCallError as exc:
            if exc.code not in AMI_NOT_FOUND_CODES:
                notes.append(f"pinned AMI of {region.region} not checked: {exc}")
                continue
            images = []
        if not images:
            refusals.append(ConfigIssue(("regions", i, "ami", "id"),
                f"{ami} is not an image the provider account can launch in {region.region}: AMI ids are regional "
                f"(an id copied from another region names nothing here); `fleetcast ami pin --region "
                f"{region.region}` writes this region's DLAMI id"))
    return refusals, notes


def check_readiness(cfg: FleetConfig, access: Any | None) -> Readiness:
    """Offline findings, plus the AZ and pinned-AMI checks when `access` has the provider account's
    credentials (None: skip them; one AMI id pinned in two regions is refused by validate itself)."""
    found = offline_findings(cfg)
    caller, note = (None, "AZ name -> AZ ID pairs and pinned AMIs not checked: no AWS credentials (run with "
                          f"credentials for provider.account {cfg.provider.account}, e.g. --profile)") \
        if access is None else provider_caller(cfg, access)
    if caller is None:
        assert note is not None  # provider_caller says why it has no caller
        return Readiness(found.refusals, found.warnings, (note,))
    zones, zone_notes = zone_findings(cfg, access, caller)
    amis, ami_notes = ami_findings(cfg, access)
    return Readiness(found.refusals + tuple(zones) + tuple(amis), found.warnings, tuple(zone_notes + ami_notes))


def line_index(path: str | Path) -> dict[tuple[Any, ...], int]:
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
    from fleetcast.contract.errors import FleetcastError

    aws = AwsSession(profile)
    try:
        aws.boto  # noqa: B018 - resolves the profile
    except FleetcastError:
        if strict:
            raise
        return None
    return None if aws.credentials_problem() else aws
