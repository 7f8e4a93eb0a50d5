"""Cross-region overflow replayed through the real processes (issue 36, "Done when": `make bench-overflow`): two
regions on loopback, each the runtime's own gateway (`python -m runtime.gateway`) in front of a timed engine
process (scripts/bench_balance.py's), and between them a path that delays each direction by half the round trip
and puts the NLB's PROXY v2 header (the provider's spill endpoint) in front of each connection, as the
cross-region interface endpoint and the remote NLB do. A two-region diurnal trace, compressed, is replayed
twice: overflow off (the home consumer's `spill_regions` empty: strict residency) and on (`[us-west-2]`).

The home region's consumers (`checkout`, which may spill, and `reports`, which may not) peak at PEAK x the home's
capacity; the remote's own consumer (`west`) peaks half a day later at REMOTE_PEAK x. Capacity is the
engine's requests at once (max_batch_size, the gateway's admission cap) over one request's service time.
Prints, per mode: the share of windows (the day cut in WINDOWS) whose P99 TTFT at the client kept the SLO, each
region's TTFT P50/P99, the share of home requests spilled and what a spilled request paid over an unqueued one,
the errors, and whether metering wrote exactly one record per request (both gateways' records against what the
client sent; the path names each request it carried, so the spilled ones are known by request). Figures depend
on this machine's load (every process shares its cores); the two modes replay the same trace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scripts.bench_balance import TTFT_MS, Child, _healthy, _start, off_on_modes, one
from scripts.bench_gateway import FakeEc2Endpoints, free_port

ROOT = Path(__file__).resolve().parents[1]
HOME, REMOTE = "us-east-1", "us-west-2"
PROVIDER = "111122223333"  # examples/spill/fleet.yaml's provider: the owner of the spill endpoint
CONSUMERS = {  # name -> (account, endpoint id, service region); checkout and reports are examples/spill's
    "checkout": ("444455556666", "vpce-0aaaaaaaaaaaaaaa1", HOME),
    "reports": ("777788889999", "vpce-0bbbbbbbbbbbbbbb2", HOME),
    "west": ("888899990000", "vpce-0ccccccccccccccc3", REMOTE),
}
SPILL_VPCE = "vpce-0ddddddddddddddd4"  # the provider's own endpoint in us-east-1 to the us-west-2 service
SLOTS = 4  # requests each region's engine holds at once
INTERVAL_MS = 30.0  # per output token after the first
SLO_MS = 300.0  # examples/spill's slo.ttft_p99_ms
REPORTS_SHARE = 0.1  # of the home region's arrivals, the strict-residency consumer's
MARKER = re.compile(rb"ovf-(\d+)-")


def replay_config(path: Path, spill: bool) -> None:
    """examples/spill/fleet.yaml with `west` served in us-west-2, SLOTS per engine, and checkout's spill_regions
    as the mode says."""
    from fleetcast.config import parse_config

    data = yaml.safe_load((ROOT / "examples" / "spill" / "fleet.yaml").read_text())
    data["engine"]["max_batch_size"] = SLOTS
    for region in data["regions"]:
        region["pools"][0]["scaling"] = {"target": SLOTS}
    remote = next(r for r in data["regions"] if r["region"] == REMOTE)
    account = CONSUMERS["west"][0]
    remote["allowed_principals"].append(f"arn:aws:iam::{account}:root")
    data["consumers"].append({
        "name": "west", "account": account, "region": REMOTE, "service_region": REMOTE,
        "vpc_id": "vpc-0c1d2e3f4a5b60718", "subnets": [{"id": "subnet-0c1d2e3f4a5b60711", "az_id": "usw2-az1"},
                                                      {"id": "subnet-0c1d2e3f4a5b60712", "az_id": "usw2-az2"}],
        "cidrs": ["10.80.0.0/16"], "endpoint_service_name": remote["endpoint_service_name"]})
    checkout = next(c for c in data["consumers"] if c["name"] == "checkout")
    checkout["spill_regions"] = [REMOTE] if spill else []
    path.write_text(parse_config(data, "<overflow replay>").model_dump_json())


class RegionPath:
    """The inter-region path from the home gateways to the remote NLB: each connection gets the NLB's PROXY v2 header
    naming the spill endpoint, and every byte reaches the other side `delay_s` after it left (one way: half the
    round trip; chunks keep their spacing, as on a real link). It notes the request markers it carries toward the
    remote (`carried`: the spilled requests, by the number in their prompt) and counts connections that open with
    a GET (the home's headroom reads) or a POST. After `fail_posts` every POST is reset before an answer (the path
    failing for inference while the headroom reads pass, to trip the home's breaker: tests/gateway/
    test_spill_processes.py)."""

    def __init__(self, target: int, delay_s: float = 0.02):
        self.target, self.delay_s = target, delay_s
        self.drop_posts = False
        self.posts = 0  # connections that opened with a POST
        self.gets = 0  # connections that opened with a GET (headroom reads)
        self.carried: set[int] = set()
        self.server: asyncio.Server | None = None
        self.open: set[asyncio.StreamWriter] = set()

    def fail_posts(self) -> None:
        """From now on every POST is reset; the kept-alive connections (which would carry POSTs unseen) go too."""
        self.drop_posts = True
        for writer in list(self.open):
            writer.transport.abort()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    def _note(self, tail: bytes, data: bytes) -> bytes:
        """Markers in `data` (and across its boundary with the last chunk); the bytes to keep for the next one."""
        seen = tail + data
        self.carried.update(int(m.group(1)) for m in MARKER.finditer(seen))
        return seen[-24:]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await reader.read(65536)
        except ConnectionError:
            writer.close()
            return
        self.gets += first.startswith(b"GET")
        if first.startswith(b"POST"):
            self.posts += 1
            if self.drop_posts:
                writer.transport.abort()
                return
        self.open.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            self.open.discard(writer)
            writer.transport.abort()
            return
        loop = asyncio.get_running_loop()

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, head: bytes, watch: bool) -> None:
            queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

            async def deliver() -> None:
                while True:
                    due, data = await queue.get()
                    if not data:
                        return
                    await asyncio.sleep(max(0.0, due - loop.time()))
                    dst.write(data)
                    await dst.drain()

            sender = asyncio.ensure_future(deliver())
            tail = self._note(b"", head) if watch else b""
            if head:
                queue.put_nowait((loop.time() + self.delay_s, head))
            try:
                while data := await src.read(65536):
                    if watch:
                        tail = self._note(tail, data)
                    queue.put_nowait((loop.time() + self.delay_s, data))
            except ConnectionError:
                pass
            finally:
                queue.put_nowait((loop.time() + self.delay_s, b""))
                try:
                    await sender
                except ConnectionError:
                    pass
                finally:
                    dst.close()

        from runtime.gateway import ppv2

        try:
            await asyncio.gather(pipe(reader, up_writer, ppv2.build(vpce_id=SPILL_VPCE) + first, True),
                                 pipe(up_reader, writer, b"", False))
        finally:
            self.open.discard(writer)

    def close(self) -> None:
        if self.server:
            self.server.close()


@dataclass(frozen=True)
class Arrival:
    number: int
    at: float  # seconds from the trace's start
    consumer: str


def rate(t: float, day_s: float, peak: float, trough: float, phase: float) -> float:
    """Arrivals per second at `t`: a raised cosine between trough and peak, peaking at `phase` of the day."""
    return trough + (peak - trough) * (1 + math.cos((t / day_s - phase) * 2 * math.pi)) / 2


def capacity_rps(tokens: int) -> float:
    """What one region's engine completes per second when its consumers keep it full: the requests fair admission
    lets one account hold at once (an account alone: the whole cap) over one request's time in the engine."""
    from runtime.gateway.fair import held_beside

    return held_beside(SLOTS, [1.0]) / ((TTFT_MS + (tokens - 1) * INTERVAL_MS) / 1000)


