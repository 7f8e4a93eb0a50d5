"""`make bench-simulate`: the CPU the planner's simulator (fleetcast/plan/simulate.py) takes per simulated request.

`fleetcast plan simulate`, and the suite's agreement tests, serve each checked hour's busiest minutes (about 20,000
to 100,000 requests) once per instance count tried, so its cost is this figure times the requests. Here: the
busiest checked hour of the planned pool of each scenario, at its planned count, on the seed results (synthetic).
Process CPU time, the best of --repeats, with the records' digest (the same digest before and after a change of
speed: the results did not move). It prints figures; nothing here is a test.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from pathlib import Path

from fleetcast.plan.run import PlanOptions, plan_fleet
from fleetcast.plan.simulate import FleetSim, _window_arrivals

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = {"seed": "examples/plan/seed/traffic-seoul-arrivals.yaml", "bursty": "examples/plan/bursty/traffic.yaml",
             "long-outputs": "examples/plan/long-outputs/traffic.yaml"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_simulate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per scenario; the fastest is reported (default 3)")
    ap.add_argument("--seed", type=int, default=7, help="the simulation's seed (plan simulate's default, 7)")
    args = ap.parse_args(argv)
    print(f"{'scenario':<14}{'requests':>10}{'instances':>11}{'CPU s':>8}{'us/request':>12}  records digest")
    for name, traffic in SCENARIOS.items():
        planned = plan_fleet(PlanOptions(results=[str(ROOT / "examples/plan/seed/results")], traffic=str(ROOT / traffic),
                                         config=str(ROOT / "config/fleet.yaml")))
        sizing = planned.pools()[0].serves[0].sizing
        assert sizing is not None and sizing.arrival_driven
        hour = max(range(24), key=lambda h: sum(m.hourly_rps()[h] * m.hourly_burstiness()[h] for m in sizing.members))
        streams = [(m.hourly_rps()[hour] * m.hourly_burstiness()[hour], m.output_tokens) for m in sizing.members]
        arrivals, horizon = _window_arrivals(streams, args.seed * 1000)
        n = sizing.processes[hour]
        best, digest = float("inf"), ""
        for _ in range(max(1, args.repeats)):
            sim = FleetSim(sizing.service, seed=args.seed * 1000 + 1)
            sim.start(n)
            start = time.process_time()
            sim.run(arrivals, until_s=horizon + 600.0)
            best = min(best, time.process_time() - start)
            rows = [(r.arrival_s, r.ttft_ms, r.itl_ms, r.done_s, r.stream, r.queued, r.ok) for r in sim.records]
            digest = hashlib.sha256(repr(rows).encode()).hexdigest()[:16]
        print(f"{name:<14}{len(arrivals):>10,}{n:>11}{best:>8.2f}{best / len(arrivals) * 1e6:>12.2f}  {digest}")
    return 0


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    raise SystemExit(run_quietly(main))
