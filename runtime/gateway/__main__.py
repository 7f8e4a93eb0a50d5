"""`python -m runtime.gateway`: start the gateway in front of the local model server.

  python -m runtime.gateway --listen 0.0.0.0:8000 --upstream 127.0.0.1:8001 \\
      --config-json /etc/fleetcast/config.json --region ap-northeast-2 --pool l40s \\
      [--service-id vpce-svc-...] [--proxy-protocol required|off]

The config comes from a file or, with FLEETCAST_CONFIG_PARAM set, from that SSM
parameter. Every --refresh-s the gateway re-reads its source (the parameter when
set, else the file) and applies consumer changes (accounts, limits, API keys)
without a restart: consumers are not part of the launch template, so adding one
does not replace instances. SIGTERM starts a drain: /health answers 503 at once, new requests
get 503, in-flight streams finish (bounded by operations.drain_timeout_s),
then the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from fleetcast.contract import telemetry as t
from fleetcast.contract.instance_env import Var, default, setting
from runtime.descriptors import reserve_descriptors
from runtime.heap import serve_gc_policy

from .http import BODY_TIMEOUT_S
from .identity import log
from .peer import check_key, read_key_file

if TYPE_CHECKING:  # for annotations only: the config package is imported where a config is loaded
    from fleetcast.config import Consumer, FleetConfig

    from .discovery import Peer, PeerDiscovery
    from .server import Gateway
    from .shared import SharedState
    from .spill import RegionLink, SpillSetup


def _hostport(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:8001)")
    return host.strip("[]") or "0.0.0.0", int(port)


def _positive(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not number > 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive number of seconds")
    return number


def _count(value: str) -> int:
    if not value.isdigit() or int(value) > 256:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number from 0 to 256")
    return int(value)


def _workers(value: str) -> int:
    from .shared import MAX_WORKERS

    if not value.isdigit() or not 1 <= int(value) <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of processes from 1 to {MAX_WORKERS}")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m runtime.gateway", description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", type=_hostport, required=True, help="HOST:PORT the NLB connects to")
    p.add_argument("--upstream", type=_hostport, required=True,
                   help="HOST:PORT of the local model server; with several engine processes, the first one's "
                        "(the others follow on the next ports in the pool's `serves` order)")
    p.add_argument("--config-json", help=f"validated fleet config as JSON (else ${Var.CONFIG_PARAM.value} in SSM)")
    p.add_argument("--region", required=True, help="this provider region")
    p.add_argument("--pool", required=True, help="this instance's pool (metric dimension)")
    p.add_argument("--service-id", default=os.environ.get(Var.ENDPOINT_SERVICE_ID),
                   help="VPC endpoint service id (vpce-svc-...) to filter connections by "
                        f"(default ${Var.ENDPOINT_SERVICE_ID.value}; "
                        "without it every connection in the account counts)")
    p.add_argument("--proxy-protocol", choices=("required", "off"), default=default(Var.GATEWAY_PROXY_PROTOCOL),
                   help="required behind the NLB (default); off only for local tests without an NLB")
    p.add_argument("--refresh-s", type=_positive, default=default(Var.GATEWAY_REFRESH_S),
                   help="period of the endpoint, API key and consumer-config refresh in seconds "
                        f"(default {default(Var.GATEWAY_REFRESH_S):g})")
    p.add_argument("--body-timeout-s", type=_positive, default=BODY_TIMEOUT_S,
                   help="a request body must arrive whole within this many seconds, else 408 and the connection "
                        f"is closed (default {BODY_TIMEOUT_S:g}); no concurrency slot is held meanwhile")
    p.add_argument("--upstream-idle-s", type=_positive, default=default(Var.UPSTREAM_IDLE_S),
                   help="abort a response whose model server sent nothing for this many seconds "
                        f"(default {default(Var.UPSTREAM_IDLE_S):g}; the runtime passes {Var.UPSTREAM_IDLE_S.value})")
    p.add_argument("--drain-deadline-file",
                   help="where the runtime writes a Spot interruption's drain deadline before SIGTERM (runtime/spot.py); "
                        "the drain then ends by it and its outcome is written next to it")
    p.add_argument("--models-state",
                   help="the runtime's per-model readiness file (one engine process per model and copy): /health "
                        "names the ready models and stays 200 while any is ready")
    p.add_argument("--queue-state",
                   help="where the gateway writes how many requests wait in its fair-admission queues, every "
                        "second (the runtime adds them to the instance's QueuedRequests gauge)")
    p.add_argument("--workers", type=_workers, default=1,
                   help="gateway processes on the one port (SO_REUSEPORT), each with its own event loop, per-consumer "
                        "limits shared exactly between them (default 1; 2 on the 4 vCPUs of a g6e.xlarge)")
    p.add_argument("--upstream-warm", type=_count, default=32,
                   help="connections each process keeps open and idle to each engine process ahead of demand, so a "
                        "burst of new requests does not wait for connects (default 32; 0: open on demand only)")
    p.add_argument("--fair-admission", choices=("on", "off"), default="on",
                   help="on (default): each engine process holds at most its max_batch_size requests and the rest "
                        "wait at the gateway in per-consumer queues, admitted by weighted fair queuing "
                        "(runtime/gateway/fair.py); off: every admitted request goes to the engine at once")
    p.add_argument("--peer-key-file", help="the fleet's peer key (else the region's Secrets Manager secret, "
                   "fleetcast.contract.spill.peer_secret_of): signs and checks forwarded requests' identity")
    p.add_argument("--spill-endpoint", action="append", default=[], metavar="REGION=HOST:PORT",
                   help="where to reach a remote region's gateways (else the SSM parameter /<fleet>/spill/<region>, "
                   "the provider's spill endpoint)")
    p.add_argument("--breaker-cool-s", type=_positive, default=None,
                   help="how long a remote region's open circuit breaker keeps spilled traffic home before a probe "
                   "(runtime/gateway/spill.py BREAKER_COOL_S)")
    p.add_argument("--peer", action="append", default=[], metavar="HOST:PORT=POOL",
                   help="a peer instance of this region (its gateway, and the pool it belongs to): a request that would "
                   "queue here goes to the cheapest peer with room, and the peer's direct connections may carry a "
                   "forwarded identity")
    p.add_argument("--peer-discovery", choices=("off", "asg"), default="off",
                   help="asg: find this region's peer instances in the fleet's Auto Scaling groups every "
                   "--peer-discovery-s (runtime/gateway/discovery.py), in a region that holds a peer key; they "
                   "join the --peer list. off (default): only --peer")
    p.add_argument("--peer-discovery-s", type=_positive, default=None,
                   help="mean period of the peer discovery read, jittered (default discovery.DISCOVERY_PERIOD_S)")
    p.add_argument("--instance-id", help="this instance's id, left out of its own peers (default: from IMDS)")
    p.add_argument("--event-loop", choices=("auto", "asyncio", "uvloop"), default="auto",
                   help="auto (default): uvloop when installed, which scripts/bench_gateway.py measures as the "
                        "faster hop; else the standard asyncio loop")
    return p


def config_source(args: argparse.Namespace) -> tuple[str, Callable[[], str]]:
    """Where the live config is re-read from: the SSM parameter when set (what the stack
    updates on deploy), else the --config-json file."""
    if os.environ.get(Var.CONFIG_PARAM):
        import boto3

        name = os.environ[Var.CONFIG_PARAM]
        ssm = boto3.client("ssm", region_name=args.region)
        return f"ssm:{name}", lambda: ssm.get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"]
    if args.config_json:
        path = args.config_json
        return f"file:{path}", lambda: Path(path).read_text()
    raise SystemExit(f"gateway: give --config-json FILE or set {Var.CONFIG_PARAM.value}")


def _load_config(args: argparse.Namespace) -> FleetConfig:
    from fleetcast.config import ConfigError, config_from_json

    try:
        if args.config_json:  # the snapshot bootstrap validated: no AWS call before serving
            text = Path(args.config_json).read_text()
        else:
            text = config_source(args)[1]()
        return config_from_json(text)
    except OSError as exc:
        raise SystemExit(f"gateway: cannot read --config-json {args.config_json}: {exc.strerror}") from None
    except ConfigError as exc:
        raise SystemExit(f"gateway: {exc.render()}") from None


async def serve(args: argparse.Namespace, shared: SharedState | None = None, worker: int = 0) -> int:
    """One gateway process; with `shared` (shared.SharedState) it is worker `worker` of several on one port."""
    import boto3

    from fleetcast.contract.isolation import new_key

    from .admission import limiter_key, model_limits_of
    from .fair import admission_caps, publish_queue_state, write_queue_state
    from .identity import ApiKeyStore, EndpointDirectory, Identity, secret_names
    from .limits import ConsumerLimiter
    from .metrics import MetricsSink
    from .reload import ConfigRefresher
    from .routing import entitlements, router_for
    from .salting import Salting, pinned_groups
    from .server import Gateway

    cfg = _load_config(args)
    try:
        region = cfg.region(args.region)
    except KeyError:
        raise SystemExit(f"gateway: --region {args.region} is not a provider region of fleet {cfg.name}") from None
    if args.pool not in {p.name for p in region.pools}:
        raise SystemExit(f"gateway: --pool {args.pool} is not a pool of {args.region}; "
                         f"pools: {', '.join(p.name for p in region.pools)}")
    consumers = cfg.consumers_of(args.region)
    endpoints = EndpointDirectory(boto3.client("ec2", region_name=args.region), args.service_id, args.refresh_s)
    # Always present, even with no keyed consumer yet: a config refresh may add one.
    keys = ApiKeyStore(boto3.client("secretsmanager", region_name=args.region),
                       secret_names(consumers, cfg.api_key_secret_of), args.refresh_s)
    metrics = MetricsSink(cfg.name, args.pool, write_lock=shared.emf_lock if shared is not None else None,
                          by_model=t.metered_per_model(len(cfg.models)))
    new_limiter = shared.limiter if shared is not None else (lambda key, limits: ConsumerLimiter(limits))
    pool = region.pool(args.pool)
    router = router_for(cfg, pool, args.upstream, setting(os.environ, Var.LOCAL_ROOT))
    # The engine processes decided their block reuse from this same start-time config (runtime/bootstrap.py).
    backend = setting(os.environ, Var.SERVING_BACKEND)
    served = [s.model.id for s in cfg.served_by(pool)]
    salting = Salting(getattr(args, "salt_key", None) or new_key(), backend,
                      pinned_groups({m: cfg.salt_groups_of(m) for m in served}, backend))
    gateway = Gateway(router=router, identity=Identity(consumers, endpoints, keys),
                      limiters={c.name: new_limiter(limiter_key(c.name), c.limits) for c in consumers},
                      metrics=metrics, entitled=entitlements(cfg, consumers, router),
                      model_limiters={(c.name, m): new_limiter(limiter_key(c.name, m), limits)
                                      for c in consumers for m, limits in model_limits_of(c).items()},
                      upstream_warm=args.upstream_warm, shared=shared,
                      proxy_protocol=args.proxy_protocol == "required",
                      drain_timeout_s=cfg.operations.drain_timeout_s, body_timeout_s=args.body_timeout_s,
                      upstream_idle_timeout_s=args.upstream_idle_s, models_state=args.models_state, salting=salting,
                      admission_caps=admission_caps(cfg, pool) if args.fair_admission == "on" else None,
                      worker=worker)
    try:
        spill = spill_setup(cfg, args)
    except PeerKeyMissing as exc:
        log("spill_disabled", reason=f"no peer key: {exc}; trying again every {args.refresh_s:g} s")
        spill = None
        waiting_for_key = True
    else:
        waiting_for_key = False
    if spill is not None:
        gateway.enable_spill(spill)

    async def apply_consumers(new_cfg: FleetConfig, new_consumers: tuple[Consumer, ...]) -> None:
        # Keys before identity: a consumer that now needs a key must not be served keyless meanwhile.
        await keys.set_secret_names(secret_names(new_consumers, new_cfg.api_key_secret_of))
        gateway.set_consumers(new_consumers, entitlements(new_cfg, new_consumers, router))

    source, read = config_source(args)
    refresher = ConfigRefresher(read, source, cfg, args.region, args.pool, apply_consumers, args.refresh_s)
    await endpoints.refresh()
    await keys.refresh()
    background = [asyncio.ensure_future(task.run()) for task in (endpoints, keys, refresher)]
    if waiting_for_key:
        background.append(asyncio.ensure_future(await_peer_key(gateway, cfg, args)))
    # The counts are shared by the workers: the first one writes them for all.
    publishes_queue = bool(getattr(args, "queue_state", None)) and gateway.fair is not None and worker == 0
    if publishes_queue and gateway.fair is not None:
        background.append(asyncio.ensure_future(publish_queue_state(gateway.fair, args.queue_state)))
    # Everything loaded so far (config model, botocore's service models: ~100k objects) lives for
    # the whole process. A full collection over them measured 85 ms on the dev VM, a pause every
    # stream would feel: frozen, and full collections only while this worker holds no request, since
    # the requests a flood holds waiting are as many objects again (runtime/heap.py).
    serve_gc_policy(gateway.holds_connections)
    host, port = args.listen
    await gateway.start(host, port, reuse_port=shared is not None)
    discovery = peer_discovery(cfg, args, gateway)
    if discovery is not None:
        background.append(asyncio.ensure_future(discovery.run()))
    log("gateway_started", worker=worker, listen=f"{args.listen[0]}:{gateway.port}", upstream=f"{args.upstream[0]}:{args.upstream[1]}",
        routes={i: [p.host_header for p in (router.resolve(i).pools)] for i in router.ids},  # type: ignore[union-attr]  # each id resolves
        region=args.region, pool=args.pool, consumers=[c.name for c in consumers],
        proxy_protocol=args.proxy_protocol, endpoints_loaded=endpoints.loaded, config_source=source,
        event_loop=getattr(args, "loop_name", "asyncio"))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if _EARLY_STOP:
        stop.set()
    await stop.wait()
    from runtime import spot

    # A Spot interruption leaves less time than a scale-in: the deadline the runtime wrote, if any.
    gateway.drain_timeout_s = spot.drain_budget_s(args.drain_deadline_file, gateway.drain_timeout_s)
    in_flight = gateway.active
    await gateway.drain()
    if shared is None:
        spot.write_outcome(args.drain_deadline_file, in_flight=in_flight, cut=gateway.active,
                           budget_s=gateway.drain_timeout_s)
    else:  # the parent adds up every worker's and writes one outcome
        shared.set_outcome(worker, in_flight, gateway.active, gateway.drain_timeout_s)
    for task in background:
        task.cancel()
    if publishes_queue:  # the drain answered every waiting request: none waits here any more
        with contextlib.suppress(OSError):
            write_queue_state(args.queue_state, 0)
    await gateway.close()
    metrics.close()
    return 0


class PeerKeyMissing(Exception):
    """The fleet's peer key could not be read; the message says why."""


