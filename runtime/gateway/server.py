"""The consumer gateway: PROXY v2 -> identity -> admission -> routing -> streaming proxy -> metering.

One asyncio process in front of trtllm-serve on the same instance. The NLB
(proxy protocol v2 on) connects to it; it forwards to the server on loopback
over pooled keep-alive connections, copying each upstream read to the client
at once (no buffering of SSE), and writes one EMF record per inference
request. It is also the health-check path: /health mirrors the server's
/health and turns 503 the moment a drain starts (SIGTERM), so the NLB stops
sending new connections while in-flight streams finish.

This module is the request path only; each concern it walks through has its own:
identity.py (who is calling), admission.py + limits.py (may they now),
routing.py (which local server), salting.py (the request's KV-cache salt), proxy.py + upstream.py (forwarding),
meter.py + metrics.py (metering), drain.py (drain), health.py (/health).

Why raw asyncio streams rather than a web framework: the gateway adds the
least latency when an upstream read turns into one client write with no
framework between them; scripts/bench_gateway.py measures this against an
aiohttp proxy and against no gateway at all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from fleetcast.contract import telemetry as t
from fleetcast.contract.instance_env import Var, default
from fleetcast.contract.isolation import new_key
from fleetcast.contract.nlb import HEALTH_PATH  # answered by the gateway: the NLB's health check
from fleetcast.contract.spill import may_serve_in

from ..ttft_trace import HEADER as TRACE_HEADER, Trace, tracer
from . import ppv2
from .admission import Admission, Ticket, local_limiter, model_not_found
from .drain import DRAINING_MESSAGE, Drain
from .fair import CLIENT_GONE, QUEUE_TIMEOUT, Waiter, fair_admission
from .health import HealthProbe
from .http import (
    BODY_TIMEOUT_S,
    BadBody,
    HttpError,
    Request,
    openai_error,
    parse_head,
    parse_json_body,
    read_body,
    response_head,
)
from .identity import Identity, ProxyRefused, Refusal, bearer_key, log, read_proxy_header
from .limits import ConsumerLimiter
from .meter import INFERENCE_PATHS, Exchange, prepare_body, record
from .metrics import MetricsSink
from .peer import PEER_HEADER, PEER_HEADER_LOWER, Claim, PeerRefused, Verifier, sign
from .proxy import Proxy
from .routing import Router, Target, invalid_model
from .salting import Salting
from .spill import (
    HEADROOM_PATH,
    HEADROOM_TTL_S,
    PEER_HEADROOM_TTL_S,
    Headroom,
    LoadGauge,
    ModelHeadroom,
    RegionLink,
    SpillSetup,
    advertised_free,
    choose_peer,
    fetch_headroom,
    http_get,
    predicted_wait_s,
)
from .upstream import StreamWatchdog, UpstreamPool

if TYPE_CHECKING:  # annotations only
    from fleetcast.config import Consumer

    from .shared import SharedState

MODELS_PATH = "/v1/models"  # answered by the gateway: the models the calling consumer may use
# Request fields a consumer may not set: `lora_request` names a path on the instance for the server to load
# (tensorrt_llm/serve/openai_protocol.py, CompletionRequest/ChatCompletionRequest); the gateway sets it
# from the adapter id in `model`.
GATEWAY_FIELDS = ("lora_request",)
CLIENT_READ_LIMIT = 64 * 1024  # the longest request head (431 beyond)
# At close, what the relayed responses get to write their endings (503s, error events), and then what the
# connections get to flush before the ones left are dropped: with a last second, 5 s at most, well
# inside the Spot exit reserve (runtime/spot.py DRAIN_EXIT_RESERVE_S), so a client that does not read cannot
# hold the exit.
CUT_ENDINGS_WAIT_S = 2.0


class Gateway:
    """Serve consumers on `listen`, forward to `upstream` (loopback trtllm-serve)."""

    # What close() gives the endings and then the flushes; an instance's own can be shorter (a test of a client that
    # never reads waits it out twice whatever its length).
    cut_endings_wait_s: float = CUT_ENDINGS_WAIT_S

    def __init__(self, *, router: Router, identity: Identity, limiters: dict[str, ConsumerLimiter],
                 metrics: MetricsSink, entitled: Mapping[str, Iterable[str]] | None = None,
                 model_limiters: dict[tuple[str, str], ConsumerLimiter] | None = None, proxy_protocol: bool = True, drain_timeout_s: float = 300.0,
                 header_timeout_s: float = 5.0, idle_timeout_s: float = 75.0, upstream_idle_timeout_s: float = 600.0,
                 health_timeout_s: float = 2.0, max_idle_upstream: int = 256, body_timeout_s: float = BODY_TIMEOUT_S,
                 disconnect_poll_s: float = 0.5, health_upstream: tuple[str, int] | None = None,
                 models_state: str | None = None, upstream_warm: int = 0, shared: SharedState | None = None,
                 clock: Callable[[], float] = time.time, salting: Salting | None = None,
                 admission_caps: Mapping[str, int] | None = None, worker: int = 0, spill: SpillSetup | None = None):
        """`entitled`: consumer -> the model and adapter ids it may call; None: every consumer, every id.
        `upstream_warm`: connections kept open ahead of demand to each engine process.
        `shared`: the limits and in-flight count of several worker processes (shared.SharedState).
        `salting`: each request's KV-cache salt (salting.py); None: a fresh key, the default backend's paths.
        `admission_caps`: model id -> requests each of its engine processes may hold at once (fair.py); None:
        no cap, requests go straight to the least busy process. `worker`: this process's index among `shared`'s.
        `spill`: forwarding to other regions' gateways and accepting what they forward (spill.py, peer.py)."""
        self.identity = identity
        self.metrics = metrics
        self.proxy_protocol = proxy_protocol
        self.header_timeout_s = header_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.body_timeout_s = body_timeout_s
        self.clock = clock  # wall clock for record timestamps (tests compress a week by injecting it)
        self.router = router
        self.salting = salting if salting is not None else Salting(new_key(), default(Var.SERVING_BACKEND))
        if entitled is None:
            entitled = {name: router.ids for name in limiters}
        self.admission = Admission(limiters, metrics, entitled, model_limiters,
                                   shared.limiter if shared is not None else local_limiter)
        self.drain_state = Drain(drain_timeout_s, shared)
        self._shared = shared
        self.fair = None if admission_caps is None else fair_admission(
            router, admission_caps, identity.consumers, shared, worker, disconnect_poll_s)
        self.upstream_warm = upstream_warm
        self.health = HealthProbe(health_upstream or router.default.address, health_timeout_s,
                                  lambda: self.drain_state.draining, models_state)
        self.started_at = int(clock())
        self.watchdog = StreamWatchdog(upstream_idle_timeout_s)
        self.proxy = Proxy(self.drain_state, self.watchdog, disconnect_poll_s)
        self._server: asyncio.Server | None = None
        # Each open connection's writer and task (the one strong reference to the task: asyncio keeps weak ones).
        self._connections: dict[asyncio.StreamWriter, asyncio.Task[None]] = {}
        self.spill: SpillSetup | None = None
        self.verifier: Verifier | None = None
        self.gauge = LoadGauge()
        self._spill_pools: dict[str, UpstreamPool] = {}
        self._headroom_task: asyncio.Task[None] | None = None
        if spill is not None:
            self.enable_spill(spill)

    def enable_spill(self, spill: SpillSetup) -> None:
        """Spill and accept forwarded requests from now on (at start, or once the peer key could be read)."""
        # One replay table for every worker on the port (shared.py), else this process's own.
        self.verifier = Verifier(spill.key, spill.region, self.clock,
                                 self._shared.first_use if self._shared is not None else None)
        self._spill_pools = {name: UpstreamPool(link.address) for name, link in
                             (spill.policy.links.items() if spill.policy is not None else ())}
        # A peer instance's gateway expects a PROXY v2 header first: the LOCAL one (its own address is the source).
        self._spill_pools.update({name: UpstreamPool(link.address, preamble=ppv2.LOCAL_HEADER)
                                  for name, link in spill.peer_links.items()})
        self.spill = spill
        if self._server is not None and self._spill_pools and self._headroom_task is None:
            self._headroom_task = asyncio.ensure_future(self._refresh_headroom())

    def set_peers(self, links: Mapping[str, RegionLink]) -> None:
        """Balance onto these peer instances from now on (discovery.py's refresh): a peer seen before keeps its
        link (breaker, headroom, connections); one gone is closed; the peers whose claims are accepted follow."""
        if self.spill is None:
            return
        old = self.spill.peer_links
        kept = {name: old.get(name, link) for name, link in links.items()}
        for name in old.keys() - kept.keys():
            pool = self._spill_pools.pop(name, None)
            if pool is not None:
                pool.close()
        for name, link in kept.items():
            if name not in self._spill_pools:
                self._spill_pools[name] = UpstreamPool(link.address, preamble=ppv2.LOCAL_HEADER)
        self.spill = dataclasses.replace(self.spill, peer_links=kept,
                                         peers=frozenset(link.address[0] for link in kept.values()))
        if self._server is not None and self._headroom_task is None:
            self._headroom_task = asyncio.ensure_future(self._refresh_headroom())

    # The gateway's state as the entry point and the tests read it; each has one home above.
    @property
    def limiters(self) -> dict[str, ConsumerLimiter]:
        return self.admission.limiters

    @property
    def active(self) -> int:
        return self.drain_state.active

    @property
    def draining(self) -> bool:
        return self.drain_state.draining

    @property
    def drain_timeout_s(self) -> float:
        return self.drain_state.timeout_s

    @drain_timeout_s.setter
    def drain_timeout_s(self, value: float) -> None:
        self.drain_state.timeout_s = value

    def set_consumers(self, consumers: Iterable[Consumer], entitled: Mapping[str, Iterable[str]] | None = None) -> None:
        """Swap in a refreshed consumer list; a kept consumer keeps its limiter (in-flight count, tokens).

        `entitled`: consumer -> the model and adapter ids it may call; None: every id this gateway routes."""
        if entitled is None:
            entitled = {c.name: self.router.ids for c in consumers}
        # Limiters first: a request resolved to a new consumer must find its limiter.
        self.admission.set_consumers(consumers, entitled)
        if self.fair is not None:
            self.fair.set_consumers(consumers)
        self.identity.consumers = tuple(consumers)

    # ------------------------------------------------------------ lifecycle

    async def start(self, host: str, port: int, reuse_port: bool = False) -> asyncio.Server:
        self._server = await asyncio.start_server(self._accepted, host, port, limit=CLIENT_READ_LIMIT, backlog=1024,
                                                  reuse_port=reuse_port or None)
        for pool in self.router.pools:
            pool.keep_warm(self.upstream_warm)
        self.watchdog.start(self.router.pools)
        if self.fair is not None:
            self.fair.start()
        if self._spill_pools and self._headroom_task is None:
            self._headroom_task = asyncio.ensure_future(self._refresh_headroom())
        global TRACE
        TRACE = tracer("gateway")
        if TRACE:
            TRACE.watch_loop()
            TRACE.watch_gc()
            if self.fair is not None:  # this worker's waits for, and holds of, the workers' shared lock
                self.fair.state.lock = TRACE.timed_lock(self.fair.state.lock)
        return self._server

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def begin_drain(self) -> None:
        """SIGTERM: health turns 503 now; new requests are refused; in-flight ones carry on."""
        self.drain_state.begin()
        if self.fair is not None:
            self.fair.flush(_DRAINING)  # queued requests never reached an engine: retryable elsewhere now

    async def drain(self) -> bool:
        """Wait for in-flight requests (bounded by the drain timeout); True if all finished."""
        return await self.drain_state.wait()

    async def close(self) -> None:
        self.watchdog.stop()
        if self._headroom_task is not None:
            self._headroom_task.cancel()
        for spill_pool in self._spill_pools.values():
            spill_pool.close()
        if self.fair is not None:
            self.fair.stop()
        if self._server:
            self._server.close()
        # Cut by the drain timeout before the server answered: a retryable 503, not a reset.
        self.drain_state.cut_unstarted()
        # Cut while relayed: a 503 where the head is still held back, else the stream's error event.
        await self.drain_state.cut_relaying(self.cut_endings_wait_s)
        open_connections = list(self._connections)
        for writer in open_connections:
            writer.close()
        self.router.close()
        self.health.close()
        # A connection ends once what is buffered for it is flushed, so a client that stopped reading would hold
        # the exit forever (and on Python 3.12.1+ Server.wait_closed() waits for every connection). Past the
        # grace, what it has not taken never will be: drop the connections still open, with it.
        flushed = asyncio.gather(*(writer.wait_closed() for writer in open_connections), return_exceptions=True)
        try:
            await asyncio.wait_for(flushed, self.cut_endings_wait_s)
        except TimeoutError:
            for writer in open_connections:
                writer.transport.abort()
        if self._server:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            except TimeoutError:  # one closed between requests, still flushing: the exit drops it
                log("connections_left_open_at_exit")

    def holds_connections(self) -> bool:
        """Whether a client connection is open (a request waiting, relayed or between two of a keep-alive): what
        runtime/heap.py's policy reads, from a thread of its own (a set's length), to collect only while none is."""
        return len(self._connections) > 0

    # ------------------------------------------------------------ connections

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A new connection: its task is started here, not by asyncio. Given a coroutine, asyncio's
        StreamReaderProtocol.connection_made starts the task itself and adds a done callback, a closure over the
        protocol and transport that only logs an exception the coroutine let out and closes the transport
        (github.com/python/cpython Lib/asyncio/streams.py). `_connection` lets none out and closes its writer; the
        closure (a function, its tuple of two cells, and the context of the callback) would be five objects more
        that each open connection, and so each waiting request, keeps alive."""
        self._connections[writer] = asyncio.get_running_loop().create_task(self._connection(reader, writer))

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted = time.monotonic() if TRACE else 0.0
        try:
            vpce_id, source = None, writer.get_extra_info("peername")
            if self.proxy_protocol:
                try:
                    header = await read_proxy_header(reader, self.header_timeout_s)
                except ProxyRefused as exc:
                    if exc.reason is not None:
                        self._refuse_connection(writer, exc.reason)
                    return
                vpce_id, source = header.vpce_id, header.source or source
                del header  # read: else this frame keeps it (and its TLVs) alive while each request waits
            loop = asyncio.get_running_loop()
            while True:
                # An idle keep-alive connection is closed by a timer rather than wait_for(), which
                # would cost a task per request on the hot path.
                idle = loop.call_later(self.idle_timeout_s, writer.transport.abort)
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except asyncio.LimitOverrunError:
                    writer.write(openai_error(431, "request head too large", "invalid_request_error", None, close=True))
                    return
                finally:
                    idle.cancel()
                del idle  # cancelled: else this frame keeps it (and its context) while the request waits
                try:
                    request = parse_head(head)
                except HttpError as exc:
                    writer.write(openai_error(exc.status, str(exc), "invalid_request_error", None, close=True))
                    return
                stamps = None
                if TRACE and TRACE_HEADER in request.lower:
                    stamps = {"kind": "gateway", "id": request.lower[TRACE_HEADER], "accepted": accepted,
                              "head": time.monotonic()}
                if not await self._request(request, reader, writer, vpce_id, source, stamps):
                    return
        except HttpError as exc:  # an unreadable request body: answer, then close (the stream is out of sync)
            writer.write(openai_error(exc.status, str(exc), "invalid_request_error", None, close=True))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception as exc:  # noqa: BLE001 - one broken connection must never stop the gateway
            log("connection_error", error=f"{type(exc).__name__}: {exc}")
        finally:
            self._connections.pop(writer, None)
            writer.close()  # flushes what is buffered, then closes

    def _refuse_connection(self, writer: asyncio.StreamWriter, reason: str) -> None:
        peer = writer.get_extra_info("peername")
        self.metrics.emit(None, {t.PROXY_PROTOCOL_ERRORS: 1}, {"reason": reason, "peer": str(peer)})
        log("proxy_protocol_refused", reason=reason, peer=peer)
        writer.write(openai_error(400, f"{reason}; this port expects the NLB's PROXY protocol v2 header",
                                  "invalid_request_error", "proxy_protocol_required", close=True))

    # ------------------------------------------------------------ requests

    async def _refuse(self, request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keep: bool,
                      body: bytes | None, refusal: Refusal) -> bool:
        """Answer `refusal` to `request` (`body`: its body if read yet, else None); True to keep the connection.

        A method, not a closure in `_request`: a closure would make cells of `_request`'s locals, kept for as
        long as the request lives, and a flood's thousands of waiting requests make each of them garbage the
        collector walks at every young collection."""
        if body is not None:
            pass  # already read: the connection is in step
        elif "100-continue" in request.lower.get("expect", "").lower():
            keep = False  # the client holds the body back; do not wait for it
        else:
            try:
                await read_body(request, reader, self.body_timeout_s)
            except HttpError:
                keep = False
        writer.write(openai_error(refusal.status, refusal.message, refusal.error_type, refusal.code,
                                  list(refusal.headers), close=not keep, param=refusal.param))
        await writer.drain()
        return keep

    async def _request(self, request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       vpce_id: str | None, source: Any, stamps: dict[str, Any] | None = None) -> bool:
        """Serve one request; True to keep the connection open for the next. `stamps`: its TTFT trace (ttft_trace.py),
        only with the test switch on."""
        started = time.perf_counter()
        path = request.path
        keep = request.keep_alive and not self.draining
        expects_continue = "100-continue" in request.lower.get("expect", "").lower()
        body: bytes | None = None  # read yet?

        if path == HEALTH_PATH and request.method in ("GET", "HEAD"):
            await read_body(request, reader, self.body_timeout_s)
            writer.write(await self.health.response(request.method == "HEAD", keep))
            await writer.drain()
            return keep
        claimed = request.lower.get(PEER_HEADER_LOWER)
        if (claimed is not None or path == HEADROOM_PATH) and not await self._from_peer(vpce_id, source):
            if claimed is not None:  # a consumer (or anyone but a peer) asserting an identity: never honoured
                self.metrics.emit(None, {t.UNKNOWN_ENDPOINT: 1}, {"vpce_id": vpce_id, "path": path,
                                                                 "reason": _FORGED.code, "source": str(source)})
                return await self._refuse(request, reader, writer, keep, body, _FORGED)
        elif path == HEADROOM_PATH and request.method == "GET":
            await read_body(request, reader, self.body_timeout_s)
            answer = self.headroom().to_json(self.spill.policy.links if self.spill and self.spill.policy else None)
            writer.write(response_head(200, [("Content-Type", "application/json")], length=len(answer),
                                       close=not keep) + answer)
            await writer.drain()
            return keep
        if self.draining:
            return await self._refuse(request, reader, writer, keep, body, _DRAINING)
        if not consumer_route(request.method, path) or (claimed is not None and request.method != "POST"):
            return await self._refuse(request, reader, writer, keep, body, unknown_route(request.method, path))

        caller = await self.identity.resolve(vpce_id, bearer_key(request.lower)) if claimed is None else None
        if caller is None:
            pass  # a forwarded request: its consumer comes from the verified claim, once the body is read
        elif caller.refusal:
            r = caller.refusal
            if r.code in ("unknown_endpoint", "ambiguous_consumer"):
                self.metrics.emit(None, {t.UNKNOWN_ENDPOINT: 1}, {"vpce_id": vpce_id, "path": path,
                                                                 "reason": r.code, "source": str(source)})
            return await self._refuse(request, reader, writer, keep, body, r)
        consumer = caller.consumer if caller is not None else None
        del caller  # read: else this frame keeps it alive while the request waits for a slot
        if consumer is not None and request.method in ("GET", "HEAD") and (path == MODELS_PATH or path.startswith(MODELS_PATH + "/")):
            body = await read_body(request, reader, self.body_timeout_s)
            listing = self._models(consumer.name, path)
            if isinstance(listing, Refusal):
                return await self._refuse(request, reader, writer, keep, body, listing)
            out = response_head(200, [("Content-Type", "application/json")], length=len(listing), close=not keep)
            writer.write(out if request.method == "HEAD" else out + listing)
            await writer.drain()
            return keep

        # The body first, then the slot: a client that stalls mid-body holds no concurrency slot
        # and is no request in flight for a drain to wait for.
        exchange = Exchange(started, consumer.name if consumer is not None else None)
        if expects_continue:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            body = await read_body(request, reader, self.body_timeout_s)
            data = parse_json_body(body)
            for name in GATEWAY_FIELDS:
                if name in data:
                    raise BadBody(f"{name} is set by the gateway, not the caller: select an adapter by its id in "
                                  "`model` (GET /v1/models lists them)", "unsupported_parameter")
        except (HttpError, BadBody) as exc:
            exchange.status = exc.status if isinstance(exc, HttpError) else 400
            exchange.props["invalid_request"] = str(exc)
            record(self.metrics, exchange, path)
            if isinstance(exc, HttpError):
                raise  # unreadable: answered, then the connection closed (the stream is out of sync)
            return await self._refuse(request, reader, writer, keep, body,
                                      Refusal(400, exc.code, str(exc), "invalid_request_error"))
        if stamps is not None:
            stamps["parsed"] = time.monotonic()
            exchange.trace = stamps
        if self.draining:  # the drain began while the body was arriving
            return await self._refuse(request, reader, writer, keep, body, _DRAINING)
        claim: Claim | None = None
        if claimed is not None:
            accepted = self._accept_claim(claimed, body, data)
            if isinstance(accepted, Refusal):
                self.metrics.emit(None, {t.UNKNOWN_ENDPOINT: 1}, {"vpce_id": vpce_id, "path": path,
                                                                 "reason": accepted.code, "source": str(source)})
                return await self._refuse(request, reader, writer, keep, body, accepted)
            claim, consumer = accepted
            exchange.consumer = consumer.name
            exchange.props.update(origin_region=claim.origin, serving_region=self.spill.region)  # type: ignore[union-attr]  # a claim needs spill
        elif self.spill is not None:
            exchange.props.update(origin_region=self.spill.region, serving_region=self.spill.region)
        assert consumer is not None

        # Routing: the same dictionary lookups whether the model is unknown or not this consumer's, and no
        # upstream contact before the answer, so neither the answer nor its timing says which models exist.
        requested = data.get("model")
        mistyped = invalid_model(data)
        if mistyped is not None:
            exchange.status = 400
            exchange.props["invalid_request"] = mistyped.message
            record(self.metrics, exchange, path)
            return await self._refuse(request, reader, writer, keep, body, mistyped)
        target = self.router.resolve(requested)
        # Entitlement is checked once, at home: a verified claim names a model its home let the consumer call.
        if target is None or (claim is None and not self.admission.may_use(consumer.name, target.id)):
            refusal = model_not_found(requested)
            exchange.status = 404
            exchange.props["model_not_found"] = refusal.message
            record(self.metrics, exchange, path)
            return await self._refuse(request, reader, writer, keep, body, refusal)
        salted = self.salting.apply(path, consumer, target.base, body, data)
        if isinstance(salted, Refusal):
            exchange.status = salted.status
            exchange.props["cache_isolation"] = salted.message
            record(self.metrics, exchange, path)
            return await self._refuse(request, reader, writer, keep, body, salted)
        original = body  # what a spill forwards: the remote gateway salts with its own key
        body, data, salt = salted
        del salted  # unpacked: else this frame keeps the tuple alive while the request waits for a slot
        arrived_ms = int(self.clock() * 1000)
        # The consumer's limits were applied at home, where its requests arrive.
        ticket = self.admission.admit(consumer.name, target.id, path, arrived_ms) if claim is None else _NO_TICKET
        if isinstance(ticket, Refusal):
            return await self._refuse(request, reader, writer, keep, body, ticket)
        exchange.model = target.id
        if claim is None and self.spill is not None and (self.spill.policy is not None or self.spill.peer_links):
            spilled = await self._spill(consumer, target, request, reader, writer, keep, original, exchange, path)
            if spilled is not None:
                ticket.release()
                return spilled
        # The engine process: at once when there is room, else in fair order (fair.py). Here, not in a helper
        # coroutine: a waiting request would keep that coroutine (and fair.acquire's) alive as well.
        pool: UpstreamPool | Refusal | Waiter
        if self.fair is None:
            pool = self.router.pick(target)
        else:
            queued = time.perf_counter()
            pool = self.fair.ask(consumer.name, target.base, _client_left, reader, exchange.trace)
            if isinstance(pool, Waiter):
                waiter = pool
                try:
                    pool = await waiter.future
                except asyncio.CancelledError:
                    self.fair.abandon(target.base, waiter)
                    raise
                del waiter  # out of its queue now: nothing keeps it while the request is relayed
            waited_ms = (time.perf_counter() - queued) * 1000
            if waited_ms >= 0.1:
                exchange.props["admission_wait_ms"] = round(waited_ms, 1)
            if isinstance(pool, Refusal):
                exchange.status = pool.status
                exchange.client_gone = pool.status == CLIENT_GONE.status
                exchange.props["admission_refused"] = pool.code
        if isinstance(pool, Refusal):
            ticket.release()
            if pool.status == 429:  # its queue is full: a throttle, counted as the limits count theirs
                self.metrics.emit(consumer.name, {t.REQUESTS: 1, t.THROTTLED: 1, t.ERRORS: 0},
                                  {"throttle_reason": pool.code, "throttle_scope": "admission", "path": path},
                                  arrived_ms, model=target.id)
            else:
                exchange.error = pool.code == QUEUE_TIMEOUT.code  # the engine stayed full: a server error
                record(self.metrics, exchange, path)
            if pool.status == CLIENT_GONE.status:
                return False
            return await self._refuse(request, reader, writer, keep, body, pool)
        if stamps is not None:
            stamps["admitted"] = time.monotonic()
        # Admitted: counts toward in-flight.
        exchange.arrived_ms, exchange.in_flight = arrived_ms, self.drain_state.enter()
        try:
            extra = {"lora_request": target.adapter.lora_request, **salt} if target.adapter else salt
            return await self.proxy.forward(pool, request, reader, writer, keep, body, exchange,
                                            prepare_body(body, data, extra))
        finally:
            if self.fair is not None:
                self.fair.release(consumer.name, target.base, pool)
            ticket.release()
            self.drain_state.leave()
            record(self.metrics, exchange, path)
            self._observe(target.base, exchange)
            if stamps is not None and TRACE:
                TRACE.write(stamps)

    # ------------------------------------------------------------ spill and peers (spill.py, peer.py)

    async def _from_peer(self, vpce_id: str | None, source: Any) -> bool:
        """Whether the connection comes from another gateway of the fleet: through the provider's own VPC endpoint
        (a spill endpoint: its owner is the provider account), or straight from a peer instance's address."""
        if self.spill is None:
            return False
        if vpce_id:
            endpoint = await self.identity.endpoints.lookup(vpce_id)
            return endpoint is not None and endpoint.account == self.spill.provider_account
        host = source[0] if isinstance(source, tuple) and source else None
        return host is not None and host in self.spill.peers

    def _accept_claim(self, header: str, body: bytes, data: Mapping[str, Any]) -> tuple[Claim, Consumer] | Refusal:
        """The verified claim of a forwarded request and its consumer, or the 403 to answer."""
        assert self.verifier is not None and self.spill is not None  # _from_peer is False without spill
        try:
            claim = self.verifier.verify(header, body)
        except PeerRefused as exc:
            return Refusal(403, _FORGED.code, f"{_FORGED.message}: {exc}", "permission_error")
        consumer = self.spill.consumers.get(claim.consumer)
        if consumer is None or claim.model != data.get("model"):
            return Refusal(403, _FORGED.code, f"{_FORGED.message}: the claim names another consumer or model",
                           "permission_error")
        # Residency, again here: a consumer's requests are served only in its home and the regions it allows.
        if not may_serve_in(consumer, self.spill.region):
            return Refusal(403, "residency", f"consumer {consumer.name}'s requests may not be served in "
                           f"{self.spill.region} (its spill_regions)", "permission_error")
        return claim, consumer

    def headroom(self) -> Headroom:
        """This gateway's headroom answer (HEADROOM_PATH): per model, the requests it admits at once now."""
        assert self.spill is not None
        models = {}
        for model_id in self.router.ids:
            target = self.router.resolve(model_id)
            if target is None or target.base != model_id:
                continue
            held, waiting, capacity = self._load(model_id)
            wait = predicted_wait_s(held, waiting, capacity, self.gauge.service_s(model_id))
            models[model_id] = ModelHeadroom(advertised_free(held, waiting, capacity), capacity,
                                             wait * 1000 + self.gauge.ttft_ms(model_id),
                                             max(0, capacity - held - waiting))
        return Headroom(self.spill.region, models, self.draining)

    def _load(self, model: str) -> tuple[int, int, int]:
        """(requests held by `model`'s engine processes, requests waiting for them, what they hold at once): fair
        admission's counts; without fair admission, the requests in flight and no cap but the router's."""
        load = self.fair.load(model) if self.fair is not None else None
        if load is None:
            target = self.router.resolve(model)
            in_flight = sum(p.in_flight for p in target.pools) if target is not None else 0
            return in_flight, 0, max(in_flight + 1, 1)
        return load

    def _predicted_local_ttft_ms(self, consumer: str, model: str) -> float:
        """The TTFT a request of `consumer` for `model` arriving now should expect here: the wait fair admission
        predicts for it (its own per-consumer query where it has one: its order by weight and class, its measured
        service rate), else one from its counts (spill.predicted_wait_s), plus the engine's measured TTFT. The one
        place the spill decision asks fair admission."""
        query = getattr(self.fair, "predicted_wait_s", None)
        wait = query(consumer, model) if query is not None else None
        if wait is None:  # no per-consumer query, or it has no rate measured yet: from the counts
            held, waiting, capacity = self._load(model)
            wait = predicted_wait_s(held, waiting, capacity, self.gauge.service_s(model))
        return float(wait) * 1000 + self.gauge.ttft_ms(model)

    def _observe(self, model: str, exchange: Exchange) -> None:
        meter = exchange.meter
        ttft = (meter.first_content_at - exchange.started) * 1000 if meter and meter.first_content_at else None
        service = (exchange.ended - exchange.started) if exchange.ended and 200 <= exchange.status < 300 else None
        self.gauge.observe(model, ttft, service)

    async def _refresh_headroom(self) -> None:
        """Every link's headroom answer, read again once it is older than HEADROOM_TTL_S (spill.py)."""
        while True:
            assert self.spill is not None
            # Read again each round: discovery (set_peers) replaces the peers.
            links = [*(self.spill.policy.links.values() if self.spill.policy else ()),
                     *self.spill.peer_links.values()]
            now = time.monotonic()
            for link in links:
                if not link.fetching and now - link.attempted_at > (PEER_HEADROOM_TTL_S if link.direct
                                                                    else HEADROOM_TTL_S):
                    asyncio.ensure_future(fetch_headroom(link, functools.partial(
                        http_get, path=HEADROOM_PATH, preamble=ppv2.LOCAL_HEADER if link.direct else b"")))
            await asyncio.sleep(0.25)

    async def _spill(self, consumer: Consumer, target: Target, request: Request, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter, keep: bool, body: bytes, exchange: Exchange,
                     path: str) -> bool | None:
        """Serve the request on a peer instance of this region when it would queue here and a peer has room
        (section 1), else in another region when the spill policy says so (section 2); None: serve it here (not
        forwarded, or the peer failed before its first byte)."""
        spill = self.spill
        assert spill is not None
        local_ms = self._predicted_local_ttft_ms(consumer.name, target.base)
        if spill.peer_links and local_ms > self.gauge.ttft_ms(target.base):  # it would wait for a slot here
            peer = choose_peer(list(spill.peer_links.values()), target.base, local_ms)
            if peer is not None:
                outcome = await self._forward(peer, consumer, target, request, reader, writer, keep, body, exchange,
                                              path, local_ms, spill.region)
                if outcome is not None:
                    return outcome
        slo = spill.slo_ttft_ms.get(target.id) or spill.slo_ttft_ms.get(target.base)
        if spill.policy is None or not consumer.spill_regions or slo is None:
            return None
        decision = spill.policy.decide(consumer, target.id, target.base, 0, local_ms, slo)
        if decision.region is None:
            return None
        return await self._forward(spill.policy.links[decision.region], consumer, target, request, reader, writer,
                                   keep, body, exchange, path, local_ms, decision.region)

    async def _forward(self, link: RegionLink, consumer: Consumer, target: Target, request: Request,
                       reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keep: bool, body: bytes,
                       exchange: Exchange, path: str, local_ms: float, destination: str) -> bool | None:
        """Forward once to `link` (a remote region's gateways or a peer instance) with the caller's identity signed
        for `destination`; None when nothing reached the client (the caller serves it here)."""
        spill = self.spill
        assert spill is not None
        header = sign(spill.key, consumer=consumer.name, model=target.id, origin=spill.region,
                      destination=destination, body=body, now=self.clock)
        away = Exchange(time.perf_counter(), consumer.name, target.id, exchange.arrived_ms)
        away.in_flight = self.drain_state.enter()
        try:
            outcome = await self.proxy.forward_peer(self._spill_pools[link.region], request, reader, writer, keep,
                                                    body, away, [(PEER_HEADER, header)], spill.head_timeout_s)
        finally:
            self.drain_state.leave()
        where = {"peer": link.region} if link.direct else {"region": link.region}
        if outcome is None:
            link.breaker.failure()
            exchange.props["spill_failed"] = {**where, "error": away.props.get("peer_error")}
            return None
        link.breaker.success()
        # The one metered record is the serving gateway's; here, only that it left (no Requests, no tokens).
        metric = t.PEER_FORWARDED_REQUESTS if link.direct else t.SPILLED_REQUESTS
        self.metrics.emit(consumer.name, {metric: 1, t.ERRORS: 1 if away.error else 0},
                          {"path": path, "status": away.status, "origin_region": spill.region,
                           "serving_region": destination, **({"serving_peer": link.region} if link.direct else {}),
                           "predicted_local_ttft_ms": round(local_ms, 1),
                           "e2e_ms": round((time.perf_counter() - exchange.started) * 1000, 1),
                           **({"client_disconnected": True} if away.client_gone else {})},
                          exchange.arrived_ms, model=target.id)
        return outcome

    def _models(self, consumer: str, path: str) -> bytes | Refusal:
        """GET /v1/models (the consumer's models and adapters, config order) or /v1/models/{id}, as OpenAI
        shapes them: `{"object": "list", "data": [Model]}`, Model = {id, object: "model", created, owned_by}
        (openai-python src/openai/types/model.py)."""
        def card(model_id: str) -> dict[str, Any]:
            return {"id": model_id, "object": "model", "created": self.started_at, "owned_by": self.metrics.fleet}

        ids = [i for i in self.router.ids if self.admission.may_use(consumer, i)]
        if path == MODELS_PATH:
            return json.dumps({"object": "list", "data": [card(i) for i in ids]}).encode()
        # An id with '/' or ':' arrives as written or percent-encoded (%2F, %3A), as HTTP clients quote a path.
        wanted = unquote(path[len(MODELS_PATH) + 1:])
        if wanted not in ids:
            return model_not_found(wanted)
        return json.dumps(card(wanted)).encode()


