"""Plot bench/data/h200-colocate.json: P99 TTFT and ITL of each model alone and co-located.

    python bench/plot_colocate.py   # writes bench/data/h200-colocate.png
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DATA = Path(__file__).resolve().parent / "data"


def main() -> None:
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


if __name__ == "__main__":
    main()