async def await_peer_key(gateway: Gateway, cfg: FleetConfig, args: argparse.Namespace) -> None:
    """Read the peer key every refresh period until it can be read, then turn spill on."""
    while True:
        await asyncio.sleep(args.refresh_s)
        try:
            setup = await asyncio.get_running_loop().run_in_executor(None, spill_setup, cfg, args)
        except PeerKeyMissing:
            continue
        if setup is not None:
            gateway.enable_spill(setup)
            log("spill_enabled", links=sorted(setup.policy.links) if setup.policy else [])
        return


def spill_setup(cfg: FleetConfig, args: argparse.Namespace) -> SpillSetup | None:
    """The gateway's spill links (home side) and claim checks (receiving side), or None when no consumer of the
    fleet spills from or into this region and no peer is named. PeerKeyMissing when the peer key cannot be read
    (yet: the secret's replica may arrive after this instance): the gateway then serves everything at home,
    refuses forwarded requests, and tries again (serve(), `await_peer_key`)."""
    from fleetcast.config.rules import served_in
    from fleetcast.contract.spill import peer_secret_of, spill_endpoint_parameter, spill_sources, spill_targets

    from .spill import Breaker, RegionLink, SpillPolicy, SpillSetup

    region = args.region
    targets, sources = spill_targets(cfg, region), spill_sources(cfg, region)
    if not targets and not sources and not args.peer and not discovers(cfg, args):
        return None
    try:
        secret = peer_secret_of(cfg, region)
        if args.peer_key_file:
            key = read_key_file(args.peer_key_file)
        elif secret is None:
            raise LookupError(f"{region} holds no peer key (one pool, no spill): give --peer-key-file")
        else:
            import boto3

            value = boto3.client("secretsmanager", region_name=region).get_secret_value(SecretId=secret)
            key = check_key((value.get("SecretString") or "").strip().encode())
    except Exception as exc:  # noqa: BLE001 - no spill is a degraded mode, not a reason to stop serving
        raise PeerKeyMissing(f"{type(exc).__name__}: {exc}") from None
    given = dict(item.split("=", 1) for item in args.spill_endpoint)
    links = {}
    for remote in targets:
        if remote in given:
            host, port = _hostport(given[remote])
        else:
            try:
                import boto3

                host = boto3.client("ssm", region_name=region).get_parameter(
                    Name=spill_endpoint_parameter(cfg.name, remote))["Parameter"]["Value"]
            except Exception as exc:  # noqa: BLE001 - that region is left out; the others still spill
                log("spill_link_missing", remote=remote, error=f"{type(exc).__name__}: {exc}")
                continue
            port = cfg.engine.port
        links[remote] = RegionLink(remote, (host, port),
                                   Breaker(cool_s=args.breaker_cool_s) if args.breaker_cool_s else Breaker())
    served = served_in(cfg)
    adapters = {m.id: {a.id for a in m.adapters} for m in cfg.models}
    reach = {r: frozenset(served.get(r, set()) | {a for m in served.get(r, set()) for a in adapters.get(m, ())})
             for r in links}
    slo = {m.id: (m.slo or cfg.slo).ttft_p99_ms for m in cfg.models}
    slo.update({a.id: slo[m.id] for m in cfg.models for a in m.adapters})
    peers = peer_links(cfg, region, args.peer, args.breaker_cool_s)
    return SpillSetup(region, key, cfg.provider.account, {c.name: c for c in cfg.consumers}, slo,
                      SpillPolicy(links, reach) if links else None,
                      frozenset(link.address[0] for link in peers.values()), peers)


