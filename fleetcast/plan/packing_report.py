"""The packing plan's report: terminal text, plan.md, plan.html, plan.json and plots (docs/plan.md,
"Reading the packing report"). Every figure says what backs it: measured (co-located or one process),
synthetic, or estimated (solo curves)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .packing import ESTIMATED, PackingEval, PackingPlan, RegionPacking, scaling_target
from .report import (
    GLOSSARY,
    ROOFLINE_MARK,
    Block,
    DayLine,
    LatencyPoint,
    Row,
    closing_blocks,
    closing_lines,
    cost_vs_latency_plots,
    fleet_heading,
    glossary,
    glossary_lines,
    inputs_tag,
    instances_plot,
    page_table,
    pick_text,
    prediction_json,
    single_instance_note,
    summary_line,
    terminal_table,
    write_pages,
)
from .sharing import ESTIMATED as ESTIMATED_BY, MPS, spread_json
from .traffic import ConsumerTraffic

ESTIMATED_MPS = ESTIMATED_BY[MPS]

TOP_OTHERS = 6  # other feasible packings listed per region


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _hourly_text(n: list[int]) -> str:
    lo, hi = min(n), max(n)
    return f"{lo}" if lo == hi else f"{lo}-{hi} (mean {sum(n) / len(n):.1f})"


def model_rows(ev: PackingEval) -> tuple[list[str], list[list[str]]]:
    header = ["model", "precision", "copies", "KV GiB each", "curve", "worst-minute P99 TTFT / SLO ms",
              "P99 ITL / SLO ms", "processes needed (peak)"]
    rows = []
    for m in ev.loads:
        worst = m.worst()
        ttft = "-" if worst is None else f"{worst[0]:.0f} / {m.slo.ttft_p99_ms:g}"
        itl = "-" if worst is None else f"{worst[1]:.1f} / {m.slo.itl_p99_ms:g}"
        rows.append([m.model, m.precision, str(m.copies), _gib(m.kv_cache_gb), m.source, ttft, itl,
                     str(max(m.processes_by_hour, default=0))])
    return header, rows


def recommendation(plan: RegionPacking) -> str:
    w = plan.winner
    if w is None and not plan.evaluations and plan.not_offered:
        return (f"{plan.region}: not offered: {', '.join(plan.not_offered)} (the instance types with results) "
                f"{'is' if len(plan.not_offered) == 1 else 'are'} not offered in {plan.region}, where its consumers "
                "are served; no packing can serve it")
    if w is None:
        # With no candidate evaluated at all (a model without curves on any type) only the notes say why.
        where = "ruled out and notes" if any(not e.feasible for e in plan.evaluations) else "notes"
        return f"{plan.region}: no packing serves every model within its SLO (see {where})"
    lo, desired, hi = w.capacity()
    tag = " (ESTIMATED from solo curves: measure it co-located before deploying)" if w.estimated else \
        f" ({w.source})"
    if len(plan.traffic) == 1:
        # One model: the one-model recommendation's figures (c*, $ per 1M input tokens), from the same words.
        return pick_text(f"{w.label}{tag}", w.region, w, scaling_target(w))
    return (f"{plan.region}: {w.label}{tag}: ${w.cost_per_hour:.2f}/h, ${w.usd_per_m_output:.3f} per 1M output tokens "
            f"over every model, instances per hour {_hourly_text(w.instances_by_hour)} (capacity min {lo}, max {hi}), "
            f"target {scaling_target(w):g} in-flight requests per instance")


def _traffic_lines(plan: RegionPacking) -> list[str]:
    """A packing of one model: its consumers' traffic and load levels, as a one-model plan says them (several
    models' traffic is each model's, which the model table sizes)."""
    return [summary_line(plan.traffic[0])] if len(plan.traffic) == 1 else []


def _one_model_rows(plan: RegionPacking, ranked: list[PackingEval]) -> list[Row]:
    """A packing of one model: the one-model candidates table's rows (report.terminal_table / page_table); several
    models have their figures per model (model_rows)."""
    if len(plan.traffic) != 1:
        return []
    return [Row(e.label, e.region, e, scaling_target(e), e.source) for e in ranked]


def _best_per_option(plan: RegionPacking) -> list[PackingEval]:
    """Each instance type, precision and GPU sharing at its cheapest, as the one-model terminal table lists each
    candidate once."""
    seen, out = set(), []
    for e in plan.ranked:
        if (key := (e.instance_type, tuple(m.precision for m in e.loads), e.sharing)) not in seen:
            seen.add(key)
            out.append(e)
    return out


def _slo_of_one(result: PackingPlan) -> str | None:
    """A plan of one model: its SLO in words (the model's own, else the fleet's); several models' are per model."""
    slo = next((e.loads[0].slo for r in result.regions for e in r.evaluations if e.loads), None)
    return slo.text() if len(result.models) == 1 and slo is not None else None


