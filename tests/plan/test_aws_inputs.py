"""--refresh-prices and --live-availability, driven through botocore's Stubber (no AWS)."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber

from fleetcast.contract.errors import UserError
from fleetcast.plan.aws import live_availability, refresh_prices
from fleetcast.plan.inputs import load_prices, shipped_availability
from fleetcast.plan.run import PlanOptions, build_packing

from .conftest import SEED


def _price_item(usd: str) -> str:
    return json.dumps({"product": {"attributes": {"instanceType": "g6e.xlarge"}}, "terms": {"OnDemand": {"X.JRTCKXETXF": {
        "priceDimensions": {"X.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "pricePerUnit": {"USD": usd}}}}}}})


def _filters(instance_type: str, region: str) -> list[dict]:
    return [{"Type": "TERM_MATCH", "Field": f, "Value": v} for f, v in (
        ("instanceType", instance_type), ("regionCode", region), ("operatingSystem", "Linux"),
        ("tenancy", "Shared"), ("preInstalledSw", "NA"), ("capacitystatus", "Used"))]


def test_refresh_prices_reads_the_on_demand_price():
    client = boto3.client("pricing", region_name="us-east-1")
    with Stubber(client) as stub:
        stub.add_response("get_products", {"PriceList": [_price_item("2.5000000000")], "FormatVersion": "aws_v1"},
                          {"ServiceCode": "AmazonEC2", "Filters": _filters("g6e.xlarge", "ap-northeast-2"), "MaxResults": 10})
        stub.add_response("get_products", {"PriceList": []},
                          {"ServiceCode": "AmazonEC2", "Filters": _filters("g6e.xlarge", "us-east-1"), "MaxResults": 10})
        prices, notes = refresh_prices(load_prices(None), ["g6e.xlarge"], ["ap-northeast-2", "us-east-1"], client=client)
        stub.assert_no_pending_responses()
    assert prices.price("g6e.xlarge", "ap-northeast-2") == 2.5
    assert prices.price("g6e.xlarge", "us-east-1") == 1.861          # kept from the shipped table
    assert notes == ["no on-demand price for g6e.xlarge in us-east-1 from the Pricing API; kept the table's"]
    assert "AWS Pricing API" in prices.as_of


def test_refresh_prices_failure_is_a_clear_error():
    client = boto3.client("pricing", region_name="us-east-1")
    with Stubber(client) as stub:
        stub.add_client_error("get_products", "AccessDeniedException", "not authorized to perform pricing:GetProducts")
        with pytest.raises(UserError, match=r"^--refresh-prices: AWS call failed .*rerun without --refresh-prices"):
            refresh_prices(load_prices(None), ["g6e.xlarge"], ["us-east-1"], client=client)


def _ec2_stub(region: str, offered: list[str], types: list[str]):
    client = boto3.client("ec2", region_name=region)
    stub = Stubber(client)
    stub.add_response("describe_instance_type_offerings",
                      {"InstanceTypeOfferings": [{"InstanceType": t, "LocationType": "region", "Location": region} for t in offered]},
                      {"LocationType": "region", "Filters": [{"Name": "instance-type", "Values": sorted(types)}]})
    stub.activate()
    return client, stub


def test_live_availability_overrides_the_shipped_table():
    types = ["g6e.xlarge", "g7e.2xlarge"]
    seoul, s1 = _ec2_stub("ap-northeast-2", ["g6e.xlarge", "g7e.2xlarge"], types)
    virginia, s2 = _ec2_stub("us-east-1", ["g6e.xlarge"], types)
    clients = {"ap-northeast-2": seoul, "us-east-1": virginia}
    live = live_availability(shipped_availability(), types, list(clients), client_for=clients.__getitem__)
    s1.assert_no_pending_responses()
    s2.assert_no_pending_responses()
    assert live.offered("g7e.2xlarge", "ap-northeast-2")           # the shipped table says no
    assert not live.offered("g7e.2xlarge", "us-east-1")            # the shipped table says yes
    assert live.offered("g6e.xlarge", "us-east-2")                 # not asked live: shipped table


def test_a_live_g7e_offer_in_seoul_with_a_price_moves_its_reason_from_availability_to_support(tmp_path):
    """If AWS now offers g7e in Seoul and a price is known, the planner no longer rules it out as not offered; the
    support matrix still refuses GPT-2's engine flow on its sm120 (fleetcast/contract/support.py)."""
    prices = tmp_path / "prices.yaml"
    prices.write_text('as_of: "2026-02-01"\nprices: {g7e.2xlarge: {ap-northeast-2: 4.10}}\n')

    def client_for(region: str):
        client = boto3.client("ec2", region_name=region)
        stub = Stubber(client)
        offered = ["g5.xlarge", "g6e.xlarge", "g7e.2xlarge"] if region == "ap-northeast-2" else []
        stub.add_response("describe_instance_type_offerings",
                          {"InstanceTypeOfferings": [{"InstanceType": t, "LocationType": "region", "Location": region}
                                                     for t in offered]})
        stub.activate()
        return client

    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / "traffic-seoul.yaml"), config=None,
                       ttft_p99_ms=300, itl_p99_ms=40, prices=str(prices), live_availability=True, ec2_client_for=client_for)
    result, _, _ = build_packing(opts)
    (plan,) = result.regions
    assert plan.winner.label == "g6e.xlarge [gpt2-xl int8_wo x1]"
    assert "g7e.2xlarge" not in plan.not_offered
    why = dict(plan.refused)["gpt2-xl fp8 on g7e.2xlarge"]
    assert "not offered" not in why.split(";")[0] and "tensorrt backend is not supported on g7e.2xlarge" in why


def test_live_availability_without_a_price_says_so():
    def client_for(region: str):
        client = boto3.client("ec2", region_name=region)
        stub = Stubber(client)
        stub.add_response("describe_instance_type_offerings", {"InstanceTypeOfferings": [
            {"InstanceType": "g7e.2xlarge", "LocationType": "region", "Location": region}]})
        stub.activate()
        return client

    opts = PlanOptions(results=[str(SEED / "results" / "g7e.2xlarge-fp8.json")], traffic=str(SEED / "traffic-seoul.yaml"),
                       config=None, ttft_p99_ms=300, itl_p99_ms=40, live_availability=True, ec2_client_for=client_for)
    result, _, _ = build_packing(opts)
    (plan,) = result.regions
    assert plan.winner is None and plan.not_offered == []  # offered now, live
    assert dict(plan.ruled_out())["g7e.2xlarge"].startswith("no price in ap-northeast-2 (prices as of ")
