"""Measure what the consumer gateway adds to TTFT and inter-token latency, on loopback.

    python -m scripts.bench_gateway [--concurrency 1,4,16,32,64,128] [--tokens 24]
        [--token-interval-ms 8] [--ttft-ms 15] [--requests 384] [--modes direct,gateway,aiohttp]
        [--cpus N] [--json FILE]

One run starts, as separate processes:
  - a timed upstream: an OpenAI-shaped SSE server that emits `--tokens` tokens,
    the first after `--ttft-ms`, then one every `--token-interval-ms`, each
    event stamped with the server's CLOCK_MONOTONIC send time;
  - the real gateway (`python -m runtime.gateway`, proxy protocol required,
    identity from a loopback EC2 fake, metering on, EMF to a file);
  - for comparison, a minimal aiohttp reverse proxy (no identity, no metering):
    the floor a framework-based gateway could reach;
and a client in this process that runs each concurrency level against each
mode in turn (same upstream, same schedule), sending the PROXY v2 header with
a VPC endpoint TLV to the gateway exactly as the NLB does.

With --cpus N the gateway (and the aiohttp peer, for a fair comparison) run pinned
to N cores (sched_setaffinity, what taskset does), and the upstream and the client
to the other cores, so the proxy gets exactly the CPUs a g6e.xlarge leaves it
(4 vCPUs shared with the engine: --cpus 2). The machine needs N + 2 cores for that.

Figures (client side, per DESIGN.md): TTFT = request sent -> first content
event; ITL = gaps between consecutive content events; delivery delay = event
received - event sent by the server (isolates the proxy hop from the server's
own timer jitter). "Added" = mode minus direct at the same percentile.

It ends with the CPU fair admission adds per request (runtime/gateway/fair.py, in process, pinned to one
core, 7 runs): a request that finds room, and one that waits and is handed the slot; bound 0.05 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple, TextIO

from runtime.descriptors import reserve_descriptors
from runtime.ttft_trace import process_cpu_s

ROOT = Path(__file__).resolve().parents[1]
REGION, POOL = "ap-northeast-2", "l40s"
SERVICE_ID = "vpce-svc-0a1b2c3d4e5f60718"
BENCH_VPCE, BENCH_ACCOUNT = "vpce-0aaaaaaaaaaaaaaa1", "444455556666"
HOPS_ENV = "BENCH_GATEWAY_HOPS"  # --trace-hops: the folder where the client, relay and upstream stamp each hop


# ---------------------------------------------------------------- loopback doubles


_hop_files: dict[str, TextIO] = {}


def tracing_hops() -> bool:
    """--trace-hops is on: callers check first, so that without it no hop's fields are even looked up."""
    return bool(os.environ.get(HOPS_ENV))


def hop(kind: str, *fields: int) -> None:
    """With --trace-hops, one line per hop of a connection's first request (monotonic ns; ports to join on):
    S client sent, A relay accepted, R relay read it and forwarded it, U upstream read it."""
    folder = os.environ[HOPS_ENV]
    out = _hop_files.get(folder)
    if out is None:
        out = _hop_files[folder] = open(Path(folder) / f"hops-{os.getpid()}", "a", buffering=1)  # noqa: SIM115
    out.write(" ".join([kind, *map(str, fields)]) + "\n")


def hops_summary(folder: Path) -> dict[str, float]:
    """The first requests' hops through a byte relay, joined by port and measured from the client's send
    (ms, p50 and max): `accept`, `read` (the relay's) and `upstream` (read by the upstream). Other modes have
    no relay stamps: their way in as a whole is each level's `reach_*` figures."""
    sent: dict[int, int] = {}
    accepted: dict[int, int] = {}
    read: dict[int, tuple[int, int]] = {}
    upstream: dict[int, list[int]] = {}
    for path in folder.glob("hops-*"):
        for line in path.read_text().splitlines():
            kind, *values = line.split()
            v = [int(x) for x in values]
            if kind == "S":
                sent[v[0]] = v[1]
            elif kind == "A":
                accepted[v[0]] = v[1]
            elif kind == "R":
                read[v[0]] = (v[1], v[2])
            elif kind == "U":
                upstream.setdefault(v[0], []).append(v[1])
    gaps: dict[str, list[float]] = {"accept": [], "read": [], "upstream": []}
    for port, at in sent.items():
        if port in accepted:
            gaps["accept"].append((accepted[port] - at) / 1e6)
        if port in read:
            up_port, read_at = read[port]
            gaps["read"].append((read_at - at) / 1e6)
            reads = [u for u in upstream.get(up_port, []) if u >= at]
            if reads:
                gaps["upstream"].append((min(reads) - at) / 1e6)
    out = {}
    for name, values in gaps.items():
        if values:
            out[f"{name}_p50"], out[f"{name}_max"] = percentile(values, 0.5), max(values)
    return out


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