def _one_model_traffic(result: PackingPlan) -> list[ConsumerTraffic]:
    """The traffic of the regions whose table is the one-model candidates table (a packing of one model)."""
    return [r.traffic[0] for r in result.regions if len(r.traffic) == 1]


def _target_terms(result: PackingPlan) -> list[tuple[str, str]]:
    """"target" in words: for one model, by the method each region was sized with (report.glossary: the histogram's
    cheapest level or the arrivals' safe rate over the busiest minute), as its table's columns are defined."""
    several = "; for several models, the same rule summed over them (docs/plan.md, \"Scaling target\")"
    one = _one_model_traffic(result)
    if len(one) < len(result.regions) or not one:
        return [("target", dict(GLOSSARY)["target"] + several)]
    return [(term, meaning) for term, meaning in glossary(one) if term.split(" (")[0] == "target"]


def said_once(regions: Sequence[RegionPacking]) -> dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]]]]:
    """Per consumer region, (ruled out, why not the others) with what a region before it already said shortened to a
    pointer to it: a ruled-out reason given in full once, and each long clause (12 words or more) of a losing reason
    once per packing; short clauses (a price, a share) are news in every region. The same sentence once per region
    buried the news (docs/plan.md, "Outputs")."""
    said: dict[tuple[str, str], str] = {}
    out = {}
    for plan in regions:
        here = plan.region
        ruled = []
        for label, why in plan.ruled_out():
            first = said.setdefault(("ruled out", why), here)
            ruled.append((label, why if first == here else
                          f"the same reason as for {first} above ({' '.join(why.split()[:6])} ...)"))
        losers = []
        for label, why in plan.why_not():
            clauses = []
            for clause in why.split("; "):
                first = said.setdefault((label, clause), here) if len(clause.split()) >= 12 else here
                clauses.append(clause if first == here else f"as for {first} above ({' '.join(clause.split()[:6])} ...)")
            losers.append((label, "; ".join(clauses)))
        out[here] = (ruled, losers)
    return out


def _hour_rows(plan: RegionPacking, w: PackingEval) -> list[list[str]]:
    """The pick hour by hour (UTC): its consumers' requests, instances and cost."""
    rps = [sum(r) for r in zip(*(t.hourly_rps() for t in plan.traffic))]
    return [[f"{h:02d}", f"{rps[h]:g}", str(w.instances_by_hour[h]), f"{w.cost_by_hour[h]:.2f}"] for h in range(24)]


