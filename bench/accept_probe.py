"""How long a burst of new loopback connections waits for the kernel's accept, with no proxy logic at all.

    python bench/accept_probe.py [--workers 2] [--burst 32] [--rounds 40] [--loop selectors|asyncio|uvloop]

`--workers` processes listen on one SO_REUSEPORT port and stamp each accepted connection (monotonic
clock); this process opens `--burst` connections at once, sends a byte on each as soon as its connect()
completes, and prints how long after that each connection was accepted (P50, P99, max). The gateway's
benchmark (scripts/bench_gateway.py) measures a first request's whole way in; this separates the
kernel's part: if this stays under a few milliseconds where the gateway's first requests wait tens of
milliseconds, the wait is not the host's accept.
"""

from __future__ import annotations

import argparse
import os
import select
import selectors
import signal
import socket
import sys
import time

READY = "listening"  # a worker's first line: its socket is in the port's group


def _wait_listening(read_end: int, workers: int) -> None:
    """Until every worker has written READY (no connection is made before, so nothing else is in the pipe)."""
    seen = b""
    for _ in range(100):  # bounded: 10 s for the forks to bind
        if seen.count(READY.encode()) >= workers:
            return
        if select.select([read_end], [], [], 0.1)[0]:
            seen += os.read(read_end, 4096)
    raise SystemExit(f"accept_probe: {workers - seen.count(READY.encode())} worker(s) never listened")


def _serve_selectors(port: int, out) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(1024)
    out.write(f"{READY}\n")
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    held = []
    while True:
        sel.select()
        while True:
            try:
                conn, addr = listener.accept()
            except BlockingIOError:
                break
            out.write(f"{addr[1]} {time.monotonic_ns()}\n")
            held.append(conn)  # kept open: a closed one would be reset before the client is done


def _serve_asyncio(port: int, out, uvloop: bool) -> None:
    import asyncio

    if uvloop:
        import uvloop as uv

        asyncio.set_event_loop_policy(uv.EventLoopPolicy())

    async def handle(reader, writer) -> None:
        out.write(f"{writer.get_extra_info('peername')[1]} {time.monotonic_ns()}\n")
        try:
            await reader.read()  # until the client closes
        except ConnectionError:
            pass
        writer.close()

    async def main() -> None:
        await asyncio.start_server(handle, "127.0.0.1", port, reuse_port=True, backlog=1024)
        out.write(f"{READY}\n")
        await asyncio.Event().wait()

    asyncio.run(main())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _burst(port: int, size: int) -> list[tuple[int, int]]:
    """Open `size` connections at once; when each connect() completes, send a byte and note the time."""
    pending = []
    for _ in range(size):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        pending.append(c)
    sel = selectors.DefaultSelector()
    for c in pending:
        sel.register(c, selectors.EVENT_WRITE)
    sent = []
    for _ in range(100):  # bounded: a loopback connect completes in well under a second
        if len(sent) == size:
            break
        for key, _ in sel.select(1.0):
            c = key.fileobj
            sent.append((c.getsockname()[1], time.monotonic_ns()))
            sel.unregister(c)
            c.send(b"x")
    time.sleep(0.1)
    for c in pending:
        c.close()
    return sent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/accept_probe.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, choices=range(1, 9), metavar="1..8", default=2)
    p.add_argument("--burst", type=int, choices=range(1, 513), metavar="1..512", default=32)
    p.add_argument("--rounds", type=int, choices=range(1, 1001), metavar="1..1000", default=40)
    p.add_argument("--loop", choices=("selectors", "asyncio", "uvloop"), default="selectors")
    args = p.parse_args(argv)
    if args.loop == "uvloop":
        try:
            import uvloop  # noqa: F401
        except ImportError:
            p.error("--loop uvloop: uvloop is not installed here")
    port = _free_port()
    read_end, write_end = os.pipe()
    children = []
    for _ in range(args.workers):
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            out = os.fdopen(write_end, "w", buffering=1)
            if args.loop == "selectors":
                _serve_selectors(port, out)
            else:
                _serve_asyncio(port, out, args.loop == "uvloop")
            os._exit(0)
        children.append(pid)
    os.close(write_end)
    try:
        _wait_listening(read_end, args.workers)
        sent: list[tuple[int, int]] = []
        for i in range(args.rounds):
            sent += _burst(port, args.burst)
            time.sleep(0.05 + (i % 5) * 0.02)  # idle gaps of 50-130 ms between bursts, as between bench levels
        time.sleep(0.3)
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    accepted: dict[int, list[int]] = {}
    with os.fdopen(read_end) as lines:
        for line in lines:
            if line.strip() and line.strip() != READY:
                port_, at = line.split()
                accepted.setdefault(int(port_), []).append(int(at))
    # A client port comes back in later bursts: each connection is the acceptance of its port nearest its send.
    waits = []
    for port_, at in sent:
        nearest = min(accepted.get(port_, []), key=lambda t: abs(t - at), default=None)
        if nearest is not None and abs(nearest - at) < 1e9:
            waits.append((nearest - at) / 1e6)
    print(f"{args.loop}, {args.workers} workers, {args.rounds} bursts of {args.burst}: {len(waits)} of {len(sent)} "
          f"accepted; accepted after the client's connect + send: P50 {percentile(waits, 0.5):.3f} ms, "
          f"P99 {percentile(waits, 0.99):.3f} ms, max {max(waits):.3f} ms, over 5 ms: {sum(w > 5 for w in waits)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