async def timed_upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ttft_s: float,
                         interval_s: float) -> None:
    """A trtllm-serve-shaped SSE server on a fixed schedule (absolute deadlines: no drift).

    A non-streaming request gets its whole completion as one JSON body when the last token
    would have been sent; anything but POST gets a 404 (scripts/soak_gateway.py sends both).
    """
    loop = asyncio.get_running_loop()
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path = lines[0].split(" ")[:2]
            length = next((int(h.split(":", 1)[1]) for h in lines if h.lower().startswith("content-length:")), 0)
            body = await reader.readexactly(length) if length else b""
            received = time.monotonic_ns()  # the request is in: what it took to get here is the hop's, not ours
            if tracing_hops():
                hop("U", writer.get_extra_info("peername")[1], received)
            if path == "/health":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                continue
            if method != "POST":
                writer.write(b'HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}')
                continue
            request = json.loads(body)
            n = int(request.get("max_tokens", 16))
            usage = bool((request.get("stream_options") or {}).get("include_usage"))
            start = loop.time()
            if not request.get("stream"):
                await asyncio.sleep(ttft_s + (n - 1) * interval_s)
                payload = json.dumps({"id": "cmpl-b", "object": "text_completion", "model": "bench",
                                      "choices": [{"index": 0, "text": "".join(f" tok{i}" for i in range(n)),
                                                   "finish_reason": "length"}],
                                      "usage": {"prompt_tokens": 8, "completion_tokens": n,
                                                "total_tokens": 8 + n}}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                             % (len(payload), payload))
                continue
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(n):
                delay = start + ttft_s + i * interval_s - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                event = {"id": "cmpl-b", "object": "text_completion", "model": "bench",
                         "choices": [{"index": 0, "text": f" tok{i}", "finish_reason": None}],
                         "t": time.monotonic_ns(), "r": received}
                writer.write(_chunk(b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"))
            if usage:
                u = {"id": "cmpl-b", "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": n,
                                                             "total_tokens": 8 + n}}
                writer.write(_chunk(b"data: " + json.dumps(u).encode() + b"\n\n"))
            writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


class FakeEc2Endpoints:
    """Answers EC2 DescribeVpcEndpointConnections (query API, XML) on loopback for given (vpce, account) pairs."""

    def __init__(self, connections: list[tuple[str, str]], service_id: str = SERVICE_ID):
        self.connections = connections
        self.service_id = service_id
        self.calls = 0

    def xml(self) -> bytes:
        items = "".join(
            f"<item><serviceId>{self.service_id}</serviceId><vpcEndpointId>{v}</vpcEndpointId>"
            f"<vpcEndpointOwner>{a}</vpcEndpointOwner><vpcEndpointState>available</vpcEndpointState></item>"
            for v, a in self.connections)
        return (f'<?xml version="1.0" encoding="UTF-8"?><DescribeVpcEndpointConnectionsResponse '
                f'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>r-1</requestId>'
                f"<vpcEndpointConnectionSet>{items}</vpcEndpointConnectionSet>"
                f"</DescribeVpcEndpointConnectionsResponse>").encode()

    @staticmethod
    async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
        """One HTTP/1.1 request: its head (through the blank line) and its Content-Length body."""
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(h.split(b":", 1)[1]) for h in head.split(b"\r\n")
                       if h.lower().startswith(b"content-length:")), 0)
        return head, await reader.readexactly(length)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            _, body = await self.read_request(reader)
            self.calls += 1
            if b"Action=DescribeVpcEndpointConnections" in body:
                payload, status = self.xml(), b"200 OK"
            else:
                payload, status = b"<Response><Errors><Error><Code>InvalidAction</Code></Error></Errors></Response>", \
                    b"400 Bad Request"
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: text/xml\r\nContent-Length: "
                         + str(len(payload)).encode() + b"\r\nConnection: close\r\n\r\n" + payload)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def start(self) -> int:
        server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return server.sockets[0].getsockname()[1]


async def aiohttp_proxy(port: int, upstream: int) -> None:
    """The comparison candidate: a plain aiohttp streaming reverse proxy (no identity, no metering)."""
    from aiohttp import ClientSession, TCPConnector, web

    session = ClientSession(connector=TCPConnector(limit=0), auto_decompress=False)
    skip = {"host", "content-length", "transfer-encoding", "connection"}

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in skip}
        async with session.request(request.method, f"http://127.0.0.1:{upstream}{request.rel_url}",
                                   data=body, headers=headers) as up:
            response = web.StreamResponse(status=up.status, headers={
                k: v for k, v in up.headers.items() if k.lower() not in skip})
            await response.prepare(request)
            async for data in up.content.iter_any():
                await response.write(data)
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


async def raw_relay(port: int, upstream: int, warm: int = 32) -> None:
    """The floor: a byte relay with no logic at all (no PROXY header, no HTTP, no metering), each client
    connection spliced to an upstream connection opened ahead of time, on asyncio protocols (no streams).
    What is left of the hop through Python on these cores is the host's: syscalls, wake-ups, the loop."""
    loop = asyncio.get_running_loop()
    spare: list[asyncio.Transport] = []

    class Side(asyncio.Protocol):
        def __init__(self) -> None:
            self.transport: asyncio.Transport | None = None
            self.peer: asyncio.Transport | None = None
            self.held: list[bytes] = []

        def connection_made(self, transport) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            if self.peer is None:
                self.held.append(data)
            else:
                self.peer.write(data)

        def connection_lost(self, exc) -> None:
            if self.transport in spare:
                spare.remove(self.transport)
            if self.peer is not None:
                self.peer.close()

    def splice(client: asyncio.Transport, client_side: Side, up: asyncio.Transport) -> None:
        up_side = up.get_protocol()
        client_side.peer, up_side.peer = up, client
        for data in client_side.held:
            up.write(data)
        client_side.held.clear()

    async def open_one() -> asyncio.Transport:
        transport, _ = await loop.create_connection(Side, "127.0.0.1", upstream)
        return transport

    async def top_up() -> None:
        failures = 0
        while len(spare) < warm:
            try:
                spare.append(await open_one())
            except OSError:  # the upstream is still starting
                failures += 1
                if failures > 100:
                    raise
                await asyncio.sleep(0.1)

    class Client(Side):
        first = True

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.first and tracing_hops():
                self.first = False
                assert self.transport is not None
                hop("R", self.transport.get_extra_info("peername")[1],
                    self.peer.get_extra_info("sockname")[1] if self.peer else 0, time.monotonic_ns())

        def connection_made(self, transport) -> None:
            if tracing_hops():
                hop("A", transport.get_extra_info("peername")[1], time.monotonic_ns())
            super().connection_made(transport)
            if spare:
                splice(transport, self, spare.pop())
                loop.create_task(top_up())
            else:
                loop.create_task(self._connect(transport))

        async def _connect(self, transport) -> None:
            splice(transport, self, await open_one())

    await top_up()
    await loop.create_server(Client, "127.0.0.1", port, reuse_port=True, backlog=1024)
    await asyncio.Event().wait()


def _serve_forked(processes: int, serve) -> None:
    """Run `serve()` (a coroutine function binding its port with SO_REUSEPORT) in `processes` processes: this
    one and processes-1 forked before any event loop exists; SIGTERM to this one ends them all."""
    children = []
    for _ in range(processes - 1):
        pid = os.fork()
        if pid == 0:
            children = []
            break
        children.append(pid)
    reserve_descriptors()  # as each gateway worker does: no proxy here pays a descriptor-table growth mid-level
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        asyncio.run(serve())
    finally:
        for pid in children:
            os.kill(pid, signal.SIGTERM)


def _serve_relay(port: int, upstream: int, workers: int, loop: str = "auto") -> None:
    """`workers` relay processes on one port (SO_REUSEPORT), as the gateway's --workers; uvloop when installed,
    unless `loop` is "asyncio"."""
    if loop != "asyncio":
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            pass
    _serve_forked(workers, lambda: raw_relay(port, upstream))


# ---------------------------------------------------------------- client


def _proxy_header() -> bytes:
    sys.path.insert(0, str(ROOT))
    from runtime.gateway import ppv2

    return ppv2.build(("10.60.1.10", 40000), ("10.40.0.5", 8000), vpce_id=BENCH_VPCE)


