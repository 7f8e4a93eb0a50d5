"""Balancing across the pools of a region (issue 36, section 1), on loopback: two instances of different pool
types, each its own gateway process (`python -m runtime.gateway`) in front of its own timed engine process, a
bursty trace spread evenly over the two (as the NLB's flow hash spreads connections), with balancing off (each
gateway queues what it cannot take) and on (each names the other with `--peer`: a request that would queue goes
once to the peer with room, the cheaper pool per request it holds preferred).

Pools (examples/spill/fleet.yaml's us-east-1 with a second pool): `l40s`, g6e.xlarge, 8 requests at once
(its admission cap, the engine's max_batch_size), 20 ms per token; `a10g`, g5.xlarge, 2 at once, 30 ms per
token; prices from the shipped table. Prints, per mode: the share of requests whose TTFT (first token at the
client) is within the P99 TTFT target (300 ms), the P99 TTFT, each pool's utilisation (busy slot-seconds over
slot-seconds, from the serving gateway's own records) and the cost-weighted utilisation (utilisation weighted
by each pool's price: the share of what is paid for that did work), and how many requests were forwarded.
Figures depend on this machine's load (every process shares its cores); the comparison is between two runs of
the same trace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from scripts.bench_gateway import FakeEc2Endpoints, free_port, timed_upstream

ROOT = Path(__file__).resolve().parents[1]
REGION = "us-east-1"
ACCOUNT, VPCE = "444455556666", "vpce-0aaaaaaaaaaaaaaa1"  # examples/spill's checkout
MODEL = "gpt2-xl"
POOLS = {"l40s": {"instance_type": "g6e.xlarge", "slots": 8, "interval_ms": 20},
         "a10g": {"instance_type": "g5.xlarge", "slots": 2, "interval_ms": 30}}
TTFT_MS = 60.0  # the engines' own time to the first token
SLO_MS = 300.0  # examples/spill's slo.ttft_p99_ms


def balance_config(path: Path) -> None:
    from fleetcast.config import parse_config

    data = yaml.safe_load((ROOT / "examples" / "spill" / "fleet.yaml").read_text())
    home = next(r for r in data["regions"] if r["region"] == REGION)
    home["pools"] = [{"name": name, "instance_type": p["instance_type"], "capacity": {"min": 1, "max": 4},
                      "engine": {"max_batch_size": p["slots"]}, "scaling": {"target": p["slots"]}}
                     for name, p in POOLS.items()]
    path.write_text(parse_config(data, "<balance bench>").model_dump_json())


def trace(seconds: float, seed: int, mean_rps: float) -> list[float]:
    """Arrival times: Poisson, alternating 3 s bursts at 1.7x the mean rate with 3 s lulls at 0.3x."""
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        burst = int(t // 3) % 2 == 0
        t += rng.expovariate(mean_rps * (1.7 if burst else 0.3))
        if t >= seconds:
            return out
        out.append(t)


class Child:
    """A child process whose stdout lines (metric records, or an engine's port first) are collected as they come;
    the loopback spill tests use it too."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.lines: list[str] = []
        self.task = asyncio.ensure_future(self._read())
        self.first: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            text = line.decode().strip()
            if not self.first.done():
                self.first.set_result(text)
            self.lines.append(text)

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.lines if x.startswith("{")]

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        await asyncio.wait_for(self.task, 5)


async def _start(*args: str, env: dict[str, str] | None = None) -> Child:
    return Child(await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL))


async def _healthy(port: int) -> None:
    from runtime.gateway import ppv2

    for _ in range(300):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(ppv2.LOCAL_HEADER + b"GET /health HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n")
            answer = await reader.read()
            writer.close()
            if answer.startswith(b"HTTP/1.1 200"):
                return
        except OSError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit(f"bench_balance: the gateway on {port} did not become healthy")


async def one(port: int, tokens: int, vpce: str = VPCE, prompt: str = "a b c") -> tuple[float | None, int]:
    """One streaming request through a gateway, from the consumer whose endpoint is `vpce`; (TTFT at the client in
    ms, status)."""
    from runtime.gateway import ppv2

    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": tokens, "stream": True}).encode()
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(ppv2.build(vpce_id=vpce) + b"POST /v1/completions HTTP/1.1\r\nHost: g\r\nConnection: close\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split()[1])
        first = None
        while chunk := await reader.read(65536):
            if first is None and b'"text"' in chunk:
                first = (time.perf_counter() - started) * 1000
        return first, status
    finally:
        writer.close()


async def run_mode(balance: bool, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    config, key = tmp / "fleet.json", tmp / "peer.key"
    balance_config(config)
    key.write_bytes(os.urandom(32).hex().encode())
    engines, gateways, ports = {}, {}, {}
    ec2 = FakeEc2Endpoints([(VPCE, ACCOUNT)])
    env = {"AWS_ENDPOINT_URL_EC2": f"http://127.0.0.1:{await ec2.start()}", "AWS_MAX_ATTEMPTS": "1",
           "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
    for name, pool in POOLS.items():
        port = free_port()
        engines[name] = await _start("-m", "scripts.bench_balance", "_engine", str(port), str(pool["interval_ms"]))
        ports[name] = (port, free_port())
    try:
        for name in POOLS:
            other = next(n for n in POOLS if n != name)
            peers = ["--peer", f"127.0.0.1:{ports[other][1]}={other}"] if balance else []
            gateways[name] = await _start(
                "-m", "runtime.gateway", "--listen", f"127.0.0.1:{ports[name][1]}", "--upstream",
                f"127.0.0.1:{ports[name][0]}", "--config-json", str(config), "--region", REGION, "--pool", name,
                "--peer-key-file", str(key), "--upstream-warm", "0", *peers, env=env)
        for name in POOLS:
            await _healthy(ports[name][1])
        if balance:  # each has read the other's headroom: it reads it every PEER_HEADROOM_TTL_S once it is up
            from runtime.gateway.spill import PEER_HEADROOM_TTL_S

            await asyncio.sleep(2 * PEER_HEADROOM_TTL_S)
        arrivals = trace(args.seconds, args.seed, args.rps)
        rng = random.Random(args.seed + 1)
        targets = [rng.choice(list(POOLS)) for _ in arrivals]  # the NLB's flow hash: evenly, blind to load
        begin = time.perf_counter()

        async def send(at: float, pool: str) -> tuple[float | None, int]:
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - begin)))
            return await one(ports[pool][1], args.tokens)

        results = await asyncio.gather(*(send(a, p) for a, p in zip(arrivals, targets)))
        elapsed = time.perf_counter() - begin
    finally:
        # Together: each stop waits for its process to exit (the gateways flush their records), so serially they add up.
        await asyncio.gather(*(child.stop() for child in gateways.values()))
        await asyncio.gather(*(child.stop() for child in engines.values()))
    return summarize(results, {n: g.records() for n, g in gateways.items()}, elapsed)


