"""Load modes against the loopback test server: what each mode sends, and when."""

from collections import Counter

import pytest

from fleetcast.bench.distributions import parse_distribution
from fleetcast.bench.runner import Bench, BenchOptions, Level, load_trace
from fleetcast.contract.errors import UserError


def opts(server, levels, **kw):
    base = dict(endpoint=server.url, levels=levels, requests_per_level=12, warmup=0,
                input_tokens=parse_distribution("32", "--input-tokens"),
                output_tokens=parse_distribution("8", "--output-tokens"))
    base.update(kw)
    return BenchOptions(**base)


def peak_in_flight(records) -> int:
    events = sorted([(r.start_s, 1) for r in records] + [(r.start_s + r.e2e_ms / 1000.0, -1) for r in records])
    level = peak = 0
    for _, step in events:  # at equal times an end (-1) sorts before a start: touching is not overlapping
        level += step
        peak = max(peak, level)
    return peak


def test_concurrency_sweep_runs_each_level_at_its_concurrency(fast_server):
    res = Bench(opts(fast_server, [Level("concurrency", concurrency=c) for c in (1, 4)], requests_per_level=16)).run()
    assert [r.load.concurrency for r in res.runs] == [1, 4]
    for run, c in zip(res.runs, (1, 4)):
        s = run.summary
        assert (s.requests, s.completed, s.errors) == (16, 16, 0)
        # Never more than c in flight, and c at once at some moment (the closed loop starts c together). The mean
        # over the run is reported but not bounded below: a late straggler on a loaded machine lowers it.
        assert peak_in_flight(run.records) == c and 0 < s.mean_concurrency <= c
        assert all(r.output_tokens == 8 and r.input_tokens == 32 for r in run.records)
        assert all(r.concurrency == c for r in run.records)
        # Server truth: 10 ms to the first token, then 2 ms per token. Nothing is faster than the truth; how much
        # slower is the machine's doing, so the upper bounds only catch a unit mistake (seconds, microseconds).
        assert 10 <= s.ttft_ms.p50 < 1000 and 2 <= s.itl_ms.p50 < 200
    assert res.labels.model == "fleetcast-testserver"  # discovered from /v1/models
    assert res.runs[0].summary.output_throughput_tps < res.runs[1].summary.output_throughput_tps


def test_constant_rate_spaces_request_starts_evenly(fast_server):
    res = Bench(opts(fast_server, [Level("rate", rate_rps=50, arrival="constant")], requests_per_level=10)).run()
    starts = [r.start_s for r in res.runs[0].records]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(starts) == 10 and all(g > 0 for g in gaps)
    # Each start is on its 20 ms slot, give or take the schedule lag this run measured (as for trace replay).
    lag_s = res.runs[0].summary.schedule_lag_ms.max / 1000.0
    for i, start in enumerate(starts):
        assert 0.020 * i - 0.002 - lag_s <= start <= 0.020 * i + lag_s + 0.002
    assert res.runs[0].load.rate_rps == 50 and res.runs[0].load.arrival == "constant"


def test_poisson_arrivals_are_seeded_and_reproducible(fast_server):
    o = opts(fast_server, [Level("rate", rate_rps=100, arrival="poisson")], requests_per_level=10, seed=9)
    a, b = Bench(o), Bench(o)
    plan_a, plan_b = a._rate_plan(o.levels[0], 10), b._rate_plan(o.levels[0], 10)
    assert plan_a == plan_b
    gaps = [y[0] - x[0] for x, y in zip(plan_a, plan_a[1:])]
    assert len(set(round(g, 9) for g in gaps)) > 5  # exponential gaps, not a constant spacing


