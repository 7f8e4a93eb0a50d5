"""Soak the consumer gateway on loopback: mixed traffic and abuse for a while, figures every minute.

    python -m scripts.soak_gateway [--minutes N] [--interval-s 60] [--clients 4] [--workers 2]   (make soak-gateway)

--minutes defaults to $SOAK_MINUTES, else 30. The pieces are scripts/bench_gateway.py's: its
timed upstream (a child process), the real gateway (`python -m runtime.gateway`, PROXY v2
required, identity from the loopback EC2 fake, limits and metering on), and its streaming
client for the well-behaved consumer. Beside that consumer, at bounded rates:

  plain      one well-behaved non-streaming client
  health     LOCAL-header /health checks, as the NLB's
  slowloris  connections trickling a request head one byte a second (at most 20 open)
  stall      heads that promise a body and stop half-way (at most 10 open; 408 after --body-timeout-s)
  proxy      malformed, truncated and missing PROXY v2 headers
  bad-body   100k-deep JSON, 5000-digit integers, NaN, non-JSON, a Content-Length of '²', 1 MB heads
  flood      bursts of 40 concurrent requests from a consumer limited to 2 (429) and from an
             endpoint of no consumer (403)
  leave      clients that close mid-stream or before a non-streaming answer

Every interval it prints the RSS and open descriptors of the gateway (all its worker processes), the loopback sockets in
TIME_WAIT on the upstream port, the well-behaved clients' request count, failures and TTFT /
end-to-end P50 and P99, and what the abuse got back. Everything binds 127.0.0.1 and every loop
is paced, so the run costs about one CPU core. Exit status 1 when a well-behaved request failed
or the gateway died: like the benchmarks, a soak prints figures, it is not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runtime.gateway.http import BODY_TIMEOUT_S
from scripts.bench_gateway import (
    BENCH_ACCOUNT,
    BENCH_VPCE,
    REGION,
    FakeEc2Endpoints,
    Sample,
    _spawn,
    _wait_port,
    _worker,
    bench_config_data,
    bench_model,
    free_port,
    gateway_args,
    gateway_env,
    percentile,
    write_config,
)

ROOT = Path(__file__).resolve().parents[1]
FLOOD_VPCE, FLOOD_ACCOUNT = "vpce-0bbbbbbbbbbbbbbb2", "777788889999"  # a consumer limited to 2 at once
STRANGER_VPCE = "vpce-0ccccccccccccccc3"  # accepted endpoint, but no consumer's account
TOKENS, TTFT_MS, INTERVAL_MS = 16, 20.0, 10.0


def _header(vpce: str | None) -> bytes:
    sys.path.insert(0, str(ROOT))
    from runtime.gateway import ppv2

    if vpce is None:
        return ppv2.LOCAL_HEADER
    return ppv2.build(("10.60.1.10", random.randint(1024, 65000)), ("10.40.0.5", 8000), vpce_id=vpce)


def _config(path: Path) -> None:
    data = bench_config_data()
    seoul = next(r for r in data["regions"] if r["region"] == REGION)
    flood = dict(data["consumers"][0], name="flooder", account=FLOOD_ACCOUNT,
                 limits={"max_concurrency": 2, "requests_per_minute": 600})
    data["consumers"].append(flood)
    seoul["allowed_principals"] = sorted({*seoul.get("allowed_principals", []),
                                          f"arn:aws:iam::{BENCH_ACCOUNT}:root", f"arn:aws:iam::{FLOOD_ACCOUNT}:root"})
    write_config(path, data)


def _request(body: bytes, path: str = "/v1/completions", extra: bytes = b"") -> bytes:
    return (b"POST %b HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n%bContent-Length: %d\r\n\r\n%b"
            % (path.encode(), extra, len(body), body))


def _completion(stream: bool, tokens: int = TOKENS) -> bytes:
    return json.dumps({"model": bench_model(), "prompt": "soak me", "max_tokens": tokens, "stream": stream}).encode()


BAD_REQUESTS = [
    ("deep", _request(b'{"model": "bench", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")),
    ("digits", _request(b'{"model": "bench", "prompt": "a", "max_tokens": ' + b"9" * 5000 + b"}")),
    ("nan", _request(b'{"model": "bench", "prompt": "a", "temperature": NaN}')),
    ("not-json", _request(b'{"model": "bench", "prompt": ')),
    ("superscript-length", b"POST /v1/completions HTTP/1.1\r\nHost: soak\r\nContent-Length: \xb2\r\n\r\n{}"),
    ("1MB-head", b"GET /v1/models HTTP/1.1\r\nHost: soak\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"),
]


class Soak:
    def __init__(self, port: int, up_port: int, pid: int, clients: int):
        self.port, self.up_port, self.pid, self.clients = port, up_port, pid, clients
        self.samples: list[Sample] = []  # well-behaved streams in this interval
        self.plain_ms: list[float] = []  # well-behaved non-streaming end-to-end in this interval
        self.failures: collections.Counter = collections.Counter()
        self.total_failures = 0
        self.total_requests = 0
        self.abuse: collections.Counter = collections.Counter()  # "kind status" -> count
        self.stop = asyncio.Event()

    async def paced(self, period_s: float, action) -> None:
        while not self.stop.is_set():
            try:
                await asyncio.wait_for(action(), 120)
            except Exception as exc:  # noqa: BLE001 - counted, the soak carries on
                self.abuse[f"{action.__name__} {type(exc).__name__}"] += 1
            try:
                await asyncio.wait_for(self.stop.wait(), period_s)
            except TimeoutError:
                pass

    async def exchange(self, data: bytes, vpce: str | None = BENCH_VPCE, header: bytes | None = None) -> str:
        """Send raw bytes on a new connection; the answer's status, or how the connection ended."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write((header if header is not None else _header(vpce)) + data)
            line = await asyncio.wait_for(reader.readline(), 60)
            while line.startswith(b"HTTP/1.1 100"):
                await reader.readuntil(b"\r\n\r\n")
                line = await asyncio.wait_for(reader.readline(), 60)
            return line.split(b" ")[1].decode() if line.startswith(b"HTTP/1.1 ") else "closed"
        except (ConnectionError, asyncio.IncompleteReadError):
            return "reset"
        finally:
            writer.close()

    # ------------------------------------------------------------ well-behaved

    async def streamer(self) -> None:
        body = _completion(True)
        header = _header(BENCH_VPCE)
        while not self.stop.is_set():
            out: list[Sample] = []
            try:
                await _worker(self.port, header, body, 20, out)  # 20 requests per kept-alive connection
            except Exception as exc:  # noqa: BLE001
                self.failures[f"stream {type(exc).__name__}: {str(exc)[:60]}"] += 1
                self.total_failures += 1
            self.samples.extend(out)
            self.total_requests += len(out)

    async def plain(self) -> None:
        request = _request(_completion(False))
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(_header(BENCH_VPCE) + request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head[:40].decode("latin-1"))
            self.plain_ms.append((time.monotonic() - started) * 1000)
            self.total_requests += 1
        except Exception as exc:  # noqa: BLE001
            self.failures[f"plain {type(exc).__name__}: {str(exc)[:60]}"] += 1
            self.total_failures += 1
        finally:
            writer.close()

    async def health(self) -> None:
        status = await self.exchange(b"GET /health HTTP/1.1\r\nHost: nlb\r\nConnection: close\r\n\r\n",
                                     header=_header(None))
        if status != "200":
            self.failures[f"health {status}"] += 1
            self.total_failures += 1

    # ------------------------------------------------------------ abuse

    async def slowloris(self) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(_header(BENCH_VPCE))
            for byte in b"POST /v1/completions HTTP/1.1\r\nHost: slow\r\nX-Slow: " + b"z" * 10_000:
                writer.write(bytes([byte]))
                await writer.drain()
                try:
                    await asyncio.wait_for(self.stop.wait(), 1.0)
                    return
                except TimeoutError:
                    pass
                if reader.at_eof():
                    break
        except ConnectionError:
            pass
        finally:
            writer.close()
        self.abuse["slowloris cut"] += 1

    async def stall(self) -> None:
        status = await self.exchange(b"POST /v1/completions HTTP/1.1\r\nHost: stall\r\nContent-Length: 1000\r\n\r\n"
                                     b'{"model": "bench", ')
        self.abuse[f"stall {status}"] += 1

    async def proxy(self) -> None:
        kind = random.choice(["garbage", "truncated", "http-first", "silent"])
        header = {"garbage": os.urandom(28), "truncated": _header(BENCH_VPCE)[:20],
                  "http-first": b"", "silent": b""}[kind]
        data = b"" if kind in ("truncated", "silent") else b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        self.abuse[f"proxy-{kind} {await self.exchange(data, header=header)}"] += 1

    async def bad_body(self) -> None:
        name, data = random.choice(BAD_REQUESTS)
        self.abuse[f"bad-{name} {await self.exchange(data)}"] += 1

    async def flood(self) -> None:
        request = _request(_completion(False, 4))
        for vpce, kind in ((FLOOD_VPCE, "flood-limited"), (STRANGER_VPCE, "flood-stranger")):
            for status in await asyncio.gather(*(self.exchange(request, vpce) for _ in range(40))):
                self.abuse[f"{kind} {status}"] += 1

    async def leave(self) -> None:
        stream = random.random() < 0.5
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(_header(BENCH_VPCE) + _request(_completion(stream, 64)))
        if stream:
            await reader.readuntil(b"data: ")  # the first token, then gone
        else:
            await asyncio.sleep(0.05)
        writer.close()
        self.abuse[f"leave-{'stream' if stream else 'plain'} closed"] += 1

    # ------------------------------------------------------------ figures

    def gateway_pids(self) -> list[int]:
        """The gateway process and its workers (--workers N forks them), read from /proc."""
        pids = [self.pid]
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                pids += [int(p) for p in (task / "children").read_text().split()]
            except OSError:
                pass
        return pids

    def gateway_figures(self) -> tuple[float, int, int]:
        """RSS (MiB) and open descriptors summed over the gateway's processes, loopback TIME_WAIT to the upstream."""
        rss_kib = fds = 0
        for pid in self.gateway_pids():
            try:
                rss_kib += next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                                if line.startswith("VmRSS:"))
                fds += len(os.listdir(f"/proc/{pid}/fd"))
            except (OSError, StopIteration):
                pass  # a worker that just exited
        port_hex = f"{self.up_port:04X}"
        time_wait = 0
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                rows = Path(table).read_text().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                cols = row.split()
                if cols[3] == "06" and (cols[1].endswith(":" + port_hex) or cols[2].endswith(":" + port_hex)):
                    time_wait += 1
        return rss_kib / 1024, fds, time_wait


