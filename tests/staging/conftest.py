import socket

import boto3
import pytest
from botocore.config import Config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint():
    """A real S3 API on loopback (moto server), shared by the staging tests."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def aws_env(monkeypatch, moto_endpoint):
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    return moto_endpoint


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
