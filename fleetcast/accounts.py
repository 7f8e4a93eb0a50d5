"""Which credentials act in which AWS account when a fleet spans several (every valid config does).

`fleetcast deploy` and `teardown` take `--profile-for ACCOUNT=PROFILE` per account, `--profile` for the
rest, and `--account` to act in some accounts only. CDK needs the target account's own credentials to
bootstrap it; a deploy may also come from another account's credentials when the target was bootstrapped
to trust that account (`cdk bootstrap --trust`, the CDK Pipelines model: awsdocs/aws-cdk-guide
v2/cdk_pipeline.md, "Bootstrap your AWS environments"), and the CDK CLI then assumes the target's
bootstrap deploy role.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fleetcast.config import FleetConfig
from fleetcast.contract.errors import UserError

_ACCOUNT = re.compile(r"[0-9]{12}")


def fleet_accounts(cfg: FleetConfig) -> dict[str, str]:
    """Every account of the fleet -> what it holds, provider first ("provider (regions)", "consumer a, b")."""
    out = {cfg.provider.account: f"provider ({', '.join(r.region for r in cfg.regions)})"}
    for consumer in cfg.consumers:
        role = out.get(consumer.account)
        out[consumer.account] = f"{role}, {consumer.name}" if role else f"consumer {consumer.name}"
    return out


def parse_profile_for(values: Iterable[str] | None) -> dict[str, str]:
    """`--profile-for ACCOUNT=PROFILE` values -> {account: profile}; a malformed or repeated one is a usage error."""
    out: dict[str, str] = {}
    for value in values or ():
        account, sep, profile = value.partition("=")
        if not sep or not _ACCOUNT.fullmatch(account) or not profile.strip():
            raise UserError(f"--profile-for {value!r}: expected ACCOUNT=PROFILE with a 12-digit account id", 2)
        if account in out and out[account] != profile:
            raise UserError(f"--profile-for names account {account} twice ({out[account]}, {profile})", 2)
        out[account] = profile
    return out


@dataclass(frozen=True)
class AccountAccess:
    """The profile acting in each account, and the accounts a run acts in (`only`; None: all)."""

    default: str | None = None
    per_account: Mapping[str, str] = field(default_factory=dict)
    only: frozenset[str] | None = None

    @classmethod
    def from_args(cls, cfg: FleetConfig, *, profile: str | None, profile_for: Sequence[str] | None,
                  accounts: Sequence[str] | None) -> AccountAccess:
        known = fleet_accounts(cfg)
        per_account = parse_profile_for(profile_for)
        for flag, named in (("--profile-for", per_account), ("--account", accounts or ())):
            for account in named:
                if account not in known:
                    raise UserError(f"{flag} {account} is not an account of fleet {cfg.name}; its accounts: "
                                    f"{', '.join(known)}", 2)
        return cls(default=profile, per_account=per_account, only=frozenset(accounts) if accounts else None)

    def profile_of(self, account: str) -> str | None:
        return self.per_account.get(account, self.default)

    def acts_in(self, account: str) -> bool:
        return self.only is None or account in self.only

    def cdk_args(self, account: str) -> list[str]:
        profile = self.profile_of(account)
        return ["--profile", profile] if profile else []

    cli_args = cdk_args  # `fleetcast` sub-commands take the same flag

    def describe(self, cfg: FleetConfig, *, trust: str | None = None, policies: Sequence[str] = (),
                 bootstrapping: bool = False) -> list[str]:
        """Who acts where, for `--dry-run`: one line per account, the bootstrap trust the run asks for, and a
        warning where one profile would bootstrap several accounts (it can be in only one of them)."""
        lines = ["Accounts (the profile acting in each; --profile-for ACCOUNT=PROFILE changes one):"]
        for account, role in fleet_accounts(cfg).items():
            profile = self.profile_of(account)
            who = f"profile {profile}" if profile else "the default credential chain"
            skipped = "" if self.acts_in(account) else "   (not acted in: --account)"
            lines.append(f"  {account}  {role:<40} {who}{skipped}")
        acting: dict[str | None, list[str]] = {}
        for account in (a for a in fleet_accounts(cfg) if self.acts_in(a)):
            acting.setdefault(self.profile_of(account), []).append(account)
        for profile, accounts in acting.items():
            if bootstrapping and len(accounts) > 1:
                who = f"profile {profile}" if profile else "the default credential chain"
                lines.append(f"Warning: {who} would bootstrap {len(accounts)} accounts ({', '.join(accounts)}); "
                             "bootstrapping needs each account's own credentials: --profile-for ACCOUNT=PROFILE")
        if trust:
            lines.append(f"Bootstrap trust: each account above lets {trust} deploy into it "
                         f"(cdk bootstrap --trust {trust} --trust-for-lookup {trust} "
                         f"--cloudformation-execution-policies {','.join(policies)})")
        return lines

    def check_identities(self, cfg: FleetConfig, caller_account: Callable[[str | None], str],
                         *, bootstrapping: bool) -> list[str]:
        """Resolve each acting profile's account (sts:GetCallerIdentity through `caller_account`) and return the
        refusals: a profile of another account cannot bootstrap an account (a deploy from one can, through the
        target's bootstrap trust). Raises nothing; the caller decides (a dry run prints, a deploy refuses)."""
        problems: list[str] = []
        resolved: dict[str | None, str] = {}
        for account in (a for a in fleet_accounts(cfg) if self.acts_in(a)):
            profile = self.profile_of(account)
            if profile not in resolved:
                resolved[profile] = caller_account(profile)
            actual = resolved[profile]
            if actual != account and bootstrapping:
                who = f"profile {profile}" if profile else "the default credentials"
                problems.append(f"{who} act(s) in account {actual}, not {account}: bootstrapping {account} needs "
                                f"that account's own credentials (--profile-for {account}=PROFILE)")
        return problems


def caller_account_via_sts(region: str) -> Callable[[str | None], str]:
    """`profile -> account` by sts:GetCallerIdentity (which needs no permission) in `region`."""
    from fleetcast.aws_session import AwsSession

    def caller_account(profile: str | None) -> str:
        account: str = AwsSession(profile, region).call("sts", region, "GetCallerIdentity")["Account"]
        return account

    return caller_account