def blocks(result: PackingPlan, plots: dict[str, list[Path]] | None = None) -> list[Block]:
    plots = plots or {}
    out: list[Block] = [("h1", f"Fleetcast plan: {result.traffic_name}"),
                        ("p", f"Models: {', '.join(result.models)}. Each consumer region is served by one pool whose "
                              "instances each run the packing below, one model a packing of one (docs/plan.md, "
                              "\"Several models: the packing search\"). Method and formulas: docs/plan.md. Costs "
                              "are day averages of hourly instance and fixed costs.")]
    head: list[tuple[str | None, str]] = [("SLO", slo)] if (slo := _slo_of_one(result)) else []
    head += [(None, n) for n in result.data_notes]
    head += [("Performance model", result.estimator)] if result.estimator else []
    out.append(("ul", head + [("warning", w) for w in result.warnings]))
    if one := _one_model_traffic(result):
        # The one-model candidates table's columns, defined by the method its regions were sized with.
        out += [("h3", "Reading the tables"), ("ul", glossary(one))]
    said = said_once(result.regions)
    for plan in result.regions:
        ruled, losers = said[plan.region]
        out.append(("h2", plan.region))
        out += [("p", line) for line in _traffic_lines(plan)]
        out.append(("rec", recommendation(plan)))
        w = plan.winner
        if single_instance_note(w):
            out.append(("ul", [("one instance", single_instance_note(w))]))
        if rows_of_one := _one_model_rows(plan, plan.ranked):
            out += [("h3", "Feasible packings"), page_table(rows_of_one)]
        if w is not None:
            header, rows = model_rows(w)
            out.append(("table", header, rows))
            if w.memory is not None:
                out.append(("p", f"GPU memory per instance: {w.memory.arithmetic()}."))
            out.append(("h3", "Against not packing (same traffic, same SLOs)"))
            out.append(("ul", [(None, s) for s in plan.savings()] or
                        [(None, "no unpacked alternative meets every SLO with the curves given")]))
        elif plan.alternatives:
            out.append(("h3", "Not packing (same traffic, same SLOs)"))
            out.append(("ul", [(None, s) for s in plan.unpacked()]))
        others = [e for e in plan.ranked if e is not w][:TOP_OTHERS]
        if others:
            out.append(("h3", f"Other packings (cheapest {len(others)} of {len(plan.ranked) - 1})"))
            out.append(("table", ["packing", "curves", "$/h", "$ per 1M output", "instance-hours/day"],
                        [[e.label, e.source, f"{e.cost_per_hour:.2f}", f"{e.usd_per_m_output:.3f}",
                          str(e.instance_hours)] for e in others]))
        if losers:
            out += [("h3", "Why not the other instance types"), ("ul", losers)]
        if ruled:
            out.append(("h3", "Ruled out"))
            out.append(("ul", ruled))
        if plan.peak_notes:
            out += [("h3", "Peak throughput"), ("ul", [(None, n) for n in plan.peak_notes])]
        if plan.decided_by:
            out += [("h3", "What decided the pick"), ("ul", [(None, n) for n in plan.decided_by])]
        if plan.stats_notes:
            out += [("h3", "Statistical notes"), ("ul", [(None, n) for n in plan.stats_notes])]
        if w is not None:
            out += [("h3", "The recommendation hour by hour (UTC)"),
                    ("table", ["hour", "req/s", "instances", "$/h"], _hour_rows(plan, w))]
        if plan.notes or (w is not None and w.notes):
            out.append(("h3", "Notes"))
            out.append(("ul", [("note", n) for n in (w.notes if w is not None else [])] +
                        [(None, n) for n in plan.notes]))
        for path in plots.get(plan.region, []):
            out.append(("img", path))
    out += closing_blocks(result)
    if len(result.regions) > 1:
        out.append(("h2", fleet_heading(result)))
        *joins, total = fleet_lines(result)
        out += ([("ul", [(None, line) for line in joins])] if joins else []) + [("p", total)]
    out.append(("h2", "Reading this report"))
    out.append(("ul", [
        ("curve", "what a model's figures rest on: 'measured (time slicing)' / 'measured (MPS)' = bench results of "
                  "exactly this packing with the other models busy, sharing the GPU that way; 'measured (one process)' "
                  f"= a solo curve, exact for a packing of one process; '{ESTIMATED}' / '{ESTIMATED_MPS}' = solo curves "
                  "stretched by the time-slicing rule / the calibrated MPS estimator (docs/plan.md); "
                  "'synthetic' = authored scenario data"),
        ("worst-minute P99", "the planner's predicted P99 at the day's worst planned minute (busiest minute of the "
                             "hour, the planned instances), network included for TTFT"),
        *_target_terms(result),
        ("one model per pool", "each model on instances of its own (its cheapest single-process choice), one NLB "
                               "and endpoint set for the fleet; a what-if: the config's pools of one region all "
                               "serve the same models, so it is not deployable as one fleet today"),
        ("one model per fleet", "the same instances, each model a fleet of its own with its own NLB and endpoints"),
        ("time slicing", "where a pool plans under MPS: the same region planned with its GPU time-sliced (the "
                         "cheapest packing then), so the saving of MPS is stated against it"),
    ]))
    return out


