"""Where the reference engine's long iterations went, from a TTFT trace (runtime/ttft_trace.py).

    python -m scripts.trace_iterations TRACE [--ms 5] [--top 15]

TRACE: the trace directory (DIR of TEST_TTFT_TRACE=DIR, the *.jsonl files) or a bench's trace.tgz. Each engine
iteration of `--ms` or more is labelled with every cause the trace shows for it:
  new_shape  it ran a prefill shape (rows, tokens, context) for the first time since start-up (warm-up included)
  gc         a collection of the engine process ran inside it (its count, or a `gc` line of 1 ms or more)
  runq       its thread waited 1 ms or more for a CPU (another thread or process had the core)
  blocked    1 ms or more off a CPU and not waiting for one: the interpreter lock, a socket write, a sleep
  http_lag   the HTTP process's loop was late 5 ms or more at the same time (it shares the engine's cores)
and counted by label and by admitted count, beside the same overlaps for windows shifted by half a second (what
chance gives). Traces written before the engine's `iteration` lines (bench/data/fairness-h100-trace-*) know only
the iterations that admitted a traced request and the one before each, with no shape and no CPU split: there,
`new_shape` is a first admitted count, the hit batches' shape on that bench (one prompt for everyone).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

LONG_MS = 5.0
SPLIT_MS = 1.0  # a runq or blocked part this long labels the iteration
SHIFT_S = 0.5  # the chance baseline: the same windows this much later
CLUSTER_S = 0.2  # long iterations this close together count as one burst


def read_trace(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Every line of the trace, by role (the file name's part before its pid)."""
    if path.is_file():
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(path) as tar:
            tar.extractall(tmp, filter="data")
            return read_trace(Path(tmp))
    by_role: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for file in sorted(path.rglob("*.jsonl")):
        role = file.name.rsplit("-", 1)[0]
        with file.open() as f:
            by_role[role] += [json.loads(line) for line in f if line.strip()]
    return dict(by_role)


def iterations(trace: dict[str, list[dict[str, Any]]], long_ms: float) -> tuple[list[dict[str, Any]], bool]:
    """The engine's iterations the trace knows (start, end, ms, admitted, ...) and whether they are the engine's own
    `iteration` lines (True) or rebuilt from the traced requests' `engine` lines (an older trace)."""
    engine = trace.get("engine", [])
    own = [r for r in engine if r["kind"] == "iteration"]
    if own:
        return [{**r, "start": r["at"], "end": r["at"] + r["ms"] / 1000} for r in sorted(own, key=lambda r: r["at"])], True
    seen: dict[tuple[float, float], int] = {}
    for r in engine:
        if r["kind"] == "engine":
            seen[(r["iter_start"], r["iter_end"])] = r["iter_admitted"]
            if r["prev_iter_end"] > r["prev_iter_start"]:
                seen[(r["prev_iter_start"], r["prev_iter_end"])] = r["prev_iter_admitted"]
    out, counts = [], set()
    for (start, end), admitted in sorted(seen.items()):
        first = bool(admitted) and admitted not in counts
        counts.add(admitted)
        out.append({"start": start, "end": end, "ms": (end - start) * 1000, "admitted": admitted,
                    "groups": [{"shape": ["?", admitted, 0, 0], "new": first}] if admitted else []})
    return out, False


def _overlaps(lines: list[dict[str, Any]], kind: str, start: float, end: float) -> list[dict[str, Any]]:
    return [r for r in lines if r["kind"] == kind and r["at"] < end and r["at"] + r["ms"] / 1000 > start]


def labels(it: dict[str, Any], trace: dict[str, list[dict[str, Any]]], shift: float = 0.0) -> list[str]:
    """The causes the trace shows for one iteration (the module's docstring), its window moved by `shift` s."""
    start, end = it["start"] + shift, it["end"] + shift
    out = []
    if not shift and any(g["new"] for g in it.get("groups") or []):
        out.append("new_shape")
    if (not shift and it.get("gc")) or _overlaps(trace.get("engine", []), "gc", start, end):
        out.append("gc")
    if not shift and it.get("runq_ms", 0.0) >= SPLIT_MS:
        out.append("runq")
    if not shift and it.get("blocked_ms", 0.0) >= SPLIT_MS:
        out.append("blocked")
    if _overlaps(trace.get("http", []), "lag", start, end):
        out.append("http_lag")
    return out


