"""Optional live inputs from AWS: on-demand prices (Pricing API) and regional
instance-type offerings (EC2). Both take injectable clients so tests drive them
with botocore's Stubber; the planner never calls AWS unless a flag asks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import date
from typing import Any

from fleetcast.contract.errors import UserError

from .inputs import Availability, Prices

PRICING_REGION = "us-east-1"  # where this command asks the Price List Query API


def _aws_failure(flag: str, exc: Exception, service: str, operation: str, region: str) -> UserError:
    """The shared one-line error (exit 4 for missing access, else 1), plus the way around it."""
    from fleetcast.aws_session import translate

    error = translate(exc, service=service, operation=operation, region=region, other_exit=1)
    return UserError(f"{flag}: AWS call failed ({error}); rerun without {flag} to use the shipped table",
                     error.exit_code)


def _on_demand_usd(price_item: str) -> float | None:
    product = json.loads(price_item)
    for term in product.get("terms", {}).get("OnDemand", {}).values():
        for dim in term.get("priceDimensions", {}).values():
            usd = dim.get("pricePerUnit", {}).get("USD")
            if usd is not None and float(usd) > 0:
                return float(usd)
    return None


def refresh_prices(prices: Prices, instance_types: list[str], regions: list[str], client: Any = None) -> tuple[Prices, list[str]]:
    """Ask the AWS Pricing API for Linux, shared-tenancy on-demand prices; returns (prices, notes)."""
    from botocore.exceptions import BotoCoreError, ClientError

    if client is None:
        from fleetcast.aws_session import AwsSession

        client = AwsSession().client("pricing", PRICING_REGION)
    table = {k: dict(v) for k, v in prices.table.items()}
    notes = []
    for instance_type in instance_types:
        for region in regions:
            filters = [
                {"Type": "TERM_MATCH", "Field": "instanceType", "Value": instance_type},
                {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
                {"Type": "TERM_MATCH", "Field": "operatingSystem", "Value": "Linux"},
                {"Type": "TERM_MATCH", "Field": "tenancy", "Value": "Shared"},
                {"Type": "TERM_MATCH", "Field": "preInstalledSw", "Value": "NA"},
                {"Type": "TERM_MATCH", "Field": "capacitystatus", "Value": "Used"},
            ]
            found, token = None, None
            try:
                while found is None:
                    kwargs = {"ServiceCode": "AmazonEC2", "Filters": filters, "MaxResults": 10}
                    if token:
                        kwargs["NextToken"] = token
                    page = client.get_products(**kwargs)
                    for item in page.get("PriceList", []):
                        found = _on_demand_usd(item)
                        if found is not None:
                            break
                    token = page.get("NextToken")
                    if not token:
                        break
            except (BotoCoreError, ClientError) as exc:
                raise _aws_failure("--refresh-prices", exc, "pricing", "GetProducts", PRICING_REGION) from None
            if found is None:
                notes.append(f"no on-demand price for {instance_type} in {region} from the Pricing API; kept the table's")
            else:
                table.setdefault(instance_type, {})[region] = found
    return Prices(table, f"{date.today().isoformat()} (AWS Pricing API)", "AWS Pricing API"), notes


def live_availability(base: Availability, instance_types: list[str], regions: list[str],
                      client_for: Callable[[str], Any] | None = None) -> Availability:
    """Replace the shipped table by `describe-instance-type-offerings` for each region asked."""
    from botocore.exceptions import BotoCoreError, ClientError

    if client_for is None:
        from fleetcast.aws_session import AwsSession

        session = AwsSession()

        def client_for(region: str) -> Any:
            return session.client("ec2", region)
    live: dict[str, frozenset[str]] = {}
    for region in regions:
        client = client_for(region)
        offered: set[str] = set()
        token = None
        try:
            while True:
                kwargs = {"LocationType": "region", "Filters": [{"Name": "instance-type", "Values": sorted(instance_types)}]}
                if token:
                    kwargs["NextToken"] = token
                page = client.describe_instance_type_offerings(**kwargs)
                offered |= {o["InstanceType"] for o in page.get("InstanceTypeOfferings", [])}
                token = page.get("NextToken")
                if not token:
                    break
        except (BotoCoreError, ClientError) as exc:
            raise _aws_failure("--live-availability", exc, "ec2", "DescribeInstanceTypeOfferings", region) from None
        live[region] = frozenset(offered)
    return Availability(base.families, f"{base.as_of}; live for {', '.join(regions)} on {date.today().isoformat()}", live)