_DRAINING = Refusal(503, "draining", DRAINING_MESSAGE, "service_unavailable")
_NO_TICKET = Ticket(())  # a forwarded request's: its consumer's limits were applied at home
# None unless the test switch is on (runtime/ttft_trace.py); read when the server starts, not at import: a fork of a
# process that imported this module has its own environment (tests/runtime/test_zygote.py).
TRACE: Trace | None = None

_FORGED = Refusal(403, "peer_identity_refused", "a forwarded identity is accepted only from another gateway of this "
                  "fleet, signed with the fleet's peer key", "permission_error")


def _client_left(reader: asyncio.StreamReader) -> bool:
    """Whether a waiting request's client has gone (fair.py's `gone`, with the connection's reader as its client):
    it closed its side (end of file), or the connection was lost (a reset, or the transport closed: asyncio's
    StreamReaderProtocol.connection_lost then ends the reader with the error or an end of file). The reader alone,
    not a partial over reader and writer: that is two more objects each waiting request keeps alive."""
    return reader.at_eof() or reader.exception() is not None


def consumer_route(method: str, path: str) -> bool:
    """Default-deny: what a consumer may call. The inference routes, entitled by `model` and metered, and the
    gateway's own answers; nothing else reaches an engine process, whose other routes generate without
    metering (/v1/responses) or tell of every account's traffic (/metrics, /perf_metrics, /kv_cache_events:
    tests/gateway/test_routes.py lists trtllm-serve's)."""
    if method == "POST":
        return path in INFERENCE_PATHS
    return method in ("GET", "HEAD") and (path == MODELS_PATH or path.startswith(MODELS_PATH + "/"))


def unknown_route(method: str, path: str) -> Refusal:
    """OpenAI's answer to a route it does not serve: 404, code `unknown_url` (as quoted in
    InternLM/MindSearch#150: "Unknown request URL: POST /v1. Please check the URL for typos, ...")."""
    served = ", ".join([f"POST {p}" for p in sorted(INFERENCE_PATHS)] + [f"GET {MODELS_PATH}"])
    return Refusal(404, "unknown_url", f"Unknown request URL: {method} {path[:256]}. This endpoint serves {served}.",
                   "invalid_request_error")
