"""PROXY protocol version 2: the header the NLB puts in front of every connection.

Behind PrivateLink the instance sees the NLB's addresses, never the consumer's.
With proxy protocol v2 on the target group, each connection (health checks
included) starts with a binary header carrying the original addresses and, for
PrivateLink traffic, an AWS TLV (type 0xEA, subtype 0x01) holding the id of the
consumer's VPC endpoint: that id is what identifies the consumer.

Layout (haproxy's proxy-protocol.txt, section 2.2):
  12 bytes  signature  \\r\\n\\r\\n\\x00\\r\\nQUIT\\n
   1 byte   version (high nibble, must be 2) | command (low nibble: 0 LOCAL, 1 PROXY)
   1 byte   family (high: 0 UNSPEC, 1 INET, 2 INET6, 3 UNIX) | transport (low: 0 UNSPEC, 1 STREAM, 2 DGRAM)
   2 bytes  length of what follows, network order
  addresses (12 bytes INET, 36 INET6, 216 UNIX), then TLVs (type, 2-byte length, value) to the end.

Everything here is pure parsing over bytes, so it is tested against headers
built byte by byte from the spec; a malformed header raises ProxyHeaderError
and never anything else.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass, field

SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
HEADER_PREFIX_LEN = 16  # signature + ver/cmd + fam + len

CMD_LOCAL = 0x0
CMD_PROXY = 0x1

AF_UNSPEC = 0x0
AF_INET = 0x1
AF_INET6 = 0x2
AF_UNIX = 0x3

PP2_TYPE_ALPN = 0x01
PP2_TYPE_AUTHORITY = 0x02
PP2_TYPE_CRC32C = 0x03
PP2_TYPE_NOOP = 0x04
PP2_TYPE_UNIQUE_ID = 0x05
PP2_TYPE_SSL = 0x20
PP2_TYPE_NETNS = 0x30
PP2_TYPE_AWS = 0xEA
PP2_SUBTYPE_AWS_VPCE_ID = 0x01

_INET = struct.Struct("!4s4sHH")
_INET6 = struct.Struct("!16s16sHH")
_ADDRESS_LEN = {AF_UNSPEC: 0, AF_INET: 12, AF_INET6: 36, AF_UNIX: 216}

# A LOCAL header with no addresses: what a local probe (the supervisor, the
# benchmark) sends so that it passes a gateway that requires the header.
LOCAL_HEADER = SIGNATURE + bytes([0x20, 0x00]) + b"\x00\x00"


class ProxyHeaderError(ValueError):
    """The connection did not start with a well-formed PROXY v2 header."""


@dataclass(frozen=True)
class ProxyHeader:
    """What the header said. `local` headers (health checks, probes) carry no consumer."""

    command: int
    family: int
    transport: int
    source: tuple[str, int] | None = None
    destination: tuple[str, int] | None = None
    tlvs: tuple[tuple[int, bytes], ...] = field(default=())
    length: int = 0  # total header bytes, prefix included

    @property
    def local(self) -> bool:
        return self.command == CMD_LOCAL

    @property
    def vpce_id(self) -> str | None:
        """The consumer's VPC endpoint id from the AWS TLV, or None (health checks, non-PrivateLink)."""
        if self.local:
            return None
        for kind, value in self.tlvs:
            if kind == PP2_TYPE_AWS and value[:1] == bytes([PP2_SUBTYPE_AWS_VPCE_ID]):
                return value[1:].decode("ascii", errors="replace")
        return None


def header_length(prefix: bytes) -> int:
    """Total header length from its first 16 bytes; raises ProxyHeaderError if they are not a v2 prefix."""
    if len(prefix) < HEADER_PREFIX_LEN:
        raise ProxyHeaderError("truncated PROXY v2 header")
    if prefix[:12] != SIGNATURE:
        if prefix[:6] == b"PROXY ":
            raise ProxyHeaderError("PROXY protocol v1 (text) header: only v2 is accepted")
        raise ProxyHeaderError("connection does not start with a PROXY v2 signature")
    version = prefix[12] >> 4
    if version != 2:
        raise ProxyHeaderError(f"PROXY protocol version {version}: only 2 is accepted")
    length: int = struct.unpack("!H", prefix[14:16])[0]
    return HEADER_PREFIX_LEN + length


