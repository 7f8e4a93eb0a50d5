"""A quiet account beside a flooding neighbour, on loopback, through the real gateway and the reference backend.

    python -m scripts.bench_fairness [--seconds 30] [--batch 8] [--tokens 32] [--quiet-share 0.1] [--flood 3]
        [--json FILE]

One reference server (tiny GPT-2 on CPU, `--batch` its max batch size) behind `python -m runtime.gateway`
(PROXY v2 from two VPC endpoints, one per account). Phases, each `--seconds` long:
The neighbour's client is a process of its own, so its open streams do not delay the quiet account's.
  1. capacity: the neighbour alone, `--batch` streams kept busy: the engine's requests per second (R);
  2. quiet alone: the quiet account at `--quiet-share` x R, Poisson arrivals: its TTFT P50/P99;
  3. quiet + neighbour, fair admission on: the neighbour's arrivals at `--flood` x R from `--lead` seconds
     before the quiet account's (its queue at the gateway grows: nothing refuses it within these limits), the
     quiet account as in 2;
  4. the same with `--fair-admission off` (every request straight to the engine, first come first served).
It prints each phase's figures and the ratio the issue holds to: quiet P99 TTFT with the neighbour / alone.
The verdict is a measurement on a shared machine, so it is printed, never asserted by the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.bench_gateway import (
    POOL,
    REGION,
    SERVICE_ID,
    FakeEc2Endpoints,
    _spawn,
    _wait_port,
    bench_config_data,
    bench_model,
    free_port,
    percentile,
    write_config,
)

ROOT = Path(__file__).resolve().parents[1]
QUIET = ("quiet", "444455556666", "vpce-0aaaaaaaaaaaaaaa1")
NEIGHBOUR = ("neighbour", "777788889999", "vpce-0bbbbbbbbbbbbbbb2")


def fairness_config(batch: int) -> dict:
    """The shipped config, its engine at `batch`, served to two accounts whose limits are far above the load."""
    data = bench_config_data()
    quiet = data["consumers"][0]
    neighbour = json.loads(json.dumps(quiet))
    quiet["name"] = QUIET[0]
    neighbour.update(name=NEIGHBOUR[0], account=NEIGHBOUR[1], vpc_id="vpc-0123456789abcdef1",
                     cidrs=["10.61.0.0/16"])
    neighbour.pop("api_key_secret", None)
    for consumer in (quiet, neighbour):
        consumer["limits"] = {"max_concurrency": 10000, "requests_per_minute": 10_000_000}
        consumer["admission"] = {"max_queued": 10000, "max_queue_wait_s": 600}
    data["consumers"] = [quiet, neighbour]
    for region in data["regions"]:
        principals = region.get("allowed_principals")
        if principals is not None:
            region["allowed_principals"] = sorted({*principals, f"arn:aws:iam::{NEIGHBOUR[1]}:root"})
    data["engine"]["max_batch_size"] = batch
    for model in data.get("models") or [data.get("model") or {}]:
        if model.get("engine"):
            model["engine"].pop("max_batch_size", None)
    for region in data["regions"]:
        for pool in region["pools"]:
            if pool.get("engine"):
                pool["engine"].pop("max_batch_size", None)
            if (pool.get("scaling") or {}).get("target", 0) > batch:  # a target above the batch is refused
                pool["scaling"]["target"] = batch
    return data


def proxy_header(vpce: str) -> bytes:
    from runtime.gateway import ppv2

    return ppv2.build(("10.60.1.10", 40000), ("10.40.0.5", 8000), vpce_id=vpce)


async def one(port: int, header: bytes, body: bytes) -> tuple[int, float | None]:
    """(status, TTFT ms) of one streamed completion on a new connection; TTFT None unless 200."""
    sent = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(header + b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%b" % (len(body), body))
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        ttft, buf = None, b""
        while True:
            data = await reader.read(65536)
            if not data:
                break
            buf += data
            if ttft is None and b'"text"' in buf:
                ttft = (time.perf_counter() - sent) * 1000
        return status, ttft if status == 200 else None
    finally:
        writer.close()


async def poisson(port: int, header: bytes, body: bytes, rate: float, seconds: float, seed: int,
                  out: list[tuple[int, float | None]]) -> None:
    rng = random.Random(seed)
    tasks, at, start = [], 0.0, time.monotonic()
    while True:
        at += rng.expovariate(rate)
        if at >= seconds:
            break
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        tasks.append(asyncio.ensure_future(one(port, header, body)))
    out.extend(await asyncio.gather(*tasks, return_exceptions=False))


async def closed_loop(port: int, header: bytes, body: bytes, streams: int, seconds: float) -> int:
    done, end = [0], time.monotonic() + seconds

    async def stream() -> None:
        while time.monotonic() < end:
            status, _ = await one(port, header, body)
            done[0] += status == 200

    await asyncio.gather(*(stream() for _ in range(streams)))
    return done[0]


def ttft_figures(samples: list[tuple[int, float | None]]) -> dict:
    ttfts = [t for s, t in samples if s == 200 and t is not None]
    return {"requests": len(samples), "ok": len(ttfts), "refused": sum(1 for s, _ in samples if s != 200),
            "ttft_p50": round(percentile(ttfts, 0.5), 2), "ttft_p99": round(percentile(ttfts, 0.99), 2)}


async def phase(port: int, body: bytes, quiet_rate: float, flood_rate: float, seconds: float, seed: int,
                lead: float = 0.0) -> dict:
    """The quiet account for `seconds`; with `flood_rate`, beside the neighbour, which starts `lead` seconds
    earlier (the quiet account arrives beside a flood under way, not at the same instant as it). The neighbour
    is a process of its own: its hundreds of open streams would otherwise delay the quiet account's sends and
    reads in one event loop, and the quiet figures would measure the client."""
    quiet: list = []
    flood = None
    if flood_rate:
        flood = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "scripts.bench_fairness", "_flood", str(port), body.decode(), str(flood_rate),
            str(seconds + lead), str(seed + 1), cwd=str(ROOT), stdout=asyncio.subprocess.PIPE)
        await asyncio.sleep(lead)
    await poisson(port, proxy_header(QUIET[2]), body, quiet_rate, seconds, seed, quiet)
    result = {"quiet": ttft_figures(quiet)}
    if flood is not None:
        out, _ = await flood.communicate()
        result["neighbour"] = json.loads(out)
    return result


def _flood(argv: list[str]) -> None:
    """The neighbour's process: Poisson arrivals at `rate` for `seconds`, then what has not finished within a
    second is abandoned (its connections closed: the gateway withdraws what still waits); figures as JSON."""
    port, body, rate, seconds, seed = int(argv[0]), argv[1].encode(), float(argv[2]), float(argv[3]), int(argv[4])

    async def run() -> dict:
        rng, header = random.Random(seed), proxy_header(NEIGHBOUR[2])
        tasks, at, start = [], 0.0, time.monotonic()
        while (at := at + rng.expovariate(rate)) < seconds:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            tasks.append(asyncio.ensure_future(one(port, header, body)))
        done, pending = await asyncio.wait(tasks, timeout=1.0) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        figures = ttft_figures([t.result() for t in done if t.exception() is None])
        return {**figures, "sent": len(tasks), "abandoned": len(pending)}

    print(json.dumps(asyncio.run(run())))


def stop(proc: subprocess.Popen, wait_s: float) -> None:
    """SIGTERM (each drains), then a kill past `wait_s`."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()


