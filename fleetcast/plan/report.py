"""The plan report's parts (fleetcast/plan/packing_report.py assembles them): the candidates table, its glossary,
the plots, Markdown and HTML from one list of blocks, and the atomic write of the report directory. Rendering only;
no decisions here.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .solver import PoolDay, Slo
from .traffic import ConsumerTraffic

if TYPE_CHECKING:
    from .packing import PackingPlan
    from .queueing import Prediction


def fleet_heading(result: PackingPlan) -> str:
    """The Fleet section's heading: it says the write deploys this fleet only when the write would."""
    if any(blocking for blocking, _ in result.write_notes):
        return "Fleet (planned; --write-config refuses to write it as the config stands: see below)"
    return "Fleet (what --write-config writes)"


def write_lines(result: PackingPlan) -> list[str]:
    return [f"{'refuses' if blocking else 'note'}: {text}" for blocking, text in result.write_notes]


def closing_lines(result: PackingPlan, spot_heading: str) -> list[str]:
    """Every plan's terminal ending: what --write-config would do, then the Spot advice."""
    from .spot import lines as spot_lines

    out = ["", "Writing it (--write-config):"] + [f"  {line}" for line in write_lines(result)] if result.write_notes \
        else []
    return out + (["", f"{spot_heading}:"] + [f"  {line}" for line in spot_lines(result.spot)] if result.spot else [])


def closing_blocks(result: PackingPlan) -> list[Block]:
    """Every plan page's ending: what --write-config would do, then the Spot advice."""
    from .spot import lines as spot_lines

    out = [("h2", "Writing it (--write-config)"), ("ul", [(None, line) for line in write_lines(result)])] \
        if result.write_notes else []
    return out + ([("h2", "Spot tier"), ("ul", [(None, line) for line in spot_lines(result.spot)])] if result.spot else [])


def levels_text(traffic: ConsumerTraffic) -> str:
    """The traffic's load in words: its busiest-minute ratios (arrivals) or its in-flight histogram; one model's
    region or a packing's model alike."""
    if traffic.arrival_driven:
        burst = traffic.hourly_burstiness()
        return (f"derived per candidate from arrivals (busiest minute {min(burst):g}-{max(burst):g}x the hour's mean)"
                if min(burst) != max(burst) else f"derived per candidate from arrivals (busiest minute {burst[0]:g}x "
                "the hour's mean)")
    return ", ".join(f"{k}: {v:.0%}" for k, v in (traffic.concurrency or {}).items())


class Figures(Protocol):
    """What a candidates table row and a recommendation read, one model's evaluation or a packing of one model's
    (packing.PackingEval; its c*, P99s and goodput are None for several models, where they are per model)."""

    @property
    def rtt_ms(self) -> float: ...
    @property
    def max_load(self) -> float | None: ...
    @property
    def cost_per_hour(self) -> float: ...
    @property
    def usd_per_m_output(self) -> float: ...
    @property
    def usd_per_m_input(self) -> float: ...
    @property
    def weighted_ttft_p99(self) -> float | None: ...
    @property
    def weighted_itl_p99(self) -> float | None: ...
    @property
    def goodput_rps(self) -> float | None: ...
    @property
    def goodput_exact(self) -> bool: ...
    @property
    def roofline(self) -> bool: ...
    def capacity(self) -> tuple[int, int, int]: ...


@dataclass(frozen=True)
class Row:
    """One line of a candidates table: its name, the region serving, its figures, the target and its source."""

    name: str
    region: str
    figures: Figures
    target: float
    source: str


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def figure_cells(e: Figures, target: float, units: bool) -> list[str]:
    """c* to goodput/inst, as the terminal (`units`) and the report pages write them."""
    ms, rps = (" ms", " rps") if units else ("", "")
    lo, _, hi = e.capacity()
    return [_fmt(e.max_load, "g"), f"{target:g}", f"{lo}-{hi}", f"{e.cost_per_hour:.2f}", f"{e.usd_per_m_output:.3f}",
            f"{e.usd_per_m_input:.3f}", _fmt(e.weighted_ttft_p99, ".0f", ms), _fmt(e.weighted_itl_p99, ".1f", ms),
            ("" if e.goodput_exact else ">=") + _fmt(e.goodput_rps, ".1f", rps)]


