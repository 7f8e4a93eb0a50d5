"""The caller's identity on a forwarded request, in a form only another gateway of the fleet can assert.

A request one gateway forwards to another (a remote region's gateway through the provider-owned spill endpoint,
issue 36 section 2; a peer instance of the same region, section 1) arrives there from the provider's own
endpoint or a peer instance, not from the consumer's: the PROXY v2 header names the provider's VPC endpoint,
whose owner is the provider account. Which consumer it is for travels in one header, `X-Fleetcast-Peer`:

    v1.<base64url(JSON claim)>.<base64url(HMAC-SHA256(key, "v1." + the claim's base64url))>

The claim holds the consumer, the model id it asked for, the origin and destination regions, the hop count,
a millisecond timestamp, a random nonce and the SHA-256 of the body. The key is the fleet's peer secret
(fleetcast.contract.spill.peer_secret_of, provided by the stacks), held by the gateways only. The receiving
gateway accepts the header only on a connection from the provider's spill endpoint or a peer (server.py decides
that, from the PROXY v2 header) and only when the MAC matches, the destination is its own region, the hop
count is within MAX_HOPS, the timestamp is within FRESH_S of its clock, the nonce was not seen in that window
and the body is the one signed. Entitlement was checked once, at home, before signing: the receiver trusts
the claim's consumer and model, and checks only that it serves the model and that the consumer's residency
allows this region (a second line behind the home's decision).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

PEER_HEADER = "X-Fleetcast-Peer"
PEER_HEADER_LOWER = PEER_HEADER.lower()
VERSION = "v1"
MAX_HOPS = 1  # a forwarded request is never forwarded again: at most one hop
FRESH_S = 30.0  # how far a claim's timestamp may be from the receiver's clock (NTP-synced instances: far less)
MIN_KEY_BYTES = 32


@dataclass(frozen=True)
class Claim:
    consumer: str
    model: str
    origin: str  # the consumer's home region, where entitlement was checked
    destination: str  # the region (or instance) the claim is for
    hop: int
    ts_ms: int
    nonce: str
    body_sha256: str


class PeerRefused(Exception):
    """The header is not a claim this gateway may accept; the message says which check failed."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def check_key(key: bytes) -> bytes:
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"the peer key has {len(key)} bytes; at least {MIN_KEY_BYTES} are needed (HMAC-SHA256)")
    return key


def _mac(key: bytes, signed: str) -> str:
    return _b64(hmac.new(key, signed.encode("ascii"), hashlib.sha256).digest())


def sign(key: bytes, *, consumer: str, model: str, origin: str, destination: str, body: bytes, hop: int = 1,
         now: Callable[[], float] = time.time) -> str:
    """The header value for one forwarded attempt (a fresh nonce each call: a retry signs anew)."""
    claim = {"c": consumer, "m": model, "o": origin, "d": destination, "h": hop, "t": int(now() * 1000),
             "n": os.urandom(16).hex(), "b": hashlib.sha256(body).hexdigest()}
    payload = _b64(json.dumps(claim, separators=(",", ":"), sort_keys=True).encode())
    signed = f"{VERSION}.{payload}"
    return f"{signed}.{_mac(key, signed)}"


class Verifier:
    """Checks claims for one receiving gateway (`destination`: its region), remembering nonces it accepted.

    Nonces are remembered for 2 x FRESH_S (a claim older than FRESH_S is refused anyway). `first_use`: where
    they are remembered when several gateway workers share the port (shared.SharedState.first_use: one table
    for every worker, so a claim replayed to another worker is refused too); None: in this process."""

    def __init__(self, key: bytes, destination: str, now: Callable[[], float] = time.time,
                 first_use: Callable[[str, float, float], bool | None] | None = None):
        self.key = check_key(key)
        self.destination = destination
        self.now = now
        self._seen: dict[str, float] = {}
        self._next_prune = 0.0
        self._first_use = first_use if first_use is not None else self._first_use_here

    def verify(self, header: str, body: bytes) -> Claim:
        parts = header.strip().split(".")
        if len(parts) != 3 or parts[0] != VERSION:
            raise PeerRefused("malformed peer claim")
        signed = f"{parts[0]}.{parts[1]}"
        if not hmac.compare_digest(_mac(self.key, signed), parts[2]):
            raise PeerRefused("peer claim signature does not match")
        try:
            raw = json.loads(_unb64(parts[1]))
            claim = Claim(str(raw["c"]), str(raw["m"]), str(raw["o"]), str(raw["d"]), int(raw["h"]), int(raw["t"]),
                          str(raw["n"]), str(raw["b"]))
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise PeerRefused("malformed peer claim") from None
        now = self.now()
        if claim.destination != self.destination:
            raise PeerRefused(f"peer claim is for {claim.destination}, not {self.destination}")
        if not 1 <= claim.hop <= MAX_HOPS:
            raise PeerRefused(f"peer claim has hop {claim.hop}; at most {MAX_HOPS} hop is allowed")
        if abs(now - claim.ts_ms / 1000) > FRESH_S:
            raise PeerRefused(f"peer claim is stale (more than {FRESH_S:g} s from this clock)")
        if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), claim.body_sha256):
            raise PeerRefused("peer claim was signed for another body")
        first = self._first_use(claim.nonce, now + 2 * FRESH_S, now)
        if first is None:
            raise PeerRefused("too many peer claims in the last minute to tell a replay apart")
        if not first:
            raise PeerRefused("peer claim was already used (replay)")
        return claim

    def _first_use_here(self, nonce: str, until: float, now: float) -> bool:
        if now >= self._next_prune:
            self._seen = {n: t for n, t in self._seen.items() if t > now}
            self._next_prune = now + FRESH_S
        if nonce in self._seen:
            return False
        self._seen[nonce] = until
        return True


def read_key_file(path: str) -> bytes:
    """A key file holds the secret as text (what Secrets Manager's SecretString gives): its UTF-8 bytes."""
    with open(path, "rb") as f:
        return check_key(f.read().strip())
