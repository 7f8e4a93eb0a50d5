"""Renders results: a CSV row per run, PNG plots, and one self-contained HTML
file (plots embedded as base64) that can be mailed or attached to a ticket.

Several results files render together, one series each (e.g. two instance
types or precisions); a series keeps its colour in every plot. Runs marked
saturated get a red ring (under the markers, hiding no other series) and are
flagged in the tables: their latencies describe the client, not the server.
A `--model-mix` run's files (one per model) render each model as a series and
the mix as a whole as one more ("total"), all against the mix's level (each
model's own part of it is in its table).
The load axis is the rates swept for a `--rate` sweep, else concurrency; the
`--slo-*` values are drawn as lines and goodput gets its own plot. Throughput-latency plots draw markers only, each
annotated with its concurrency: a line joining them in either concurrency or
throughput order would suggest a curve the runs do not measure (throughput can
fall as load rises, and noise reorders neighbours).
"""

from __future__ import annotations

import base64
import csv
import html
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetcast.bench.schema import Load, Results, Run

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_STATS = ("ttft_ms", "itl_ms", "e2e_ms", "chunk_gap_ms")
_QS = ("p50", "p90", "p95", "p99")


def series_name(res: Results) -> str:
    lab = res.labels
    modes = sorted({r.load.mode for r in res.runs} - {"concurrency"})
    # Co-located files differ by the model they hold: it leads their name.
    model = lab.model if res.packing is not None or res.model_mix is not None else None
    parts = [p for p in (model, lab.instance_type or lab.gpu, lab.precision,
                         lab.backend if lab.backend != "unknown" else None,
                         lab.region, lab.path, lab.consumer, *modes, _peer_state(res)) if p]
    return " / ".join(parts) or res.endpoint


def _peer_state(res: Results) -> str | None:
    """'peers idle' or 'peers busy' for a packed file outside a mix (an alone and a together file of one model
    otherwise share a name); None where no run recorded its peers."""
    loads = [c for r in res.runs for c in (r.peers or {}).values()]
    if res.model_mix is not None or not loads:
        return None
    return "peers idle" if not any(loads) else "peers busy"


def total_name(res: Results) -> str:
    """The name of a model-mix run's total series, e.g. 'mix total (gpt2-xl 0.7 + qwen2.5-1.5b 0.3)'."""
    assert res.model_mix is not None, "a total is named for a model-mix file only"
    return "mix total (" + " + ".join(f"{m} {s:g}" for m, s in res.model_mix.shares.items()) + ")"


def total_precision(files: list[Results]) -> str | None:
    """A mix total's precision: the models' one precision, or each model's ('gpt2-xl int8_wo + qwen2.5-0.5b
    bf16') where they differ; None where no file knows its own. The total holds every model's requests, so the
    precision of the file it is built from (one model's) would misname it."""
    precisions = {f.labels.model: f.labels.precision for f in files}
    known = set(precisions.values())
    if known == {None}:
        return None
    if len(known) == 1:
        return known.pop()
    return " + ".join(f"{m} {p or 'unknown'}" for m, p in precisions.items())


def is_total(res: Results) -> bool:
    return res.model_mix is not None and res.labels.model == total_name(res)


def mix_key(res: Results) -> tuple[str, str] | None:
    """Which model-mix run a file belongs to (its files share the mix and the start time); None: not a mix."""
    return None if res.model_mix is None else (res.model_mix.spec, res.started_at.isoformat())


def with_totals(results: list[Results]) -> list[Results]:
    """`results` and, after the last file of each model-mix run, one more series: the mix as a whole at each
    level (Run.total), named 'total of <mix>'. Only when every model's file of that run is there: a total beside
    a partial set would read as the sum of the series shown."""
    keys = [mix_key(r) for r in results]
    out: list[Results] = []
    for i, res in enumerate(results):
        out.append(res)
        key = keys[i]
        # A file with a mix key has a mix (mix_key); said again for the type checker.
        if key is None or res.model_mix is None or key in keys[i + 1:] or keys.count(key) < len(res.model_mix.shares):
            continue
        if not res.runs or not all(r.total for r in res.runs):
            continue
        out.append(res.model_copy(update={
            "labels": res.labels.model_copy(update={"model": total_name(res), "precision": total_precision(
                [r for r, k in zip(results, keys) if k == key])}),
            "runs": [Run(load=t.load, lengths=r.lengths, summary=t.summary) for r in res.runs if (t := r.total)],
            "request": None}))
    return out


def series_names(results: list[Results]) -> list[str]:
    """One distinct name per series: files whose labels coincide get #2, #3 appended."""
    names = [series_name(r) for r in results]
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if names.count(name) == 1 else f"{name} #{seen[name]}")
    return out


