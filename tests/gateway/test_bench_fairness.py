"""scripts/bench_fairness.py and bench_gateway's fair-admission line: what they set up and what they print
(the measurements themselves are load-dependent, so they are printed, never asserted)."""

from __future__ import annotations

from fleetcast.config import parse_config
from runtime.gateway.fair import admission_caps
from scripts.bench_fairness import NEIGHBOUR, QUIET, fairness_config
from scripts.bench_gateway import POOL, REGION, fair_admission_cpu


def test_the_fairness_bench_serves_two_accounts_from_one_engine_capped_at_its_batch():
    cfg = parse_config(fairness_config(8), "<test>")
    assert admission_caps(cfg, POOL) == {cfg.models[0].id: 8}
    served = {c.name: c.account for c in cfg.consumers_of(REGION)}
    assert served == {QUIET[0]: QUIET[1], NEIGHBOUR[0]: NEIGHBOUR[1]}
    # Limits and queues far above the load: only the admission order decides who waits.
    assert all(c.limits.max_concurrency == 10000 and c.admission.max_queued == 10000 for c in cfg.consumers)


def test_bench_gateway_prints_fair_admissions_cpu_only_against_a_run_with_it_off():
    levels = {16: {"gateway": {"cpu_ms_per_request": 0.210}, "gateway-alt": {"cpu_ms_per_request": 0.195}}}
    on = fair_admission_cpu({"config": {"alt_arg": ["--fair-admission=off"]}, "levels": levels})
    assert on[1] == "  c=16: +0.015 (0.210 on, 0.195 off)"
    assert fair_admission_cpu({"config": {"alt_arg": ["--workers=2"]}, "levels": levels}) == []


def test_bench_gateways_config_sets_a_cap_its_levels_never_reach():
    from scripts.bench_gateway import bench_config_data

    caps = admission_caps(parse_config(bench_config_data(), "<test>"), POOL)
    assert min(caps.values()) >= 2 * 128  # above the soft cap at its busiest level: it times the hop, not a queue