class Sample:
    __slots__ = ("ttft_ms", "gaps_ms", "delays_ms", "tokens", "new_connection", "connect_ms", "reach_ms")

    def __init__(self, new_connection: bool, connect_ms: float | None = None):
        self.new_connection = new_connection  # first request on its connection: TTFT includes connection setup
        self.connect_ms = connect_ms  # a new connection's connect(), before the request is sent (not in its TTFT)
        self.ttft_ms = None
        self.reach_ms = None  # request sent -> the upstream has read it: the request's way in, through the proxy
        self.gaps_ms: list[float] = []
        self.delays_ms: list[float] = []
        self.tokens = 0


async def _worker(port: int, header: bytes | None, body: bytes, count: int, out: list[Sample],
                  opens_at: float = 0.0) -> None:
    if opens_at:
        await asyncio.sleep(opens_at)
    connecting = time.monotonic_ns()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    connect_ms = (time.monotonic_ns() - connecting) / 1e6
    if header:
        writer.write(header)
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
    try:
        for i in range(count):
            sample = Sample(new_connection=i == 0, connect_ms=connect_ms if i == 0 else None)
            sent = time.monotonic_ns()
            if i == 0 and tracing_hops():
                hop("S", writer.get_extra_info("sockname")[1], sent)
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"bench request failed: {head[:80]!r}")
            buf, last = b"", None
            while True:
                data = await reader.read(65536)
                if not data:
                    raise RuntimeError("connection closed mid-stream")
                now = time.monotonic_ns()
                buf += data
                # The chunked framing around each event is parsed lazily: events are "data: ...\n\n".
                done = buf.endswith(b"0\r\n\r\n") and b"data: [DONE]" in buf
                while True:
                    start = buf.find(b"data: {")
                    if start < 0:
                        break
                    end = buf.find(b"\n\n", start)
                    if end < 0:
                        break
                    event = json.loads(buf[start + 6:end])
                    buf = buf[end + 2:]
                    if event.get("choices") and event["choices"][0].get("text"):
                        sample.tokens += 1
                        if sample.ttft_ms is None:
                            sample.ttft_ms = (now - sent) / 1e6
                            sample.reach_ms = (event["r"] - sent) / 1e6
                        else:
                            sample.gaps_ms.append((now - last) / 1e6)
                        sample.delays_ms.append((now - event["t"]) / 1e6)
                        last = now
                if done:
                    break
            out.append(sample)
    finally:
        writer.close()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _request_body(tokens: int, model: str) -> bytes:
    return json.dumps({"model": model, "prompt": "measure me", "max_tokens": tokens, "stream": True}).encode()


def arrival_offsets(connections: int, per_s: float, seed: int) -> list[float]:
    """When each connection opens, in seconds from the level's start: all at once (per_s 0: the burst a
    cold client pool makes), or a Poisson process of `per_s` new connections a second (a client
    population that grows), seeded so that every mode of a run meets the same arrivals."""
    if not per_s:
        return [0.0] * connections
    rng, at, offsets = random.Random(seed), 0.0, []
    for _ in range(connections):
        at += rng.expovariate(per_s)
        offsets.append(at)
    return offsets


async def _client_samples(port: int, header: bytes | None, connections: int, per_worker: int, tokens: int,
                          model: str, opens_per_s: float = 0.0, seed: int = 0) -> list[Sample]:
    body = _request_body(tokens, model)
    samples: list[Sample] = []
    offsets = arrival_offsets(connections, opens_per_s, seed)
    await asyncio.gather(*(_worker(port, header, body, per_worker, samples, at) for at in offsets))
    return samples


async def _spread_samples(port: int, header: bytes | None, concurrency: int, per_worker: int, tokens: int,
                          procs: int, cpus: set[int] | None, opens_per_s: float = 0.0) -> list[Sample]:
    """The level's connections spread over `procs` client processes, released together: one Python client
    timestamping 128 streams' events queues them behind each other (a burst of 128 events takes it
    milliseconds), which would be measured as the proxy's."""
    shares = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    children = []
    for i, share in enumerate(filter(None, shares)):
        # Each process opens its share at its share of the rate: together, one Poisson process of opens_per_s.
        rate = opens_per_s * share / concurrency
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "scripts.bench_gateway", "_client", str(port), (header or b"").hex(), str(share),
            str(per_worker), str(tokens), bench_model(), repr(rate), str(concurrency * 100 + i), cwd=str(ROOT),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE)
        if cpus:
            os.sched_setaffinity(child.pid, cpus)
        children.append(child)
    for child in children:  # every one imported and waiting
        assert child.stdout is not None
        if (await child.stdout.readline()).strip() != b"ready":
            raise RuntimeError("a bench client process did not start")
    for child in children:
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        await child.stdin.drain()
    samples = []
    for child in children:
        out, _ = await child.communicate()
        if child.returncode:
            raise RuntimeError(f"a bench client process failed (exit {child.returncode})")
        for ttft, gaps, delays, tokens_seen, new, connect, reach in json.loads(out):
            sample = Sample(new, connect)
            sample.reach_ms = reach
            sample.ttft_ms, sample.gaps_ms, sample.delays_ms, sample.tokens = ttft, gaps, delays, tokens_seen
            samples.append(sample)
    return samples


def _client_main(argv: list[str]) -> None:
    port, header, connections, per_worker, tokens, model = (int(argv[0]), bytes.fromhex(argv[1]) or None,
                                                            int(argv[2]), int(argv[3]), int(argv[4]), argv[5])
    opens_per_s, seed = float(argv[6]), int(argv[7])
    print("ready", flush=True)
    sys.stdin.readline()
    samples = asyncio.run(_client_samples(port, header, connections, per_worker, tokens, model, opens_per_s, seed))
    print(json.dumps([[s.ttft_ms, s.gaps_ms, s.delays_ms, s.tokens, s.new_connection, s.connect_ms, s.reach_ms]
                      for s in samples]))


class ProcessStats(NamedTuple):
    cpu_s: float  # user + system
    runq_wait_s: float  # runnable but not running: waiting for a core (schedstat, sched-stats.rst)
    minor_faults: int  # pages first touched (a VM may take each one to its host)


