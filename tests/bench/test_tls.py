"""HTTPS endpoints (an NLB TLS listener): certificates verified, a private CA by --ca-bundle,
reads stamped on the clock (kernel stamps need plain TCP)."""

import datetime
import ipaddress

import pytest

from fleetcast.bench.accuracy import TestServerProcess
from fleetcast.bench.distributions import parse_distribution
from fleetcast.bench.runner import Bench, BenchOptions, Level
from fleetcast.bench.testserver import Timings
from fleetcast.contract.errors import UserError
from tests.bench.conftest import free_port


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    d = tmp_path_factory.mktemp("tls")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleetcast-bench-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = d / "cert.pem", d / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    with TestServerProcess(free_port(), Timings(ttft_ms=10, itl_ms=2), tls=(str(cert_path), str(key_path))) as server:
        yield server, str(cert_path)


def _opts(url, **kw):
    return BenchOptions(endpoint=url, levels=[Level("concurrency", concurrency=2)], requests_per_level=6, warmup=0,
                        input_tokens=parse_distribution("16", "x"), output_tokens=parse_distribution("6", "y"), **kw)


def test_https_with_a_private_ca(tls_server):
    server, ca = tls_server
    assert server.url.startswith("https://")
    s = Bench(_opts(server.url, ca_bundle=ca)).run().runs[0].summary
    assert (s.completed, s.errors) == (6, 0)
    assert s.rx_timestamps == "clock"
    assert s.ttft_ms.p50 >= 10


def test_an_untrusted_certificate_is_refused(tls_server):
    server, _ = tls_server
    with pytest.raises(UserError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        Bench(_opts(server.url)).run()
