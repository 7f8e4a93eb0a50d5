"""Who is calling: VPC endpoint id -> consumer account -> consumer, plus optional API keys.

The PROXY v2 header gives the consumer's VPC endpoint id. The provider account
learns which account owns that endpoint from DescribeVpcEndpointConnections
(filtered to this fleet's endpoint service), refreshed periodically and on a
miss, so a connection accepted a minute ago works without a restart. The
account (and the endpoint's region, for cross-region consumers) selects the
consumer in the fleet config.

API keys are optional per consumer: they live in Secrets Manager, are re-read
periodically, and both the AWSCURRENT and AWSPREVIOUS versions are accepted,
so a rotation never cuts off a caller that has not picked up the new key yet.
Keys are held only as SHA-256 digests.

AWS calls run in a worker thread (boto3 is blocking) and a failed refresh keeps
the last good data: an AWS hiccup must not turn into refused traffic.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fleetcast.config.model import Consumer
from fleetcast.contract.instance_env import Var, default

from . import ppv2


def log(event: str, **fields: Any) -> None:
    """Operational log lines go to stderr as JSON; stdout carries only metric records."""
    print(json.dumps({"event": event, **fields}, default=str), file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Endpoint:
    vpce_id: str
    account: str
    state: str
    region: str | None  # the endpoint's own region (cross-region PrivateLink); None when AWS omits it


class EndpointDirectory:
    """VPC endpoint id -> owning account, from DescribeVpcEndpointConnections.

    `ec2` is a boto3 EC2 client (or anything with the same method); a botocore
    Stubber stands in for AWS in tests.
    """

    def __init__(self, ec2: Any, service_id: str | None, refresh_s: float = default(Var.GATEWAY_REFRESH_S),
                 miss_refresh_s: float = 10.0):
        self._ec2 = ec2
        self._service_id = service_id
        self.refresh_s = refresh_s
        self.miss_refresh_s = miss_refresh_s
        self._endpoints: dict[str, Endpoint] = {}
        self.loaded = False
        self._last_refresh = float("-inf")
        self._lock = asyncio.Lock()

    def _describe(self) -> dict[str, Endpoint]:
        kwargs: dict[str, Any] = {}
        if self._service_id:
            kwargs["Filters"] = [{"Name": "service-id", "Values": [self._service_id]}]
        found: dict[str, Endpoint] = {}
        while True:
            page = self._ec2.describe_vpc_endpoint_connections(**kwargs)
            for conn in page.get("VpcEndpointConnections", []):
                vpce, owner = conn.get("VpcEndpointId"), conn.get("VpcEndpointOwner")
                if vpce and owner:
                    found[vpce] = Endpoint(vpce, owner, str(conn.get("VpcEndpointState", "")).lower(),
                                           conn.get("VpcEndpointRegion"))
            token = page.get("NextToken")
            if not token:
                return found
            kwargs["NextToken"] = token

    async def refresh(self) -> bool:
        """Re-read the endpoint connections; True on success. Concurrent callers share one call."""
        started = time.monotonic()
        async with self._lock:
            if self._last_refresh >= started:  # someone refreshed while we waited
                return True
            try:
                endpoints = await asyncio.get_running_loop().run_in_executor(None, self._describe)
            except Exception as exc:  # noqa: BLE001 - keep serving on the last good data
                self._last_refresh = time.monotonic()
                log("endpoint_refresh_failed", error=f"{type(exc).__name__}: {exc}", kept=len(self._endpoints))
                return False
            self._endpoints, self.loaded = endpoints, True
            self._last_refresh = time.monotonic()
            return True

    def get(self, vpce_id: str) -> Endpoint | None:
        return self._endpoints.get(vpce_id)

    async def lookup(self, vpce_id: str) -> Endpoint | None:
        """The endpoint, refreshing once on a miss (at most every `miss_refresh_s`, so unknown ids cannot hammer EC2)."""
        found = self._endpoints.get(vpce_id)
        if found is None and time.monotonic() - self._last_refresh >= self.miss_refresh_s:
            await self.refresh()
            found = self._endpoints.get(vpce_id)
        return found

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_secret(text: str) -> list[str]:
    """A secret holds {"keys": ["...", ...]} (several callers per consumer) or one bare key."""
    text = text.strip()
    if text.startswith("{"):
        data = json.loads(text)
        keys = data.get("keys") if isinstance(data, dict) else None
        if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
            raise ValueError('secret JSON must be {"keys": ["key", ...]} with non-empty strings')
        return keys
    if not text:
        raise ValueError("secret is empty")
    return [text]


class ApiKeyStore:
    """API key digest -> consumer name, for the consumers whose config sets `api_keys: true`.

    `secrets` is a boto3 Secrets Manager client; `secret_names` maps consumer
    name -> secret name.
    """

    STAGES = ("AWSCURRENT", "AWSPREVIOUS")

    def __init__(self, secrets: Any, secret_names: dict[str, str],
                 refresh_s: float = default(Var.GATEWAY_REFRESH_S)):
        self._secrets = secrets
        self.secret_names = dict(secret_names)
        self.refresh_s = refresh_s
        self._by_consumer: dict[str, frozenset[bytes]] = {}
        self._index: dict[bytes, str] = {}
        self._lock = asyncio.Lock()

    def _read(self, consumer: str) -> frozenset[bytes]:
        digests: set[bytes] = set()
        for stage in self.STAGES:
            try:
                value = self._secrets.get_secret_value(SecretId=self.secret_names[consumer], VersionStage=stage)
            except Exception as exc:
                code = getattr(exc, "response", {}).get("Error", {}).get("Code")
                if stage == "AWSPREVIOUS" and code == "ResourceNotFoundException":
                    continue  # never rotated yet: there is no previous version
                raise
            digests.update(_digest(k) for k in parse_secret(value.get("SecretString") or ""))
        return frozenset(digests)

    def _read_all(self) -> tuple[dict[str, frozenset[bytes]], list[str]]:
        result, failed = {}, []
        for consumer in self.secret_names:
            try:
                result[consumer] = self._read(consumer)
            except Exception as exc:  # noqa: BLE001 - one bad secret must not drop the others
                failed.append(consumer)
                log("api_key_refresh_failed", consumer=consumer, secret=self.secret_names[consumer],
                    error=f"{type(exc).__name__}: {exc}")
        return result, failed

    async def refresh(self) -> bool:
        if not self.secret_names:
            return True
        async with self._lock:
            fresh, failed = await asyncio.get_running_loop().run_in_executor(None, self._read_all)
            merged = {**self._by_consumer, **fresh}  # a failed read keeps that consumer's last good keys
            # Swap whole dicts: a request reading the old index mid-swap sees a complete, consistent one.
            self._by_consumer = merged
            self._index = {d: name for name, digests in merged.items() for d in digests}
            return not failed

    async def set_secret_names(self, secret_names: dict[str, str]) -> bool:
        """Config refresh: read the keys of consumers that gained them; forget those of consumers that lost them."""
        async with self._lock:
            self.secret_names = dict(secret_names)
            kept = {name: digests for name, digests in self._by_consumer.items() if name in self.secret_names}
            self._by_consumer = kept
            self._index = {d: name for name, digests in kept.items() for d in digests}
        return await self.refresh()

    def consumer_for(self, key: str) -> str | None:
        return self._index.get(_digest(key))

    def loaded(self, consumer: str) -> bool:
        return consumer in self._by_consumer

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()


@dataclass(frozen=True)
class Refusal:
    """A request answered with an OpenAI-shaped error instead of being served."""

    status: int
    code: str | None
    message: str
    error_type: str
    headers: tuple[tuple[str, str], ...] = ()
    param: str | None = None  # the request member at fault, as OpenAI's error names it


class ProxyRefused(Exception):
    """A connection without a usable PROXY v2 header; `reason` None: it left without sending a byte."""

    def __init__(self, reason: str | None):
        super().__init__(reason or "connection closed before a PROXY v2 header")
        self.reason = reason


async def read_proxy_header(reader: asyncio.StreamReader, timeout_s: float) -> ppv2.ProxyHeader:
    """The connection's PROXY v2 header, read within `timeout_s`; ProxyRefused says why not."""
    try:
        async with asyncio.timeout(timeout_s):  # one deadline for the whole header: one timer per connection
            prefix = await reader.readexactly(ppv2.HEADER_PREFIX_LEN)
            total = ppv2.header_length(prefix)
            rest = await reader.readexactly(total - ppv2.HEADER_PREFIX_LEN)
        return ppv2.parse(prefix + rest)
    except ppv2.ProxyHeaderError as exc:
        raise ProxyRefused(str(exc)) from None
    except asyncio.IncompleteReadError as exc:
        # Connected and left without a byte (a port probe): nothing to count.
        raise ProxyRefused("truncated PROXY v2 header" if exc.partial else None) from None
    except TimeoutError:
        raise ProxyRefused(f"no PROXY v2 header within {timeout_s:g} s") from None