def process_stats(pid: int) -> ProcessStats:
    """What `pid` and its live child processes (gateway workers) have used so far, from proc(5) and their CPU clocks."""
    def stat(p: int | str) -> list[str]:
        with open(f"/proc/{p}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    pids = [pid]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(stat(entry)[1]) == pid:
                    pids.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    cpu_s, wait_ns, faults = 0.0, 0, 0
    for p in pids:
        try:
            fields = stat(p)
            # The process's CPU clock, in ns: utime and stime (fields 14, 15) count clock ticks, and a short run's
            # CPU per request read 0 or one tick.
            cpu_s += process_cpu_s(p)
            faults += int(fields[7])  # minflt (field 10)
            with open(f"/proc/{p}/schedstat") as f:
                wait_ns += int(f.read().split()[1])  # time spent waiting on a runqueue, ns
        except (OSError, IndexError, ValueError):
            pass
    return ProcessStats(cpu_s, wait_ns / 1e9, faults)


def steal_ms(cpus: set[int], stat: str = "/proc/stat") -> float:
    """Milliseconds the hypervisor ran something else while these cores had work ("steal", proc(5)
    /proc/stat): on a virtual machine, time a pinned proxy stood still through no fault of its own."""
    total = 0
    with open(stat) as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus and len(fields) > 7:
                total += int(fields[7])
    return total * 1000 / os.sysconf("SC_CLK_TCK")


# The kernel's TCP counters that say a segment was retransmitted or dropped on its way in (Linux's Tcp and
# TcpExt names, proc(5) /proc/net/{snmp,netstat}). On loopback nothing is lost on the wire: a retransmission
# there waited on a timer, unless a D-SACK came back for it (TCPDSACKRecv: the first copy had arrived, the
# probe was spurious and cost the request nothing). DelayedACKs moves all the time; it is kept for the record.
TCP_COUNTERS = ("Tcp:RetransSegs", "TcpExt:TCPLossProbes", "TcpExt:TCPLossProbeRecovery", "TcpExt:TCPTimeouts",
                "TcpExt:TCPSynRetrans", "TcpExt:TCPFastRetrans", "TcpExt:ListenOverflows", "TcpExt:ListenDrops",
                "TcpExt:TCPBacklogDrop", "TcpExt:TCPDSACKRecv", "TcpExt:TCPDSACKOldSent",
                "TcpExt:TCPSpuriousRtxHostQueues", "TcpExt:DelayedACKs", "TcpExt:TCPReqQFullDrop")


def tcp_counters(paths: tuple[str, ...] = ("/proc/net/snmp", "/proc/net/netstat")) -> dict[str, int]:
    """The host's TCP_COUNTERS now (host-wide: the bench runs one proxy at a time, so a level's delta is its own)."""
    found: dict[str, int] = {}
    for path in paths:
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for names, values in zip(lines[0::2], lines[1::2]):
            group, *keys = names.split()
            for key, value in zip(keys, values.split()[1:]):
                if f"{group}{key}" in TCP_COUNTERS:
                    found[f"{group}{key}"] = int(value)
    return found


def wake_spinners(cpus: set[int]) -> list[subprocess.Popen]:
    """One SCHED_IDLE busy loop per core: the core never halts, so a wake-up never waits on the hypervisor
    to schedule a halted virtual CPU again, and any runnable proxy preempts the loop at once (sched(7))."""
    code = ("import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True:\n    pass\n")
    return [_spawn(["-c", code], cpus={cpu}) for cpu in sorted(cpus)]


async def run_level(port: int, header: bytes | None, concurrency: int, requests: int, tokens: int,
                    client_procs: int = 1, client_cpus: set[int] | None = None, proxy_pid: int | None = None,
                    proxy_cpus: set[int] | None = None, opens_per_s: float = 0.0) -> dict:
    per_worker = max(1, -(-requests // concurrency))
    hops = Path(os.environ[HOPS_ENV]) if os.environ.get(HOPS_ENV) else None
    for stale in hops.glob("hops-*") if hops else ():
        stale.write_bytes(b"")  # truncated, not removed: the relay and upstream keep appending to theirs
    before = process_stats(proxy_pid) if proxy_pid else None
    stolen_before = steal_ms(proxy_cpus) if proxy_cpus else 0.0
    tcp_before = tcp_counters()
    started = time.monotonic()
    if min(client_procs, concurrency) > 1:
        samples = await _spread_samples(port, header, concurrency, per_worker, tokens, min(client_procs, concurrency),
                                        client_cpus, opens_per_s)
    else:
        samples = await _client_samples(port, header, concurrency, per_worker, tokens, bench_model(), opens_per_s,
                                        concurrency * 100)
    elapsed = time.monotonic() - started
    tcp_after = tcp_counters()
    ttft = [s.ttft_ms for s in samples]
    kept = [s.ttft_ms for s in samples if not s.new_connection]
    new = [s.ttft_ms for s in samples if s.new_connection]
    connects = [s.connect_ms for s in samples if s.connect_ms is not None]
    gaps = [g for s in samples for g in s.gaps_ms]
    delays = [d for s in samples for d in s.delays_ms]
    assert all(s.tokens == tokens for s in samples), "a stream lost tokens"
    result = {
        "requests": len(samples), "itl_samples": len(gaps), "seconds": round(elapsed, 2),
        "ttft_p50": percentile(ttft, 0.5), "ttft_p99": percentile(ttft, 0.99),
        "ttft_kept_p99": percentile(kept, 0.99), "kept_samples": len(kept),
        "itl_p50": percentile(gaps, 0.5), "itl_p99": percentile(gaps, 0.99),
        "delay_p50": percentile(delays, 0.5), "delay_p99": percentile(delays, 0.99),
        # The burst of first requests on their own, and how long their connect() took before it (outside TTFT):
        # to tell a slow accept from a slow first byte.
        "ttft_new_p50": percentile(new, 0.5), "ttft_new_max": max(new, default=float("nan")),
        "connect_p99": percentile(connects, 0.99), "connect_max": max(connects, default=float("nan")),
        # Of a TTFT, the request's way in (sent -> read by the upstream): where a slow first request loses its time.
        "reach_new_p50": percentile([s.reach_ms for s in samples if s.new_connection], 0.5),
        "reach_new_max": max((s.reach_ms for s in samples if s.new_connection), default=float("nan")),
        "reach_kept_p99": percentile([s.reach_ms for s in samples if not s.new_connection], 0.99),
        "tcp": {name.split(":")[1]: tcp_after[name] - tcp_before[name] for name in tcp_after
                if name in tcp_before and tcp_after[name] != tcp_before[name]},
    }
    if proxy_pid:
        # CPU the proxy spent per request (its events included), and how busy that kept its cores: a tail
        # that grows while the cores are far from busy is not the proxy's Python.
        after = process_stats(proxy_pid)
        assert before is not None
        cpu = after.cpu_s - before.cpu_s
        # Waiting for a core and first-touched pages: a tail with neither is the proxy's own code (or a
        # sleep), one with them is the host's scheduling or memory.
        result["proxy_runq_wait_ms"] = round((after.runq_wait_s - before.runq_wait_s) * 1000, 2)
        result["proxy_minor_faults"] = after.minor_faults - before.minor_faults
        result["cpu_ms_per_request"] = round(cpu * 1000 / max(1, len(samples)), 3)
        result["cpu_busy"] = round(cpu / elapsed / (len(proxy_cpus) if proxy_cpus else os.cpu_count() or 1), 3)
    if proxy_cpus:
        result["proxy_steal_ms"] = round(steal_ms(proxy_cpus) - stolen_before, 1)
    if hops:
        result["hops"] = hops_summary(hops)
    return result


# ---------------------------------------------------------------- orchestration


def free_port() -> int:
    sys.path.insert(0, str(ROOT))
    from runtime.devtools.harness import free_port as loopback_port

    return loopback_port()


async def _wait_port(port: int, header: bytes | None, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write((header or b"") + b"GET /health HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
            head = await reader.read(64)
            writer.close()
            if head.startswith(b"HTTP/1.1 200"):
                return
        except OSError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"nothing healthy on port {port} after {timeout:g} s")


def bench_config_data() -> dict:
    """The shipped config served to one consumer (the bench account) with limits and an admission cap nobody
    reaches."""
    sys.path.insert(0, str(ROOT))
    from fleetcast.config import load_config

    data = load_config(ROOT / "config" / "fleet.yaml").model_dump(mode="json")
    data["consumers"] = [c for c in data["consumers"] if c["account"] == BENCH_ACCOUNT][:1]
    data["consumers"][0]["limits"] = {"max_concurrency": 10000, "requests_per_minute": 10_000_000}
    # The timed upstream has no batch limit: an admission cap at the shipped max_batch_size (64) would queue the
    # bench's 128-stream level at the gateway and time the queue, not the hop.
    data["engine"]["max_batch_size"] = 2048
    return data


@functools.lru_cache(maxsize=1)
def bench_model() -> str:
    """The model the bench's requests name: the shipped config's (the gateway routes by it)."""
    sys.path.insert(0, str(ROOT))
    from fleetcast.config import load_config

    return load_config(ROOT / "config" / "fleet.yaml").model.id


def write_config(path: Path, data: dict) -> None:
    from fleetcast.config import parse_config

    parse_config(data, "<bench config>")
    path.write_text(json.dumps(data))


def _bench_config(path: Path) -> None:
    write_config(path, bench_config_data())


def _spawn(args: list[str], env: dict | None = None, stdout=subprocess.DEVNULL,
           stderr=subprocess.DEVNULL, cpus: set[int] | None = None, cwd: Path = ROOT) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, *args], cwd=str(cwd), env={**os.environ, **(env or {})},
                            stdout=stdout, stderr=stderr)
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)  # before it starts serving: its threads inherit the mask
    return proc


def cpu_split(cpus: int | None) -> tuple[set[int] | None, set[int] | None]:
    """(proxy cores, everything else's cores) for --cpus; (None, None) without it."""
    if not cpus:
        return None, None
    available = sorted(os.sched_getaffinity(0))
    if cpus < 1 or len(available) < cpus + 2:
        raise SystemExit(f"--cpus {cpus}: this machine lets the bench use {len(available)} cores; it needs "
                         f"--cpus + 2 (the upstream and the client get cores of their own)")
    return set(available[:cpus]), set(available[cpus:])


def gateway_args(port: int, up_port: int, config: Path, loop: str = "auto") -> list[str]:
    """`python -m runtime.gateway` as on an instance: PROXY v2 required, identity from the EC2 fake."""
    return ["-m", "runtime.gateway", "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{up_port}",
            "--config-json", str(config), "--region", REGION, "--pool", POOL, "--service-id", SERVICE_ID,
            "--event-loop", loop]


def gateway_env(ec2_port: int) -> dict:
    return {"AWS_ENDPOINT_URL_EC2": f"http://127.0.0.1:{ec2_port}", "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench", "AWS_MAX_ATTEMPTS": "1"}


async def main_async(args: argparse.Namespace) -> dict:
    levels = [int(c) for c in args.concurrency.split(",")]
    modes = args.modes.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    up_port, aio_port = free_port(), free_port()
    ec2 = FakeEc2Endpoints([(BENCH_VPCE, BENCH_ACCOUNT)])
    ec2_port = await ec2.start()
    config = tmp / "fleet.json"
    _bench_config(config)
    emf = open(tmp / "emf.log", "w")  # noqa: SIM115 - the gateways write it; closed after they stop
    proxy_cpus, other_cpus = cpu_split(args.cpus)
    if args.trace_hops:
        (tmp / "hops").mkdir()
        os.environ[HOPS_ENV] = str(tmp / "hops")  # before anything is spawned: every process stamps its hops
    if other_cpus:
        os.sched_setaffinity(0, other_cpus)  # the client (this process) off the proxy's cores
    procs = [_spawn(["-m", "scripts.bench_gateway", "_upstream", str(up_port), str(args.ttft_ms),
                     str(args.token_interval_ms), str(args.upstream_procs), "nogc"], cpus=other_cpus)]
    header = _proxy_header()
    relay_port, relay_asyncio_port = free_port(), free_port()
    targets = {"direct": (up_port, None), "aiohttp": (aio_port, None), "relay": (relay_port, None),
               "relay-asyncio": (relay_asyncio_port, None)}
    pids: dict[str, int] = {}
    for mode in modes:
        if mode.startswith("gateway"):
            # gateway: the production default (uvloop when installed); gateway-asyncio: the stdlib loop;
            # gateway-base: the gateway of another checkout (--base-tree), for a before/after in one run.
            loop = {"gateway": "auto", "gateway-asyncio": "asyncio", "gateway-uvloop": "uvloop",
                    "gateway-base": "auto", "gateway-alt": "auto"}[mode]
            port = free_port()
            targets[mode] = (port, header)
            if mode == "gateway-base":
                tree = Path(args.base_tree).resolve()
                env = {**gateway_env(ec2_port),
                       "PYTHONPATH": os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])}
                procs.append(_spawn(gateway_args(port, up_port, config, loop) + args.gateway_arg, env, stdout=emf,
                                    cpus=proxy_cpus, cwd=tree))
            else:
                argv = gateway_args(port, up_port, config, loop) + (args.alt_arg if mode == "gateway-alt"
                                                                     else args.gateway_arg)
                if args.profile and mode == "gateway":
                    argv = ["-m", "cProfile", "-o", str(Path(args.profile).resolve()), *argv]
                elif args.gc_log and mode == "gateway":
                    argv = ["-m", "scripts.gc_log", str(Path(args.gc_log).resolve()), *argv]
                procs.append(_spawn(argv, gateway_env(ec2_port), stdout=emf, cpus=proxy_cpus))
            pids[mode] = procs[-1].pid
    if "aiohttp" in modes:
        procs.append(_spawn(["-m", "scripts.bench_gateway", "_aiohttp", str(aio_port), str(up_port)],
                            cpus=proxy_cpus))
        pids["aiohttp"] = procs[-1].pid
    for mode, loop in (("relay", "auto"), ("relay-asyncio", "asyncio")):
        if mode in modes:
            procs.append(_spawn(["-m", "scripts.bench_gateway", "_relay", str(targets[mode][0]), str(up_port),
                                 str(args.relay_workers), loop], cpus=proxy_cpus))
            pids[mode] = procs[-1].pid
    try:
        import uvloop  # noqa: F401
        auto_loop = "uvloop"
    except ImportError:
        auto_loop = "asyncio"
    results: dict = {"config": vars(args), "cpus": os.cpu_count(), "gateway_loop": auto_loop,
                     "proxy_cpus": sorted(proxy_cpus) if proxy_cpus else None,
                     "python": sys.version.split()[0], "levels": {}}
    try:
        for mode in modes:
            await _wait_port(*targets[mode])
        for mode in modes:  # warm-up: connections, imports, JIT-free but caches
            await run_level(*targets[mode], 4, 8, args.tokens)
        if args.wake_cores:
            # Every core the bench uses: the upstream's too, whose wake-up a request after a pause would wait on.
            procs += wake_spinners((proxy_cpus or set()) | (other_cpus or set()) or os.sched_getaffinity(0))
        for c in levels:
            requests = max(args.requests, 3 * c)
            row = {}
            for mode in modes:
                row[mode] = m = await run_level(*targets[mode], c, requests, args.tokens, args.client_procs, other_cpus,
                                                pids.get(mode), proxy_cpus if mode != "direct" else None,
                                                args.opens_per_s)
                print(progress_line(c, mode, m), file=sys.stderr, flush=True)
            results["levels"][level_key(results["levels"], c)] = row
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        emf.close()
    with open(tmp / "emf.log") as lines:
        records = sum(1 for _ in lines)
    results["gateway_emf_records"] = records
    if args.gc_log:
        from scripts.gc_log import summary as gc_summary

        results["gateway_gc"] = gc_summary(args.gc_log) if Path(args.gc_log).exists() else {}
    return results


