"""Plot where a new connection's first request waits: bench/data/h200-gateway-first-request-*.json.

    python bench/plot_gateway_first_request.py   # writes bench/data/h200-gateway-first-request.png

Each run of `python -m scripts.bench_gateway` records, per level and mode, the first requests' way in
(sent by the client -> read by the upstream: `reach_new_p50`, `reach_new_max`). One dot per run: the
median first request (open) and the slowest one (filled), per proxy and level, against no proxy at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DATA = Path(__file__).resolve().parent / "data"
RUNS = ("burst", "loops-run1", "loops-run2", "sched-run1", "sched-run2", "wake")  # all at once, 16-128
MODES = {"direct": ("no proxy", "black"), "gateway": ("gateway (uvloop)", "tab:red"),
         "gateway-asyncio": ("gateway (stdlib loop)", "tab:orange"), "relay": ("byte relay (uvloop)", "tab:blue"),
         "relay-asyncio": ("byte relay (stdlib loop)", "tab:green")}
LEVELS = (16, 32, 64, 128)


def main() -> None:
    runs = [json.loads((DATA / f"h200-gateway-first-request-{r}.json").read_text()) for r in RUNS]
    fig, ax = plt.subplots(figsize=(11, 5.6), constrained_layout=True)
    width = 0.8 / len(MODES)
    for i, (mode, (label, colour)) in enumerate(MODES.items()):
        for j, level in enumerate(LEVELS):
            rows = [run["levels"][str(level)][mode] for run in runs if mode in run["levels"].get(str(level), {})]
            x = j + (i - (len(MODES) - 1) / 2) * width
            xs = [x + (k - (len(rows) - 1) / 2) * width / 8 for k in range(len(rows))]
            ax.scatter(xs, [r["reach_new_max"] for r in rows], color=colour, s=22, label=label if j == 0 else None)
            ax.scatter(xs, [r["reach_new_p50"] for r in rows], facecolors="none", edgecolors=colour, s=22)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.text(-0.48, 1.08, "1 ms", color="grey", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(0.05, 80)
    ax.set_xticks(range(len(LEVELS)), [f"{c} new connections\nat once" for c in LEVELS])
    ax.set_xlim(-0.5, len(LEVELS) - 0.5)
    ax.set_ylabel("request sent -> read by the upstream (ms, log)\nfilled: slowest first request, open: median")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False)
    ax.set_title("A new connection's first request on its way in, H200 host (Firecracker), proxies pinned to 2 cores: "
                 "one dot per run (6 runs)", fontsize=10)
    fig.savefig(DATA / "h200-gateway-first-request.png", dpi=110)


if __name__ == "__main__":
    main()
