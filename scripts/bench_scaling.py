"""`make bench-scaling`: a diurnal day with bursts through a simulated Auto Scaling group, under
(a) target tracking on per-instance load alone and (b) the same plus SLO protection
(stacks/fleet_scaling.py), with SLO attainment and instance-hours for each.

The fleet is the planner's simulator (fleetcast/plan/simulate.py: random routing, continuous
batching per the measured curve). The group follows what the synthesized policies do, one
CloudWatch minute at a time, acting on the previous minute's data (EMF lands and alarms
evaluate about a minute late):
- target tracking (scale-out only, DisableScaleIn): after 3 consecutive minutes with the mean
  ActiveRequests of the serving instances above target, desired = ceil(mean x serving / target);
  instances still warming are in desired already, so they count as capacity coming.
- SLO protection (b only): a minute whose SLO ratio max(P99 TTFT / SLO, P99 ITL / SLO) is above
  slo_scale_out_ratio sets desired to at least ceil(serving x 1.2) (x1.5 past the SLO), at least
  one more; a repeat while those instances warm asks for the same number, so nothing launches twice
  (EC2 Auto Scaling, "Set the default instance warmup for an Auto Scaling group").
- scale-in (both): one instance after 15 consecutive minutes in which the load over one instance
  fewer stays under target, at most once per scale_in_cooldown_s, never while instances warm up;
  in (b) only while the SLO ratio is at or below slo_scale_in_ratio in each of those minutes.
- a launch resumes a warm-pool instance when one is ready (warm-pool resume time), else starts cold
  (launch-to-healthy); the warm pool refills behind it. Stopped warm-pool instances are not billed
  as instance-hours (EBS only); pending and draining instances are.

Launch timings: production-scale assumptions (ASSUMPTIONS below) around the cache-hit start that
`make demo` measures (python -m runtime.demo: "cache hit: start to healthy"); pass --cache-hit-s with
your own measurement. None of this is a test: it prints figures.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from dataclasses import dataclass, field

from fleetcast.config.model import ScalingSpec
from fleetcast.plan.curves import Candidate
from fleetcast.plan.inputs import load_candidates
from fleetcast.plan.queueing import Limits, ServiceModel, max_safe_rate
from fleetcast.plan.simulate import Arrival, FleetSim, p99
from fleetcast.plan.solver import TargetPart, scaling_target

# Production-scale launch assumptions (seconds), stated so they can be argued with:
ASSUMPTIONS = {
    "ec2_launch_and_boot_s": 90.0,   # RunInstances to the bootstrap unit starting on a GPU AMI
    "engine_download_s": 16.0,       # a 3.2 GB GPT-2 XL fp16 engine from the S3 cache at ~200 MB/s
    "engine_load_s": 20.0,           # trtllm-serve loading the engine onto the GPU to /health
    "warm_resume_s": 40.0,           # a stopped warm-pool instance back to running (engine on its disk)
}
DEMO_CACHE_HIT_S = 1.31  # `make demo` on the development machine: bootstrap start -> launch hook CONTINUE, cache hit

SCALING_DEFAULTS = ScalingSpec()
TT_HIGH_MINUTES = 3  # target tracking's scale-out alarm: 3 one-minute datapoints above target
SCALE_IN_MINUTES = 15
SLO_STEP_NEAR, SLO_STEP_PAST = 0.20, 0.50  # stacks.fleet_scaling.SLO_STEPS, as fractions


@dataclass
class Policy:
    name: str
    target: float
    slo_protection: bool
    out_ratio: float = SCALING_DEFAULTS.slo_scale_out_ratio
    in_ratio: float = SCALING_DEFAULTS.slo_scale_in_ratio
    scale_in_cooldown_s: float = 600.0


@dataclass
class Outcome:
    policy: Policy
    windows: int
    windows_ok: int
    requests: int
    requests_ok: int
    instance_hours: float
    peak_instances: int
    launches: int
    minutes_log: list = field(default_factory=list)

    @property
    def window_attainment(self) -> float:
        return self.windows_ok / max(self.windows, 1)

    @property
    def request_attainment(self) -> float:
        return self.requests_ok / max(self.requests, 1)


def diurnal_trace(peak_rps: float, seed: int, hours: float = 24.0) -> list[float]:
    """Per-minute arrival rates: a day from 25% to 100% of peak, with bursts: a 2-minute ramp to 1.4-1.9x the
    current rate, held 6-18 minutes, about every 80 minutes."""
    rng = random.Random(seed)
    minutes = int(hours * 60)
    base = [peak_rps * (0.25 + 0.75 * (0.5 * (1 - math.cos(2 * math.pi * ((m / 60.0 - 3) % 24) / 24))) ** 1.5)
            for m in range(minutes)]
    factor = [1.0] * minutes
    m = rng.randrange(20, 60)
    while m < minutes:
        height, hold = rng.uniform(1.4, 1.9), rng.randrange(6, 19)
        for k in range(hold + 2):
            if m + k < minutes:
                factor[m + k] = 1 + (height - 1) * min(1.0, (k + 1) / 2)
        m += hold + 2 + rng.randrange(50, 110)
    return [b * f for b, f in zip(base, factor)]


def arrivals_for(rates: list[float], output_tokens: int, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    out = []
    for m, rate in enumerate(rates):
        t, end = m * 60.0, (m + 1) * 60.0
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                break
            out.append(Arrival(t, 0, output_tokens))
    return out


class Group:
    """The Auto Scaling side: desired capacity, warm pool, the policies' minute-by-minute decisions."""

    def __init__(self, sim: FleetSim, policy: Policy, slo, min_n: int, max_n: int, warm_size: int,
                 cold_s: float, warm_s: float) -> None:
        self.sim, self.policy, self.slo = sim, policy, slo
        self.min_n, self.max_n = min_n, max_n
        self.cold_s, self.warm_s = cold_s, warm_s
        self.warm_size = warm_size
        self.warm_ready = warm_size  # stopped instances ready to resume
        self.warm_refills: list[float] = []  # when each refilling warm instance is ready (stopped, engine on disk)
        self.high_streak = 0
        self.low_streak = 0
        self.last_scale_in = -1e9
        self.launches = 0
        self.prev = None  # the previous minute's metrics (what the alarms see now)
        self.done_upto = 0
        self.log: list[tuple] = []
        sim.start(min_n)

    def desired(self) -> int:
        return len(self.sim.routable) + self.sim.pending

    def _launch(self, n: int, t: float) -> None:
        for _ in range(n):
            self.warm_ready += sum(1 for r in self.warm_refills if r <= t)
            self.warm_refills = [r for r in self.warm_refills if r > t]
            if self.warm_ready > 0:
                self.warm_ready -= 1
                self.sim.launch(self.warm_s)
                self.warm_refills.append(t + self.cold_s)  # the pool prepares a replacement and stops it
            else:
                self.sim.launch(self.cold_s)
            self.launches += 1

    def _minute_stats(self, t: float) -> tuple[float, float, int]:
        area = self.sim.take_load_area()
        serving = max(len(self.sim.routable), 1)
        load = area / 60000.0 / serving
        rows = self.sim.rows  # simulate.Row: (arrival_s, ttft_ms, itl_ms, done_s, stream, queued, ok)
        window = [r for r in rows[self.done_upto:] if r[6]]
        self.done_upto = len(rows)
        ratio = 0.0
        if window:
            ratio = max(p99([r[1] for r in window]) / self.slo.ttft_p99_ms,
                        p99([r[2] for r in window if r[2] is not None] or [0.0]) / self.slo.itl_p99_ms)
        return load, ratio, len(window)

    def tick(self, sim: FleetSim, t: float) -> None:
        now = self._minute_stats(t)
        seen, self.prev = self.prev, now
        self.log.append((t, len(sim.routable), sim.pending, now[0], now[1]))
        if seen is None:
            return
        load, ratio, _ = seen
        serving = len(sim.routable)
        desired = self.desired()
        want = desired
        p = self.policy
        self.high_streak = self.high_streak + 1 if load > p.target else 0
        if self.high_streak >= TT_HIGH_MINUTES:
            want = max(want, math.ceil(load * serving / p.target))
        if p.slo_protection and ratio > p.out_ratio:
            step = SLO_STEP_PAST if ratio >= 1.0 else SLO_STEP_NEAR
            want = max(want, serving + max(1, math.floor(serving * step)))
        want = min(want, self.max_n)
        if want > desired:
            self._launch(want - desired, t)
            self.low_streak = 0
            return
        after = load * serving / (serving - 1) if serving > 1 else p.target
        gate = (not p.slo_protection) or ratio <= p.in_ratio
        self.low_streak = self.low_streak + 1 if (after < p.target and gate) else 0
        if (self.low_streak >= SCALE_IN_MINUTES and sim.pending == 0 and serving > self.min_n
                and t - self.last_scale_in >= p.scale_in_cooldown_s):
            if sim.drain_one():
                self.last_scale_in = t
                self.low_streak = 0
                if self.warm_ready + len(self.warm_refills) < self.warm_size:
                    self.warm_ready += 1  # reuse_on_scale_in: back to the warm pool


