"""The seed scenario, worked by hand: g5 / g6e / g7e x fp16 / int8_wo / fp8 for GPT-2 XL,
consumers in Seoul, traffic mostly at batch 1-16 (examples/plan/seed, synthetic data).

Shared hand-calculation facts (from examples/plan/seed/make_results.py):
  mean E2E W(c) = TTFT_mean(c) + 127 * ITL_mean(c), linear in c:
    g6e int8_wo: 12 + 4c + 127(3.4 + 0.06c)   = 443.8 + 11.62c ms
    g6e fp8:     10 + 2.2c + 127(3.8 + 0.03c)  = 492.6 + 6.01c ms
    g5 int8_wo:  28 + 9c + 127(5.2 + 0.12c)    = 688.4 + 24.24c ms
    g7e fp8:     5 + 1.2c + 127(1.7 + 0.015c)  = 220.9 + 3.105c ms
  Seoul traffic: 120 req/s for 9 h, 180 for 4 h, 20 for 9 h, 80 for 2 h (2140 req/s-hours);
  levels {1-16: 0.80 (each integer 0.05), 32: 0.15, 64: 0.05}; 256 in / 128 out tokens.
  Instance-seconds per request S(k) = sum_l w_l W(min(l,k)) / min(l,k), and
  sum_{c=1}^{16} (a + b c)/c = a H16 + 16 b with H16 = 3.380728993.
  Fixed costs (shipped table, same for every candidate in one region): GB per request
  (256*4 + 128*180 + 1500)/1e9 = 2.5564e-5; the NLB LCU is the GB/hour, so each hour costs
  nlb 0.0225 + endpoints (7 provider + 1 consumer) * 2 AZ * az_hour + rps*3600*2.5564e-5*(0.006 + 0.01).
"""

from __future__ import annotations

import functools
import math

import pytest

from fleetcast.plan.packing import PackingEval, RegionPacking, scaling_target
from fleetcast.plan.run import PlanOptions, build_packing

from .conftest import SEED

H16 = sum(1 / c for c in range(1, 17))
H4 = 1 + 1 / 2 + 1 / 3 + 1 / 4
HOURS = [(120, 9), (180, 4), (20, 9), (80, 2)]  # (req/s, hours) in the Seoul profile
GB_PER_REQUEST = (256 * 4 + 128 * 180 + 1500) / 1e9


def fixed_per_day(az_hour: float) -> float:
    # 12 interface endpoints in 2 AZs: the provider stack's 11 (tests/plan/test_fixed_costs.py checks the count
    # against the synthesized template) and the consumer's one.
    return sum(h * (0.0225 + 12 * 2 * az_hour + rps * 3600 * GB_PER_REQUEST * 0.016) for rps, h in HOURS)


def instance_hours(seconds_per_request: float) -> int:
    return sum(h * max(1, math.ceil(rps * seconds_per_request)) for rps, h in HOURS)


@functools.cache
def run(traffic="traffic-seoul.yaml", ttft=300.0, quality=None) -> RegionPacking:
    """The seed planned once per set of inputs, which the module's tests share: one model, a packing of one."""
    opts = PlanOptions(results=[str(SEED / "results")], traffic=str(SEED / traffic), config=None,
                       ttft_p99_ms=ttft, itl_p99_ms=40.0, error_rate=0.01,
                       quality=str(SEED / quality) if quality else None)
    result, _, _ = build_packing(opts)
    (plan,) = result.regions
    return plan


def candidate(ev: PackingEval) -> str:
    """A packing of one process named as the candidate it runs: "g6e.xlarge int8_wo"."""
    (load,) = ev.loads
    return f"{ev.instance_type} {load.precision}"


def best(plan: RegionPacking, label: str) -> PackingEval:
    return next(e for e in plan.ranked if candidate(e) == label)


def reason(plan: RegionPacking, label: str) -> str:
    itype, precision = label.split()
    return next(why for name, why in plan.why_not() if name.startswith(f"{itype} [gpt2-xl {precision} x1]"))


