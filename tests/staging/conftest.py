import boto3
import pytest
from botocore.config import Config


@pytest.fixture
def clients(aws_env):
    cache = {}

    def client(service, region):
        if (service, region) not in cache:
            cache[(service, region)] = boto3.client(service, region_name=region, endpoint_url=aws_env,
                                                    config=Config(retries={"mode": "standard", "max_attempts": 2}))
        return cache[(service, region)]

    return client


@pytest.fixture
def make_bucket(clients):
    import uuid

    def make(region: str) -> str:
        name = f"fleetcast-test-{uuid.uuid4().hex[:12]}"
        kwargs = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
        clients("s3", region).create_bucket(Bucket=name, **kwargs)
        return name

    return make