def progress_line(concurrency: int, mode: str, m: dict) -> str:
    """One level of one mode as the bench prints it while running: the figures, then what the proxy's
    processes, cores, hops and the host's TCP counters say about it (each only where measured)."""
    notes = []
    if "cpu_busy" in m:
        notes.append(f"  CPU {m['cpu_ms_per_request']:.3f} ms/req, cores {m['cpu_busy']:.0%} busy")
    if "proxy_steal_ms" in m:
        notes.append(f", {m['proxy_steal_ms']:g} ms stolen")
    if "proxy_runq_wait_ms" in m:
        notes.append(f", waited {m['proxy_runq_wait_ms']:g} ms for a core, {m['proxy_minor_faults']} page faults")
    hops = m.get("hops", {})
    notes += [f", {name} {hops[name + '_p50']:.2f}/{hops[name + '_max']:.2f}"
              for name in ("accept", "read", "upstream") if name + "_p50" in hops]
    notes += [f", {name} +{n}" for name, n in m["tcp"].items() if name != "DelayedACKs"]
    return (f"  c={concurrency:<3} {mode:<12} {m['requests']:>4} req  TTFT p50 {m['ttft_p50']:7.3f} "
            f"p99 {m['ttft_p99']:7.3f} (first on a connection: max {m['ttft_new_max']:7.3f}, connect "
            f"max {m['connect_max']:6.3f}, in {m['reach_new_p50']:.3f}/{m['reach_new_max']:.3f})  "
            f"ITL p50 {m['itl_p50']:6.3f} p99 {m['itl_p99']:6.3f} ms" + "".join(notes))