def attribute(trace: dict[str, list[dict[str, Any]]], long_ms: float = LONG_MS) -> dict[str, Any]:
    """The long iterations, each labelled, and the counts the report prints."""
    known, own = iterations(trace, long_ms)
    long = [it for it in known if it["ms"] >= long_ms]
    by_label: collections.Counter[str] = collections.Counter()
    chance: collections.Counter[str] = collections.Counter()
    combos: collections.Counter[tuple[str, ...]] = collections.Counter()
    for it in long:
        it["labels"] = labels(it, trace)
        combos[tuple(it["labels"])] += 1
        by_label.update(it["labels"] or ["unexplained"])
        chance.update(labels(it, trace, SHIFT_S))
    by_admitted: dict[int, list[float]] = collections.defaultdict(list)
    for it in known:
        by_admitted[it["admitted"]].append(it["ms"])
    bursts, last = 0, None
    for it in long:
        if last is None or it["start"] - last > CLUSTER_S:
            bursts += 1
        last = it["start"]
    seconds = [r for r in trace.get("engine", []) if r["kind"] == "iteration_second"]
    split = {key: round(sum(it.get(key, 0.0) for it in long), 3) for key in ("ms", "cpu_ms", "runq_ms", "blocked_ms")}
    return {"own_lines": own, "known": len(known), "long": long, "by_label": dict(by_label), "chance": dict(chance),
            "combos": dict(combos), "bursts": bursts, "split": split,
            "by_admitted": {a: _spread(v, long_ms) for a, v in sorted(by_admitted.items())},
            "all_iterations": sum(r["count"] for r in seconds) or None,
            "all_long": sum(r["long"] for r in seconds) if seconds else None}


def _spread(values: list[float], long_ms: float) -> dict[str, float]:
    v = sorted(values)
    return {"n": len(v), "p50": round(v[len(v) // 2], 2), "p90": round(v[int(len(v) * 0.9)], 2),
            "max": round(v[-1], 2), "long": sum(x >= long_ms for x in v)}


def report(result: dict[str, Any], long_ms: float = LONG_MS, top: int = 15) -> list[str]:
    long = result["long"]
    source = ("the engine's own iteration lines" if result["own_lines"]
              else "iterations rebuilt from the traced requests (an older trace: no shapes, no CPU split)")
    lines = [f"engine iterations known: {result['known']} ({source}); {len(long)} of {long_ms:g} ms or more, "
             f"in {result['bursts']} bursts (long ones within {CLUSTER_S * 1000:.0f} ms of each other)"]
    if result["all_iterations"] is not None:
        lines.append(f"  the engine ran {result['all_iterations']} iterations, {result['all_long']} of them long")
    lines.append("by admitted count (n, P50 / P90 / max ms, long):")
    for admitted, s in result["by_admitted"].items():
        lines.append(f"  {admitted:>3}: {s['n']:>6}  {s['p50']:7.2f} {s['p90']:7.2f} {s['max']:7.2f}  {s['long']}")
    lines.append(f"long iterations by cause (an iteration counts under each of its labels; chance: the same windows "
                 f"{SHIFT_S:g} s later):")
    for label in ("new_shape", "gc", "runq", "blocked", "http_lag", "unexplained"):
        if label in result["by_label"] or label in result["chance"]:
            lines.append(f"  {label:<12}{result['by_label'].get(label, 0):>6}   chance {result['chance'].get(label, '-')}")
    if result["own_lines"] and long:
        s = result["split"]
        lines.append(f"their time: {s['ms']:.1f} ms, of it on a CPU {s['cpu_ms']:.1f}, waiting for one "
                     f"{s['runq_ms']:.1f}, blocked {s['blocked_ms']:.1f}")
    lines.append(f"the {min(top, len(long))} longest (ms, admitted, labels, prefill groups):")
    for it in sorted(long, key=lambda it: -it["ms"])[:top]:
        groups = ", ".join(f"{'/'.join(map(str, g['shape']))}{' NEW' if g['new'] else ''}"
                           + (f" {g['ms']:.1f} ms" if "ms" in g else "") for g in it.get("groups") or [])
        extra = (f"; cpu {it['cpu_ms']:.1f} runq {it['runq_ms']:.1f} blocked {it['blocked_ms']:.1f} "
                 f"decode {it['decode_ms']:.1f} gc {it['gc']}" if "cpu_ms" in it else "")
        lines.append(f"  {it['start']:.3f}  {it['ms']:6.1f}  {it['admitted']:>3}  {','.join(it['labels']) or '-'}"
                     f"  [{groups}]{extra}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.trace_iterations", description=__doc__.split("\n")[0])
    parser.add_argument("trace", type=Path, help="a trace directory or a bench's trace.tgz")
    parser.add_argument("--ms", type=float, default=LONG_MS, help=f"what counts as long (default {LONG_MS:g} ms)")
    parser.add_argument("--top", type=int, default=15, help="how many of the longest to list (default 15)")
    args = parser.parse_args(argv)
    if not args.trace.exists():
        parser.error(f"trace: {args.trace} does not exist")
    trace = read_trace(args.trace)
    if not trace.get("engine"):
        parser.error(f"trace: {args.trace} holds no engine-*.jsonl (was the bench run with --ttft-trace?)")
    print("\n".join(report(attribute(trace, args.ms), args.ms, args.top)))
    return 0


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    sys.exit(run_quietly(main))
