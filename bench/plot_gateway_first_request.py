"""Plot where a new connection's first request waits, before and after the descriptor-table reservation.

    python bench/plot_gateway_first_request.py   # writes bench/data/h200-gateway-first-request.png

Each run of `python -m scripts.bench_gateway` records, per level and mode, the first requests' way in
(sent by the client -> read by the upstream: `reach_new_p50`, `reach_new_max`). One dot per run: the
median first request (open) and the slowest one (filled), per proxy and level, against no proxy at all.
Top: bench/data/h200-gateway-first-request-*.json, every process growing its descriptor table mid-burst.
Bottom: bench/data/h200-gateway-descriptors-ab{4,5}.json, each level run on fresh processes and then 16
and 128 again: the gateway before the reservation (0f62128) beside the gateway and relays that reserve.
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
LEVELS = ("16", "32", "64", "128")
AB_RUNS = ("ab4", "ab5")
AB_MODES = {"direct": ("no proxy", "black"), "gateway-base": ("gateway before (0f62128)", "tab:purple"),
            "gateway": ("gateway (uvloop)", "tab:red"), "relay": ("byte relay (uvloop)", "tab:blue"),
            "relay-asyncio": ("byte relay (stdlib loop)", "tab:green")}
AB_LEVELS = ("16", "32", "64", "128", "16#2", "128#2")


def _panel(ax, runs: list[dict], modes: dict, levels: tuple[str, ...], ticks: list[str], title: str) -> None:
    width = 0.8 / len(modes)
    for i, (mode, (label, colour)) in enumerate(modes.items()):
        for j, level in enumerate(levels):
            rows = [run["levels"][level][mode] for run in runs if mode in run["levels"].get(level, {})]
            x = j + (i - (len(modes) - 1) / 2) * width
            xs = [x + (k - (len(rows) - 1) / 2) * width / 8 for k in range(len(rows))]
            ax.scatter(xs, [r["reach_new_max"] for r in rows], color=colour, s=22, label=label if j == 0 else None)
            ax.scatter(xs, [r["reach_new_p50"] for r in rows], facecolors="none", edgecolors=colour, s=22)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.text(-0.48, 1.08, "1 ms", color="grey", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(0.05, 80)
    ax.set_xticks(range(len(levels)), ticks)
    ax.set_xlim(-0.5, len(levels) - 0.5)
    ax.set_ylabel("request sent -> read upstream (ms, log)\nfilled: slowest first request, open: median", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=len(modes), loc="upper left", frameon=False)
    ax.set_title(title, fontsize=10)


def main() -> None:
    before = [json.loads((DATA / f"h200-gateway-first-request-{r}.json").read_text()) for r in RUNS]
    after = [json.loads((DATA / f"h200-gateway-descriptors-{r}.json").read_text()) for r in AB_RUNS]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 10), constrained_layout=True)
    _panel(top, before, MODES, LEVELS, [f"{c} new connections at once" for c in LEVELS],
           "Before: the proxies grow their descriptor tables mid-burst, a wait in each process with threads (6 runs)")
    _panel(bottom, after, AB_MODES, AB_LEVELS,
           [f"{c.split('#')[0]} new at once\n{'fresh processes' if '#' not in c else 'again, same processes'}" for c in AB_LEVELS],
           "After: the gateway and the relays reserve their tables at start; 'before' is the previous gateway "
           "(2 runs)")
    fig.suptitle("A new connection's first request on its way in, H200 host (Firecracker), proxies pinned to 2 cores",
                 fontsize=11)
    fig.savefig(DATA / "h200-gateway-first-request.png", dpi=110)


if __name__ == "__main__":
    main()