def level_key(levels: dict, concurrency: int) -> int | str:
    """The key of a level in the results: its concurrency, and "16#2", "16#3" for a level run again (a repeat
    after processes have grown is a different measurement from the first pass, so neither may overwrite the other)."""
    if concurrency not in levels:
        return concurrency
    return f"{concurrency}#{sum(1 for k in levels if str(k).split('#')[0] == str(concurrency)) + 1}"


def summary(results: dict) -> list[str]:
    """The issue's table: what the gateway adds at P99, with the aiohttp peer beside it, and the other modes
    run (the relay floor, the base tree's gateway) after it."""
    rows = results["levels"]
    first = next(iter(rows.values()))
    if "gateway" not in first:
        return []
    pinned = f"pinned to {len(results['proxy_cpus'])} cores" if results.get("proxy_cpus") else "unpinned"
    others = [m for m in ("aiohttp", "relay", "gateway-base", "gateway-alt") if m in first]
    label = {"aiohttp": "aiohttp proxy peer", "relay": "byte relay (floor)", "gateway-base": "base tree's gateway",
             "gateway-alt": "gateway with --alt-arg"}
    lines = [f"\nadded over direct at P99 (ms), gateway [{results['gateway_loop']}] {pinned}, "
             f"{results['config']['tokens']} tokens @ {results['config']['token_interval_ms']} ms:",
             "| concurrency | TTFT P99, all requests | TTFT P99, kept-alive | ITL P99 | gateway CPU ms/request (cores busy) |"
             + "".join(f" {label[m]}, TTFT P99 all / kept-alive | {m} ITL P99 |" for m in others),
             "|---:|---:|---:|---:|---:|" + "---:|---:|" * len(others)]
    for c, row in rows.items():
        d, g = row["direct"], row["gateway"]
        cpu = f"{g['cpu_ms_per_request']:.3f} ({g['cpu_busy']:.0%})" if "cpu_busy" in g else "n/a"
        line = (f"| {c} | {g['ttft_p99'] - d['ttft_p99']:+.2f} | {g['ttft_kept_p99'] - d['ttft_kept_p99']:+.2f} "
                f"| {g['itl_p99'] - d['itl_p99']:+.2f} | {cpu} |")
        for m in others:
            a = row[m]
            line += (f" {a['ttft_p99'] - d['ttft_p99']:+.2f} / {a['ttft_kept_p99'] - d['ttft_kept_p99']:+.2f} "
                     f"| {a['itl_p99'] - d['itl_p99']:+.2f} |")
        lines.append(line)
    return lines