def fleet_lines(result: PackingPlan) -> list[str]:
    """The fleet over its regions: each pooling move, then its cost against not packing."""
    return result.joins + [f"packed ${result.cost_per_hour:.2f}/h; one model per pool "
                           f"${result.alternative_cost('one model per pool'):.2f}/h; one model per fleet "
                           f"${result.alternative_cost('one model per fleet'):.2f}/h"]


def render_terminal(result: PackingPlan) -> str:
    lines = [f"fleetcast plan: traffic {result.traffic_name}, model{'s' if len(result.models) > 1 else ''} "
             f"{', '.join(result.models)}"]
    lines += [f"SLO: {slo}"] if (slo := _slo_of_one(result)) else []
    lines += [f"Data: {'; '.join(result.data_notes)}"]
    lines += [f"Estimates: {result.estimator}"] if result.estimator else []
    lines += [f"warning: {w}" for w in result.warnings]
    said = said_once(result.regions)
    for plan in result.regions:
        lines += [""] + _traffic_lines(plan)
        if rows_of_one := _one_model_rows(plan, _best_per_option(plan)):
            lines += terminal_table(rows_of_one)
            lines += [ROOFLINE_MARK] if any(e.roofline for e in plan.ranked) else []
            lines += glossary_lines(result.consumers()) if plan is result.regions[0] else []
            lines.append("")
        # A packing of one model is headed as a one-model plan's pick is.
        lines.append(("Recommendation: " if rows_of_one else "") + recommendation(plan))
        if single_instance_note(plan.winner):
            lines.append(f"  note: {single_instance_note(plan.winner)}")
        if plan.winner is not None:
            header, rows = model_rows(plan.winner)
            widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
            lines.append("  " + "  ".join(h.ljust(widths[i]) for i, h in enumerate(header)))
            lines += ["  " + "  ".join(c.ljust(widths[i]) for i, c in enumerate(r)) for r in rows]
            lines += [f"  {s}" for s in plan.savings()]
        else:
            lines += [f"  no packing serves; {s}" for s in plan.unpacked()]
        ruled, losers = said[plan.region]
        lines += [f"  why not {a}: {b}" for a, b in losers]
        lines += [f"  ruled out: {a}: {b}" for a, b in ruled]
        # One model's notes under the one-model report's headings.
        lines += ["Peak throughput is not the decision metric:"] + [f"  - {n}" for n in plan.peak_notes] \
            if plan.peak_notes else []
        lines += [f"  decided the pick: {n}" for n in plan.decided_by]
        lines += ["Statistical notes:"] + [f"  - {n}" for n in plan.stats_notes] if plan.stats_notes else []
        lines += [f"  note: {n}" for n in (plan.winner.notes if plan.winner is not None else []) + plan.notes]
    if len(result.regions) > 1:
        lines += ["", f"{fleet_heading(result)}:"] + [f"  {line}" for line in fleet_lines(result)]
    return "\n".join(lines + closing_lines(result, "Spot tier (docs/plan.md#spot; a packing's processes are drained "
                                                    "together)"))


