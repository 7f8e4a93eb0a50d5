"""Cross-region overflow: a two-region diurnal trace, the home region offered 1.5x its capacity at its peak,
replayed with spill off and on; per 1-minute window, whether the P99 TTFT kept the SLO.

A discrete-event SIMULATION driving the gateway's real decision code (runtime/gateway/spill.py: SpillPolicy
with its hysteresis, Breaker, predicted_wait_s, the headroom answer cached HEADROOM_TTL_S and aged out as the
gateway ages it), not the processes: the engines are slots with a service time, each region's gateway queue is
first come first served (one consumer per region, so fair admission's order is arrival order), and the
inter-region path is a fixed round trip (`make bench-overflow-sim`). The processes themselves are exercised by
tests/gateway/test_spill_processes.py and replayed, a compressed day, by scripts/bench_overflow_replay.py
(`make bench-overflow`). What it shows is the decision's effect on the SLO windows, the spill
share and what a spilled request pays; absolute figures depend on the assumptions printed with them.

Each region serves its own consumer on a diurnal curve (a raised cosine over one compressed day); the remote's
peak is half a day from the home's, so the home's peak meets the remote's trough, which is what makes a spill
pay (regions whose peaks coincide have nothing to give each other).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.gateway.spill import (
    HEADROOM_TTL_S,
    Breaker,
    Headroom,
    LoadGauge,
    ModelHeadroom,
    RegionLink,
    SpillPolicy,
    advertised_free,
    predicted_wait_s,
)

HOME, REMOTE = "us-east-1", "us-west-2"
MODEL = "m"


@dataclass(frozen=True)
class Consumer:
    name: str
    service_region: str
    spill_regions: tuple[str, ...]


@dataclass
class Region:
    name: str
    slots: int
    held: int = 0
    waiting: deque[Req] = field(default_factory=deque)  # requests queued for a slot, in arrival order

    def headroom(self, service_s: float, ttft_ms: float) -> Headroom:
        wait = predicted_wait_s(self.held, len(self.waiting), self.slots, service_s)
        return Headroom(self.name, {MODEL: ModelHeadroom(advertised_free(self.held, len(self.waiting), self.slots),
                                                         self.slots, wait * 1000 + ttft_ms)})


@dataclass
class Req:
    origin: str
    arrived: float
    spilled: bool = False
    ttft_ms: float = 0.0


def rate(t: float, day_s: float, peak: float, trough: float, phase: float) -> float:
    """Arrivals per second at `t`: a raised cosine between trough and peak, peaking at `phase` of the day."""
    x = (t / day_s - phase) * 2 * math.pi
    return trough + (peak - trough) * (1 + math.cos(x)) / 2


def simulate(spill: bool, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    capacity = args.slots / args.service_s  # requests per second one region completes at full batch
    regions = {HOME: Region(HOME, args.slots), REMOTE: Region(REMOTE, args.slots)}
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731 - the simulation's clock, injected into the real policy
    link = RegionLink(REMOTE, ("sim", 0), Breaker(clock))
    link.rtt_ms = args.rtt_ms
    policy = SpillPolicy({REMOTE: link}, {REMOTE: frozenset({MODEL})}, clock)
    consumer = Consumer("home-consumer", HOME, (REMOTE,) if spill else ())
    gauge = LoadGauge(ttft_ms=args.ttft_ms, service_s=args.service_s)
    events: list[tuple[float, int, str, str, Req | None]] = []
    seq = [0]

    def push(at: float, kind: str, region: str, req: Req | None = None) -> None:
        seq[0] += 1
        heapq.heappush(events, (at, seq[0], kind, region, req))

    # Arrivals: a thinned Poisson process per region over the compressed day.
    for name, peak, phase in ((HOME, args.home_peak, 0.5), (REMOTE, args.remote_peak, 0.0)):
        top, t = peak * capacity, 0.0
        while True:
            t += rng.expovariate(top)
            if t >= args.day_s:
                break
            if rng.random() < rate(t, args.day_s, peak * capacity, args.trough * capacity, phase) / top:
                push(t, "arrive", name, Req(name, t))
    push(0.0, "headroom", REMOTE)
    done: list[Req] = []

    def start(region: Region, req: Req, at: float) -> None:
        region.held += 1
        extra = args.rtt_ms if req.spilled else 0.0
        req.ttft_ms = (at - req.arrived) * 1000 + args.ttft_ms + extra
        push(at + rng.expovariate(1 / args.service_s), "finish", region.name, req)

    while events:
        at, _, kind, name, req = heapq.heappop(events)
        now[0] = at
        region = regions[name]
        if kind == "headroom":  # the home gateway's background read, once per TTL
            link.headroom = region.headroom(args.service_s, args.ttft_ms)
            link.fetched_at, link.spent = at, 0
            if at + HEADROOM_TTL_S < args.day_s:
                push(at + HEADROOM_TTL_S + args.rtt_ms / 1000, "headroom", name)
            continue
        if kind == "arrive":
            assert req is not None
            if name == HOME and not req.spilled and spill:
                local = predicted_wait_s(region.held, len(region.waiting), region.slots,
                                         gauge.service_s(MODEL)) * 1000 + gauge.ttft_ms(MODEL)
                decision = policy.decide(consumer, MODEL, MODEL, 0, local, args.slo_ms)
                if decision.region is not None:
                    req.spilled = True
                    link.breaker.success()  # the path in this simulation never fails
                    push(at + args.rtt_ms / 2000, "arrive", REMOTE, req)
                    continue
            if region.held < region.slots and not region.waiting:
                start(region, req, at)
            else:
                region.waiting.append(req)
            continue
        # finish
        assert req is not None
        region.held -= 1
        done.append(req)
        while region.waiting and region.held < region.slots:
            start(region, region.waiting.popleft(), at)
    return summarize(done, args, policy)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def summarize(done: list[Req], args: argparse.Namespace, policy: SpillPolicy) -> dict[str, Any]:
    windows: dict[tuple[str, int], list[float]] = {}
    for req in done:
        windows.setdefault((req.origin, int(req.arrived // args.window_s)), []).append(req.ttft_ms)
    out: dict[str, Any] = {}
    for origin in (HOME, REMOTE):
        mine = {k: v for k, v in windows.items() if k[0] == origin}
        within = sum(1 for v in mine.values() if p99(v) <= args.slo_ms)
        out[origin] = {"windows": len(mine), "within_slo": within,
                       "share_within": round(within / len(mine), 3) if mine else None,
                       "p99_ms_worst_window": round(max((p99(v) for v in mine.values()), default=0.0), 1)}
    home = [r for r in done if r.origin == HOME]
    spilled = [r for r in home if r.spilled]
    out["spill_share"] = round(len(spilled) / len(home), 4) if home else 0.0
    out["spilled_requests"] = len(spilled)
    out["decisions"] = dict(sorted(policy.counters.reasons.items()))
    if spilled:
        waits = sorted(r.ttft_ms - args.ttft_ms for r in spilled)
        out["spilled_added_ms_median"] = round(waits[len(waits) // 2], 1)
        out["spilled_added_ms_p99"] = round(p99(waits), 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench_overflow", description=__doc__.split("\n\n")[0])
    p.add_argument("--day-s", type=float, default=7200.0, help="one compressed day, seconds (default 7200: "
                   "120 one-minute windows)")
    p.add_argument("--window-s", type=float, default=60.0, help="SLO window (default 60)")
    p.add_argument("--slots", type=int, default=8, help="requests one region's engines hold at once (default 8)")
    p.add_argument("--service-s", type=float, default=2.0, help="mean request duration, seconds (default 2)")
    p.add_argument("--ttft-ms", type=float, default=80.0, help="TTFT of a request that does not wait (default 80)")
    p.add_argument("--slo-ms", type=float, default=300.0, help="P99 TTFT target (default 300, examples/spill)")
    p.add_argument("--rtt-ms", type=float, default=70.0, help="inter-region round trip (default 70, an assumed "
                   "us-east-1 <-> us-west-2 figure; measure yours)")
    p.add_argument("--home-peak", type=float, default=1.5, help="home's peak, x its capacity (default 1.5)")
    p.add_argument("--remote-peak", type=float, default=0.9, help="remote's own peak, x capacity (default 0.9)")
    p.add_argument("--trough", type=float, default=0.2, help="both regions' trough, x capacity (default 0.2)")
    p.add_argument("--reserve", type=float, default=None, help="the share of the remote's capacity it never "
                   "offers (default: runtime/gateway/spill.py RESERVE)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", help="write the figures here as JSON")
    args = p.parse_args(argv)
    if args.reserve is not None:
        import runtime.gateway.spill as spill_module

        spill_module.RESERVE = args.reserve
    results = {"off": simulate(False, args), "on": simulate(True, args),
               "assumptions": {k: v for k, v in vars(args).items() if k != "json"}}
    off, on = results["off"], results["on"]
    print(json.dumps(results, indent=1))
    print(f"\nhome ({HOME}, peak {args.home_peak:g}x capacity): 1-minute windows within the P99 TTFT SLO "
          f"({args.slo_ms:g} ms): without spill {off[HOME]['within_slo']}/{off[HOME]['windows']}, with spill "
          f"{on[HOME]['within_slo']}/{on[HOME]['windows']}")
    print(f"remote ({REMOTE}, own peak {args.remote_peak:g}x, half a day later): without {off[REMOTE]['within_slo']}/"
          f"{off[REMOTE]['windows']}, with {on[REMOTE]['within_slo']}/{on[REMOTE]['windows']}")
    print(f"spill share of home requests {on['spill_share']:.1%}; a spilled request's TTFT above an unqueued "
          f"local one: median {on.get('spilled_added_ms_median')} ms, P99 {on.get('spilled_added_ms_p99')} ms "
          f"(the round trip is {args.rtt_ms:g} ms)")
    print("trade-off: spill buys the home's peak windows with the remote's idle trough and costs each spilled "
          "request one inter-region round trip; the remote's own windows stay within the SLO only while its "
          "own load and the spill together fit (it advertises headroom only then), and when the peaks "
          "coincide there is nothing to spill into")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    sys.exit(run_quietly(main))