def test_seed_picks_g6e_int8_for_seoul_by_hand():
    plan = run()
    win = plan.winner
    assert (candidate(win), win.region) == ("g6e.xlarge int8_wo", "ap-northeast-2")

    # P99 TTFT (bench and service both in-region, so +0 ms): 30 52 80 140 232 296 | 380 at c=64 > 300.
    assert win.max_load == 48 and scaling_target(win) == 48
    s = (0.80 * (443.8 * H16 + 11.62 * 16) / 16 + 0.15 * (443.8 + 11.62 * 32) / 32
         + 0.05 * (443.8 + 11.62 * 48) / 48) / 1000          # = 0.08917 s
    assert win.seconds_per_request == pytest.approx(s, rel=1e-6)
    # 120*0.08917 = 10.7 -> 11, 180* -> 16.05 -> 17, 20* -> 1.8 -> 2, 80* -> 7.1 -> 8
    assert win.instances_by_hour == [11] * 9 + [17] * 4 + [2] * 9 + [8] * 2
    assert instance_hours(s) == 201
    day = 201 * 2.288 + fixed_per_day(0.013)                  # 459.89 + 11.18
    assert win.cost_per_hour == pytest.approx(day / 24, rel=1e-6)   # $19.63/h
    assert win.usd_per_m_output == pytest.approx(day / (2140 * 3600 * 128) * 1e6, rel=1e-6)  # $0.475
    assert win.usd_per_m_input == pytest.approx(day / (2140 * 3600 * 256) * 1e6, rel=1e-6)
    assert win.capacity() == (2, 9, 17)                        # desired: ceil(201 / 24)


def test_seed_explains_why_g5_loses_on_ttft_at_seouls_load():
    plan = run()
    g5 = best(plan, "g5.xlarge int8_wo")
    # P99 TTFT 312 ms > 300 at c=8, so k = 4: levels 5-16 and 32/64 all run at 4 per instance.
    failure = g5.loads[0].histogram.first_failure
    assert g5.max_load == 4 and failure.metric == "P99 TTFT" and failure.level == 8
    s = (0.80 * ((688.4 * H4 + 24.24 * 4) + 12 * (688.4 + 24.24 * 4) / 4) / 16
         + 0.20 * (688.4 + 24.24 * 4) / 4) / 1000              # = 0.23363 s
    assert g5.seconds_per_request == pytest.approx(s, rel=1e-6)
    assert instance_hours(s) == 9 * 29 + 4 * 43 + 9 * 5 + 2 * 19 == 516
    assert g5.cost_per_hour == pytest.approx((516 * 1.237 + fixed_per_day(0.013)) / 24, rel=1e-6)  # $27.06 > $19.63
    why = reason(plan, "g5.xlarge int8_wo")
    assert "P99 TTFT 312 ms" in why and "> 300 ms at concurrency 8" in why and "caps its load at 4" in why
    assert "80% of ap-northeast-2's requests" in why   # levels 5-16 (0.6) + 32 + 64 (0.2)


def test_seed_explains_why_g7e_is_ruled_out():
    plan = run()
    assert not any(e.instance_type.startswith("g7e.") for e in plan.evaluations)
    # Ruled out as an instance type, before any of its precisions (fp8, fp16) is tried: one line says it for both.
    why = dict(plan.ruled_out())["g7e.2xlarge"]
    assert why.startswith("not offered in ap-northeast-2 (availability as of 2026-01-15)")
    assert "ap-northeast-2 is not in the cross-region PrivateLink table" in why


def test_seed_explains_why_the_peak_throughput_choice_loses():
    plan = run()
    # Peak output throughput: g7e fp8 at c=64: 64 * 128 / 0.41962 s = 19,522 tok/s (not offered);
    # among offered types g6e fp8 at c=64: 64 * 128 / 0.87724 s = 9,338 tok/s.
    peak_overall, peak_local = plan.peak_notes
    # Each note names its scope, so the two read as two facts, not two contradictory "peak-throughput choices".
    assert peak_overall.startswith("highest peak throughput of all candidates: g7e.2xlarge fp8, 19,522")
    assert peak_overall.endswith("not the choice: ruled out: g7e is not offered in ap-northeast-2 "
                                 "(availability as of 2026-01-15)")
    assert peak_local.startswith("highest peak throughput of the types offered in ap-northeast-2: g6e.xlarge fp8, "
                                 "9,338") and "5% of" in peak_local and "not the choice: +4% cost" in peak_local
    fp8 = best(plan, "g6e.xlarge fp8")
    s = (0.80 * (492.6 * H16 + 6.01 * 16) / 16 + 0.15 * (492.6 + 6.01 * 32) / 32
         + 0.05 * (492.6 + 6.01 * 64) / 64) / 1000            # = 0.09197 s: slower at batch 1-16
    assert fp8.max_load == 64 and fp8.seconds_per_request == pytest.approx(s, rel=1e-6)
    # 120 * 0.09197 = 11.04 -> 12 instances in the 9 business hours (int8_wo needs 11): +9 instance-hours.
    assert fp8.instance_hours == 201 + 9
    assert fp8.cost_per_hour - plan.winner.cost_per_hour == pytest.approx(9 * 2.288 / 24, rel=1e-6)
    assert "+4%" in reason(plan, "g6e.xlarge fp8")