def admission_waits(emf: Path, consumer: str) -> dict:
    """What the gateway's records say the account's requests waited for an engine slot (P50/P99/max, ms)."""
    waits = []
    for line in emf.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("Consumer") == consumer and "admission_wait_ms" in record or record.get("Consumer") == consumer:
            waits.append(float(record.get("admission_wait_ms", 0.0)))
    return {"p50": round(percentile(waits, 0.5), 2), "p99": round(percentile(waits, 0.99), 2),
            "max": max(waits, default=0.0)}


async def main_async(args: argparse.Namespace) -> dict:
    from runtime.reference.build import build_artifact

    tmp = Path(tempfile.mkdtemp(prefix="bench-fairness-"))
    build_artifact(tmp / "artifact", size="tiny")
    config = tmp / "fleet.json"
    write_config(config, fairness_config(args.batch))
    ec2 = FakeEc2Endpoints([(QUIET[2], QUIET[1]), (NEIGHBOUR[2], NEIGHBOUR[1])])
    ec2_port = await ec2.start()
    env = {"AWS_ENDPOINT_URL_EC2": f"http://127.0.0.1:{ec2_port}", "AWS_ACCESS_KEY_ID": "bench",
           "AWS_SECRET_ACCESS_KEY": "bench", "AWS_MAX_ATTEMPTS": "1"}
    up_port = free_port()
    engine = _spawn(["-m", "runtime.reference.server", "--artifact", str(tmp / "artifact"), "--port", str(up_port),
                     "--max-batch-size", str(args.batch), "--threads", "1", "--served-model-name", bench_model()])
    body = json.dumps({"model": bench_model(), "prompt": "the quick brown fox " * 8, "max_tokens": args.tokens,
                       "ignore_eos": True, "stream": True}).encode()
    results: dict = {"config": vars(args)}
    try:
        await _wait_port(up_port, None, timeout=120)
        for mode in ("on", "off"):
            port = free_port()
            gateway = _spawn(["-m", "runtime.gateway", "--listen", f"127.0.0.1:{port}", "--upstream",
                              f"127.0.0.1:{up_port}", "--config-json", str(config), "--region", REGION, "--pool", POOL,
                              "--service-id", SERVICE_ID, "--fair-admission", mode], env,
                             stdout=open(tmp / f"emf-{mode}.log", "w"))  # noqa: SIM115 - the child's stdout
            try:
                await _wait_port(port, proxy_header(QUIET[2]))
                await closed_loop(port, proxy_header(NEIGHBOUR[2]), body, args.batch, 3)  # warm-up
                if mode == "on":
                    served = await closed_loop(port, proxy_header(NEIGHBOUR[2]), body, args.batch, args.seconds)
                    capacity = served / args.seconds
                    results["capacity_rps"] = round(capacity, 2)
                    print(f"capacity: {capacity:.2f} requests/s at batch {args.batch}", file=sys.stderr, flush=True)
                    results["alone"] = await phase(port, body, args.quiet_share * capacity, 0, args.seconds, 1)
                    print(f"quiet alone: {results['alone']['quiet']}", file=sys.stderr, flush=True)
                capacity = results["capacity_rps"]
                row = await phase(port, body, args.quiet_share * capacity, args.flood * capacity, args.seconds, 1,
                                  args.lead)
                results[f"fair_{mode}"] = row
                print(f"with neighbour, fair admission {mode}: {row}", file=sys.stderr, flush=True)
            finally:
                stop(gateway, 30)
    finally:
        stop(engine, 40)
    for mode in ("on", "off"):
        results[f"fair_{mode}"]["quiet_admission_wait_ms"] = admission_waits(tmp / f"emf-{mode}.log", QUIET[0])
    alone = results["alone"]["quiet"]["ttft_p99"]
    for mode in ("on", "off"):
        results[f"ratio_{mode}"] = round(results[f"fair_{mode}"]["quiet"]["ttft_p99"] / alone, 2)
    return results