def summarize(results: list[tuple[float | None, int]], records: dict[str, list[dict]], elapsed: float) -> dict:
    from fleetcast.config.catalog import instance_catalog

    ttfts = sorted(t for t, status in results if t is not None and status == 200)
    catalog = instance_catalog()
    pools, weighted, paid = {}, 0.0, 0.0
    for name, pool in POOLS.items():
        served = [r for r in records[name] if r.get("Requests") == 1 and r.get("status") == 200]
        # In the engine: from admission to the last token (the wait at the gateway is no engine work).
        busy_s = sum(r.get("EndToEndLatencyMs", 0.0) - r.get("admission_wait_ms", 0.0) for r in served) / 1000
        utilisation = busy_s / (pool["slots"] * elapsed)
        price = catalog.get(pool["instance_type"]).price_per_hour[REGION]
        pools[name] = {"served": len(served), "utilisation": round(utilisation, 3), "price_per_hour": price,
                       "forwarded_out": sum(1 for r in records[name] if r.get("PeerForwardedRequests") == 1)}
        weighted += price * utilisation
        paid += price
    p99 = ttfts[min(len(ttfts) - 1, math.ceil(0.99 * len(ttfts)) - 1)] if ttfts else None
    return {"requests": len(results), "ok": len(ttfts),
            "within_slo": round(sum(1 for t in ttfts if t <= SLO_MS) / len(results), 3) if results else None,
            "ttft_p99_ms": None if p99 is None else round(p99, 1), "pools": pools,
            "cost_weighted_utilisation": round(weighted / paid, 3),
            "metered": sum(p["served"] for p in pools.values())}


def _engine(argv: list[str]) -> None:
    port, interval_ms = int(argv[0]), float(argv[1])

    async def serve() -> None:
        server = await asyncio.start_server(
            lambda r, w: timed_upstream(r, w, TTFT_MS / 1000, interval_ms / 1000), "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


def off_on_modes(text: str) -> list[str]:
    """A bench's `--modes`: off, on or off,on, the runs to make in that order (an argparse type)."""
    modes = [m for m in text.split(",") if m]
    if not modes or set(modes) - {"off", "on"}:
        raise argparse.ArgumentTypeError(f"{text!r}: write off, on or off,on")
    return modes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_engine"]:
        _engine(argv[1:])
        return 0
    p = argparse.ArgumentParser(prog="python -m scripts.bench_balance", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=40.0, help="length of the trace (default 40)")
    p.add_argument("--rps", type=float, default=8.0, help="mean arrivals per second (default 8; bursts at 1.7x: "
                   "half of them reach the a10g instance, which holds 2 at once, for about 0.5 s)")
    p.add_argument("--tokens", type=int, default=16, help="output tokens per request (default 16)")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--modes", type=off_on_modes, default=["off", "on"], help="which of off,on to run (default both)")
    p.add_argument("--json", help="write the figures here as JSON")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results = {mode: asyncio.run(run_mode(mode == "on", args, Path(tmp))) for mode in args.modes}
    print(json.dumps(results, indent=1))
    print(f"\nrequests within the {SLO_MS:g} ms TTFT target: "
          + ", ".join(f"balancing {m} {r['within_slo']:.1%} (P99 TTFT {r['ttft_p99_ms']} ms)" for m, r in results.items()))
    print("cost-weighted utilisation: " + ", ".join(f"{m} {r['cost_weighted_utilisation']:.1%}"
                                                    for m, r in results.items()))
    if "on" in results:
        on = results["on"]
        print(f"forwarded to a peer: {sum(p['forwarded_out'] for p in on['pools'].values())} of {on['requests']}")
    print("trade-off: a forwarded request pays one more hop on loopback (a peer in the same region: well under "
          "a millisecond plus the connection) and the small pool's queue is emptied into the large pool's free "
          "slots; balancing cannot add capacity, so in a burst beyond both instances requests still wait")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    sys.exit(run_quietly(main))