def peer_links(cfg: FleetConfig, region: str, given: list[str], cool_s: float | None) -> dict[str, RegionLink]:
    """`--peer HOST:PORT=POOL` as links to balance onto, each priced by its pool's instance type in the shipped
    price table (fleetcast.config.catalog; none known: 0, no preference)."""
    from fleetcast.config.catalog import instance_catalog

    from .spill import Breaker, RegionLink

    catalog = instance_catalog()
    pools = {p.name: p for p in cfg.region(region).pools}
    links = {}
    for item in given:
        address, _, pool_name = item.partition("=")
        pool = pools.get(pool_name)
        if pool is None:
            raise SystemExit(f"gateway: --peer {item}: {pool_name or '(no pool)'} is not a pool of {region}; "
                             f"write HOST:PORT=POOL with one of: {', '.join(pools)}")
        spec = catalog.get(pool.instance_type) if pool.instance_type in catalog else None
        price = (spec.price_per_hour.get(region) if spec is not None else None) or 0.0
        links[address] = RegionLink(address, _hostport(address), Breaker(cool_s=cool_s) if cool_s else Breaker(),
                                    pool=pool_name, price=price, direct=True)
    return links


def discovers(cfg: FleetConfig, args: argparse.Namespace) -> bool:
    """Whether this gateway finds its peers (--peer-discovery asg): only where a peer key is, the regions that spill,
    are spilled to or have several pools (fleetcast.contract.spill.keyed_regions): elsewhere no claim could be
    signed, and a region of one pool has no other pool to balance onto."""
    from fleetcast.contract.spill import keyed_regions

    return getattr(args, "peer_discovery", "off") == "asg" and args.region in keyed_regions(cfg)