TERMINAL_HEADER = ("#", "candidate", "region", "c*", "target", "instances", "$/h", "$/1M out", "$/1M in",
                   "wP99 TTFT", "wP99 ITL", "goodput/inst", "source")
PAGE_HEADER = ["#", "candidate", "service region", "RTT ms", "c*", "target", "instances/h", "$/h", "$/1M out",
               "$/1M in", "wP99 TTFT ms", "wP99 ITL ms", "goodput/inst rps", "source"]
ROOFLINE_MARK = "*  estimated by the roofline model, not measured"


def terminal_table(rows: list[Row]) -> list[str]:
    """The terminal's candidates table, one model's or a packing of one model's; a roofline estimate starred."""
    cells = [TERMINAL_HEADER] + [(str(i), r.name + ("*" if r.figures.roofline else ""), r.region,
                                  *figure_cells(r.figures, r.target, True), r.source) for i, r in enumerate(rows, 1)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(TERMINAL_HEADER))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]


def page_table(rows: list[Row]) -> Block:
    """The report pages' candidates table (plan.md / plan.html), one model's or a packing of one model's."""
    return ("table", PAGE_HEADER, [[str(i), r.name, r.region, f"{r.figures.rtt_ms:g}",
                                    *figure_cells(r.figures, r.target, False), r.source] for i, r in enumerate(rows, 1)])


def pick_text(name: str, where: str, w: Figures, target: float) -> str:
    """The recommendation's figures, one model's pick or a packing of one model's."""
    lo, desired, hi = w.capacity()
    return (f"{name} in {where}: ${w.cost_per_hour:.2f}/h "
            f"(${w.usd_per_m_output:.3f} per 1M output tokens, ${w.usd_per_m_input:.3f} per 1M input), "
            f"{lo}-{hi} instances over the day ({desired} on average; capacity min {lo}, max {hi}), "
            f"target {target:g} in-flight requests per instance (highest load within the SLO: {_fmt(w.max_load, 'g')})")


# The table columns that need words (said once: terminal, plan.md and plan.html print these).
GLOSSARY = [
    ("c*", "the highest measured load (requests in flight per instance) at which this candidate meets every SLO, "
           "network included, at that level and every level below it"),
    ("target", "the load per instance the pool scales on (the config's scaling.target, ActiveRequests): the level "
               "at or below c* that costs least per request; traffic at higher levels is spread over more instances"),
    ("wP99 TTFT / wP99 ITL", "traffic-weighted P99: the P99 at each traffic level (capped at target), weighted by the "
                             "share of requests at that level; TTFT includes the network round trip"),
    ("instances/h", "the lowest and highest instance count over the day's hours"),
    ("goodput/inst", "requests per second per instance at target that meet every SLO ('>=' when only a lower bound "
                     "is known, without per-request records)"),
    ("source", "measured (fleetcast bench against a server), synthetic (authored data, not measured) or estimated "
               "(the roofline model, not measured)"),
]


# With arrivals the same columns mean something else (docs/plan.md, "Sizing from arrivals").
ARRIVALS_GLOSSARY = [
    ("c*", "the most requests in flight per instance (mean, Little's law) at which this candidate meets both P99 "
           "SLOs, the error SLO and its measured range, network included, with arrivals joining at random"),
    ("target", "the load per instance the pool scales on (scaling.target, ActiveRequests): the in-flight count at "
               "the SLO-safe rate divided by the busiest minute's ratio to the hour's mean (at least 10% headroom)"),
    ("wP99 TTFT / wP99 ITL", "the predicted P99 in each hour's busiest minute at the planned instance count, weighted "
                             "by the hour's requests; TTFT includes the network round trip"),
    ("goodput/inst", "requests per second per instance at the SLO-safe rate (the arrival rate at c*), less the "
                     "predicted error rate and a 2% margin ('>=': a lower bound, not counted from per-request records)"),
]
SIZED_TERMS = ("c*", "target", "wP99 TTFT / wP99 ITL", "goodput/inst")