def trace(args: argparse.Namespace) -> list[Arrival]:
    """Both regions' arrivals over one compressed day (Poisson, thinned from the peak rate): the home's peak at
    mid-day, the remote's at the day's ends. Each home arrival is `reports`' with REPORTS_SHARE, else checkout's."""
    rng, cap = random.Random(args.seed), capacity_rps(args.tokens)
    curves = {HOME: (args.peak * cap, args.trough * cap, 0.5), REMOTE: (args.remote_peak * cap, args.trough * cap, 0.0)}
    out: list[tuple[float, str]] = []
    for region, (peak, trough, phase) in curves.items():
        t = 0.0
        while True:
            t += rng.expovariate(peak)
            if t >= args.day_s:
                break
            if rng.random() < rate(t, args.day_s, peak, trough, phase) / peak:
                consumer = "west" if region == REMOTE else ("reports" if rng.random() < REPORTS_SHARE else "checkout")
                out.append((t, consumer))
    return [Arrival(i, at, consumer) for i, (at, consumer) in enumerate(sorted(out))]


def p(values: list[float], q: float) -> float | None:
    """The q-quantile by the nearest rank, or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def run_mode(spill: bool, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    config, key = tmp / f"fleet-{spill}.json", tmp / "peer.key"
    replay_config(config, spill)
    key.write_bytes(os.urandom(32).hex().encode())
    ec2 = FakeEc2Endpoints([(vpce, account) for account, vpce, _ in CONSUMERS.values()] + [(SPILL_VPCE, PROVIDER)])
    env = {"AWS_ENDPOINT_URL_EC2": f"http://127.0.0.1:{await ec2.start()}", "AWS_MAX_ATTEMPTS": "1",
           "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
    children: list[Child] = []
    ports = {HOME: free_port(), REMOTE: free_port()}
    path: RegionPath | None = None
    home = remote = None
    try:
        engines = {}
        for region in (HOME, REMOTE):
            engines[region] = free_port()
            children.append(await _start("-m", "scripts.bench_balance", "_engine", str(engines[region]),
                                         str(INTERVAL_MS)))

        def gateway(region: str, *extra: str) -> Any:
            return _start("-m", "runtime.gateway", "--listen", f"127.0.0.1:{ports[region]}", "--upstream",
                          f"127.0.0.1:{engines[region]}", "--config-json", str(config), "--region", region,
                          "--pool", "l40s", "--peer-key-file", str(key), "--upstream-warm", "0", *extra, env=env)

        remote = await gateway(REMOTE)
        children.append(remote)
        await _healthy(ports[REMOTE])
        path = RegionPath(ports[REMOTE], args.rtt_ms / 2000)
        path_port = await path.start()
        home = await gateway(HOME, "--spill-endpoint", f"{REMOTE}=127.0.0.1:{path_port}")
        children.append(home)
        await _healthy(ports[HOME])
        if spill:
            for _ in range(100):  # the home gateway has read the remote's headroom through the path
                if path.gets >= 1:
                    break
                await asyncio.sleep(0.1)

        async def send(arrival: Arrival, begin: float) -> dict[str, Any]:
            await asyncio.sleep(max(0.0, arrival.at - (time.perf_counter() - begin)))
            account, vpce, region = CONSUMERS[arrival.consumer]
            try:
                ttft, status = await asyncio.wait_for(
                    one(ports[region], args.tokens, vpce, f"ovf-{arrival.number}- a b c"), args.request_timeout_s)
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
                ttft, status = None, 0
            return {"n": arrival.number, "at": arrival.at, "consumer": arrival.consumer, "ttft_ms": ttft,
                    "status": status}

        # Unqueued: each region's consumer alone, one request at a time (also the engines' and paths' warm-up); the
        # two regions at once, as their engines and gateways are their own.
        async def calm(consumer: str) -> list[dict[str, Any]]:
            return [await send(Arrival(-1, 0.0, consumer), time.perf_counter()) for _ in range(args.calibration)]

        home_calm, remote_calm = await asyncio.gather(calm("checkout"), calm("west"))
        unqueued = {HOME: home_calm, REMOTE: remote_calm}
        arrivals = trace(args)
        begin = time.perf_counter()
        results = await asyncio.gather(*(send(a, begin) for a in arrivals))
        elapsed = time.perf_counter() - begin
    finally:
        # The gateways write what records they hold as they exit (MetricsSink.close); together, not one after the
        # other: each stop waits for its process to exit.
        await asyncio.gather(*(child.stop() for child in (home, remote) if child is not None))
        await asyncio.gather(*(child.stop() for child in children if child not in (home, remote)))
        if path is not None:
            path.close()
    assert home is not None and remote is not None and path is not None
    records = {HOME: home.records(), REMOTE: remote.records()}
    return summarize(list(results), unqueued, records, path.carried, args, elapsed)


def summarize(results: list[dict[str, Any]], unqueued: dict[str, list[dict[str, Any]]],
              records: dict[str, list[dict[str, Any]]], carried: set[int], args: argparse.Namespace,
              elapsed: float) -> dict[str, Any]:
    window_s = args.day_s / args.windows

    def ok(r: dict[str, Any]) -> bool:
        return r["status"] == 200 and r["ttft_ms"] is not None

    def region_figures(region: str) -> dict[str, Any]:
        mine = [r for r in results if CONSUMERS[r["consumer"]][2] == region]
        ttfts = [r["ttft_ms"] for r in mine if ok(r)]
        within = total = 0
        for w in range(args.windows):
            inside = [r for r in mine if w * window_s <= r["at"] < (w + 1) * window_s]
            if not inside:
                continue
            total += 1
            # An error or a request with no token counts as over the target.
            worst = p([r["ttft_ms"] if ok(r) else math.inf for r in inside], 0.99)
            within += worst is not None and worst <= SLO_MS
        calm = [r["ttft_ms"] for r in unqueued[region] if ok(r)]
        errors: dict[str, int] = {}
        for r in mine:
            if not ok(r):  # 429: the consumer's queue full; 503: waited past max_queue_wait_s; 0: no answer
                errors[str(r["status"])] = errors.get(str(r["status"]), 0) + 1
        return {"requests": len(mine), "errors": sum(errors.values()), "errors_by_status": errors,
                "windows_within_slo": within, "windows": total,
                "ttft_p50_ms": _round(p(ttfts, 0.5)), "ttft_p99_ms": _round(p(ttfts, 0.99)),
                "unqueued_ttft_p50_ms": _round(p(calm, 0.5))}

    home_requests = [r for r in results if CONSUMERS[r["consumer"]][2] == HOME]
    spilled = [r for r in home_requests if r["n"] in carried]
    spilled_ttfts = [r["ttft_ms"] for r in spilled if ok(r)]
    figures = {HOME: region_figures(HOME), REMOTE: region_figures(REMOTE)}
    base = figures[HOME]["unqueued_ttft_p50_ms"]
    # Metering: each request the client sent (the trace and the calibration) is one record with Requests = 1, in
    # the gateway that served it; a spilled one is the remote's, with origin_region the home, and the home writes
    # only SpilledRequests for it.
    sent: dict[str, int] = {}
    for r in [*results, *unqueued[HOME], *unqueued[REMOTE]]:
        sent[r["consumer"]] = sent.get(r["consumer"], 0) + 1
    metered: dict[str, int] = {}
    for region in (HOME, REMOTE):
        for rec in records[region]:
            if rec.get("Requests") == 1:
                metered[rec["Consumer"]] = metered.get(rec["Consumer"], 0) + 1
    served_remote_for_home = sum(1 for rec in records[REMOTE] if rec.get("Requests") == 1
                                 and rec.get("origin_region") == HOME)
    spilled_out = sum(1 for rec in records[HOME] if rec.get("SpilledRequests") == 1)
    return {
        "elapsed_s": round(elapsed, 1), "window_s": round(window_s, 2), **figures,
        "spill_share": round(len(spilled) / len(home_requests), 3) if home_requests else 0.0,
        "spilled": len(spilled),
        "spilled_ttft_p50_ms": _round(p(spilled_ttfts, 0.5)), "spilled_ttft_p99_ms": _round(p(spilled_ttfts, 0.99)),
        "spilled_added_p50_ms": _round(None if base is None or not spilled_ttfts else p(spilled_ttfts, 0.5) - base),
        "spilled_by_consumer": {c: sum(1 for r in spilled if r["consumer"] == c) for c in CONSUMERS},
        "metering": {"sent": sent, "metered": metered, "home_spilled_out": spilled_out,
                     "remote_served_for_home": served_remote_for_home,
                     "one_record_per_request": sent == metered and spilled_out == served_remote_for_home
                     == len(spilled)},
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    from runtime.gateway.fair import held_beside

    rows = [("home windows within the P99 SLO", lambda f: f"{f[HOME]['windows_within_slo']}/{f[HOME]['windows']}"),
            ("remote windows within the P99 SLO",
             lambda f: f"{f[REMOTE]['windows_within_slo']}/{f[REMOTE]['windows']}"),
            ("home TTFT P50 / P99 (ms)", lambda f: f"{f[HOME]['ttft_p50_ms']} / {f[HOME]['ttft_p99_ms']}"),
            ("remote TTFT P50 / P99 (ms)", lambda f: f"{f[REMOTE]['ttft_p50_ms']} / {f[REMOTE]['ttft_p99_ms']}"),
            ("spill share of home requests", lambda f: f"{f['spill_share']:.1%} ({f['spilled']})"),
            ("spilled TTFT P50 / P99 (ms)", lambda f: f"{f['spilled_ttft_p50_ms']} / {f['spilled_ttft_p99_ms']}"),
            ("spilled: added over unqueued P50 (ms)", lambda f: f"{f['spilled_added_p50_ms']}"),
            ("errors: home, remote (of requests)", lambda f: f"{f[HOME]['errors']}/{f[HOME]['requests']}, "
                                                         f"{f[REMOTE]['errors']}/{f[REMOTE]['requests']}"),
            ("one metered record per request", lambda f: "yes" if f["metering"]["one_record_per_request"] else "NO")]
    modes = list(results)
    print(f"\n{'':40}" + "".join(f"{'overflow ' + m:>16}" for m in modes))
    for label, cell in rows:
        print(f"{label:40}" + "".join(f"{cell(results[m]):>16}" for m in modes))
    cap = capacity_rps(args.tokens)
    print(f"\nassumed: {SLOTS} requests at once per region (an account alone holds {held_beside(SLOTS, [1.0])}), "
          f"{TTFT_MS:g} ms to the first token and {INTERVAL_MS:g} ms a token after, {args.tokens} tokens (capacity {cap:.1f} requests/s); round trip {args.rtt_ms:g} ms; "
          f"one day compressed to {args.day_s:g} s in {args.windows} windows; home peak {args.peak:g}x capacity, "
          f"remote {args.remote_peak:g}x half a day later; SLO P99 TTFT {SLO_MS:g} ms")
    print("trade-off: a spilled request pays the round trip and a second gateway, so spill only helps while the "
          "home's queue would cost more than that; it takes the remote's spare slots, which its own consumers "
          "then find busier (the headroom answer's reserve bounds how much); strict-residency consumers "
          "(reports) keep waiting at home in every mode")


def main(argv: list[str] | None = None) -> int:
    p_ = argparse.ArgumentParser(prog="python -m scripts.bench_overflow_replay", description=__doc__.split("\n\n")[0])
    p_.add_argument("--day-s", type=float, default=40.0, help="one compressed day, per mode (default 40)")
    p_.add_argument("--windows", type=int, default=20, help="SLO windows the day is cut in (default 20)")
    p_.add_argument("--peak", type=float, default=1.5, help="the home's peak, times its capacity (default 1.5)")
    p_.add_argument("--remote-peak", type=float, default=0.9, help="the remote's peak, times its capacity (0.9)")
    p_.add_argument("--trough", type=float, default=0.3, help="both regions' trough, times capacity (0.3)")
    p_.add_argument("--tokens", type=int, default=16, help="output tokens per request (default 16)")
    p_.add_argument("--rtt-ms", type=float, default=70.0, help="inter-region round trip (default 70)")
    p_.add_argument("--calibration", type=int, default=5, help="unqueued requests per region before the trace")
    p_.add_argument("--request-timeout-s", type=float, default=60.0, help="a request not done by then is an error")
    p_.add_argument("--modes", type=off_on_modes, default=["off", "on"], help="which of off,on to run (default both)")
    p_.add_argument("--seed", type=int, default=7)
    p_.add_argument("--json", help="write the figures here as JSON")
    args = p_.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes:
            results[mode] = asyncio.run(run_mode(mode == "on", args, Path(tmp)))
    print(json.dumps(results, indent=1))
    report(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    sys.exit(run_quietly(main))
