"""End-to-end check of the reference server as a process: start, health, streamed load, drain.

Builds the artifact if --artifact does not exist yet (with --size/--device), starts
`python -m runtime.reference.server`, waits for /health 200, sends one streamed completion and
then --concurrency concurrent ones (printing TTFT, ITL and throughput, and checking every usage
count), then SIGTERMs the server with streams in flight and checks the drain contract: /health
503, new requests 503, in-flight streams complete with their full token counts, exit code 0.

  python scripts/reference_serve_check.py --artifact /tmp/xl --size gpt2-xl --device cuda
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from runtime.devtools.harness import free_port  # noqa: E402
from runtime.reference.client import stream_completion  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog. " * 3  # 135 byte tokens


async def wait_healthy(base: str, proc: subprocess.Popen, timeout: float) -> float:
    started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        while time.monotonic() - started < timeout:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode} before becoming healthy")
            try:
                async with session.get(base + "/health") as resp:
                    if resp.status == 200:
                        return time.monotonic() - started
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError(f"server not healthy after {timeout}s")


def summarize(results, wall_s: float) -> dict:
    ttft = [r.ttft_s * 1000 for r in results if r.ttft_s is not None]
    itl = [r.itl_s * 1000 for r in results if r.itl_s is not None]
    tokens = sum((r.usage or {}).get("completion_tokens", 0) for r in results)
    return {"requests": len(results), "ok": sum(r.status == 200 and r.done for r in results),
            "ttft_ms_p50": statistics.median(ttft) if ttft else None, "ttft_ms_max": max(ttft) if ttft else None,
            "itl_ms_mean": statistics.fmean(itl) if itl else None, "output_tokens": tokens,
            "output_tokens_per_s": tokens / wall_s if wall_s else None}


async def exercise(base: str, proc: subprocess.Popen, args) -> dict:
    out: dict = {}
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        opts = {"temperature": 0, "ignore_eos": True}
        single = []
        for _ in range(3):
            single.append(await stream_completion(session, base, PROMPT, args.max_tokens, **opts))
        out["single"] = summarize(single, sum(r.e2e_s or 0 for r in single))
        out["single"]["ttft_ms_each"] = [round(r.ttft_s * 1000, 2) for r in single]
        # Each new prompt length is a new prefill shape: TTFT must not pay a per-shape setup cost.
        varied = {}
        for n in (37, 90, 173, 256, 311, 402, 509, 640):
            r = await stream_completion(session, base, "y" * n, 8, **opts)
            varied[n] = round(r.ttft_s * 1000, 2) if r.ttft_s is not None else None
        out["ttft_ms_by_prompt_tokens"] = varied
        t = time.monotonic()
        conc = await asyncio.gather(*[stream_completion(session, base, PROMPT, args.max_tokens, **opts)
                                      for _ in range(args.concurrency)])
        out["concurrent"] = summarize(conc, time.monotonic() - t)
        bad = [r for r in single + list(conc) if (r.usage or {}).get("completion_tokens") != args.max_tokens
               or r.chunks != args.max_tokens]
        out["token_count_mismatches"] = len(bad)

        # Drain: more accepted requests than batch slots (so some wait in the queue), SIGTERM once
        # the first has streamed a token; every accepted request must still finish in full.
        n_drain = args.drain_requests
        drain_tokens = args.drain_tokens
        started = [asyncio.Event() for _ in range(n_drain)]
        tasks = [asyncio.ensure_future(stream_completion(session, base, "x", drain_tokens, first_chunk=ev, **opts))
                 for ev in started]
        await asyncio.wait([asyncio.ensure_future(ev.wait()) for ev in started], return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0.05)  # let the remaining requests reach the server's queue
        proc.send_signal(signal.SIGTERM)
        t_sig = time.monotonic()
        out["_sigterm_at"] = t_sig
        health = None
        for _ in range(50):
            try:
                async with session.get(base + "/health") as resp:
                    health = resp.status
                    if health == 503:
                        break
            except aiohttp.ClientError as exc:
                health = f"connection error {exc!r}"
                break
            await asyncio.sleep(0.02)
        out["drain_health_after_sigterm"] = health
        out["drain_health_503_after_ms"] = round((time.monotonic() - t_sig) * 1000, 1)
        try:
            refused = await stream_completion(session, base, PROMPT, 4, **opts)
            out["drain_new_request_status"] = refused.status
        except aiohttp.ClientError as exc:
            out["drain_new_request_status"] = f"connection error {exc!r}"
        drained = await asyncio.gather(*tasks)
        out["drain_inflight_completion_tokens"] = [(r.usage or {}).get("completion_tokens") for r in drained]
        out["drain_inflight_full"] = all((r.usage or {}).get("completion_tokens") == drain_tokens for r in drained)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", required=True)
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-batch-size", type=int, default=None)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--drain-requests", type=int, default=8)
    ap.add_argument("--drain-tokens", type=int, default=255)
    ap.add_argument("--health-timeout", type=float, default=300)
    ap.add_argument("--out", default=None)
    ap.add_argument("--server-log", default=None)
    args = ap.parse_args(argv)

    art = Path(args.artifact)
    result: dict = {"device": args.device}
    if not (art / "config.json").exists():
        from runtime.reference.build import build_artifact

        built = build_artifact(art, size=args.size, seed=args.seed,
                               dtype="float16" if args.device == "cuda" else "float32", device=args.device)
        result["build"] = {"seconds": built["seconds"], "bytes": built["bytes"]}
    result["size"] = json.loads((art / "config.json").read_text())["fleetcast_reference"]["size"]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "runtime.reference.server", "--artifact", str(art), "--port", str(port),
           "--device", args.device]
    if args.max_batch_size:
        cmd += ["--max-batch-size", str(args.max_batch_size)]
    log = open(args.server_log, "w") if args.server_log else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        result["start_to_healthy_s"] = round(asyncio.run(wait_healthy(base, proc, args.health_timeout)), 2)
        result.update(asyncio.run(exercise(base, proc, args)))
        result["exit_code"] = proc.wait(timeout=120)
        result["exit_after_sigterm_s"] = round(time.monotonic() - result.pop("_sigterm_at"), 2)
    finally:
        if proc.poll() is None:
            proc.kill()
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    ok = (result.get("token_count_mismatches") == 0 and result.get("drain_inflight_full")
          and result.get("exit_code") == 0 and result.get("drain_health_after_sigterm") == 503
          and result.get("drain_new_request_status") == 503)
    print("SERVE CHECK", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    sys.exit(run_quietly(main))