def _ev_json(e: PackingEval) -> dict[str, Any]:
    d: dict[str, Any] = {"instance_type": e.instance_type, "region": e.region, "label": e.label, "source": e.source,
         # The one-model result's names for them: the candidate (its label), where it is served, its precision.
         "candidate": e.label, "service_region": e.region,
         "precision": e.loads[0].precision if len(e.loads) == 1 else None,
         "gpu_sharing": e.sharing,
         "rejected": e.rejected,
         "packing": [{"model": m.model, "precision": m.precision, "copies": m.copies, "kv_cache_gib": m.kv_gib,
                      "source": m.source, "sources": list(m.sources), "peer_step_ms": m.peer_step_ms,
                      "spread": spread_json(m.curve)}
                     for m in e.loads]}
    if e.feasible:
        lo, desired, hi = e.capacity()
        d.update(instances_by_hour=e.instances_by_hour, cost_per_hour=e.cost_per_hour,
                 usd_per_m_output=e.usd_per_m_output, capacity={"min": lo, "desired": desired, "max": hi},
                 fixed_per_hour=sum(e.fixed_by_hour) / 24, price_per_hour=e.price_per_hour, target=scaling_target(e),
                 # The one-model result's keys (report.to_json); c*, the P99s and goodput are null for several models.
                 rtt_ms=e.rtt_ms, usd_per_m_input=e.usd_per_m_input, max_load=e.max_load, estimated=e.estimated,
                 weighted_ttft_p99_ms=e.weighted_ttft_p99, weighted_ttft_ci=e.weighted_ttft_ci,
                 weighted_itl_p99_ms=e.weighted_itl_p99, goodput_rps_per_instance=e.goodput_rps,
                 goodput_exact=e.goodput_exact,
                 sizing="histogram" if any(m.histogram is not None for m in e.loads) else "arrivals",
                 measured_cap=e.measured_cap, notes=e.notes, seconds_per_request=e.seconds_per_request)
        if e.safe_rate_rps is not None:  # one model sized from arrivals, as a one-model result's
            (load,) = e.loads
            d.update(binding=e.binding, safe_rate_rps_per_instance=e.safe_rate_rps,
                     predicted_by_hour=[prediction_json(x, load.network_ms) for x in load.predictions])
        for m, row in zip(e.loads, d["packing"]):
            worst = m.worst()
            row.update(processes_by_hour=m.processes_by_hour,
                       worst_ttft_p99_ms=worst and worst[0], worst_itl_p99_ms=worst and worst[1],
                       slo={"ttft_p99_ms": m.slo.ttft_p99_ms, "itl_p99_ms": m.slo.itl_p99_ms,
                            "error_rate": m.slo.error_rate})
    return d


def _one_model_keys(result: PackingPlan) -> dict[str, Any]:
    """A packing of one model: the one-model result's `model` and `slo` (the model's own, else the fleet's)."""
    slo = next((e.loads[0].slo for r in result.regions for e in r.evaluations if e.loads), None)
    return {"model": result.models[0], "slo": vars(slo)} if len(result.models) == 1 and slo is not None else {}


def to_json(result: PackingPlan) -> dict[str, Any]:
    return {
        "schema": "fleetcast.plan/v1", "kind": "packing", "traffic": result.traffic_name,
        "models": list(result.models), "data": result.data_notes, "estimator": result.estimator,
        "warnings": result.warnings,
        **_one_model_keys(result),
        "max_copies": result.max_copies, "spot": [a.to_json() for a in result.spot],
        "pools": [_ev_json(p) | {"consumer_regions": list(p.consumer_regions or (p.region,)),
                                 "joined": list(p.marginal), "marginal_cost_per_hour": p.marginal,
                                 "member_checks": {region: {model: {"ttft_p99_ms": t, "itl_p99_ms": i}
                                                            for model, (t, i) in by_model.items()}
                                                   for region, by_model in p.member_checks.items()}}
                  for p in result.pools],
        "joins": result.joins,
        "write_config": [{"refuses": blocking, "text": text} for blocking, text in result.write_notes],
        "regions": [{
            "consumer_region": p.region,
            "winner": _ev_json(p.winner) if p.winner else None,
            "alternatives": [{"name": a.name, "cost_per_hour": a.cost_per_hour, "usd_per_m_output": a.usd_per_m_output,
                              "instance_cost_per_hour": a.instance_cost_per_hour,
                              "fixed_cost_per_hour": a.fixed_cost_per_hour, "estimated": a.estimated,
                              "parts": [_ev_json(x) for x in a.parts]} for a in p.alternatives],
            "savings": p.savings(), "notes": p.notes, "decided_by": p.decided_by,
            "peak_notes": p.peak_notes, "stats_notes": p.stats_notes,
            "why_not": [{"packing": a, "reason": b} for a, b in p.why_not()],
            "evaluations": [_ev_json(e) for e in p.ranked] + [_ev_json(e) for e in p.evaluations if not e.feasible],
        } for p in result.regions],
    }