def parse(data: bytes) -> ProxyHeader:
    """Parse one complete header (exactly `header_length(data[:16])` bytes, or more: the rest is ignored)."""
    total = header_length(data)
    if len(data) < total:
        raise ProxyHeaderError(f"truncated PROXY v2 header: {len(data)} of {total} bytes")
    command = data[12] & 0x0F
    family, transport = data[13] >> 4, data[13] & 0x0F
    if command not in (CMD_LOCAL, CMD_PROXY):
        raise ProxyHeaderError(f"unknown PROXY v2 command {command:#x}")
    if family not in _ADDRESS_LEN:
        raise ProxyHeaderError(f"unknown PROXY v2 address family {family:#x}")
    if transport > 2:
        raise ProxyHeaderError(f"unknown PROXY v2 transport {transport:#x}")
    body = data[HEADER_PREFIX_LEN:total]
    if command == CMD_LOCAL:
        # The spec says a receiver must ignore a LOCAL header's address block
        # (and any TLVs); the connection's own endpoints apply.
        return ProxyHeader(command, family, transport, length=total)
    addr_len = _ADDRESS_LEN[family]
    if len(body) < addr_len:
        raise ProxyHeaderError(f"PROXY v2 address block needs {addr_len} bytes, header has {len(body)}")
    source = destination = None
    # IPv4 through inet_ntop (in C, the same dotted quad as ipaddress); IPv6 through ipaddress, whose text
    # (RFC 5952) glibc's inet_ntop does not match for IPv4-mapped and -compatible addresses.
    if family == AF_INET:
        src, dst, sport, dport = _INET.unpack_from(body)
        source = (socket.inet_ntop(socket.AF_INET, src), sport)
        destination = (socket.inet_ntop(socket.AF_INET, dst), dport)
    elif family == AF_INET6:
        src, dst, sport, dport = _INET6.unpack_from(body)
        source = (str(ipaddress.IPv6Address(src)), sport)
        destination = (str(ipaddress.IPv6Address(dst)), dport)
    return ProxyHeader(command, family, transport, source, destination, _parse_tlvs(body[addr_len:]), total)


def _parse_tlvs(data: bytes) -> tuple[tuple[int, bytes], ...]:
    tlvs, offset = [], 0
    while offset < len(data):
        if len(data) - offset < 3:
            raise ProxyHeaderError("truncated PROXY v2 TLV header")
        kind, length = data[offset], struct.unpack("!H", data[offset + 1 : offset + 3])[0]
        start, end = offset + 3, offset + 3 + length
        if end > len(data):
            raise ProxyHeaderError(f"PROXY v2 TLV {kind:#x} claims {length} bytes, {len(data) - start} left")
        value = data[start:end]
        if kind == PP2_TYPE_AWS and length < 1:
            raise ProxyHeaderError("PROXY v2 AWS TLV without a subtype")
        tlvs.append((kind, value))
        offset = end
    return tuple(tlvs)


# ---------------------------------------------------------------- building (tests, probes, benchmark)


def tlv(kind: int, value: bytes) -> bytes:
    return struct.pack("!BH", kind, len(value)) + value


def aws_vpce_tlv(vpce_id: str) -> bytes:
    return tlv(PP2_TYPE_AWS, bytes([PP2_SUBTYPE_AWS_VPCE_ID]) + vpce_id.encode("ascii"))


def build(
    source: tuple[str, int] = ("10.60.1.10", 40000),
    destination: tuple[str, int] = ("10.40.0.5", 8000),
    *,
    vpce_id: str | None = None,
    extra_tlvs: bytes = b"",
    command: int = CMD_PROXY,
) -> bytes:
    """A PROXY v2 header as an NLB sends it (the family follows the source address)."""
    ip = ipaddress.ip_address(source[0])
    if ip.version == 4:
        fam, addrs = AF_INET, struct.pack(
            "!4s4sHH", ip.packed, ipaddress.IPv4Address(destination[0]).packed, source[1], destination[1])
    else:
        fam, addrs = AF_INET6, struct.pack(
            "!16s16sHH", ip.packed, ipaddress.IPv6Address(destination[0]).packed, source[1], destination[1])
    body = addrs + (aws_vpce_tlv(vpce_id) if vpce_id else b"") + extra_tlvs
    return SIGNATURE + bytes([0x20 | command, (fam << 4) | 0x1]) + struct.pack("!H", len(body)) + body
