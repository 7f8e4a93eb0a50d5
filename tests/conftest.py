"""Fixtures shared by every test area: one loopback moto server for the session (a real AWS API for
S3, Secrets Manager, CloudWatch and Auto Scaling; never AWS) and the dummy-credential environment that
points boto3 at it. Tests that share the server keep apart by their own names (unique buckets, secrets)
or by resetting it (tests/usage)."""

import pytest


@pytest.fixture(scope="session")
def moto_endpoint():
    # Imported here, not at collection: moto is heavy and most test runs (`-k`, one file) never need it.
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_env(monkeypatch, moto_endpoint):
    """Dummy credentials and AWS_ENDPOINT_URL=moto for this test; no profile or instance role is consulted."""
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    return moto_endpoint