def _cost_vs_latency(plt: Any, plan: RegionPacking, directory: Path) -> list[Path]:
    """A packing of one model: the one-model plan's cost-vs-latency pictures (report.cost_vs_latency_plots), each
    packing at its P99s as the model table gives them."""
    if len(plan.traffic) != 1 or not plan.ranked:
        return []
    points, best, seen = [], [], set()
    for e in plan.ranked:
        (load,) = e.loads
        worst = load.worst() or (0.0, 0.0)
        points.append(LatencyPoint(e.label, worst[0], worst[1], e.usd_per_m_output, e.estimated, e is plan.winner))
        # Each instance type, precision and GPU sharing at its cheapest, as each one-model candidate is.
        if (key := (e.instance_type, load.precision, e.sharing)) not in seen:
            seen.add(key)
            best.append(points[-1])
    measure = "traffic-weighted" if plan.ranked[0].loads[0].histogram is not None else "worst-minute"
    return cost_vs_latency_plots(plt, points, best, plan.region, measure, plan.ranked[0].loads[0].slo, _sources(plan.ranked),
                                 directory)


def _instances(plt: Any, plan: RegionPacking, pools: Sequence[PackingEval], directory: Path) -> list[Path]:
    """The one-model report's demand and instances over the day (report.instances_plot): each instance type,
    precision and GPU sharing at its cheapest packing, the pick bold, a pool serving this region with others dashed."""
    if not plan.ranked:
        return []
    shown = _best_per_option(plan)
    lines = [DayLine(e.label, e.instances_by_hour, e is plan.winner) for e in shown]
    fleet = [DayLine(f"the planned fleet: {p.label} pooled in {p.region} (serves {', '.join(p.consumer_regions)})",
                     p.instances_by_hour, False)
             for p in pools if plan.region in p.consumer_regions and len(p.consumer_regions) > 1]
    rps = [sum(t.hourly_rps()[h] for t in plan.traffic) for h in range(24)]
    # The title names what the lines drawn rest on: the ranked packings not drawn said "estimated" over a measured pick.
    return [instances_plot(plt, plan.region, rps, lines, fleet, inputs_tag(_sources(shown)), directory)]


def _sources(evs: list[PackingEval]) -> set[str]:
    """What the packings' figures rest on, in the one-model pictures' words: "measured" and "synthetic" without the
    table's gloss."""
    return {e.source.split(" (")[0] if e.source.startswith(("measured", "synthetic")) else e.source for e in evs}


