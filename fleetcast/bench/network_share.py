"""`fleetcast bench network-share`: split the network's share out of latency by
comparing two results files of the same sweep, one measured on the serving
instance itself (`path=instance`, stacks/bench_fleet.py) and one from inside a
consumer VPC through PrivateLink (`path=privatelink`, stacks/consumer_probe.py).

Per load level both files ran, the share is the PrivateLink figure minus the
instance figure, for TTFT and E2E at P50 and P99. The RTT probe (median TCP
connect time) is one network round trip; a streamed request pays about one
round trip before its first token, so `ttft_p50_delta - rtt` is what the path
adds beyond the wire (NLB, gateway, cross-zone hops). Percentile differences are
differences of two distributions, not a distribution of differences: a P99
delta can be smaller than the P50 delta, or negative, when the tails differ.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from fleetcast.bench.schema import Results, Run
from fleetcast.contract.errors import UserError

METRICS = ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99")


@dataclass(frozen=True)
class LevelShare:
    """One load level: both paths' figures (ms) and PrivateLink minus instance."""

    level: str
    instance: dict[str, float | None]
    privatelink: dict[str, float | None]
    delta: dict[str, float | None]
    instance_rtt_ms: float | None
    privatelink_rtt_ms: float | None
    ttft_p50_beyond_rtt_ms: float | None
    completed: tuple[int, int]
    saturated: tuple[bool, bool]


def level_key(run: Run) -> str:
    load = run.load
    if load.mode == "concurrency":
        return f"concurrency={load.concurrency}"
    if load.mode == "rate":
        return f"rate={load.rate_rps:g}/{load.arrival}"
    return load.mode  # trace and mix: one run per file


def _figures(run: Run) -> dict[str, float | None]:
    s = run.summary
    return {"ttft_p50": s.ttft_ms.p50, "ttft_p99": s.ttft_ms.p99, "e2e_p50": s.e2e_ms.p50, "e2e_p99": s.e2e_ms.p99}


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def network_share(instance: Results, privatelink: Results) -> tuple[list[LevelShare], list[str]]:
    """Level-by-level shares (in the instance file's order) and the levels only one file has."""
    inst = {level_key(r): r for r in instance.runs}
    pl = {level_key(r): r for r in privatelink.runs}
    common = [k for k in inst if k in pl]
    if not common:
        raise UserError(
            f"the two results files share no load level (instance: {', '.join(inst) or 'none'}; "
            f"privatelink: {', '.join(pl) or 'none'}): run the same sweep on both paths"
        )
    shares = []
    for key in common:
        a, b = inst[key], pl[key]
        fa, fb = _figures(a), _figures(b)
        delta = {m: _sub(fb[m], fa[m]) for m in METRICS}
        inst_rtt, pl_rtt = a.summary.network_rtt_ms, b.summary.network_rtt_ms
        # The round trip PrivateLink adds: the instance's own (loopback) RTT is not part of it.
        added_rtt = pl_rtt if inst_rtt is None else _sub(pl_rtt, inst_rtt)
        shares.append(LevelShare(
            level=key, instance=fa, privatelink=fb, delta=delta,
            instance_rtt_ms=inst_rtt, privatelink_rtt_ms=pl_rtt,
            ttft_p50_beyond_rtt_ms=_sub(delta["ttft_p50"], added_rtt),
            completed=(a.summary.completed, b.summary.completed),
            saturated=(a.summary.saturated, b.summary.saturated),
        ))
    only_one = [k for k in inst if k not in pl] + [k for k in pl if k not in inst]
    return shares, only_one


def check_paths(instance: Results, privatelink: Results) -> list[str]:
    """Warnings when the files look swapped or mislabeled (labels are optional, so never an error)."""
    warnings = []
    if instance.labels.path and instance.labels.path != "instance":
        warnings.append(f"first file is labeled path={instance.labels.path}, expected instance")
    if privatelink.labels.path and privatelink.labels.path != "privatelink":
        warnings.append(f"second file is labeled path={privatelink.labels.path}, expected privatelink")
    if instance.labels.model and privatelink.labels.model and instance.labels.model != privatelink.labels.model:
        warnings.append(f"different models: {instance.labels.model} vs {privatelink.labels.model}")
    return warnings


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def render_table(shares: list[LevelShare]) -> str:
    """Plain-text table: per level, instance / PrivateLink / delta for each metric, then the RTTs."""
    header = ["level"] + [f"{m} inst/pl/delta" for m in METRICS] + ["rtt pl", "ttft_p50-rtt", "flags"]
    rows = []
    for s in shares:
        cells = [s.level]
        for m in METRICS:
            cells.append(f"{_fmt(s.instance[m])} / {_fmt(s.privatelink[m])} / {_fmt(s.delta[m], signed=True)}")
        cells.append(_fmt(s.privatelink_rtt_ms))
        cells.append(_fmt(s.ttft_p50_beyond_rtt_ms, signed=True))
        flags = [name for name, sat in zip(("instance", "privatelink"), s.saturated) if sat]
        cells.append("saturated: " + ",".join(flags) if flags else "")
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    return "\n".join(lines) + "\n"


def to_json(shares: list[LevelShare], only_one: list[str]) -> dict[str, object]:
    return {"unit": "ms", "levels": [asdict(s) for s in shares], "unmatched_levels": only_one}
