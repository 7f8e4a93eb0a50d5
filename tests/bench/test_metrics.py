"""Metric definitions (docs/bench.md) applied to synthetic responses with known timing."""

import pytest

from fleetcast.bench.client import RawResponse
from fleetcast.bench.metrics import Sent, Slo, summarize, to_record
from tests.bench.test_client import HEAD, chunk, completion_events


def response(t_send, token_times, t_done=None, status_line=None):
    """A raw response whose i-th content event arrives at token_times[i] (seconds)."""
    events = completion_events(len(token_times))
    reads = [HEAD] + [chunk(e) for e in events[: len(token_times)]]
    reads.append(b"".join(chunk(e) for e in events[len(token_times):]) + b"0\r\n\r\n")
    times = [t_send + 0.0001] + list(token_times) + [token_times[-1] if token_times else t_send]
    if status_line:
        reads, times = [status_line + b"\r\nContent-Length: 0\r\n\r\n"], [t_send + 0.001]
    raw = RawResponse(t_send=t_send, reads=reads, times=times)
    raw.t_done = t_done if t_done is not None else times[-1]
    return raw


def test_ttft_e2e_itl_and_gaps_follow_the_definitions():
    # sent at 1.000 s; tokens at 1.050, 1.060, 1.080, 1.090 s
    raw = response(1.0, [1.050, 1.060, 1.080, 1.090])
    rec = to_record(Sent(raw, 128, 4), "completions", t0=0.5)
    assert rec.ok and rec.error is None
    assert rec.start_s == pytest.approx(0.5)
    assert rec.ttft_ms == pytest.approx(50.0)
    assert rec.e2e_ms == pytest.approx(90.0)
    assert rec.itl_ms == pytest.approx((90.0 - 50.0) / (4 - 1))
    assert rec.chunk_gaps_ms == pytest.approx([10.0, 20.0, 10.0])
    assert (rec.input_tokens, rec.output_tokens) == (7, 4)  # server-reported usage wins


def test_summary_throughput_goodput_and_errors():
    sent = [
        Sent(response(0.0, [0.010, 0.020]), 8, 2),   # TTFT 10 ms
        Sent(response(0.0, [0.100, 0.150]), 8, 2),   # TTFT 100 ms: misses a 50 ms TTFT SLO
        Sent(response(0.5, [0.520, 0.530]), 8, 2),
        Sent(response(0.6, [], status_line=b"HTTP/1.1 500 Internal Server Error"), 8, 2),
    ]
    sent[2].raw.t_done = 1.0  # last response ends at 1.0 s: the run lasts 1.0 s
    records = [to_record(s, "completions", 0.0) for s in sent]
    s = summarize(sent, records, Slo(ttft_ms=50), loop_lags_ms=[0.1] * 10, cpu_util=0.2)
    assert (s.requests, s.completed, s.errors) == (4, 3, 1)
    assert s.errors_by_type == {"http_500": 1}
    assert s.error_rate == pytest.approx(0.25)
    assert s.duration_s == pytest.approx(1.0)
    assert s.output_throughput_tps == pytest.approx(6.0)        # 3 requests x 2 tokens / 1 s
    assert s.total_throughput_tps == pytest.approx(6.0 + 21.0)  # + 3 x 7 prompt tokens
    assert s.request_throughput_rps == pytest.approx(3.0)
    assert s.goodput_rps == pytest.approx(2.0)  # the slow one and the failure do not count
    assert s.ttft_ms.count == 3 and s.ttft_ms.p50 == pytest.approx(20.0)
    assert not s.saturated and s.saturation_reason is None


def test_no_slo_means_no_goodput():
    sent = [Sent(response(0.0, [0.01, 0.02]), 8, 2)]
    s = summarize(sent, [to_record(sent[0], "completions", 0.0)], Slo(), [], None)
    assert s.goodput_rps is None


@pytest.mark.parametrize("lags, planned_late_ms, cpu, reason", [
    ([0.05] * 100, 0.0, 0.3, None),
    ([0.05] * 95 + [4.0] * 5, 0.0, 0.3, "event-loop lag"),
    ([0.05] * 100, 20.0, 0.3, "schedule lag"),
    ([0.05] * 100, 0.0, 0.97, "client CPU"),
])
def test_saturation_is_flagged_with_its_cause(lags, planned_late_ms, cpu, reason):
    sent = []
    for i in range(20):
        t = i * 0.1 + planned_late_ms / 1000
        sent.append(Sent(response(t, [t + 0.01, t + 0.02]), 8, 2, planned=i * 0.1))
    records = [to_record(s, "completions", 0.0) for s in sent]
    s = summarize(sent, records, Slo(), lags, cpu)
    assert s.saturated is (reason is not None)
    if reason:
        assert reason in s.saturation_reason
    assert s.schedule_lag_ms.p50 == pytest.approx(planned_late_ms, abs=1e-6)


def test_mean_concurrency_is_littles_law():
    # Two overlapping 1 s requests over a 1 s window: concurrency 2.
    sent = [Sent(response(0.0, [0.5, 1.0]), 8, 2), Sent(response(0.0, [0.5, 1.0]), 8, 2)]
    s = summarize(sent, [to_record(x, "completions", 0.0) for x in sent], Slo(), [], None)
    assert s.mean_concurrency == pytest.approx(2.0, rel=1e-3)


def waited(t, wait_ns):
    """A request sent at t whose client waited `wait_ns` for a CPU before the read of its first token."""
    raw = response(t, [t + 0.01, t + 0.02])
    raw.rq_send = 1_000_000_000
    # Headers, then the first token's read, then the rest: the wait lands before the first token.
    raw.rq_reads = [raw.rq_send] + [raw.rq_send + wait_ns] * (len(raw.times) - 1)
    return Sent(raw, 8, 2)


def test_each_request_records_the_run_queue_wait_up_to_its_first_token():
    rec = to_record(waited(0.0, 2_500_000), "completions", 0.0)
    assert rec.run_queue_wait_ms == pytest.approx(2.5)
    unmeasured = to_record(Sent(response(0.0, [0.01, 0.02]), 8, 2), "completions", 0.0)
    assert unmeasured.run_queue_wait_ms is None


@pytest.mark.parametrize("late, wait_ns, flagged", [
    (0, 5_000_000, False),    # nobody waited
    (1, 900_000, False),      # under the 1 ms floor
    (1, 5_000_000, True),     # 1 of 20 requests > 1 ms: the TTFT P99 may be the client's
])
def test_a_run_whose_client_waited_for_a_cpu_past_the_accuracy_floor_is_flagged(late, wait_ns, flagged):
    sent = [waited(i * 0.1, wait_ns if i < late else 0) for i in range(20)]
    s = summarize(sent, [to_record(x, "completions", 0.0) for x in sent], Slo(), [0.05] * 100, 0.3,
                  run_queue_share=0.02)
    assert s.saturated is flagged
    assert ("the OS kept the client waiting for a CPU" in (s.saturation_reason or "")) is flagged
    assert s.client_run_queue_wait_ms.count == 20 and s.client_run_queue_share == 0.02


def test_without_schedstat_the_summary_records_null():
    sent = [Sent(response(0.0, [0.01, 0.02]), 8, 2)]
    s = summarize(sent, [to_record(sent[0], "completions", 0.0)], Slo(), [], None)
    assert s.client_run_queue_wait_ms is None and s.client_run_queue_share is None and not s.saturated
