"""Who may connect: the one rule shared by the CLI and the auto-approver.

An account may have its endpoint connections accepted in a region when the
region's `allowed_principals` name a principal of that account (its root, a
role or a user). The endpoint service's own permissions come from the same
list, so a request from any other account means the service was opened outside
the config, or the config has since dropped the account: either way a person
decides, never a default.

The config is described by the attributes read here (fleetcast.config's models have them).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol


class _Consumer(Protocol):
    @property
    def account(self) -> str: ...
    @property
    def vpc_id(self) -> str: ...


class _Region(Protocol):
    @property
    def allowed_principals(self) -> Sequence[str]: ...


class FleetConfig(Protocol):
    def region(self, name: str) -> _Region: ...
    def consumers_of(self, region: str) -> Sequence[_Consumer]: ...

_PRINCIPAL_ACCOUNT = re.compile(r"^arn:aws[a-z-]*:iam::(\d{12}):")
ACCOUNT_ID = re.compile(r"^\d{12}$")


def account_of(principal_arn: str) -> str:
    """The 12-digit account id of an IAM principal ARN (validated by the config model)."""
    match = _PRINCIPAL_ACCOUNT.match(principal_arn)
    if not match:
        raise ValueError(f"{principal_arn!r} is not an IAM principal ARN")
    return match.group(1)


def allowed_accounts(cfg: FleetConfig, region: str) -> frozenset[str]:
    """Accounts whose connection requests the config allows in `region`."""
    return frozenset(account_of(arn) for arn in cfg.region(region).allowed_principals)


def consumer_vpcs(cfg: FleetConfig, region: str) -> dict[str, tuple[str, ...]]:
    """VPC ids the config lists per consumer account for `region`.

    EC2 does not tell the service owner which VPC an endpoint lives in; this is
    what the config expects, shown next to each connection for orientation.
    """
    out: dict[str, list[str]] = {}
    for consumer in cfg.consumers_of(region):
        out.setdefault(consumer.account, []).append(consumer.vpc_id)
    return {account: tuple(vpcs) for account, vpcs in out.items()}
