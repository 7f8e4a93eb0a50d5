"""Plot the H200 co-location data.

    python bench/plot_colocate.py   # bench/data/h200-colocate.json -> bench/data/h200-colocate.png (time slicing)
    python bench/plot_colocate.py --sharing DIR [DIR ...] [--png PATH]
        # bench/h200_sharing.py runs (each DIR holds a sharing.json), both modes on one figure:
        # combined throughput and each model's ITL P99, median over the repeats with bars from the lowest to the
        # highest repeat; default PATH bench/data/h200-sharing.png
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DATA = Path(__file__).resolve().parent / "data"


def plot_time_slicing() -> None:
    rows = json.loads((DATA / "h200-colocate.json").read_text())["latency"]
    levels = sorted({r["level"] for r in rows})
    models = list(dict.fromkeys(r["model"] for r in rows))
    colours = {models[0]: "tab:blue", models[1]: "tab:orange"}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for ax, metric, title in ((axes[0], "ttft_ms", "TTFT P99 (ms)"), (axes[1], "itl_ms", "ITL P99 (ms)")):
        for model in models:
            for together, style, label in ((False, "-", "alone (other loaded, idle)"), (True, "--", "both busy, same concurrency")):
                ys = [next(r[metric]["p99"] for r in rows if r["model"] == model and r["level"] == c
                           and (r["with"] is not None) == together) for c in levels]
                ax.plot(levels, ys, style, marker="o", color=colours[model], label=f"{model}: {label}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("closed-loop concurrency (per model)")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Two reference-backend processes on one H200 (GPT-2 medium + XL shapes, fp16, 128 in / 128 out)",
                 fontsize=10)
    fig.savefig(DATA / "h200-colocate.png", dpi=110)


MODE_STYLE = {"time_slicing": ("--", "time slicing"), "mps": ("-", "MPS")}
# Each series a little to the side on the log axis, so the range bars of one level do not hide each other.
NUDGE = {"time_slicing": 0.93, "mps": 1.07, "alone": 1.0}


def sharing_points(runs: list[dict], kind: str, model: str, key: str) -> dict[int, list[float]]:
    """Every repeat's figure per level, over the runs (both start orders) of one mode."""
    out: dict[int, list[float]] = {}
    for run in runs:
        for row in run["table"]:
            if row["kind"] == kind and row["model"] == model:
                out.setdefault(row["level"], []).extend(r[key] for r in row["repeats"] if r.get(key) is not None)
    return out


def _errorbar(ax, points: dict[int, list[float]], style: str, colour: str, label: str, nudge: float = 1.0) -> None:
    levels = sorted(points)
    mids = [statistics.median(points[c]) for c in levels]
    low = [m - min(points[c]) for m, c in zip(mids, levels, strict=True)]
    high = [max(points[c]) - m for m, c in zip(mids, levels, strict=True)]
    ax.errorbar([c * nudge for c in levels], mids, yerr=[low, high], fmt=style, marker="o", capsize=4, color=colour, label=label)


def plot_sharing(dirs: list[str], png: Path) -> Path:
    runs = [json.loads((Path(d) / "sharing.json").read_text()) for d in dirs]
    by_mode = {m: [r for r in runs if r["gpu_sharing"] == m] for m in MODE_STYLE}
    models = sorted({row["model"] for r in runs for row in r["table"] if row["model"] != "combined"})
    colours = dict(zip(models, ("tab:orange", "tab:blue", "tab:green", "tab:red"), strict=False))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    ax = axes[0]
    for mode, (style, words) in MODE_STYLE.items():
        if by_mode[mode]:
            _errorbar(ax, sharing_points(by_mode[mode], "together", "combined", "output_tps"), style, "black",
                      f"both busy, {words}: combined", NUDGE[mode])
            for model in models:
                _errorbar(ax, sharing_points(by_mode[mode], "together", model, "output_tps"), style, colours[model],
                          f"{model}, {words}", NUDGE[mode])
    ax.set_title("output throughput (tok/s), median and range over repeats")
    ax = axes[1]
    for model in models:
        solo = sharing_points(runs, "alone", model, "itl_p99_ms")
        if solo:
            _errorbar(ax, solo, ":", colours[model], f"{model} alone (other loaded, idle)")
        for mode, (style, words) in MODE_STYLE.items():
            if by_mode[mode]:
                _errorbar(ax, sharing_points(by_mode[mode], "together", model, "itl_p99_ms"), style, colours[model],
                          f"{model} both busy, {words}", NUDGE[mode])
    ax.set_title("ITL P99 (ms), median and range over repeats")
    for ax in axes:
        levels = sorted({row["level"] for r in runs for row in r["table"]})
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("closed-loop concurrency (per model)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    pooled: dict[tuple, int] = {}  # repeats per plotted point: both start orders (and any top-up run) pooled
    for r in runs:
        for row in r["table"]:
            key = (r["gpu_sharing"], row["kind"], row["model"], row["level"])
            pooled[key] = pooled.get(key, 0) + len(row["repeats"])
    repeats = sorted(n for n in pooled.values() if n)
    gpu = runs[0].get("gpu", "?")
    orders = sorted({r["order"] for r in runs})
    fig.suptitle(f"Two reference-backend processes on one {gpu}, time-sliced and under MPS (started {' and '.join(orders)}, "
                 f"{'-'.join(map(str, (repeats[0], repeats[-1]))) if len(repeats) > 1 else repeats[0]} repeats per "
                 "point, orders pooled; bench/h200_sharing.py)", fontsize=10)
    fig.savefig(png, dpi=110)
    return png


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="plot the H200 co-location data")
    ap.add_argument("--sharing", nargs="+", metavar="DIR", help="bench/h200_sharing.py runs (sharing.json in each)")
    ap.add_argument("--png", default=str(DATA / "h200-sharing.png"), help="with --sharing: the figure's path")
    args = ap.parse_args(argv)
    if args.sharing:
        print(plot_sharing(args.sharing, Path(args.png)))
    else:
        plot_time_slicing()


if __name__ == "__main__":
    main()