def glossary(traffic: Sequence[ConsumerTraffic]) -> list[tuple[str, str]]:
    """The table's terms, defined by the method the plan was sized with: arrivals, the histogram of in-flight
    levels, or (regions sized differently) each definition named with the regions it applies to. One model's regions
    or a packing's: each consumer traffic says how it was sized."""
    arrivals = list(dict.fromkeys(t.region for t in traffic if t.arrival_driven))
    histogram = list(dict.fromkeys(t.region for t in traffic if not t.arrival_driven))
    common = [(t, m) for t, m in GLOSSARY if t not in SIZED_TERMS]
    if not histogram:
        return ARRIVALS_GLOSSARY + common
    if not arrivals:
        return list(GLOSSARY)
    by_term = dict(GLOSSARY)
    out = []
    for term, meaning in ARRIVALS_GLOSSARY:
        out += [(f"{term} (sized from arrivals: {', '.join(arrivals)})", meaning),
                (f"{term} (sized from the in-flight histogram: {', '.join(histogram)})", by_term[term])]
    return out + common


def glossary_lines(traffic: Sequence[ConsumerTraffic]) -> list[str]:
    """The terminal's words for the table's sized columns (c*, target, wP99), under the first region's table."""
    return [f"   {term}: {meaning}" for term, meaning in glossary(traffic) if term.split(" (")[0] in SIZED_TERMS[:3]]


def summary_line(traffic: ConsumerTraffic) -> str:
    rps = traffic.hourly_rps()
    per_day = sum(rps) * 3600
    return (f"Consumers in {traffic.region}: {per_day / 1e6:.2f} M requests/day, peak {max(rps):g} req/s, "
            f"input {traffic.input_mean:g} / output {traffic.output_mean:g} tokens; "
            f"concurrency levels {levels_text(traffic)}")


def single_instance_note(w: PoolDay | None) -> str | None:
    """What capacity.min 1 means for a service with a P99 SLO: the hours it runs one instance, that instance is in
    one Availability Zone and is the whole service; its failure is an outage no P99 in this plan accounts for. One
    model's pick or a packing's alike."""
    if w is None or w.capacity()[0] != 1:
        return None
    hours = [h for h, n in enumerate(w.instances_by_hour) if n == 1]
    spans, start = [], hours[0]
    for a, b in zip(hours, hours[1:] + [-1]):
        if b != a + 1:
            spans.append(f"{start:02d}-{a + 1:02d}")
            start = b
    extra = len(hours) * w.price_per_hour / 24
    return (f"capacity min 1: for {len(hours)} h a day (UTC {', '.join(spans)}) this pool is one instance in one "
            f"Availability Zone. If it or its AZ fails, every request fails until a replacement launches and loads its "
            f"engine (minutes), an outage the P99 SLOs above do not count; the region's other AZs hold nothing meanwhile. "
            f"capacity.min 2 keeps one instance in each of two AZs for +${extra:.2f}/h on average "
            f"(set capacity.min in the config, or --min-instances 2)")


# ---------------------------------------------------------------- plots


def _pareto(points: list[tuple[float, float]]) -> list[int]:
    """Indexes of points no other point beats on both axes (lower is better)."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((x2 <= x and y2 <= y) and (x2 < x or y2 < y) for j, (x2, y2) in enumerate(points) if j != i):
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def inputs_tag(sources: set[str]) -> str:
    """A title suffix saying what the plotted figures rest on, when that is not all measurement."""
    rest = sorted(sources - {"measured"})
    return f" [{' and '.join(rest)} inputs]" if rest else ""


@dataclass(eq=False)
class LatencyPoint:
    """One candidate as the cost-vs-latency plots draw it, one model's evaluation or a packing of one model alike."""

    label: str
    ttft_ms: float  # P99 TTFT, network included
    itl_ms: float
    usd_per_m_output: float
    estimated: bool
    pick: bool