def peer_discovery(cfg: FleetConfig, args: argparse.Namespace, gateway: Gateway) -> PeerDiscovery | None:
    """The discovery loop (discovery.py) that keeps `gateway`'s peers: the --peer list plus the instances found."""
    if getattr(args, "peer_discovery", "off") != "asg":
        return None
    if not discovers(cfg, args):
        log("peer_discovery_off", reason=f"{args.region} holds no peer key: one pool, and no consumer spills from "
            "or into it")
        return None
    import boto3

    from .discovery import DISCOVERY_PERIOD_S, AsgPeerSource, PeerDiscovery, fleet_groups, links_of

    own = args.instance_id
    if own is None:
        from runtime.lifecycle import Imds, MetadataError

        try:
            own = Imds(setting(os.environ, Var.IMDS_ENDPOINT)).instance_id()
        except MetadataError as exc:  # its own address then answers its headroom reads: no harm but a wasted read
            log("peer_discovery_no_instance_id", error=str(exc))
    source = AsgPeerSource(boto3.client("autoscaling", region_name=args.region),
                           boto3.client("ec2", region_name=args.region), fleet_groups(cfg, args.region),
                           args.region, gateway.port, own)
    given = list(args.peer)

    def apply(peers: list[Peer]) -> None:
        gateway.set_peers({**links_of(peers, args.breaker_cool_s),
                           **peer_links(cfg, args.region, given, args.breaker_cool_s)})

    return PeerDiscovery(source, apply, args.peer_discovery_s or DISCOVERY_PERIOD_S)