def labels_text(res: Results) -> str:
    """Labels as `key=value` pairs, the way --label takes them."""
    return ", ".join(f"{k}={v}" for k, v in res.labels.model_dump(exclude_none=True).items())


def slo_text(res: Results) -> str:
    if res.slo is None:
        return "not recorded (file older than revision 2)"
    parts = [f"{name} <= {v:g} ms" for name, v in (("TTFT", res.slo.ttft_ms), ("ITL", res.slo.itl_ms),
                                                    ("E2E", res.slo.e2e_ms)) if v is not None]
    return ", ".join(parts) or "none given (goodput not computed)"


def packing_text(res: Results) -> str:
    if res.packing is not None:
        return res.packing.text()
    return "not recorded (file older than revision 3)" if res.revision < 3 else "none (one model alone or unknown)"


def shape_text(res: Results) -> str:
    shape = res.request_shape()
    if shape is None:
        return "no runs"
    return shape.text() + ("" if res.request is not None else " (read from the runs' length specs)")


def csv_rows(results: list[Results]) -> list[dict[str, Any]]:
    rows = []
    results = with_totals(results)
    for res, name in zip(results, series_names(results)):
        for run in res.runs:
            s = run.summary
            row = {
                "series": name, "endpoint": res.endpoint, "api": res.api,
                **{f"label_{k}": v for k, v in res.labels.model_dump().items()},
                "mode": run.load.mode, "concurrency": run.load.concurrency, "rate_rps": run.load.rate_rps,
                "arrival": run.load.arrival, "input_mean": run.lengths.input_mean,
                "output_mean": run.lengths.output_mean, "requests": s.requests, "completed": s.completed,
                "errors": s.errors, "error_rate": s.error_rate, "duration_s": s.duration_s,
                "output_throughput_tps": s.output_throughput_tps, "total_throughput_tps": s.total_throughput_tps,
                "request_throughput_rps": s.request_throughput_rps, "goodput_rps": s.goodput_rps,
                "mean_concurrency": s.mean_concurrency, "saturated": s.saturated,
                "saturation_reason": s.saturation_reason, "network_rtt_ms": s.network_rtt_ms,
                "load_note": s.load_note, "provenance": res.provenance,
                "packing": res.packing.text() if res.packing else None, "peers": run.peers_text() or None,
                "model_mix": res.model_mix.spec if res.model_mix else None,
                "mix_concurrency": run.total.load.concurrency if run.total else None,
                "mix_rate_rps": run.total.load.rate_rps if run.total else None,
                "errors_by_type": "; ".join(f"{k}={v}" for k, v in s.errors_by_type.items()),
            }
            for stat in _STATS:
                st = getattr(s, stat)
                row[f"{stat}_count"] = st.count
                row[f"{stat}_mean"] = st.mean
                for q in _QS:
                    row[f"{stat}_{q}"] = getattr(st, q)
                row[f"{stat}_p99_ci_lo"] = st.p99_ci[0] if st.p99_ci else None
                row[f"{stat}_p99_ci_hi"] = st.p99_ci[1] if st.p99_ci else None
            rows.append(row)
    return rows


def write_csv(results: list[Results], path: Path) -> Path:
    rows = csv_rows(results)
    with Path(path).open("w", newline="") as fh:
        if rows:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return Path(path)


def load_axis_kind(results: list[Results]) -> str:
    """What the load axis of the plots is: the rates swept when every run is an open-loop `--rate` run (so a reader
    reads off which rate broke the SLO), else concurrency: the levels of closed-loop runs, the measured mean
    concurrency of the others (trace and mix runs, or rate runs beside closed-loop files)."""
    loads = [_level(r) for res in results for r in res.runs]
    if loads and all(x.rate_rps for x in loads):
        return "rate"
    return "concurrency" if all(x.concurrency for x in loads) else "mixed"


def _level(run: Run) -> Load:
    """The load a run is plotted at: a model-mix run's whole level (its own part is in its table)."""
    return run.total.load if run.total is not None else run.load


def load_x(run: Run, kind: str = "concurrency") -> float:
    """Where a run sits on the load axis of `kind` (load_axis_kind): its offered rate, its concurrency, else the
    measured mean concurrency."""
    load = _level(run)
    if kind == "rate" and load.rate_rps:
        return float(load.rate_rps)
    if load.concurrency:
        return float(load.concurrency)
    return run.total.summary.mean_concurrency if run.total is not None else run.summary.mean_concurrency