def test_seed_reports_statistical_honesty():
    plan = run()
    notes = " | ".join(plan.stats_notes)
    # int8_wo passes at c=48 with P99 296 ms, but the CI (296*0.952, 296*1.06) = (282, 314) holds 300.
    assert "target load 48 the P99 TTFT CI (282-314 ms) contains the 300 ms SLO" in notes
    # If c=48 fails on a longer run, k = 32: S = 0.8*105.393 + 0.15*W(32)/32 + 0.05*W(32)/32 = 89.41 ms,
    # still 11/17/2/8 instances (120*0.08941 = 10.7): the same $19.63/h, and no rival is cheaper.
    assert "the target drops to 32 and the cost to $19.63/h (+0.0%), still the cheapest" in notes
    assert "within noise on traffic-weighted P99 TTFT" in notes


def test_relaxed_ttft_slo_makes_the_cheaper_g5_win():
    plan = run(ttft=1000.0)
    win = plan.winner
    assert candidate(win) == "g5.xlarge int8_wo"
    # g5 P99 TTFT 990 ms at c=48 passes, 1290 at 64 fails: k = 48.
    s = (0.80 * (688.4 * H16 + 24.24 * 16) / 16 + 0.15 * (688.4 + 24.24 * 32) / 32
         + 0.05 * (688.4 + 24.24 * 48) / 48) / 1000           # = 0.14455 s
    assert scaling_target(win) == 48 and win.seconds_per_request == pytest.approx(s, rel=1e-6)
    assert win.instance_hours == 9 * 18 + 4 * 27 + 9 * 3 + 2 * 12 == 321
    assert win.cost_per_hour == pytest.approx((321 * 1.237 + fixed_per_day(0.013)) / 24, rel=1e-6)  # $17.01
    assert best(plan, "g6e.xlarge int8_wo").cost_per_hour == pytest.approx((201 * 2.288 + fixed_per_day(0.013)) / 24)


def test_batch_64_traffic_makes_fp8_win():
    plan = run(traffic="traffic-batch64.yaml")
    win = plan.winner
    assert candidate(win) == "g6e.xlarge fp8"
    # Every request at level 64: fp8 holds 64 (P99 TTFT 290 ms): S = W(64)/64 = 877.24/64 ms;
    # int8_wo caps at 48 (380 ms at 64): S = W(48)/48 = 991.56/48 ms.
    assert win.seconds_per_request == pytest.approx((492.6 + 6.01 * 64) / 64 / 1000, rel=1e-6)
    int8 = best(plan, "g6e.xlarge int8_wo")
    assert int8.seconds_per_request == pytest.approx((443.8 + 11.62 * 48) / 48 / 1000, rel=1e-6)
    # fp8: 120*.01371 -> 2, 180* -> 3, 20* -> 1, 80* -> 2 = 43 h; int8: 3, 4, 1, 2 = 56 h.
    assert win.instance_hours == 43 and int8.instance_hours == 56
    assert "caps its load at 48" in reason(plan, "g6e.xlarge int8_wo")


def test_consumers_in_us_east_1_would_pick_g7e_but_its_engine_flow_is_refused():
    plan = run(traffic="traffic-us-east-1.yaml")
    win = plan.winner
    # g7e fp8 would cost $13.49/h (94 instance-hours of the mean E2E 220.9 + 3.105c ms at $3.363), but GPT-2 runs on
    # the engine flow, which no TensorRT-LLM 1.2.x source supports on sm120 (fleetcast/contract/support.py).
    assert (candidate(win), win.region) == ("g6e.xlarge int8_wo", "us-east-1")
    assert win.cost_per_hour == pytest.approx((201 * 1.861 + fixed_per_day(0.010)) / 24, rel=1e-6)
    for precision in ("fp8", "fp16"):
        why = dict(plan.refused)[f"gpt2-xl {precision} on g7e.2xlarge"]
        assert why.startswith("the tensorrt backend is not supported on g7e.2xlarge (RTXPRO6000, sm120)")
        assert "refused until measured" in why and "the config validator would refuse it" in why
    # The report rules them out as one group, with the reason.
    assert dict(plan.ruled_out())["2 candidate(s)"].startswith("the tensorrt backend is not supported on g7e.2xlarge")


def test_failed_quality_check_excludes_int8():
    plan = run(quality="quality-int8-fails.yaml")
    assert candidate(plan.winner) == "g6e.xlarge fp8"
    assert not any(candidate(e) == "g6e.xlarge int8_wo" for e in plan.evaluations)
    (why,) = [n for n in plan.notes if n.startswith("gpt2-xl int8_wo on g6e.xlarge: ")]
    assert why.endswith("ruled out: quality check failed: perplexity_delta_pct 1.8 > threshold 1")
    assert "cross-region" not in why   # quality does not depend on the region