def test_trace_replay_follows_timestamps_and_lengths(fast_server, tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(
        f'{{"timestamp": {1000 + 40 * i}, "input_length": {10 + i}, "output_length": {3 + i % 3}}}' for i in range(6)))
    rows = load_trace(str(trace))
    res = Bench(opts(fast_server, [Level("trace", trace=rows)], requests_per_level=None)).run()
    recs = res.runs[0].records
    assert [r.output_tokens for r in recs] == [3, 4, 5, 3, 4, 5]
    assert [r.input_tokens for r in recs] == [10, 11, 12, 13, 14, 15]  # word prompts calibrated on the server
    # Each request leaves no earlier than its trace timestamp (relative to the first send, which may itself
    # be late); how much later is the machine's doing, so it is measured and reported, not bounded here.
    lag_s = res.runs[0].summary.schedule_lag_ms.max / 1000.0
    for i, r in enumerate(recs):
        assert 0.040 * i - 0.002 - lag_s <= r.start_s <= 0.040 * i + lag_s + 0.002
    assert [r.start_s for r in recs] == sorted(r.start_s for r in recs)


def test_trace_csv_and_bad_rows(tmp_path):
    good = tmp_path / "t.csv"
    good.write_text("timestamp_s,input_tokens,output_tokens\n2.0,5,6\n1.0,7,8\n")
    rows = load_trace(str(good), speed=2.0)
    assert [(r.at_s, r.input_tokens) for r in rows] == [(0.0, 7), (0.5, 5)]
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"timestamp": 1, "input_length": 3}\n')
    with pytest.raises(UserError, match="row 1 needs"):
        load_trace(str(bad))


def test_traffic_mix_shares_requests_by_weight(fast_server):
    mix = parse_distribution("1-2:0.5,4:0.25,8:0.25", "--mix")
    res = Bench(opts(fast_server, [Level("mix", mix=mix)], requests_per_level=48)).run()
    run = res.runs[0]
    by_level = Counter("1-2" if r.concurrency <= 2 else r.concurrency for r in run.records)
    assert run.load.mode == "mix" and run.summary.requests == 48
    assert by_level == {"1-2": 24, 4: 12, 8: 12}
    assert "mix=1-2:0.5,4:0.25,8:0.25" in run.lengths.spec


def test_duration_stops_issuing(fast_server):
    res = Bench(opts(fast_server, [Level("concurrency", concurrency=2)], requests_per_level=None, duration_s=0.3)).run()
    s = res.runs[0].summary
    assert s.requests > 2  # more than one round of the 2 workers, then it stopped (requests_per_level is None)
    # Issued before the deadline; the send itself may land later by the event loop's lag (measured in this run).
    lag_s = s.event_loop_lag_ms.max / 1000.0
    assert max(r.start_s for r in res.runs[0].records) < 0.3 + lag_s + 0.2


def test_errors_are_counted_by_type(flaky_server):
    res = Bench(opts(flaky_server, [Level("concurrency", concurrency=4)], requests_per_level=60)).run()
    s = res.runs[0].summary
    assert s.errors == s.errors_by_type["http_500"] > 0
    assert s.completed + s.errors == 60
    assert s.error_rate == pytest.approx(s.errors / 60)
    assert 0.15 < s.error_rate < 0.55


def test_seed_makes_request_shapes_reproducible(fast_server):
    o = opts(fast_server, [Level("concurrency", concurrency=1)], requests_per_level=6, seed=4,
             input_tokens=parse_distribution("8:0.5,16:0.5", "--input-tokens"),
             output_tokens=parse_distribution("normal:6,2", "--output-tokens"))
    a = [(r.input_tokens, r.output_tokens) for r in Bench(o).run().runs[0].records]
    b = [(r.input_tokens, r.output_tokens) for r in Bench(o).run().runs[0].records]
    assert a == b and len(set(a)) > 1


def test_chat_api_and_labels(fast_server):
    from fleetcast.bench.schema import Labels

    res = Bench(opts(fast_server, [Level("concurrency", concurrency=2)], api="chat", requests_per_level=4,
                     labels=Labels(backend="reference", gpu="H200"))).run()
    assert res.api == "chat" and res.labels.gpu == "H200" and res.labels.backend == "reference"
    assert res.runs[0].summary.completed == 4
    assert all(r.output_tokens == 8 for r in res.runs[0].records)


def test_unreachable_endpoint_is_a_user_error():
    o = BenchOptions(endpoint="http://127.0.0.1:9", levels=[Level("concurrency", concurrency=1)])
    with pytest.raises(UserError, match="cannot connect"):
        Bench(o).run()
