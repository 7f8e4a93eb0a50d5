"""Run a module with every garbage collection after its startup freeze logged, one line each.

    python -m scripts.gc_log FILE -m MODULE [ARGS...]

A line is `pid,generation,pause ms,objects freed`, appended (worker processes forked by the
module log under their own pid). Only collections after the module called gc.freeze() count:
the gateway freezes what it loaded before serving (runtime/gateway/__main__.py), so what is
logged is what a collection costs the streams. scripts/bench_gateway.py --gc-log uses it.
"""

from __future__ import annotations

import gc
import os
import runpy
import sys
import time
from typing import Any


def summary(path: str) -> dict[str, dict[str, float]]:
    """Per generation: how many collections, the longest and the total pause (ms), objects freed."""
    out: dict[str, dict[str, float]] = {}
    with open(path) as lines:
        for line in lines:
            _, generation, pause, freed = line.strip().split(",")
            row = out.setdefault(f"gen{generation}", {"collections": 0, "max_ms": 0.0, "total_ms": 0.0, "freed": 0})
            row["collections"] += 1
            row["max_ms"] = max(row["max_ms"], float(pause))
            row["total_ms"] = round(row["total_ms"] + float(pause), 3)
            row["freed"] += int(freed)
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3 or argv[1] != "-m":
        raise SystemExit("usage: python -m scripts.gc_log FILE -m MODULE [ARGS...]")
    path, module = argv[0], argv[2]
    started: dict[int, float] = {}

    def watch(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[info["generation"]] = time.perf_counter()
        elif gc.get_freeze_count():
            pause = (time.perf_counter() - started[info["generation"]]) * 1000
            with open(path, "a") as log:
                log.write(f"{os.getpid()},{info['generation']},{pause:.3f},{info['collected']}\n")

    gc.callbacks.append(watch)
    sys.argv = [module, *argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    sys.exit(run_quietly(main))
