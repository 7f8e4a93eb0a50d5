"""`make bench-spot-drain`: how many in-flight streams finish inside a Spot interruption notice.

    python -m scripts.bench_spot_drain [--notice-s 120] [--exit-reserve-s 10] [--scale auto|F]
        [--lengths 16,32,...] [--streams-per-length 3] [--json FILE] [--write-data FILE]

The reference backend (runtime.reference, tiny GPT-2 shapes on CPU) behind the real gateway
(`python -m runtime.gateway`, PROXY v2 required, identity from a loopback EC2 fake), driven the way the instance
drives it on an interruption (runtime/spot.py): every stream in flight, then the deadline file and SIGTERM.

The drain budget is the notice less the exit reserve (default 10 s, the gateway's own deadline; runtime/spot.py
safe_request_seconds): the NLB stops routing new flows about 20 s into the drain but keeps the open ones
(fleetcast/contract/nlb.py), so nothing else shortens it. Time is compressed by --scale so a run takes seconds:
the budget, and so the stream durations that fit, shrink by that factor; `auto` measures the streams once
without an interruption and picks the scale at which about half the lengths fit. The figures scale back:
a stream that took d seconds here stands for d / scale seconds against the full notice.

Printed: per length, streams finished / in flight and their undisturbed duration; the longest length that
always finished (the safe length, in tokens at this backend's speed and in seconds at full scale), and any
stream cut although its duration fit the budget (a defect). --write-data writes the figure the planner reads
(fleetcast/config/data/spot_drain.yaml) with the command that produced it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime import spot

ROOT = Path(__file__).resolve().parents[1]
REGION, POOL = "ap-northeast-2", "l40s"


def _parse_lengths(text: str) -> list[int]:
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lengths must be comma-separated token counts, got {text!r}") from None
    if not values or values[0] < 1 or values[-1] > 1000:
        raise argparse.ArgumentTypeError("--lengths: each between 1 and 1000 tokens (gpt2's 1024 positions less "
                                         "the prompt; tiny: at most 240)")
    return values


def _scale(text: str) -> float | None:
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"--scale must be 'auto' or a number in (0, 1], got {text!r}")
    return value


def _seconds(flag: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value >= 0:
            raise argparse.ArgumentTypeError(f"{flag} must be a number of seconds >= 0, got {text!r}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scripts.bench_spot_drain", description=__doc__.split("\n\n")[0])
    p.add_argument("--notice-s", type=_seconds("--notice-s"), default=120.0,
                   help="interruption notice in seconds (EC2's is two minutes)")
    p.add_argument("--exit-reserve-s", type=_seconds("--exit-reserve-s"), default=spot.DRAIN_EXIT_RESERVE_S,
                   help="end of the notice kept for the gateway and server to exit (default "
                        f"{spot.DRAIN_EXIT_RESERVE_S:g}, the runtime's)")
    p.add_argument("--scale", type=_scale, default=None, metavar="auto|F",
                   help="time compression (budget x F); auto (default) calibrates from an undisturbed run")
    p.add_argument("--size", choices=("tiny", "gpt2"), default="gpt2",
                   help="reference model shape (default gpt2: 124M random weights, a few tokens/s per stream on one "
                        "CPU thread, so the compressed budget is seconds, not milliseconds; tiny: quick smoke run)")
    p.add_argument("--lengths", type=_parse_lengths, default=None,
                   help="output lengths in tokens (default 25,50,...,300 for gpt2; 20,40,...,240 for tiny)")
    p.add_argument("--streams-per-length", type=int, default=3, help="streams of each length in flight (default 3)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--write-data", metavar="FILE", help="write the planner's drain figure (spot_drain.yaml shape)")
    return p


# ---------------------------------------------------------------- processes


def _spawn(args: list[str], env: dict[str, str] | None = None, log: Path | None = None) -> subprocess.Popen[bytes]:
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
    return subprocess.Popen([sys.executable, *args], cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                            stdout=out, stderr=subprocess.STDOUT)


def _config(path: Path, vpce_account: str) -> str:
    from fleetcast.config import parse_config
    from runtime.devtools.harness import tiny_config

    data = tiny_config(REGION).model_dump(mode="json")
    data["consumers"] = [c for c in data["consumers"] if c["account"] == vpce_account][:1]
    data["consumers"][0]["limits"] = {"max_concurrency": 10000, "requests_per_minute": 10_000_000}
    # The scale-in drain timeout must not be what ends the drain: the notice's deadline is measured.
    data["operations"]["drain_timeout_s"] = 3600
    cfg = parse_config(data, "<bench config>")
    path.write_text(json.dumps(data))
    return cfg.model.id


async def _stream(port: int, header: bytes, model: str, tokens: int,
                  first_tokens: list[float] | None = None) -> dict[str, Any]:
    """One streaming completion through the gateway: how many tokens arrived, whether it ended, when.
    `first_tokens` collects the time of each stream's first token (the stream is then in flight)."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"model": model, "prompt": "spot drain", "max_tokens": tokens, "stream": True,
                       "ignore_eos": True, "temperature": 0}).encode()
    writer.write(header + b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await writer.drain()
    got, first, done, status = 0, None, False, 0
    buffer = b""
    try:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                break
            buffer += chunk
            if not status and b"\r\n" in buffer:
                status = int(buffer.split(b" ", 2)[1])
            got_now = buffer.count(b'"text"')
            if got_now and first is None:
                first = time.monotonic()
                if first_tokens is not None:
                    first_tokens.append(first)
            got = got_now
            if b"data: [DONE]" in buffer:
                done = True
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()
    return {"tokens": tokens, "received": got, "completed": done and got >= tokens, "status": status,
            "started": started, "first": first, "ended": time.monotonic()}


async def _wait_health(port: int, header: bytes, want: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(header + b"GET /health HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            await writer.drain()
            line = await reader.readline()
            writer.close()
            if line and int(line.split()[1]) == want:
                return
        except (OSError, ValueError, IndexError):
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"gateway /health did not answer {want} within {timeout:.0f} s")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from runtime.devtools.harness import free_port
    from runtime.gateway import ppv2
    from scripts.bench_gateway import BENCH_ACCOUNT, BENCH_VPCE, SERVICE_ID, FakeEc2Endpoints

    work = Path(tempfile.mkdtemp(prefix="fleetcast-spot-drain-"))
    artifact = work / "artifact"
    subprocess.run([sys.executable, "-m", "runtime.reference.build", "--out", str(artifact), "--size", args.size,
                    "--device", "cpu"], cwd=ROOT, check=True, capture_output=True)
    if args.lengths is None:
        args.lengths = list(range(25, 301, 25)) if args.size == "gpt2" else list(range(20, 241, 20))
    if args.size == "tiny" and args.lengths[-1] > 240:
        raise SystemExit("--lengths: the tiny model serves at most 240 output tokens")
    positions = 1024 if args.size == "gpt2" else 256
    model = _config(work / "fleet.json", BENCH_ACCOUNT)
    streams = [n for n in args.lengths for _ in range(args.streams_per_length)]
    server_port, port = free_port(), free_port()
    server = _spawn(["-m", "runtime.reference.server", "--artifact", str(artifact), "--port", str(server_port),
                     "--served-model-name", model, "--max-batch-size", str(len(streams)), "--max-seq-len", str(positions),
                     "--threads", "1", "--drain-timeout", "600"], log=work / "server.log")
    ec2 = FakeEc2Endpoints([(BENCH_VPCE, BENCH_ACCOUNT)], SERVICE_ID)
    ec2_port = await ec2.start()
    deadline_file = work / "spot-drain-deadline.json"
    gateway = _spawn(["-m", "runtime.gateway", "--listen", f"127.0.0.1:{port}", "--upstream",
                      f"127.0.0.1:{server_port}", "--config-json", str(work / "fleet.json"), "--region", REGION,
                      "--pool", POOL, "--service-id", SERVICE_ID, "--drain-deadline-file", str(deadline_file)],
                     env={"AWS_ENDPOINT_URL_EC2": f"http://127.0.0.1:{ec2_port}", "AWS_ACCESS_KEY_ID": "bench",
                          "AWS_SECRET_ACCESS_KEY": "bench", "AWS_MAX_ATTEMPTS": "1"}, log=work / "gateway.log")
    header = ppv2.build(vpce_id=BENCH_VPCE)
    try:
        await _wait_health(port, ppv2.LOCAL_HEADER, 200, timeout=600)  # a loaded 2-core machine loads gpt2 slowly
        # 1. Undisturbed: how long each length takes with everything in flight at once.
        calm_firsts: list[float] = []
        calm = await asyncio.gather(*(_stream(port, header, model, n, calm_firsts) for n in streams))
        if not all(r["completed"] for r in calm):
            raise RuntimeError("undisturbed streams did not all complete: see " + str(work))
        # Time each length still needs once every stream is in flight: what a notice at that moment leaves to it.
        t_calm = max(calm_firsts)
        duration = {n: max(r["ended"] - t_calm for r in calm if r["tokens"] == n) for n in args.lengths}
        full_budget = spot.safe_request_seconds(args.notice_s, args.exit_reserve_s)
        if full_budget <= 0:
            raise SystemExit("--exit-reserve-s leaves no time of the notice")
        scale = args.scale
        if scale is None:  # about half the lengths fit
            scale = min(1.0, duration[args.lengths[len(args.lengths) // 2]] / full_budget)
        budget = full_budget * scale

        # 2. The interruption: all streams in flight, then the notice's deadline and SIGTERM, as on an instance.
        first_tokens: list[float] = []
        tasks = [asyncio.ensure_future(_stream(port, header, model, n, first_tokens)) for n in streams]
        while len(first_tokens) < len(streams) and not any(t.done() for t in tasks):
            await asyncio.sleep(0.01)
        notice_at, t_notice = time.time(), time.monotonic()  # T: every stream is in flight
        spot.write_deadline(deadline_file, spot.Notice("instance-action", "terminate", notice_at + budget, notice_at),
                            reserve_s=0.0)
        t0 = time.monotonic()
        gateway.send_signal(signal.SIGTERM)
        await _wait_health(port, ppv2.LOCAL_HEADER, 503, timeout=5)
        health_503_s = time.monotonic() - t0
        results = await asyncio.gather(*tasks)
        gateway.wait(timeout=budget + 60)
        drain_s = time.monotonic() - t0
        outcome = spot.read_outcome(deadline_file) or {}
    finally:
        for proc in (gateway, server):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)

    rows = []
    for n in args.lengths:
        mine = [r for r in results if r["tokens"] == n]
        done = [r["ended"] - t_notice for r in mine if r["completed"]]
        rows.append({"tokens": n, "in_flight": len(mine), "finished": len(done), "undisturbed_s": duration[n],
                     "remaining_at_notice_s": max(done) if done else None})
    # The longest length that always finished, and the longest time after the notice a stream still finished in.
    longest = None
    for row in rows:
        if row["finished"] != row["in_flight"]:
            break
        longest = row
    finished_after = [r["ended"] - t_notice for r in results if r["completed"]]
    # A cut before the deadline would be a defect: a stream is only ever cut when the budget is spent.
    cut_early = [r["tokens"] for r in results if not r["completed"] and r["ended"] - t_notice < 0.95 * budget]
    safe_s = max(finished_after, default=0.0) / scale
    return {
        "notice_s": args.notice_s, "exit_reserve_s": args.exit_reserve_s, "full_budget_s": full_budget,
        "scale": scale, "budget_s": budget, "health_503_s": health_503_s, "drain_s": drain_s,
        "gateway_outcome": outcome, "rows": rows,
        "safe_tokens_here": longest["tokens"] if longest else 0,
        "tokens_per_s_per_stream": (longest["tokens"] / longest["undisturbed_s"]) if longest else None,
        "safe_request_s": min(full_budget, safe_s), "cut_before_deadline": cut_early,
        # Only a run in which some stream was cut at the deadline bounds the figure; else it is a lower bound.
        "bounded": any(not r["completed"] for r in results),
    }


def render(res: dict[str, Any]) -> str:
    out = [f"Spot drain budget: notice {res['notice_s']:g} s - exit reserve {res['exit_reserve_s']:g} s = "
           f"{res['full_budget_s']:g} s, compressed x{res['scale']:.4f} to {res['budget_s']:.2f} s",
           f"/health 503 after SIGTERM: {res['health_503_s'] * 1000:.0f} ms; drain took {res['drain_s']:.2f} s; "
           f"gateway: {res['gateway_outcome'].get('in_flight')} in flight, {res['gateway_outcome'].get('cut')} cut",
           "tokens  in flight  finished  undisturbed remaining s  last finish after notice s"]
    for row in res["rows"]:
        last = row["remaining_at_notice_s"]
        out.append(f"{row['tokens']:>6}  {row['in_flight']:>9}  {row['finished']:>8}  {row['undisturbed_s']:>23.2f}  "
                   f"{'-' if last is None else f'{last:.2f}':>26}")
    out.append(f"Longest safe length here: {res['safe_tokens_here']} tokens (every stream of it finished; "
               f"{res['tokens_per_s_per_stream'] or 0:.1f} tokens/s per stream at this compressed load)")
    out.append(f"Longest remaining time that still finished: {res['safe_request_s'] * res['scale']:.2f} s of "
               f"{res['budget_s']:.2f} s, i.e. requests with {'up to' if res['bounded'] else 'at least (nothing was cut: raise --lengths)'} {res['safe_request_s']:.0f} s left at the notice are "
               f"safe against the full {res['notice_s']:g} s notice (an engine at R tokens/s per stream: "
               f"{res['safe_request_s']:.0f} x R output tokens)")
    out.append("Cut before the deadline (a defect): " + (", ".join(map(str, res["cut_before_deadline"])) or "none"))
    return "\n".join(out)


def write_data(path: str, res: dict[str, Any]) -> None:
    Path(path).write_text(
        "# Interruption drain budget, measured (not assumed): the longest request that finishes inside a Spot\n"
        "# interruption notice, from `make bench-spot-drain` (scripts/bench_spot_drain.py: the reference backend\n"
        "# behind the real gateway, a compressed notice scaled back to the full one). Read by the planner\n"
        "# (fleetcast/plan/spot.py) and quoted in docs/runbook.md#spot-tier. Rerun the command and replace this\n"
        "# file after a change to the drain path.\n"
        f"as_of: \"{dt.date.today().isoformat()}\"\n"
        f"command: \"{res.get('command', 'make bench-spot-drain')}\"\n"
        f"notice_s: {res['notice_s']:g}\n"
        f"exit_reserve_s: {res['exit_reserve_s']:g}\n"
        f"scale: {res['scale']:.4f}\n"
        f"safe_tokens_at_reference_speed: {res['safe_tokens_here']}\n"
        f"safe_request_s: {res['safe_request_s']:.0f}\n")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.streams_per_length < 1:
        print("--streams-per-length must be at least 1", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    res = asyncio.run(run(args))
    res["command"] = "make bench-spot-drain" + (f" BENCH_ARGS='{' '.join(argv if argv is not None else sys.argv[1:])}'"
                                                 if (argv if argv is not None else sys.argv[1:]) else "")
    print(render(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    if args.write_data:
        write_data(args.write_data, res)
        print(f"wrote {args.write_data}")
    return 1 if res["cut_before_deadline"] else 0


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    sys.exit(run_quietly(main))