_AXIS_LABEL = {"rate": "offered rate (requests/s, the --rate values swept)", "concurrency": "concurrency",
               "mixed": "concurrency (mean concurrency for rate, trace and mix runs)"}
_MIX_AXIS = " of the whole model mix (each model gets its share)"


def _load_axis(ax: Axes, kind: str, levels: list[float], xs: list[float], mix: bool = False) -> None:
    """The rates swept on a linear axis ticked at each rate; otherwise a log-2 load axis whose ticks read as numbers
    (1, 2, 4, 8), not 2^0..2^3: the swept concurrency levels, else the powers of two the measured loads span."""
    import math

    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.set_xlabel(_AXIS_LABEL[kind] + (_MIX_AXIS if mix else ""))
    if kind == "rate":
        ax.set_xticks(sorted(set(levels)))
        ax.set_xlim(0, max(levels) * 1.08)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        return
    ax.set_xscale("log", base=2)
    ticks = sorted({x for x in levels if x > 0})
    positive = [x for x in xs if x > 0]
    if not ticks and positive:
        lo, hi = math.floor(math.log2(min(positive))), math.ceil(math.log2(max(positive)))
        ticks = [2.0 ** k for k in range(lo, hi + 1)]
    if ticks:
        ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}" if v >= 1 else f"{v:.2g}"))
    ax.xaxis.set_minor_locator(NullLocator())


def slo_values(results: list[Results], field: str) -> list[float]:
    """The distinct `--slo-*` values (ms) of one latency the files were counted against, e.g. field='ttft_ms'."""
    return sorted({getattr(r.slo, field) for r in results if r.slo is not None and getattr(r.slo, field) is not None})


def _slo_lines(ax: Axes, results: list[Results], field: str) -> None:
    what = field.split("_")[0].upper()
    for v in slo_values(results, field):
        ax.axhline(v, color="k", linestyle=(0, (6, 3)), linewidth=1.3, zorder=1.5,
                   label=f"{what} SLO: {v:g} ms (goodput counts requests under it)")


def _saturated(ax: Axes, points: list[tuple[float, float]]) -> None:
    """A red ring around each saturated run, under the series' markers: a cross on top hid other series' points."""
    if points:
        ax.plot(*zip(*points), "o", markersize=14, markerfacecolor="none", markeredgecolor="red",
                markeredgewidth=1.6, zorder=1, label="_saturated")


def _legend_below(fig: Figure, axes: Sequence[Axes], extra: Sequence[tuple[Artist, str]] | None = None) -> None:
    """One legend for the figure, below the panels, where it covers no data: entries of every panel, each once."""
    from matplotlib.lines import Line2D

    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if any(line.get_label() == "_saturated" for ax in axes for line in ax.get_lines()):
        handles.append(Line2D([], [], marker="o", markersize=10, markerfacecolor="none", markeredgecolor="red",
                              linestyle=""))
        labels.append("client saturated: that run's latency describes the client")
    for h, lab in extra or []:
        handles.append(h)
        labels.append(lab)
    fig.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, frameon=False)


def _run_tag(run: Run, kind: str) -> str:
    load = _level(run)
    if load.concurrency:
        return f"c={load.concurrency}"
    if load.rate_rps:
        return f"r={load.rate_rps:g}"
    return f"~{run.summary.mean_concurrency:.1f}"