def write_plots(plan: RegionPacking, directory: Path, pools: Sequence[PackingEval] = ()) -> list[Path]:
    """Per region: the cost-vs-latency pictures (a packing of one model), the demand and instances over the day,
    what the choice costs against not packing (and what its GPU holds), and the instances over the day, packed
    against one model per pool."""
    from .report import _matplotlib

    plt = _matplotlib()
    w = plan.winner
    paths = _cost_vs_latency(plt, plan, directory) + _instances(plt, plan, pools, directory)
    if w is None:
        return paths
    fig, (ax, mem) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [1.4, 1]})
    names = [f"packed\n{w.instance_type}\n[{w.source}]"]
    inst = [sum(w.instances_by_hour) * w.price_per_hour / 24]
    fixed = [sum(w.fixed_by_hour) / 24]
    for alt in plan.alternatives:
        types = ", ".join(sorted({p.instance_type for p in alt.parts}))
        names.append(f"{alt.name}\n{types}\n[{'estimated' if alt.estimated else alt.parts[0].source}]")
        inst.append(alt.instance_cost_per_hour)
        fixed.append(alt.fixed_cost_per_hour)
    y = list(range(len(names)))[::-1]
    ax.barh(y, inst, color="#4477aa", label="instances")
    ax.barh(y, fixed, left=inst, color="#cc8844", label="fixed (NLB, endpoints, LCUs)")
    for yi, a, b in zip(y, inst, fixed):
        ax.text(a + b, yi, f"  ${a + b:.2f}/h", va="center")
    ax.set_yticks(y, names, fontsize=8)
    ax.set_xlabel("USD per hour (mean over the day)")
    ax.set_xlim(0, max(a + b for a, b in zip(inst, fixed)) * 1.3)
    ax.set_title(f"{plan.region}: cost of the same traffic, packed or not")
    ax.legend(loc="upper right", fontsize=8)
    if w.memory is not None:
        from fleetcast.contract.serving import GIB

        bottom = 0.0
        colors = {"weights": "#4477aa", "overhead": "#999999", "KV": "#66aa55"}
        seen = set()
        for proc in w.memory.processes:
            for i in range(proc.copies):
                parts = [("weights", (proc.weights_bytes or 0) / GIB), ("overhead", proc.overhead_bytes / GIB),
                         ("KV", (proc.kv_bytes or 0) / GIB)]
                for kind, size in parts:
                    mem.bar(0, size, bottom=bottom, color=colors[kind], edgecolor="white",
                            label=kind if kind not in seen else None)
                    seen.add(kind)
                    bottom += size
                mem.text(0.45, bottom - ((proc.weights_bytes or 0) / GIB + proc.overhead_bytes / GIB
                                         + (proc.kv_bytes or 0) / GIB) / 2,
                         f"{proc.model_id} {proc.precision}" + (f" #{i + 1}" if proc.copies > 1 else ""),
                         va="center", fontsize=8)
        mem.axhline(w.memory.usable_bytes / GIB, color="black", ls="--", lw=1)
        mem.text(-0.4, w.memory.usable_bytes / GIB, " usable", va="bottom", fontsize=8)
        mem.set_xlim(-0.5, 1.5)
        mem.set_xticks([])
        mem.set_ylabel("GiB")
        mem.set_ylim(0, w.memory.gpu_bytes / GIB * 1.05)
        mem.set_title(f"one {w.memory.gpu} ({w.memory.gpu_bytes / GIB:.0f} GiB): what each process holds", fontsize=10)
        # Below the axes: inside, it sat on a process's label wherever the stack put one.
        mem.legend(loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    path = directory / f"packing-{plan.region}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

    fig, ax = plt.subplots(figsize=(11, 5))
    hours = list(range(24))
    ax.step(hours + [24], w.instances_by_hour + w.instances_by_hour[-1:], where="post", lw=7, alpha=0.3,
            color="black", label=f"packed: {w.instance_type} [{w.source}] (what the pool runs)")
    if plan.alternatives:
        alt = plan.alternatives[0]
        total = [sum(p.instances_by_hour[h] for p in alt.parts) for h in hours]
        types = ", ".join(sorted({p.instance_type for p in alt.parts}))
        ax.step(hours + [24], total + total[-1:], where="post", lw=1.5, ls="--", color="black",
                label=f"one model per pool: every model's pool together ({types})")
    for i, m in enumerate(w.loads):
        # A small offset per model keeps equal counts apart; the packed line is the maximum of these and the floor.
        per = [n + 0.06 * (i - (len(w.loads) - 1) / 2) for n in m.instances_by_hour]
        ax.step(hours + [24], per + per[-1:], where="post", lw=1.2, marker=".", markersize=4,
                label=f"{m.model}: instances its processes need in the packing [{m.source}]")
    ax.set_xlim(0, 24)
    ax.set_xticks(range(0, 25, 3))
    ax.set_xlabel("UTC hour")
    ax.set_ylabel("instances")
    ax.set_ylim(0, max([max(w.instances_by_hour)] + ([max(total)] if plan.alternatives else [])) * 1.25 + 0.5)
    ax.set_title(f"{plan.region}: instances over the day (sized at each hour's busiest minute)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, fontsize=8)
    fig.tight_layout()
    path = directory / f"packing-day-{plan.region}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths


def write_report(result: PackingPlan, directory: str | Path) -> list[Path]:
    return write_pages(directory, f"Fleetcast plan: {result.traffic_name}", lambda plots: blocks(result, plots),
                       to_json(result), lambda d: {p.region: write_plots(p, d, result.pools) for p in result.regions})