def fair_admission_cpu(results: dict) -> list[str]:
    """What fair admission costs the gateway per request: gateway minus gateway-alt when --alt-arg turned it off."""
    if "--fair-admission=off" not in results["config"].get("alt_arg", []):
        return []
    lines = ["\nfair admission's gateway CPU per request (gateway - gateway-alt with --fair-admission=off), ms:"]
    for c, row in results["levels"].items():
        on, off = row.get("gateway", {}), row.get("gateway-alt", {})
        if "cpu_ms_per_request" in on and "cpu_ms_per_request" in off:
            lines.append(f"  c={c}: {on['cpu_ms_per_request'] - off['cpu_ms_per_request']:+.3f} "
                         f"({on['cpu_ms_per_request']:.3f} on, {off['cpu_ms_per_request']:.3f} off)")
    return lines


def fair_admission_cpu_runs(cap: int = 8, runs: int = 7, n: int = 10_000) -> dict:
    """The CPU fair admission spends per request, in process (acquire + release, two accounts alternating, the
    shared state of two workers), pinned to one core, `runs` times: {path: {min, median, max} microseconds}.

    "room": the request finds a slot (what every request below the cap pays); "queued": it finds the cap full,
    waits in its account's queue and is handed the slot when the holder's request ends (what a request pays at
    capacity: the future, the hand-over and the service-rate timing)."""
    from fleetcast.config import parse_config
    from runtime.gateway.fair import FairAdmission
    from runtime.gateway.shared import SharedState
    from scripts.bench_fairness import fairness_config  # two accounts (it imports this module: not at the top)

    consumers = parse_config(fairness_config(cap), "<bench config>").consumers
    names = [c.name for c in consumers]

    class Engine:
        host_header = "127.0.0.1:9"

    async def room(admission: FairAdmission) -> None:
        for i in range(n):
            who = names[i % 2]
            engine = await admission.acquire(who, "m", lambda: False)
            admission.release(who, "m", engine)  # type: ignore[arg-type]

    async def queued(admission: FairAdmission) -> None:
        holder = await admission.acquire(names[0], "m", lambda: False)
        held_by = names[0]
        for i in range(n):
            who = names[(i + 1) % 2]
            waiter = asyncio.ensure_future(admission.acquire(who, "m", lambda: False))
            await asyncio.sleep(0)  # it queues behind the full cap
            admission.release(held_by, "m", holder)  # type: ignore[arg-type]
            holder, held_by = await waiter, who
        admission.release(held_by, "m", holder)  # type: ignore[arg-type]

    async def harness(_admission: FairAdmission) -> None:
        """`queued`'s own task and loop turns, without the admission: taken off its figure (the gateway's
        connection task exists with fair admission off as well)."""
        for _ in range(n):
            waiter = asyncio.ensure_future(asyncio.sleep(0))
            await asyncio.sleep(0)
            await waiter

    def timed(path) -> float:
        admission = FairAdmission(SharedState(2), {"m": [Engine()]},  # type: ignore[list-item]
                                  {"m": cap if path is room else 1}, consumers)
        start = time.process_time()
        asyncio.run(path(admission))
        return (time.process_time() - start) / n * 1e6

    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {max(before)})  # one core: no migration between the timed turns
    try:
        samples: dict[str, list[float]] = {"room": [], "queued": []}
        for _ in range(runs):
            # Each run's harness right after its queued run, and the difference taken per run: a machine whose
            # load drifts between runs moves both alike (a median harness taken apart made one slow run the max).
            samples["room"].append(timed(room))
            queued_us = timed(queued)
            samples["queued"].append(queued_us - timed(harness))
        out = {name: {"min": round(min(s), 1), "median": round(statistics.median(s), 1), "max": round(max(s), 1)}
               for name, s in samples.items()}
    finally:
        os.sched_setaffinity(0, before)
    return {"runs": runs, "requests_per_run": n, **out}


FAIR_ADMISSION_CPU_BOUND_US = 50  # issue 35: fair admission adds at most 0.05 ms of gateway CPU per request


def fair_admission_cpu_lines(cpu: dict) -> list[str]:
    """fair_admission_cpu_runs as the bench prints it, both paths against the issue's bound (0.05 ms)."""
    lines = [f"\nfair admission's gateway CPU per request, in process, pinned to one core, {cpu['runs']} runs of "
             f"{cpu['requests_per_run']} (min / median / max, microseconds; bound {FAIR_ADMISSION_CPU_BOUND_US}):"]
    for name, label in (("room", "finds room"), ("queued", "waits, then is handed the slot")):
        r = cpu[name]
        lines.append(f"  {label}: {r['min']} / {r['median']} / {r['max']}"
                     + ("  within the bound" if r["max"] <= FAIR_ADMISSION_CPU_BOUND_US else "  ABOVE THE BOUND"))
    return lines


def render(results: dict) -> str:
    modes = [m for m in next(iter(results["levels"].values())) if m != "direct"]
    lines = summary(results) + fair_admission_cpu(results)
    if "fair_admission_cpu_us" in results:
        lines += fair_admission_cpu_lines(results["fair_admission_cpu_us"])
    for mode in modes:
        label = f"{mode} [{results['gateway_loop']}]" if mode == "gateway" else mode
        lines.append(f"\nadded by {label} vs direct (ms; + = slower), {results['cpus']} CPUs, "
                     f"{results['config']['tokens']} tokens @ {results['config']['token_interval_ms']} ms:")
        lines.append("| conc | requests | ITL samples | TTFT P50 | TTFT P99 | TTFT P99 kept-alive | ITL P50 | ITL P99 "
                     "| delay P50 | delay P99 |")
        lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for c, row in results["levels"].items():
            d, m = row["direct"], row[mode]
            lines.append(
                f"| {c} | {m['requests']} | {m['itl_samples']} | "
                + " | ".join(f"{m[k] - d[k]:+.3f}" for k in
                             ("ttft_p50", "ttft_p99", "ttft_kept_p99", "itl_p50", "itl_p99", "delay_p50",
                              "delay_p99")) + " |")
    lines.append("\nTTFT P99 kept-alive leaves out each connection's first request (its TTFT includes opening "
                 "the connection,\nand through a proxy a second one upstream when its pool must grow); ITL samples "
                 "are chunk gaps;\ndelay = event received - event sent by the server (the hop itself).")
    lines.append("\ndirect (no proxy) absolute figures (ms):")
    lines.append("| conc | TTFT P50 | TTFT P99 | ITL P50 | ITL P99 | delay P50 | delay P99 |")
    lines.append("|---:|---:|---:|---:|---:|---:|---:|")
    for c, row in results["levels"].items():
        d = row["direct"]
        lines.append(f"| {c} | " + " | ".join(f"{d[k]:.3f}" for k in
                                               ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "delay_p50",
                                                "delay_p99")) + " |")
    if "gateway_gc" in results:
        lines.append("\ngateway garbage collections after its startup freeze (all processes, the whole run): "
                     + (", ".join(f"{g}: {r['collections']:g} (longest {r['max_ms']:.2f} ms, {r['total_ms']:.1f} ms in "
                                  f"all, {r['freed']:g} objects freed)" for g, r in sorted(results["gateway_gc"].items()))
                        or "none"))
    if results.get("gateway_emf_records"):
        lines.append(f"\ngateway wrote {results['gateway_emf_records']} EMF records (one per request).")
    return "\n".join(lines)