def admission_cpu_us(batch: int, rounds: int = 5, n: int = 20_000) -> float:
    """CPU microseconds fair admission spends on a request that finds room (acquire + release, two accounts,
    the two-worker shared state): the figure the gateway adds per request below capacity, best of `rounds`."""
    from fleetcast.config import parse_config
    from runtime.gateway.fair import FairAdmission
    from runtime.gateway.shared import SharedState

    cfg = parse_config(fairness_config(batch), "<bench config>")
    consumers = [c.name for c in cfg.consumers]

    class Engine:
        host_header = "127.0.0.1:9"

    async def run() -> float:
        admission = FairAdmission(SharedState(2), {"m": [Engine()]}, {"m": batch}, cfg.consumers)  # type: ignore[list-item]
        best = float("inf")
        for _ in range(rounds):
            start = time.process_time()
            for i in range(n):
                who = consumers[i % len(consumers)]
                engine = await admission.acquire(who, "m", lambda: False)
                admission.release(who, "m", engine)  # type: ignore[arg-type]
            best = min(best, (time.process_time() - start) / n * 1e6)
        return best

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_flood"]:
        _flood(argv[1:])
        return 0
    p = argparse.ArgumentParser(prog="python -m scripts.bench_fairness", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=30.0, help="length of each phase (default 30)")
    p.add_argument("--batch", type=int, default=8, help="the engine's max batch size, so its admission cap (default 8)")
    p.add_argument("--tokens", type=int, default=32, help="output tokens per request (default 32)")
    p.add_argument("--quiet-share", type=float, default=0.1,
                   help="the quiet account's arrival rate as a share of the engine's capacity (default 0.1)")
    p.add_argument("--flood", type=float, default=3.0,
                   help="the neighbour's arrival rate as a multiple of the engine's capacity (default 3)")
    p.add_argument("--lead", type=float, default=5.0,
                   help="seconds the neighbour floods before the quiet account's measured phase starts (default 5)")
    p.add_argument("--json", help="write the figures here as JSON")
    args = p.parse_args(argv)
    results = asyncio.run(main_async(args))
    results["admission_cpu_us"] = round(admission_cpu_us(args.batch), 1)
    print(f"\nquiet account P99 TTFT: alone {results['alone']['quiet']['ttft_p99']} ms; beside a neighbour at "
          f"{args.flood:g}x capacity: fair admission {results['fair_on']['quiet']['ttft_p99']} ms "
          f"({results['ratio_on']}x), first come first served {results['fair_off']['quiet']['ttft_p99']} ms "
          f"({results['ratio_off']}x); the bound: 1.1x")
    print(f"fair admission's CPU per request that finds room: {results['admission_cpu_us']} us (bound: 50 us)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    sys.exit(run_quietly(main))
