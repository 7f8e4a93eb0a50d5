"""What growing the descriptor table costs a process with threads, and what runtime/descriptors.py saves.

Each case runs in a fresh interpreter (a child's table starts as small as its open descriptors allow) that
opens `--sockets` sockets one after another and times each socket() call:

- `one thread`: the table grows with no wait (files_struct not shared);
- `threads`: a second thread exists, so each growth waits for an RCU grace period (torvalds/linux fs/file.c,
  `expand_fdtable`) in the calling thread: an event loop's, in a server;
- `threads, reserved`: runtime.descriptors.reserve_descriptors() ran first, with one thread, as
  each gateway worker does at its start;
- `threads, parent reserved`: started by a process that reserved for its children, as the supervisor does
  for every server it starts (trtllm-serve, the gateway).

    python bench/fd_table_probe.py [--sockets 1100] [--rounds 3] [--json FILE]

Prints, per case and round, each socket() call over 1 ms with the descriptor it returned and the table's
size (FDSize) at start and end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ("one thread", "threads", "threads, reserved", "threads, parent reserved")

_CHILD = r"""
import json, socket, sys, threading, time
sys.path.insert(0, sys.argv[1])
from runtime.descriptors import descriptor_slots, reserve_descriptors
case, count = sys.argv[2], int(sys.argv[3])
start = descriptor_slots()
if case == "threads, reserved":
    reserve_descriptors()
if case != "one thread":
    threading.Thread(target=threading.Event().wait, daemon=True).start()
held, slow = [], []
for _ in range(count):
    began = time.perf_counter()
    s = socket.socket()
    took_ms = (time.perf_counter() - began) * 1000
    held.append(s)
    if took_ms > 1.0:
        slow.append([s.fileno(), round(took_ms, 2)])
print(json.dumps({"slots_at_start": start, "slots_at_end": descriptor_slots(), "slow_calls": slow}))
"""


_RESERVING_PARENT = ("import subprocess, sys\nsys.path.insert(0, sys.argv[1])\n"
                     "from runtime.descriptors import reserve_descriptors\n"
                     "reserve_descriptors(for_children=True)\nsys.exit(subprocess.call(sys.argv[2:]))\n")


def run_case(case: str, sockets: int) -> dict:
    argv = [sys.executable, "-c", _CHILD, str(ROOT), case, str(sockets)]
    if case == "threads, parent reserved":
        argv = [sys.executable, "-c", _RESERVING_PARENT, str(ROOT), *argv]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/fd_table_probe.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--sockets", type=int, default=1100, help="sockets each case opens (default 1100)")
    p.add_argument("--rounds", type=int, default=3, help="times each case runs (default 3)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    if not 1 <= args.sockets <= 60000:
        p.error(f"--sockets {args.sockets}: between 1 and 60000")
    if not 1 <= args.rounds <= 100:
        p.error(f"--rounds {args.rounds}: between 1 and 100")
    results: dict[str, list[dict]] = {case: [] for case in CASES}
    for round_ in range(args.rounds):
        for case in CASES:
            r = run_case(case, args.sockets)
            results[case].append(r)
            calls = ", ".join(f"fd {fd}: {ms:g} ms" for fd, ms in r["slow_calls"]) or "none"
            print(f"round {round_ + 1}  {case:<24} table {r['slots_at_start']} -> {r['slots_at_end']} slots; "
                  f"socket() calls over 1 ms: {calls}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"sockets": args.sockets, "cases": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