def run_policy(model: ServiceModel, policy: Policy, slo, rates: list[float], arrivals: list[Arrival], *, min_n: int,
               max_n: int, warm_size: int, cold_s: float, warm_s: float, seed: int) -> Outcome:
    sim = FleetSim(model, seed=seed)
    group = Group(sim, policy, slo, min_n, max_n, warm_size, cold_s, warm_s)
    horizon = len(rates) * 60.0
    sim.run(arrivals, until_s=horizon + 300.0, tick_s=60.0, on_tick=group.tick)
    per_minute: dict[int, list] = {}
    ok_requests = 0
    for r in sim.rows:  # simulate.Row: (arrival_s, ttft_ms, itl_ms, done_s, stream, queued, ok)
        good = r[6] and r[1] <= slo.ttft_p99_ms and (r[2] is None or r[2] <= slo.itl_p99_ms)
        ok_requests += good
        if r[3] < horizon:
            per_minute.setdefault(int(r[3] // 60), []).append(r)
    windows_ok = 0
    for rows in per_minute.values():
        ok = [r for r in rows if r[6]]
        if len(ok) == len(rows) and p99([r[1] for r in ok]) <= slo.ttft_p99_ms and \
                p99([r[2] for r in ok if r[2] is not None] or [0.0]) <= slo.itl_p99_ms:
            windows_ok += 1
    return Outcome(policy, len(per_minute), windows_ok, len(sim.rows), ok_requests,
                   sim.instance_seconds(horizon) / 3600.0, max(n for _, n, _, _, _ in group.log), group.launches,
                   group.log)


def write_day_plot(path: str, rates: list[float], outcomes: list[Outcome], slo) -> str:
    """The day at a glance: arrivals per minute; instances serving per minute under each policy drawn; and each
    policy's SLO windows, the minutes whose P99 TTFT or ITL exceeded the SLO marked on its own row, in its line's
    colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = [m / 60.0 for m in range(len(rates))]
    fig, (arr, inst, win) = plt.subplots(3, 1, figsize=(10, 8), sharex=True,
                                         gridspec_kw={"height_ratios": [1, 1.5, 0.25 + 0.3 * len(outcomes)]})
    arr.plot(hours, rates, color="0.35", linewidth=0.8)
    arr.set_ylabel("arrivals (req/s)")
    arr.set_ylim(0, max(rates) * 1.1)
    arr.set_title(f"Scaling over the simulated day: SLO P99 TTFT {slo.ttft_p99_ms:g} ms, P99 ITL {slo.itl_p99_ms:g} ms",
                  fontsize=10)
    styles = ["-", "--", ":"]
    for i, o in enumerate(outcomes):
        t = [row[0] / 3600.0 for row in o.minutes_log]
        n = [row[1] for row in o.minutes_log]
        inst.step(t, n, where="post", color=f"C{i}", linestyle=styles[i % 3], linewidth=1.6 if i == 0 else 1.2,
                  label=f"{o.policy.name}: {o.instance_hours:.0f} instance-hours, windows in SLO "
                        f"{o.window_attainment:.2%}")
        # A minute whose P99 over the SLO ratio (logged by the group, the signal SLO protection acts on) exceeds 1.
        over = [row[0] / 3600.0 for row in o.minutes_log if row[4] > 1.0]
        row_y = len(outcomes) - 1 - i
        win.broken_barh([(x - 1 / 60.0, 1 / 60.0) for x in over], (row_y + 0.15, 0.7), color=f"C{i}")
    inst.set_ylabel("instances serving")
    inst.set_ylim(0, max(row[1] for o in outcomes for row in o.minutes_log) * 1.15 + 0.5)
    win.set_yticks([len(outcomes) - 1 - i + 0.5 for i in range(len(outcomes))])
    # Two (a) rows differ only by target: the label carries it, and each row has its line's colour.
    win.set_yticklabels([o.policy.name.replace(" load target", " target").replace(" + SLO protection", " + SLO")
                         for o in outcomes], fontsize=8)
    for i, tick in enumerate(win.get_yticklabels()):
        tick.set_color(f"C{i}")
    win.set_ylim(0, len(outcomes))
    win.set_title("SLO windows: each mark a minute whose P99 TTFT or ITL exceeded the SLO, one row per policy",
                  fontsize=9, loc="left")
    win.set_xlim(0, len(rates) / 60.0)
    win.set_xticks(range(0, int(len(rates) / 60.0) + 1, 3 if len(rates) > 360 else 1))
    win.set_xlabel("hour of the simulated day")
    for ax in (arr, inst, win):
        ax.grid(alpha=0.3, axis="x")
    arr.grid(alpha=0.3)
    inst.grid(alpha=0.3)
    fig.tight_layout()
    handles, labels = inst.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=1, frameon=False)
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_scaling", description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default="examples/plan/seed/results/g5.xlarge-fp16.json",
                    help="one candidate's bench results (default: the seed's g5.xlarge fp16)")
    ap.add_argument("--peak-rps", type=float, default=40.0, help="the day's peak mean arrival rate (default 40)")
    ap.add_argument("--hours", type=float, default=24.0, help="trace length (default 24)")
    ap.add_argument("--ttft-p99-ms", type=float, default=300.0)
    ap.add_argument("--itl-p99-ms", type=float, default=40.0)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--cache-hit-s", type=float, default=DEMO_CACHE_HIT_S,
                    help=f"measured cache-hit start to healthy (default {DEMO_CACHE_HIT_S}, `make demo`)")
    ap.add_argument("--warm-pool", type=int, default=1, help="warm pool size (config/fleet.yaml: 1)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out-ratio", type=float, default=SCALING_DEFAULTS.slo_scale_out_ratio,
                    help="scaling.slo_scale_out_ratio (default: the config default)")
    ap.add_argument("--in-ratio", type=float, default=SCALING_DEFAULTS.slo_scale_in_ratio,
                    help="scaling.slo_scale_in_ratio (default: the config default)")
    ap.add_argument("--plot", metavar="PNG", help="draw the day (arrivals, instances and SLO windows of (b), (a) at "
                    "the planner's target and (a) matched) into this PNG; `make bench-scaling` writes "
                    "build/bench-scaling.png")
    args = ap.parse_args(argv)

    (cand,) = load_candidates([args.results])[:1] or [None]
    if not isinstance(cand, Candidate):
        print(f"--results: no candidate in {args.results}", file=sys.stderr)
        return 2
    model = ServiceModel(cand.curve)
    slo = argparse.Namespace(ttft_p99_ms=args.ttft_p99_ms, itl_p99_ms=args.itl_p99_ms)
    limits = Limits(args.ttft_p99_ms, args.itl_p99_ms, 0.01)
    safe = max_safe_rate(model, args.output_tokens, limits)
    if safe is None:
        print("the candidate misses the SLO even at one request per instance", file=sys.stderr)
        return 1
    x_star, at_safe, binding = safe
    # The planner's target, no burst allowance (a flat day at burstiness 1: only the target headroom).
    target = scaling_target([TargetPart(model, args.output_tokens, x_star, 1, (1.0,) * 24, (1.0,) * 24)])
    a = ASSUMPTIONS
    cold = a["ec2_launch_and_boot_s"] + a["engine_download_s"] + a["engine_load_s"] + args.cache_hit_s
    warm = a["warm_resume_s"] + a["engine_load_s"] + args.cache_hit_s
    rates = diurnal_trace(args.peak_rps, args.seed, args.hours)
    arrivals = arrivals_for(rates, args.output_tokens, args.seed + 1)
    max_n = math.ceil(max(rates) * 2 / x_star) + 2
    min_n = max(1, math.floor(min(rates) / x_star))
    print(f"candidate {cand.label}; SLO P99 TTFT {args.ttft_p99_ms:g} ms, P99 ITL {args.itl_p99_ms:g} ms; SLO-safe "
          f"{x_star:.2f} req/s per instance ({at_safe.in_flight:.1f} in flight, capped by {binding}); planner "
          f"target {target:g} ActiveRequests")
    print(f"trace: {args.hours:g} h diurnal, peak {args.peak_rps:g} req/s mean with bursts to {max(rates):.1f}; "
          f"{len(arrivals):,} requests; seed {args.seed}")
    print(f"launch: cold {cold:.0f} s = boot {a['ec2_launch_and_boot_s']:g} + engine download "
          f"{a['engine_download_s']:g} + load {a['engine_load_s']:g} + measured cache-hit start {args.cache_hit_s:g}; "
          f"warm pool ({args.warm_pool}) resume {warm:.0f} s = resume {a['warm_resume_s']:g} + load "
          f"{a['engine_load_s']:g} + {args.cache_hit_s:g} (assumptions: scripts/bench_scaling.py ASSUMPTIONS)")
    print(f"group: min {min_n}, max {max_n}")
    common = dict(min_n=min_n, max_n=max_n, warm_size=args.warm_pool, cold_s=cold, warm_s=warm, seed=args.seed + 2)

    def show(o: Outcome) -> None:
        print(f"  {o.policy.name:<44} windows in SLO {o.window_attainment:7.2%}  requests in SLO "
              f"{o.request_attainment:7.2%}  instance-hours {o.instance_hours:7.1f}  peak {o.peak_instances:>3}  "
              f"launches {o.launches}")

    fractions = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)

    def targets():
        seen = []
        for frac in fractions:
            t = max(0.5, round(target * frac, 1))
            if t not in seen:
                seen.append(t)
                yield t

    print(f"(b) load target + SLO protection (scale out above {args.out_ratio:g} of the SLO, no scale-in above "
          f"{args.in_ratio:g}), from the planner's target down until >= 99% of windows are within SLO:")
    b_out = None
    for t in targets():
        o = run_policy(model, Policy(f"(b) load target {t:g} + SLO protection", t, True, args.out_ratio, args.in_ratio),
                       slo, rates, arrivals, **common)
        show(o)
        if b_out is None or o.window_attainment > b_out.window_attainment:
            b_out = o
        if o.window_attainment >= 0.99:
            b_out = o
            break
    print("(a) load target alone, from the planner's target down until it matches (b)'s window attainment:")
    matched = first_99 = None
    a_runs = []
    for t in targets():
        o = run_policy(model, Policy(f"(a) load target {t:g}", t, False), slo, rates, arrivals, **common)
        a_runs.append(o)
        show(o)
        if first_99 is None and o.window_attainment >= 0.99:
            first_99 = o
        if o.window_attainment >= b_out.window_attainment:
            matched = o
            break
    goal = b_out.window_attainment >= 0.99
    print(f"goal (b) >= 99% of windows within SLO: {'met' if goal else 'NOT met'} ({b_out.window_attainment:.2%} "
          f"at target {b_out.policy.target:g})")
    if matched is not None:
        print(f"(a) reaches {b_out.window_attainment:.2%} at target {matched.policy.target:g} with "
              f"{matched.instance_hours:.1f} instance-hours vs (b)'s {b_out.instance_hours:.1f} "
              f"({(b_out.instance_hours / matched.instance_hours - 1) * 100:+.0f}% for (b)): "
              f"{'goal met' if goal and b_out.instance_hours <= matched.instance_hours else 'goal NOT met'}")
    else:
        print(f"(a) does not reach {b_out.window_attainment:.2%} at any target tried")
    if first_99 is not None:
        print(f"(a) first clears 99% at target {first_99.policy.target:g}: {first_99.window_attainment:.2%} on "
              f"{first_99.instance_hours:.1f} instance-hours")
    print("trade-off: (b) spends instances only once the SLO ratio rises and holds them through the burst, so it needs "
          "no re-tuned target; (a) must hold its headroom all day, bursts or not. Neither catches a burst that "
          "arrives faster than an instance launches: only standing headroom (target, warm pool, schedule) does")
    if args.plot:
        drawn = [b_out, a_runs[0]] + ([matched] if matched is not None and matched is not a_runs[0] else [])
        print(f"picture: {write_day_plot(args.plot, rates, drawn, slo)}")
    return 0


if __name__ == "__main__":
    from fleetcast.contract.entry import run_quietly

    raise SystemExit(run_quietly(main))
