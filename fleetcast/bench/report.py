"""Renders results: a CSV row per run, PNG plots, and one self-contained HTML
file (plots embedded as base64) that can be mailed or attached to a ticket.

Several results files render together, one series each (e.g. two instance
types or precisions). Runs marked saturated are drawn hollow and flagged in
the tables: their latencies describe the client, not the server.
"""

from __future__ import annotations

import base64
import csv
import html
from pathlib import Path

from fleetcast.bench.schema import Results, Run

_STATS = ("ttft_ms", "itl_ms", "e2e_ms", "chunk_gap_ms")
_QS = ("p50", "p90", "p95", "p99")


def series_name(res: Results) -> str:
    lab = res.labels
    parts = [p for p in (lab.instance_type or lab.gpu, lab.precision, lab.backend if lab.backend != "unknown" else None,
                         lab.region) if p]
    return " / ".join(parts) or res.endpoint


def load_x(run: Run) -> float:
    """Where a run sits on the load axis: its concurrency, else the measured mean concurrency."""
    return float(run.load.concurrency) if run.load.concurrency else run.summary.mean_concurrency


def csv_rows(results: list[Results]) -> list[dict]:
    rows = []
    for res in results:
        for run in res.runs:
            s = run.summary
            row = {
                "series": series_name(res), "endpoint": res.endpoint, "api": res.api,
                **{f"label_{k}": v for k, v in res.labels.model_dump().items()},
                "mode": run.load.mode, "concurrency": run.load.concurrency, "rate_rps": run.load.rate_rps,
                "arrival": run.load.arrival, "input_mean": run.lengths.input_mean,
                "output_mean": run.lengths.output_mean, "requests": s.requests, "completed": s.completed,
                "errors": s.errors, "error_rate": s.error_rate, "duration_s": s.duration_s,
                "output_throughput_tps": s.output_throughput_tps, "total_throughput_tps": s.total_throughput_tps,
                "request_throughput_rps": s.request_throughput_rps, "goodput_rps": s.goodput_rps,
                "mean_concurrency": s.mean_concurrency, "saturated": s.saturated,
                "saturation_reason": s.saturation_reason, "network_rtt_ms": s.network_rtt_ms,
            }
            for name in _STATS:
                st = getattr(s, name)
                row[f"{name}_count"] = st.count
                row[f"{name}_mean"] = st.mean
                for q in _QS:
                    row[f"{name}_{q}"] = getattr(st, q)
                row[f"{name}_p99_ci_lo"] = st.p99_ci[0] if st.p99_ci else None
                row[f"{name}_p99_ci_hi"] = st.p99_ci[1] if st.p99_ci else None
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


def _plots(results: list[Results], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for res in results:
        runs = sorted(res.runs, key=load_x)
        xs = [load_x(r) for r in runs]
        for ax, metric, title in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "itl_ms", "ITL")):
            for q, style in (("p50", "-o"), ("p95", "--s"), ("p99", ":^")):
                ys = [getattr(getattr(r.summary, metric), q) for r in runs]
                line, = ax.plot(xs, [y if y is not None else float("nan") for y in ys], style,
                                label=f"{series_name(res)} {q}")
                sat = [(x, y) for x, y, r in zip(xs, ys, runs) if r.summary.saturated and y is not None]
                if sat:
                    ax.plot(*zip(*sat), "x", color="red", markersize=10)
            ax.set_title(f"{title} percentiles vs load (red x: client saturated)")
            ax.set_xlabel("concurrency")
            ax.set_ylabel("ms")
            ax.set_xscale("log", base=2)
            ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    p = out / "latency_vs_concurrency.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for res in results:
        runs = sorted(res.runs, key=lambda r: r.summary.output_throughput_tps)
        xs = [r.summary.output_throughput_tps for r in runs]
        for ax, metric, q in ((axes[0], "ttft_ms", "p99"), (axes[1], "itl_ms", "p50")):
            ys = [getattr(getattr(r.summary, metric), q) for r in runs]
            ax.plot(xs, [y if y is not None else float("nan") for y in ys], "-o", label=series_name(res))
            for x, y, r in zip(xs, ys, runs):
                if y is not None and r.load.concurrency:
                    ax.annotate(str(r.load.concurrency), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
            ax.set_xlabel("output throughput (tokens/s)")
            ax.set_ylabel(f"{metric.split('_')[0].upper()} {q} (ms)")
            ax.set_title(f"throughput vs {metric.split('_')[0].upper()} {q}")
            ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    p = out / "throughput_vs_latency.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 1000 else f"{v:.0f}"
    return html.escape(str(v))


def write_report(results: list[Results], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    write_csv(results, out / "summary.csv")
    images = _plots(results, out)
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>fleetcast bench report</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#eee}"
             "tr.sat{background:#fdd}</style></head><body><h1>fleetcast bench report</h1>"]
    for img in images:
        data = base64.b64encode(img.read_bytes()).decode()
        parts.append(f"<p><img alt='{img.stem}' src='data:image/png;base64,{data}' style='max-width:100%'></p>")
    for res in results:
        parts.append(f"<h2>{html.escape(series_name(res))}</h2><p>endpoint {html.escape(res.endpoint)} "
                     f"({res.api}), {res.started_at:%Y-%m-%d %H:%M:%S} UTC, client {html.escape(res.client.host)} "
                     f"({res.client.cpus} CPUs), seed {res.seed}, labels "
                     f"{html.escape(str(res.labels.model_dump(exclude_none=True)))}</p>")
        head = ["load", "ok/req", "TTFT p50", "TTFT p90", "TTFT p99 [95% CI]", "ITL p50", "ITL p99", "E2E p99",
                "out tok/s", "req/s", "goodput/s", "errors", "note"]
        parts.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>")
        for run in res.runs:
            s = run.summary
            load = (f"c={run.load.concurrency}" if run.load.concurrency else
                    f"{run.load.rate_rps:g} rps {run.load.arrival}" if run.load.rate_rps else run.load.mode)
            ci = f" [{_fmt(s.ttft_ms.p99_ci[0])}, {_fmt(s.ttft_ms.p99_ci[1])}]" if s.ttft_ms.p99_ci else ""
            note = "; ".join(x for x in (s.saturation_reason and "SATURATED: " + s.saturation_reason,
                                         s.ttft_ms.tail_note) if x)
            errs = ", ".join(f"{k}: {v}" for k, v in s.errors_by_type.items()) or "0"
            cells = [load, f"{s.completed}/{s.requests}", _fmt(s.ttft_ms.p50), _fmt(s.ttft_ms.p90),
                     _fmt(s.ttft_ms.p99) + ci, _fmt(s.itl_ms.p50), _fmt(s.itl_ms.p99), _fmt(s.e2e_ms.p99),
                     _fmt(s.output_throughput_tps), _fmt(s.request_throughput_rps), _fmt(s.goodput_rps),
                     html.escape(errs), html.escape(note)]
            cls = " class='sat'" if s.saturated else ""
            parts.append(f"<tr{cls}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
    parts.append("<p>Metric definitions: docs/bench.md. Latencies in ms, measured at the client.</p></body></html>")
    index = out / "report.html"
    index.write_text("\n".join(parts))
    return index