def _plots(results: list[Results], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    names = series_names(results)
    # One colour per series, the same in every figure; line style tells the percentile.
    # A mix total is black: it is the sum of the coloured model series beside it, not another candidate.
    colours, i = [], 0
    for res in results:
        colours.append("k" if is_total(res) else f"C{i % 10}")
        i += not is_total(res)
    kind = load_axis_kind(results)
    styles = (("p50", "-o"), ("p95", "--s"), ("p99", ":^"))
    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    all_x: list[float] = []
    levels = [load_x(r, kind) for res in results for r in res.runs if kind == "rate" or _level(r).concurrency]
    for res, name, colour in zip(results, names, colours):
        runs = sorted(res.runs, key=lambda r: load_x(r, kind))
        xs = [load_x(r, kind) for r in runs]
        all_x += xs
        for ax, metric in ((axes[0], "ttft_ms"), (axes[1], "itl_ms")):
            for q, style in styles:
                ys = [getattr(getattr(r.summary, metric), q) for r in runs]
                ax.plot(xs, [y if y is not None else float("nan") for y in ys], style, color=colour,
                        label=f"{name} {q}", zorder=2)
            _saturated(ax, [(x, getattr(r.summary, metric).p99) for x, r in zip(xs, runs)
                            if r.summary.saturated and getattr(r.summary, metric).p99 is not None])
    for ax, title, field in ((axes[0], "TTFT", "ttft_ms"), (axes[1], "ITL", "itl_ms")):
        _slo_lines(ax, results, field)
        ax.set_title(f"{title} percentiles vs {'offered rate' if kind == 'rate' else 'load'}")
        ax.set_ylabel(f"{title} (ms)")
        _load_axis(ax, kind, levels, all_x, any(r.model_mix for r in results))
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    _legend_below(fig, axes)
    p = out / "latency_vs_load.png"
    fig.savefig(p, dpi=110, bbox_inches="tight")
    plt.close(fig)
    paths.append(p)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for res, name, colour in zip(results, names, colours):
        runs = res.runs
        xs = [r.summary.output_throughput_tps for r in runs]
        for ax, metric, q in ((axes[0], "ttft_ms", "p99"), (axes[1], "itl_ms", "p50")):
            ys = [getattr(getattr(r.summary, metric), q) for r in runs]
            # Markers only (module docstring): each point is one run, labelled with its load.
            ax.plot(xs, [y if y is not None else float("nan") for y in ys], "o", color=colour, label=name, zorder=2)
            for x, y, r in zip(xs, ys, runs):
                if y is not None:
                    ax.annotate(_run_tag(r, kind), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points",
                                color=colour)
            _saturated(ax, [(x, y) for x, y, r in zip(xs, ys, runs) if r.summary.saturated and y is not None])
    for ax, metric, q in ((axes[0], "ttft_ms", "p99"), (axes[1], "itl_ms", "p50")):
        what = metric.split("_")[0].upper()
        _slo_lines(ax, results, metric)
        ax.set_xlabel("output throughput (tokens/s)")
        ax.set_ylabel(f"{what} {q} (ms)")
        mixed_in = " of the mix" if any(r.model_mix for r in results) else ""
        ax.set_title(f"throughput vs {what} {q} (one marker per run; c = concurrency{mixed_in}, r = rate{mixed_in})",
                     fontsize=10)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    _legend_below(fig, axes)
    p = out / "throughput_vs_latency.png"
    fig.savefig(p, dpi=110, bbox_inches="tight")
    plt.close(fig)
    paths.append(p)

    # Goodput only means something against SLOs: a file run without --slo-* (its goodput counts every completed
    # request) has none to draw, and the plot is left out when no file has any.
    if any(slo_values([res], f) for res in results for f in ("ttft_ms", "itl_ms", "e2e_ms")):
        fig, ax = plt.subplots(figsize=(8, 4.8))
        for res, name, colour in zip(results, names, colours):
            runs = sorted(res.runs, key=lambda r: load_x(r, kind))
            xs = [load_x(r, kind) for r in runs]
            ax.plot(xs, [r.summary.request_throughput_rps for r in runs], ":o", color=colour, markerfacecolor="none",
                    zorder=2)
            has_slo = any(slo_values([res], f) for f in ("ttft_ms", "itl_ms", "e2e_ms"))
            good = [(x, r.summary.goodput_rps) for x, r in zip(xs, runs) if r.summary.goodput_rps is not None
                    and has_slo]
            if good:
                ax.plot(*zip(*good), "-o", color=colour, label=name, zorder=2)
            _saturated(ax, [(x, r.summary.request_throughput_rps) for x, r in zip(xs, runs) if r.summary.saturated])
        if kind == "rate":
            top = max(levels)
            ax.plot([0, top], [0, top], color="0.6", linewidth=1, zorder=1, label="offered (every request served)")
        ax.set_title("goodput (requests/s meeting every SLO) and throughput vs "
                     f"{'offered rate' if kind == 'rate' else 'load'}", fontsize=10)
        ax.set_ylabel("requests/s")
        ax.set_ylim(bottom=0)
        _load_axis(ax, kind, levels, all_x, any(r.model_mix for r in results))
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        styles_key = [(Line2D([], [], color="0.3", linestyle="-", marker="o"), "solid: goodput"),
                      (Line2D([], [], color="0.3", linestyle=":", marker="o", markerfacecolor="none"),
                       "dotted: all completed requests")]
        _legend_below(fig, [ax], styles_key)
        p = out / "goodput_vs_load.png"
        fig.savefig(p, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(p)
    return paths


def _load_cell(load: Load) -> str:
    return (f"c={load.concurrency}" if load.concurrency else
            f"{load.rate_rps:g} rps {load.arrival}" if load.rate_rps else load.mode)


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 1000 else f"{v:.0f}"
    return html.escape(str(v))


def write_report(results: list[Results], out: Path, allow_mixed: bool = False,
                 names: list[str] | None = None) -> Path:
    """`names` (file paths) only word the refusal when request shapes differ and `allow_mixed` is False."""
    from fleetcast.bench.schema import mixed_shapes
    from fleetcast.contract.errors import UserError

    mixed = mixed_shapes(list(zip(names or series_names(results), results)))
    one_mix = len({mix_key(r) for r in results}) == 1 and mix_key(results[0]) is not None
    if mixed and one_mix:
        mixed = None  # one model-mix run: each model has its own shape by design (each series' header says which)
    if mixed and not allow_mixed:
        raise UserError(f"the results have different request shapes, so their latencies are not comparable ({mixed}); "
                        "compare runs of one shape, or pass --allow-mixed to put them side by side anyway")
    out.mkdir(parents=True, exist_ok=True)
    write_csv(results, out / "summary.csv")
    results = with_totals(results)
    images = _plots(results, out)
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>fleetcast bench report</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#eee}"
             "tr.sat{background:#fdd}.warn{background:#fdd;padding:.5em}</style></head><body><h1>fleetcast bench report</h1>"]
    for img in images:
        data = base64.b64encode(img.read_bytes()).decode()
        parts.append(f"<p><img alt='{img.stem}' src='data:image/png;base64,{data}' style='max-width:100%'></p>")
    if mixed:
        parts.append(f"<p class='warn'><b>Mixed request shapes</b> (--allow-mixed): {html.escape(mixed)}. "
                     "Latencies of different shapes are not comparable.</p>")
    for res, name in zip(results, series_names(results)):
        synthetic = "<b>SYNTHETIC data, not a measurement.</b> " if res.provenance == "synthetic" else ""
        parts.append(f"<h2>{html.escape(name)}</h2><p>{synthetic}endpoint {html.escape(res.endpoint)} "
                     f"({res.api}), {res.started_at:%Y-%m-%d %H:%M:%S} UTC, client {html.escape(res.client.host)} "
                     f"({res.client.cpus} CPUs), seed {res.seed}</p><ul>"
                     f"<li>labels: {html.escape(labels_text(res)) or 'none'}</li>"
                     f"<li>request shape: {html.escape(shape_text(res) if res.model_mix is None or res.request else 'each model its own (the models above)')}</li>"
                     f"<li>SLOs (goodput): {html.escape(slo_text(res))}</li>"
                     f"<li>sharing the instance (packing): {html.escape(packing_text(res))}</li>"
                     + (f"<li>model mix: {html.escape(res.model_mix.spec)}"
                        + (" (every model's requests together)" if res.request is None else
                           "; load below: this model's part of each level (the mix's level in brackets)")
                        + "</li>" if res.model_mix else "") + "</ul>")
        head = ["load", "ok/req", "TTFT p50", "TTFT p90", "TTFT p99 [95% CI]", "ITL p50", "ITL p99", "E2E p99",
                "out tok/s", "req/s", "goodput/s", "errors", "note"]
        parts.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>")
        for run in res.runs:
            s = run.summary
            load = _load_cell(run.load)
            if run.total is not None:
                load += f" [{_load_cell(run.total.load)}]"
            ci = f" [{_fmt(s.ttft_ms.p99_ci[0])}, {_fmt(s.ttft_ms.p99_ci[1])}]" if s.ttft_ms.p99_ci else ""
            note = "; ".join(x for x in (run.peers and "peers: " + run.peers_text(),
                                         s.saturation_reason and "SATURATED: " + s.saturation_reason,
                                         s.load_note and "LOAD NOT REACHED: " + s.load_note,
                                         s.ttft_ms.tail_note) if x)
            errs = ", ".join(f"{k}: {v}" + (f" ({s.error_messages[k]})" if k in s.error_messages else "")
                             for k, v in s.errors_by_type.items()) or "0"
            cells = [load, f"{s.completed}/{s.requests}", _fmt(s.ttft_ms.p50), _fmt(s.ttft_ms.p90),
                     _fmt(s.ttft_ms.p99) + ci, _fmt(s.itl_ms.p50), _fmt(s.itl_ms.p99), _fmt(s.e2e_ms.p99),
                     _fmt(s.output_throughput_tps), _fmt(s.request_throughput_rps), _fmt(s.goodput_rps),
                     html.escape(errs), html.escape(note)]
            cls = " class='sat'" if s.saturated or s.load_note else ""
            parts.append(f"<tr{cls}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
    parts.append("<p>Metric definitions: docs/bench.md. Latencies in ms, measured at the client.</p></body></html>")
    index = out / "report.html"
    index.write_text("\n".join(parts))
    return index