def cost_vs_latency_plots(plt: Any, ranked: list[LatencyPoint], best: list[LatencyPoint], region: str, measure: str,
                          slo: Slo, sources: set[str], directory: Path) -> list[Path]:
    """The two cost-vs-latency pictures of a region: `ranked` every feasible candidate (the Pareto front is theirs),
    `best` each candidate at its cheapest, `measure` what the P99 is ("traffic-weighted")."""
    tag = inputs_tag(sources)
    return [_cost_vs_latency(plt, ranked, best, region, measure, "ttft_ms", slo.ttft_p99_ms,
                             directory / f"cost_vs_ttft-{region}.png", tag),
            _cost_vs_latency(plt, ranked, best, region, measure, "itl_ms", slo.itl_p99_ms,
                             directory / f"cost_vs_itl-{region}.png", tag)]


def _cost_vs_latency(plt: Any, ranked: list[LatencyPoint], best: list[LatencyPoint], region: str, measure: str,
                     latency: str, slo_ms: float, path: Path, tag: str) -> Path:
    """$ per 1M output tokens against one P99 (TTFT or ITL), its SLO as a line and the cost / latency Pareto front
    as a staircase; each candidate at its cheapest region, every point labelled."""
    front_evs = [ranked[i] for i in _pareto([(getattr(e, latency), e.usd_per_m_output) for e in ranked])]
    shown = front_evs + [e for e in best if e not in front_evs]
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    for e in shown:
        x, y = getattr(e, latency), e.usd_per_m_output
        on_front = e in front_evs
        marker = "*" if e.pick else ("x" if e.estimated else "o")
        ax.scatter(x, y, marker=marker, s=160 if e.pick else 45, color="C3" if on_front else "0.45",
                   zorder=3)
        # The pick's star is about 13 points wide: its label starts past it, not under it.
        ax.annotate(e.label + (" (est.)" if e.estimated else ""), (x, y), fontsize=7, xytext=(8 if e.pick else 4, 3),
                    textcoords="offset points", color="C3" if on_front else "0.35")
    if len(front_evs) > 1:
        ax.step([getattr(e, latency) for e in front_evs], [e.usd_per_m_output for e in front_evs], where="post",
                color="C3", label="Pareto front: nothing cheaper is also faster")
    else:
        ax.plot([], [], color="C3", marker="o", linestyle="",
                label="Pareto front (one candidate: cheapest and fastest)")
    what = "TTFT incl. network" if latency == "ttft_ms" else "ITL"
    ax.axvline(slo_ms, color="C0", linestyle="--", linewidth=1.2, label=f"P99 {what.split()[0]} SLO: {slo_ms:g} ms")
    ax.axvspan(slo_ms, max(slo_ms * 1.3, max(getattr(e, latency) for e in shown) * 1.25), color="C0", alpha=0.06)
    ax.set_xlabel(f"{measure} P99 {what} (ms)")
    ax.set_ylabel("$ per 1M output tokens")
    ax.set_title(f"Cost per token vs P99 {what.split()[0]}: consumers in {region}\n"
                 f"{tag.strip()} star: the pick; x: estimated; shaded: over the SLO".strip(), fontsize=10)
    ax.set_xlim(0, max(slo_ms * 1.3, max(getattr(e, latency) for e in shown) * 1.25))
    ax.margins(y=0.12)
    # Below the axes: a legend inside would sit on some candidate's point or label.
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _matplotlib() -> Any:
    """pyplot on the file backend, or one line saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        from fleetcast.contract.errors import UserError

        raise UserError("--report draws plots with matplotlib, which is not installed: "
                        "pip install 'fleetcast[plan]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@dataclass(frozen=True)
class DayLine:
    """One line of the instances-over-the-day picture: a candidate (or packing) at its cheapest, or a pooled pool."""

    label: str
    instances_by_hour: list[int]
    pick: bool


def instances_plot(plt: Any, region: str, rps: list[float], shown: list[DayLine], fleet: list[DayLine], tag: str,
                   directory: Path) -> Path:
    """Demand and instances over the day for a consumer region, one model's candidates or a packing's: `rps` its
    requests per second per UTC hour (every model's), `shown` each option at its cheapest (the pick drawn bold),
    `fleet` the pooled pools serving it (dashed)."""
    # Demand above, instances below: two scales, two panels, so neither hides the other.
    fig, (demand, ax) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, gridspec_kw={"height_ratios": [1, 2.2]})
    hours = list(range(25))
    demand.fill_between(hours, rps + rps[-1:], step="post", alpha=0.3, color="0.4")
    demand.set_ylabel("requests/s")
    demand.set_ylim(0, max(rps) * 1.15 or 1)
    demand.set_title(f"Demand and instances over the day: consumers in {region}{tag}", fontsize=10)
    demand.grid(alpha=0.3)
    picked = [e.instances_by_hour for e in shown if e.pick]
    for e in sorted(shown, key=lambda e: e.pick):  # the pick drawn last, on top
        # An option that runs the pick's counts every hour is hidden under its bold line: the legend says where.
        hidden = not e.pick and e.instances_by_hour in picked
        ax.step(hours, e.instances_by_hour + e.instances_by_hour[-1:], where="post",
                label=e.label + (" (this region's pick)" if e.pick else " (under the pick: the same counts)"
                                 if hidden else ""), linewidth=3 if e.pick else 1.2,
                color="k" if e.pick else None, zorder=4 if e.pick else 2, alpha=1 if e.pick else 0.8)
    for pool in fleet:
        n = pool.instances_by_hour
        # Red over the black pick: where the pool runs what the region alone would, a black dash vanished into it.
        ax.step(hours, n + n[-1:], where="post", color="C3", linestyle="--", linewidth=2, zorder=5, label=pool.label)
    top = max(max(e.instances_by_hour) for e in shown + fleet)
    ax.set_ylim(0, top * 1.15 + 0.5)
    ax.set_xlabel("hour of day (UTC)")
    ax.set_ylabel("instances")
    ax.set_xlim(0, 24)
    ax.set_xticks(range(0, 25, 3))
    ax.grid(alpha=0.3)
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # instances are whole
    # A packing's labels are long: one column, and the page sized to hold them, else they ran off its edges.
    wide = max(len(e.label) for e in shown + fleet) > 60
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1 if wide else 2, frameon=False)
    path = directory / f"instances-{region}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


# ---------------------------------------------------------------- markdown / html / json


# The report as a list of blocks, rendered to Markdown and to HTML alike, so the two pages
# cannot drift apart: ("h1"|"h2"|"h3"|"p"|"rec", text), ("ul", [(bold or None, text)]),
# ("table", header, rows), ("img", path).
Block = tuple[Any, ...]


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def blocks_markdown(blocks: list[Block]) -> str:
    """A report's blocks as Markdown (the plan report's and the packing report's)."""
    out: list[str] = []
    for block in blocks:
        kind = block[0]
        if kind in ("h1", "h2", "h3"):
            out += [f"{'#' * int(kind[1])} {block[1]}", ""]
        elif kind == "p":
            out += [block[1], ""]
        elif kind == "rec":
            out += [f"**Recommendation:** {block[1]}", ""]
        elif kind == "ul":
            out += [f"- **{bold}**: {text}" if bold else f"- {text}" for bold, text in block[1]] + [""]
        elif kind == "table":
            out += _md_table(block[1], block[2]) + [""]
        elif kind == "img":
            out += [f"![{block[1].stem}]({block[1].name})", ""]
    return "\n".join(out)


def blocks_html(title: str, blocks: list[Block]) -> str:
    """A report's blocks as one self-contained HTML page (plots inlined)."""
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}td:nth-child(2),td:nth-child(3){text-align:left}"
             ".rec{background:#eef7ee;padding:.6em;border-left:4px solid #3a3}</style></head><body>"]
    for block in blocks:
        kind = block[0]
        if kind in ("h1", "h2", "h3"):
            parts.append(f"<{kind}>{e(block[1])}</{kind}>")
        elif kind == "p":
            parts.append(f"<p>{e(block[1])}</p>")
        elif kind == "rec":
            parts.append(f"<p class='rec'><b>Recommendation:</b> {e(block[1])}</p>")
        elif kind == "ul":
            parts.append("<ul>" + "".join(f"<li><b>{e(bold)}</b>: {e(text)}</li>" if bold else f"<li>{e(text)}</li>"
                                          for bold, text in block[1]) + "</ul>")
        elif kind == "table":
            parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in block[1]) + "</tr>"
                         + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in block[2])
                         + "</table>")
        elif kind == "img":
            data = base64.b64encode(block[1].read_bytes()).decode()
            parts.append(f"<p><img alt='{e(block[1].stem)}' src='data:image/png;base64,{data}'></p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def prediction_json(p: Prediction | None, network_ms: float) -> dict[str, Any] | None:
    """The planner's steady state at an hour's busiest minute (None for an hour without traffic)."""
    if p is None:
        return None
    return {"rate_rps_per_instance": p.rate_rps, "in_flight": p.in_flight, "ttft_p99_ms": p.ttft_p99_ms + network_ms,
            "itl_p99_ms": p.itl_p99_ms, "out_of_range": p.out_of_range}


def write_report_dir(directory: str | Path, write: Callable[[Path], list[Path]]) -> list[Path]:
    """Write a report through `write(stage)` (its pages and plots, returned pages first) into a fresh sibling
    directory, then move it into place: a directory that did not exist appears whole (one rename), an existing one
    gets each file replaced with SIGINT held back (its other files, such as `plan simulate` pictures, stay). An
    error or Ctrl-C before that leaves `directory` as it was and removes the stage."""
    import os
    import shutil
    import signal
    import tempfile

    d = Path(directory)
    d.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{d.name}.", dir=d.parent))
    try:
        written = write(stage)
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            if not d.exists():
                os.replace(stage, d)
            else:
                done: list[tuple[Path, bytes | None]] = []
                try:
                    for path in written[3:] + written[:3]:  # plots first, the pages that show them last
                        target = d / path.name
                        before = target.read_bytes() if target.is_file() else None
                        os.replace(path, target)
                        done.append((target, before))
                except OSError:
                    for target, before in reversed(done):  # all or none: the previous report stays whole
                        if before is None:
                            target.unlink(missing_ok=True)
                        else:
                            target.write_bytes(before)
                    raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return [d / p.name for p in written]


def write_pages(directory: str | Path, title: str, blocks: Callable[[dict[str, list[Path]]], list[Block]],
                doc: dict[str, Any], plots: Callable[[Path], dict[str, list[Path]]]) -> list[Path]:
    """A plan report, one model or a packing: its plots, then plan.md, plan.html (the same blocks) and plan.json,
    written whole or not at all (write_report_dir)."""
    def write(d: Path) -> list[Path]:
        drawn = plots(d)
        page = blocks(drawn)
        pages = {d / "plan.md": blocks_markdown(page) + "\n", d / "plan.html": blocks_html(title, page),
                 d / "plan.json": json.dumps(doc, indent=1) + "\n"}
        for path, text in pages.items():
            path.write_text(text)
        return list(pages) + [p for ps in drawn.values() for p in ps]

    return write_report_dir(directory, write)
