"""PROXY protocol v2 parsing against header bytes written out from the specification.

Spec: haproxy doc/proxy-protocol.txt section 2.2; AWS TLV: NLB docs (type 0xEA,
subtype 0x01 = VPC endpoint id). The headers below are spelled byte by byte,
not produced by the gateway's own builder, so a builder bug cannot hide a
parser bug.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from runtime.gateway import ppv2

SIG = b"\x0D\x0A\x0D\x0A\x00\x0D\x0A\x51\x55\x49\x54\x0A"
VPCE = b"vpce-08d2bf15fac5001c9"
AWS_TLV = b"\xEA" + (1 + len(VPCE)).to_bytes(2, "big") + b"\x01" + VPCE


def test_ipv4_proxy_header_with_aws_vpce_tlv():
    addresses = bytes([10, 60, 1, 10]) + bytes([10, 40, 0, 5]) + (40000).to_bytes(2, "big") + (8000).to_bytes(2, "big")
    body = addresses + AWS_TLV
    raw = SIG + b"\x21" + b"\x11" + len(body).to_bytes(2, "big") + body
    header = ppv2.parse(raw)
    assert not header.local
    assert header.family == ppv2.AF_INET and header.transport == 1
    assert header.source == ("10.60.1.10", 40000)
    assert header.destination == ("10.40.0.5", 8000)
    assert header.vpce_id == "vpce-08d2bf15fac5001c9"
    assert header.length == len(raw) == 16 + 12 + 3 + 1 + len(VPCE)


def test_ipv6_header_and_unrelated_tlvs_around_the_aws_one():
    src = bytes.fromhex("fd00000000000000000000000000000a")
    dst = bytes.fromhex("fd000000000000000000000000000005")
    noop = b"\x04\x00\x02\x00\x00"  # PP2_TYPE_NOOP, 2 bytes
    alpn = b"\x01\x00\x02h2"  # PP2_TYPE_ALPN
    body = src + dst + (51000).to_bytes(2, "big") + (443).to_bytes(2, "big") + noop + AWS_TLV + alpn
    header = ppv2.parse(SIG + b"\x21\x21" + len(body).to_bytes(2, "big") + body)
    assert header.source == ("fd00::a", 51000) and header.destination == ("fd00::5", 443)
    assert header.vpce_id == "vpce-08d2bf15fac5001c9"
    assert [kind for kind, _ in header.tlvs] == [0x04, 0xEA, 0x01]


def test_local_command_is_a_health_check_without_consumer():
    # The NLB's own health checks: LOCAL, UNSPEC family, no addresses.
    header = ppv2.parse(SIG + b"\x20\x00\x00\x00")
    assert header.local and header.vpce_id is None and header.source is None
    # A LOCAL header may still carry an address block: the receiver must skip it, not trust it.
    body = bytes(12) + AWS_TLV
    header = ppv2.parse(SIG + b"\x20\x11" + len(body).to_bytes(2, "big") + body)
    assert header.local and header.vpce_id is None and header.length == 16 + len(body)


def test_unspec_family_proxy_command_has_no_addresses_but_keeps_tlvs():
    header = ppv2.parse(SIG + b"\x21\x00" + len(AWS_TLV).to_bytes(2, "big") + AWS_TLV)
    assert header.source is None and header.vpce_id == "vpce-08d2bf15fac5001c9"


def test_aws_tlv_with_another_subtype_is_not_an_endpoint_id():
    other = b"\xEA\x00\x05\x02abcd"
    body = bytes(12) + other
    assert ppv2.parse(SIG + b"\x21\x11" + len(body).to_bytes(2, "big") + body).vpce_id is None


def test_bytes_after_the_header_belong_to_the_stream():
    raw = SIG + b"\x20\x00\x00\x00"
    assert ppv2.parse(raw + b"GET / HTTP/1.1\r\n").length == 16


def test_builder_agrees_with_hand_written_bytes():
    addresses = bytes([10, 60, 1, 10, 10, 40, 0, 5]) + (40000).to_bytes(2, "big") + (8000).to_bytes(2, "big")
    body = addresses + AWS_TLV
    expected = SIG + b"\x21\x11" + len(body).to_bytes(2, "big") + body
    assert ppv2.build(("10.60.1.10", 40000), ("10.40.0.5", 8000), vpce_id=VPCE.decode()) == expected
    assert ppv2.LOCAL_HEADER == SIG + b"\x20\x00\x00\x00"


MALFORMED = {
    "wrong signature": b"\x0D\x0A\x0D\x0A\x00\x0D\x0A\x51\x55\x49\x54\x0B" + b"\x21\x11\x00\x0c" + bytes(12),
    "v1 text header": b"PROXY TCP4 10.0.0.1 10.0.0.2 1111 2222\r\n",
    "version 1 nibble": SIG + b"\x11\x11\x00\x0c" + bytes(12),
    "version 3 nibble": SIG + b"\x31\x11\x00\x0c" + bytes(12),
    "unknown command": SIG + b"\x22\x11\x00\x0c" + bytes(12),
    "unknown family": SIG + b"\x21\x41\x00\x0c" + bytes(12),
    "unknown transport": SIG + b"\x21\x13\x00\x0c" + bytes(12),
    "address block short": SIG + b"\x21\x11\x00\x08" + bytes(8),
    "ipv6 block short": SIG + b"\x21\x21\x00\x0c" + bytes(12),
    "length beyond data": SIG + b"\x21\x11\x00\x40" + bytes(12),
    "prefix truncated": SIG + b"\x21",
    "tlv header truncated": SIG + b"\x21\x11\x00\x0e" + bytes(12) + b"\xEA\x00",
    "tlv value overruns": SIG + b"\x21\x11\x00\x11" + bytes(12) + b"\xEA\x00\x09\x01v",
    "aws tlv without subtype": SIG + b"\x21\x11\x00\x0f" + bytes(12) + b"\xEA\x00\x00",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_headers_raise_only_proxy_header_error(name):
    with pytest.raises(ppv2.ProxyHeaderError):
        ppv2.parse(MALFORMED[name])


def test_v1_header_is_named_in_the_error():
    with pytest.raises(ppv2.ProxyHeaderError, match="v1"):
        ppv2.parse(MALFORMED["v1 text header"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # no timing verdicts
@given(st.binary(min_size=0, max_size=80), st.integers(0, 255), st.integers(0, 255))
def test_arbitrary_bytes_after_the_signature_never_crash_the_parser(tail, ver_cmd, fam):
    raw = SIG + bytes([ver_cmd, fam]) + len(tail).to_bytes(2, "big") + tail
    try:
        header = ppv2.parse(raw)
    except ppv2.ProxyHeaderError:
        return
    assert header.length == len(raw)
    assert header.vpce_id is None or isinstance(header.vpce_id, str)