def _use_uvloop(choice: str) -> bool:
    if choice == "asyncio":
        return False
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise SystemExit("gateway: --event-loop uvloop, but uvloop is not installed") from None
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


_EARLY_STOP: list[int] = []  # a SIGTERM that came before the event loop took the signal over


def _worker(args: argparse.Namespace, shared: SharedState | None, index: int) -> None:
    # Forked with the parent's handlers: until the loop installs its own, a SIGTERM is only noted
    # (serve() then drains at once) and SIGINT is the parent's to forward.
    signal.signal(signal.SIGTERM, lambda signum, _frame: _EARLY_STOP.append(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    reserve_descriptors()  # the fork left this worker one thread: now its table grows without a grace period
    args.loop_name = "uvloop" if _use_uvloop(args.event_loop) else "asyncio"
    sys.exit(asyncio.run(serve(args, shared, index)))


def run_workers(args: argparse.Namespace) -> int:
    """Several gateway processes on one port (SO_REUSEPORT), limits shared (runtime/gateway/shared.py).

    The parent forks them before anything starts a thread or an event loop, forwards SIGTERM to
    each (each drains its own streams), and writes the Spot drain outcome for all of them.
    If a worker dies on its own, the others are stopped too and the exit status says so: the
    runtime restarts the gateway as a whole.
    """
    import multiprocessing
    import socket

    from runtime import spot

    from .shared import SharedState

    shared = SharedState(args.workers)
    # Hold the port (bound, not listening: it takes no connections) so that port 0 resolves once
    # and every worker binds the same one.
    holder = socket.socket(socket.AF_INET6 if ":" in args.listen[0] else socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        holder.bind(args.listen)
    except OSError as exc:
        raise SystemExit(f"gateway: cannot listen on {args.listen[0]}:{args.listen[1]}: {exc.strerror}") from None
    args.listen = (args.listen[0], holder.getsockname()[1])
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_worker, args=(args, shared, i), name=f"gateway-worker-{i}", daemon=False)
               for i in range(args.workers)]
    stopping = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for proc in workers:
            if proc.is_alive() and proc.pid is not None:  # a started process has its pid
                os.kill(proc.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for proc in workers:
        proc.start()
    holder.close()  # the workers' sockets hold the port from here
    failed = 0
    while any(proc.is_alive() for proc in workers):
        for proc in workers:
            proc.join(0.2)
            if proc.exitcode not in (None, 0) and not stopping:
                log("gateway_worker_died", worker=proc.name, exit_code=proc.exitcode)
                failed = proc.exitcode if proc.exitcode > 0 else 1
                forward(signal.SIGTERM, None)
    outcomes = shared.outcomes(args.workers)
    spot.write_outcome(args.drain_deadline_file, in_flight=sum(o[0] for o in outcomes),
                       cut=sum(o[1] for o in outcomes),
                       budget_s=max(o[2] for o in outcomes))
    return failed or max(proc.exitcode or 0 for proc in workers)


def main(argv: list[str] | None = None) -> int:
    from fleetcast.contract.isolation import new_key

    args = build_parser().parse_args(argv)
    # One KV-cache salt key per gateway start, drawn before the workers fork so that they all salt alike; it is
    # never written anywhere, and a restart only costs the engine's cached prefixes one more prefill each.
    args.salt_key = new_key()
    if args.workers > 1:
        return run_workers(args)
    reserve_descriptors()
    args.loop_name = "uvloop" if _use_uvloop(args.event_loop) else "asyncio"
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