def bearer_key(lower_headers: dict[str, str]) -> str | None:
    """The API key of an `Authorization: Bearer <key>` header (scheme case-insensitive, RFC 9110 11.1)."""
    auth = lower_headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return None


@dataclass(frozen=True)
class Caller:
    consumer: Consumer | None
    refusal: Refusal | None = None


class Identity:
    """Resolves a request's (VPC endpoint id, API key) to one configured consumer or a refusal."""

    def __init__(self, consumers: Iterable[Consumer], endpoints: EndpointDirectory, keys: ApiKeyStore | None):
        self.consumers = tuple(consumers)
        self.endpoints = endpoints
        self.keys = keys

    async def resolve(self, vpce_id: str | None, api_key: str | None) -> Caller:
        if not vpce_id:
            return Caller(None, Refusal(403, "unknown_endpoint", "the connection carries no VPC endpoint id: "
                                        "the API is reachable only through the fleet's PrivateLink endpoint service",
                                        "permission_error"))
        endpoint = await self.endpoints.lookup(vpce_id)
        if endpoint is None:
            if not self.endpoints.loaded:
                return Caller(None, Refusal(503, "identity_unavailable", "consumer identity is not loaded yet; retry",
                                            "service_unavailable"))
            return Caller(None, Refusal(403, "unknown_endpoint", f"VPC endpoint {vpce_id} is not a connection of "
                                        "this endpoint service", "permission_error"))
        candidates = [c for c in self.consumers if c.account == endpoint.account
                      and (endpoint.region is None or c.region == endpoint.region)]
        if not candidates:
            return Caller(None, Refusal(403, "unknown_endpoint", f"VPC endpoint {vpce_id} belongs to account "
                                        f"{endpoint.account}, which is not a consumer of this fleet",
                                        "permission_error"))
        keyed = [c for c in candidates if c.api_keys]
        if not keyed:
            if len(candidates) == 1:
                return Caller(candidates[0])
            return Caller(None, Refusal(403, "ambiguous_consumer", f"account {endpoint.account} maps to several "
                                        "consumers; give them API keys to tell them apart", "permission_error"))
        if not api_key:
            return Caller(None, Refusal(401, "missing_api_key", "this consumer requires an API key: send "
                                        "'Authorization: Bearer <key>'", "invalid_request_error"))
        name = self.keys.consumer_for(api_key) if self.keys else None
        match = [c for c in keyed if c.name == name]
        if match:
            return Caller(match[0])
        if self.keys and not any(self.keys.loaded(c.name) for c in keyed):
            return Caller(None, Refusal(503, "identity_unavailable", "API keys are not loaded yet; retry",
                                        "service_unavailable"))
        return Caller(None, Refusal(401, "invalid_api_key", "incorrect API key provided", "invalid_request_error"))


def secret_names(consumers: Iterable[Consumer], name_of: Callable[[Consumer], str]) -> dict[str, str]:
    return {c.name: name_of(c) for c in consumers if c.api_keys}