def settle() -> None:
    """Collect once and freeze what is loaded, as the gateway does at start (runtime/gateway/__main__.py):
    a full collection over a process's imports pauses it for milliseconds, and in the upstream or a client
    that pause lands on whichever proxy is being measured at the time (new connections' TTFT most: a
    burst of them allocates the most)."""
    gc.collect()
    gc.freeze()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0].startswith("_"):  # a child process: the upstream, a client, a peer proxy
        if argv[0] == "_aiohttp":
            import aiohttp.web  # noqa: F401 - loaded before the freeze
        settle()
        if argv[0] == "_client" or argv[-1:] == ["nogc"]:
            # The measuring side, not a proxy under test: no collection pauses at all while it runs (a client
            # lives for one level, the bench's upstream for one run; the soak's upstream keeps collecting).
            gc.disable()
    if argv[:1] == ["_upstream"]:  # child process modes
        port, ttft_ms, interval_ms = int(argv[1]), float(argv[2]), float(argv[3])
        processes = int(argv[4]) if len(argv) > 4 and argv[4].isdigit() else 1

        async def serve():
            server = await asyncio.start_server(
                lambda r, w: timed_upstream(r, w, ttft_ms / 1000, interval_ms / 1000), "127.0.0.1", port,
                backlog=1024, reuse_port=processes > 1 or None)
            async with server:
                await server.serve_forever()
        _serve_forked(processes, serve)
        return 0
    if argv[:1] == ["_relay"]:
        _serve_relay(int(argv[1]), int(argv[2]), int(argv[3]), argv[4] if len(argv) > 4 else "auto")
        return 0
    if argv[:1] == ["_client"]:
        _client_main(argv[1:])
        return 0
    if argv[:1] == ["_aiohttp"]:
        reserve_descriptors()
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        asyncio.run(aiohttp_proxy(int(argv[1]), int(argv[2])))
        return 0
    p = argparse.ArgumentParser(prog="python -m scripts.bench_gateway", description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", default="1,4,16,32,64,128")
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--token-interval-ms", type=float, default=8.0)
    p.add_argument("--ttft-ms", type=float, default=15.0)
    p.add_argument("--requests", type=int, default=384, help="requests per level and mode (at least 3 x concurrency)")
    p.add_argument("--cpus", type=int, help="pin the gateway and the aiohttp peer to this many cores, the upstream "
                   "and the client to the others (e.g. 2: what a g6e.xlarge leaves the gateway)")
    p.add_argument("--gateway-arg", action="append", default=[],
                   help="one more argument for `python -m runtime.gateway` (repeatable), e.g. --gateway-arg=--workers=2")
    p.add_argument("--modes", default="direct,gateway,aiohttp",
                   help="direct (baseline), gateway (default event loop), gateway-asyncio, gateway-uvloop, "
                        "gateway-base (--base-tree's gateway), gateway-alt (this gateway with --alt-arg), aiohttp, "
                        "relay (a byte relay with no logic: the floor), relay-asyncio (the same on the stdlib loop)")
    p.add_argument("--alt-arg", action="append", default=[],
                   help="the gateway-alt mode's arguments for `python -m runtime.gateway` (repeatable): this tree's "
                        "gateway with other flags in the same run, e.g. --alt-arg=--workers=3 --alt-arg=--upstream-warm=64")
    p.add_argument("--upstream-procs", type=int, choices=range(1, 17), metavar="1..16", default=1,
                   help="processes of the timed upstream on its one port (default 1); more, to see whether a burst of "
                        "new connections waits on the upstream double rather than on the proxy")
    p.add_argument("--relay-workers", type=int, default=2, help="processes of the relay mode on its one port")
    p.add_argument("--client-procs", type=int, default=1,
                   help="client processes a level's connections are spread over (default 1; with --cpus on a big "
                        "host, 4: one Python client cannot timestamp 128 streams' events as they arrive)")
    p.add_argument("--opens-per-s", type=float, default=0.0,
                   help="open a level's connections as a Poisson process of this many a second instead of all at "
                        "once (default 0: all at once, the burst of a cold client pool)")
    p.add_argument("--wake-cores", action="store_true",
                   help="keep the bench's cores from halting (a SCHED_IDLE busy loop on each), to tell a virtual "
                        "machine's slow wake-up of an idle virtual CPU from the proxy's own time")
    p.add_argument("--trace-hops", action="store_true",
                   help="stamp each hop of a connection's first request through the byte relay (client sent, relay "
                        "accepted, relay read, upstream read) and print each level's median/slowest per hop")
    p.add_argument("--base-tree", help="a checkout whose gateway the gateway-base mode runs (before/after in one run)")
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--profile", help="run the gateway (one process: no --workers) under cProfile and write its "
                   "pstats here when it exits")
    p.add_argument("--gc-log", help="log every garbage collection in the gateway's processes after their startup "
                   "freeze to this file (scripts/gc_log.py) and print a summary")
    args = p.parse_args(argv)
    if not math.isfinite(args.opens_per_s) or args.opens_per_s < 0:
        p.error(f"--opens-per-s {args.opens_per_s:g}: must be 0 (all at once) or a finite rate above 0")
    if "direct" not in args.modes.split(","):
        p.error("--modes must include direct (the baseline)")
    if "gateway-base" in args.modes.split(",") and not args.base_tree:
        p.error("--modes gateway-base needs --base-tree DIR")
    bench_model()  # the config loaded before the freeze
    settle()
    results = asyncio.run(main_async(args))
    results["fair_admission_cpu_us"] = fair_admission_cpu_runs()
    print(render(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    sys.exit(run_quietly(main))