async def run(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="soak-gateway-"))
    up_port, port = free_port(), free_port()
    ec2 = FakeEc2Endpoints([(BENCH_VPCE, BENCH_ACCOUNT), (FLOOD_VPCE, FLOOD_ACCOUNT), (STRANGER_VPCE, "999988887777")])
    ec2_port = await ec2.start()
    config = tmp / "fleet.json"
    _config(config)
    emf, log = open(tmp / "emf.log", "w"), open(tmp / "gateway.log", "w")  # noqa: SIM115 - closed after the gateway stops
    upstream = _spawn(["-m", "scripts.bench_gateway", "_upstream", str(up_port), str(TTFT_MS), str(INTERVAL_MS)])
    gateway = _spawn(gateway_args(port, up_port, config) + ["--body-timeout-s", str(args.body_timeout_s),
                                                            "--workers", str(args.workers)],
                     gateway_env(ec2_port), stdout=emf, stderr=log)
    soak = Soak(port, up_port, gateway.pid, args.clients)
    rows = []
    status = 0
    try:
        await _wait_port(port, _header(None))
        tasks = [asyncio.ensure_future(soak.streamer()) for _ in range(args.clients)]
        tasks += [asyncio.ensure_future(soak.paced(period, action)) for period, action, copies in (
            (0.2, soak.plain, 1), (1.0, soak.health, 1), (0.0, soak.slowloris, 20), (0.0, soak.stall, 10),
            (0.1, soak.proxy, 1), (0.2, soak.bad_body, 1), (2.0, soak.flood, 1), (0.5, soak.leave, 1),
        ) for _ in range(copies)]
        started = time.monotonic()
        print(f"soak: {args.minutes:g} min on loopback, gateway pid {gateway.pid}, figures every {args.interval_s:g} s",
              file=sys.stderr, flush=True)
        print("|  min | RSS MiB | fds | TIME_WAIT | requests | failures | TTFT P50 | TTFT P99 | plain P50 | plain P99 "
              "| connection errors |", flush=True)
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
        end = started + args.minutes * 60
        while time.monotonic() < end:
            await asyncio.sleep(min(args.interval_s, max(0.0, end - time.monotonic())))
            if gateway.poll() is not None:
                print(f"gateway exited with {gateway.returncode}", file=sys.stderr)
                status = 1
                break
            rss, fds, time_wait = soak.gateway_figures()
            ttft = [s.ttft_ms for s in soak.samples if s.ttft_ms is not None]
            errors = (tmp / "gateway.log").read_text().count('"event": "connection_error"')
            row = {"min": round((time.monotonic() - started) / 60, 1), "rss_mib": round(rss, 1), "fds": fds,
                   "time_wait": time_wait, "requests": len(soak.samples) + len(soak.plain_ms),
                   "failures": sum(soak.failures.values()), "ttft_p50": percentile(ttft, 0.5),
                   "ttft_p99": percentile(ttft, 0.99), "plain_p50": percentile(soak.plain_ms, 0.5),
                   "plain_p99": percentile(soak.plain_ms, 0.99), "connection_errors": errors}
            rows.append(row)
            print(f"| {row['min']:4.1f} | {rss:7.1f} | {fds:3d} | {time_wait:9d} | {row['requests']:8d} | "
                  f"{row['failures']:8d} | {row['ttft_p50']:8.1f} | {row['ttft_p99']:8.1f} | {row['plain_p50']:9.1f} | "
                  f"{row['plain_p99']:9.1f} | {errors:17d} |", flush=True)
            if soak.failures:
                print(f"  failures: {dict(soak.failures)}", file=sys.stderr, flush=True)
            soak.samples, soak.plain_ms = [], []
            soak.failures.clear()
        soak.stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for proc in (gateway, upstream):
            proc.send_signal(signal.SIGTERM)
        for proc in (gateway, upstream):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        emf.close()
        log.close()
    with open(tmp / "emf.log") as lines:
        records = sum(1 for _ in lines)
    if gateway.returncode is None:  # still up 30 s after SIGTERM, killed: say what it was doing
        gateway.wait(5)
        tail = (tmp / "gateway.log").read_text().splitlines()[-20:]
        print("gateway did not exit within 30 s of SIGTERM and was killed; its last log lines:\n  "
              + "\n  ".join(tail), file=sys.stderr)
    print(f"\nwell-behaved: {soak.total_requests} requests, {soak.total_failures} failed; gateway wrote {records} EMF "
          f"records; exit {gateway.returncode}")
    if rows:
        print(f"RSS {rows[0]['rss_mib']} -> {rows[-1]['rss_mib']} MiB, fds {rows[0]['fds']} -> {rows[-1]['fds']}, "
              f"TIME_WAIT on the upstream port at most {max(r['time_wait'] for r in rows)}")
    print("abuse answered: " + ", ".join(f"{k}: {v}" for k, v in sorted(soak.abuse.items())))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "abuse": dict(soak.abuse),
                                               "requests": soak.total_requests, "failures": soak.total_failures},
                                              indent=2))
    for name in ("emf.log", "gateway.log", "fleet.json"):
        (tmp / name).unlink(missing_ok=True)
    tmp.rmdir()
    return 1 if status or soak.total_failures or gateway.returncode != 0 else 0  # a drain that hangs fails it too


def _minutes(value: str) -> float:
    """A positive, finite number (minutes or seconds, as the option says)."""
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not 0 < number < float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive number")
    return number


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scripts.soak_gateway", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=_minutes, default=os.environ.get("SOAK_MINUTES", "30"),
                   help="how long to run (default $SOAK_MINUTES, else 30)")
    p.add_argument("--interval-s", type=_minutes, default=60.0, help="seconds between figure rows (default 60)")
    p.add_argument("--clients", type=int, choices=range(1, 65), metavar="1..64", default=4,
                   help="well-behaved streaming clients (default 4)")
    p.add_argument("--body-timeout-s", type=_minutes, default=BODY_TIMEOUT_S,
                   help=f"the gateway's --body-timeout-s (default {BODY_TIMEOUT_S:g}, its own default)")
    p.add_argument("--workers", type=int, choices=range(1, 9), metavar="1..8", default=2,
                   help="gateway processes (python -m runtime.gateway --workers; default 2, as on a g6e.xlarge)")
    p.add_argument("--json", help="also write the rows here")
    return p


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(run(build_parser().parse_args(argv)))


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    sys.exit(run_quietly(main))
