"""From captured responses to per-request records and a run summary, following
the pinned metric definitions (docs/bench.md, "Metric definitions"):

- TTFT: request sent -> first non-empty content chunk.
- E2E: request sent -> last content chunk.
- ITL: per request, (E2E - TTFT) / (output_tokens - 1); chunk gaps are kept raw.
- Output throughput: output tokens of completed requests / (last response - first request).
- Goodput: completed requests meeting every SLO, per second; failures never count.
- Mean concurrency: sum of request durations / run duration (Little's law).

Saturation: the client marks a run saturated when its own delays could have
moved the figures by more than the accuracy target: event-loop lag (when reads
are stamped in the loop, lag is timestamp error), schedule lag (requests sent
later than planned, or re-issued late in closed loop), first tokens read late
and merged with later tokens in over 1% of requests (their TTFT may be
overstated), a client process near 100% of a core, or the OS keeping the
client waiting for a CPU between a request's send stamp and its first token
(Linux schedstat run-queue wait; a thread that is runnable but not running
stamps nothing, so the loop-lag probe cannot see that wait).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetcast.bench.client import ParsedResponse, RawResponse, parse_stream
from fleetcast.bench.schema import Record, Summary
from fleetcast.bench.stats import make_stat

# Saturation thresholds. When reads are stamped by the clock in the event loop,
# loop lag IS timestamp error, so its limit is the accuracy target's absolute
# floor (1 ms). With kernel receive timestamps a late loop does not move a
# stamp, except that one read then gathers several events and all get the
# arrival time of the last: that starts when the lag nears the gap between a
# stream's events, so the limit is half the median chunk gap (1 to 10 ms).
LOOP_LAG_P99_LIMIT_MS = 1.0
LOOP_LAG_P99_LIMIT_KERNEL_STAMPS_MS = 10.0
SCHEDULE_LAG_P95_LIMIT_MS = 5.0
CPU_BUSY_LIMIT = 0.85
# Above this share of requests with a late-merged first token, the TTFT tail
# (P99) may be the client's.
TTFT_MERGED_SHARE_LIMIT = 0.01
# A request whose client waited W ms for a CPU between its send stamp and its
# first token may report a TTFT up to W ms long. When over 1% of requests
# waited more than the accuracy target's absolute floor, the TTFT P99 (and, as
# the share grows, the lower percentiles) may be off by more than that floor.
RUN_QUEUE_WAIT_P99_LIMIT_MS = LOOP_LAG_P99_LIMIT_MS


@dataclass
class Sent:
    """One request as the load generator issued it."""

    raw: RawResponse
    input_tokens: int  # requested
    output_tokens: int  # requested
    planned: float | None = None  # planned send time (rate/trace), None for closed-loop modes
    ready: float | None = None  # when the request could have been sent (closed loop: previous response done)
    concurrency: int | None = None


@dataclass
class Slo:
    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.itl_ms, self.e2e_ms))

    def met(self, r: Record) -> bool:
        if not r.ok:
            return False
        if self.ttft_ms is not None and (r.ttft_ms is None or r.ttft_ms > self.ttft_ms):
            return False
        if self.itl_ms is not None and r.itl_ms is not None and r.itl_ms > self.itl_ms:
            return False
        if self.e2e_ms is not None and (r.e2e_ms is None or r.e2e_ms > self.e2e_ms):
            return False
        return True


def to_record(sent: Sent, api: str, t0: float) -> Record:
    raw = sent.raw
    p: ParsedResponse = parse_stream(raw, api)
    ok = p.error is None and p.status == 200 and bool(p.content_times)
    out_tokens = p.completion_tokens if p.completion_tokens is not None else len(p.content_times)
    in_tokens = p.prompt_tokens if p.prompt_tokens is not None else sent.input_tokens
    ttft = e2e = itl = None
    gaps: list[float] = []
    if p.content_times:
        ttft = (p.content_times[0] - raw.t_send) * 1000.0
        e2e = (p.content_times[-1] - raw.t_send) * 1000.0
        if out_tokens > 1:
            itl = (e2e - ttft) / (out_tokens - 1)
        ct = p.content_times
        gaps = [(ct[i] - ct[i - 1]) * 1000.0 for i in range(1, len(ct))]
    rq_wait = None
    if ok and raw.rq_send is not None and len(raw.rq_reads) == len(raw.times):
        after = raw.rq_reads[raw.times.index(p.content_times[0])]
        if after is not None:
            rq_wait = max(0, after - raw.rq_send) / 1e6
    return Record(
        start_s=raw.t_send - t0,
        ttft_ms=ttft,
        e2e_ms=e2e,
        itl_ms=itl,
        input_tokens=in_tokens or 0,
        output_tokens=out_tokens if ok else len(p.content_times),
        ok=ok,
        error=None if ok else (p.error or "no_content"),
        error_detail=None if ok else p.error_detail,
        chunk_gaps_ms=gaps,
        concurrency=sent.concurrency,
        ttft_merged=p.first_token_merged,
        run_queue_wait_ms=rq_wait,
    )


def summarize(
    sent: list[Sent],
    records: list[Record],
    slo: Slo,
    loop_lags_ms: list[float],
    cpu_util: float | None,
    network_rtt_ms: float | None = None,
    kernel_stamps: bool = False,
    run_queue_share: float | None = None,
) -> Summary:
    """`run_queue_share`: the run-queue wait of all the client's threads over the run per second of wall time
    (None: not measured)."""
    n = len(records)
    ok = [r for r in records if r.ok]
    if sent:
        first = min(s.raw.t_send for s in sent)
        last = max((s.raw.t_done or s.raw.t_send) for s in sent)
        duration = max(last - first, 1e-9)
        busy = sum(((s.raw.t_done or s.raw.t_send) - s.raw.t_send) for s in sent)
    else:
        duration, busy = 1e-9, 0.0
    errors_by_type: dict[str, int] = {}
    error_messages: dict[str, str] = {}
    for r in records:
        if not r.ok:
            kind = r.error or "unknown"
            errors_by_type[kind] = errors_by_type.get(kind, 0) + 1
            if r.error_detail and kind not in error_messages:
                error_messages[kind] = r.error_detail
    out_tok = sum(r.output_tokens for r in ok)
    in_tok = sum(r.input_tokens for r in ok)
    sched = []
    for s in sent:
        ref = s.planned if s.planned is not None else s.ready
        if ref is not None:
            sched.append(max(0.0, (s.raw.t_send - ref) * 1000.0))
    sched_stat = make_stat(sched)
    loop_stat = make_stat(loop_lags_ms)
    reasons = []
    gaps = [g for r in ok for g in r.chunk_gaps_ms]
    loop_limit = LOOP_LAG_P99_LIMIT_MS
    if kernel_stamps:
        gap_p50 = make_stat(gaps).p50 if gaps else None
        loop_limit = LOOP_LAG_P99_LIMIT_KERNEL_STAMPS_MS
        if gap_p50 is not None:
            loop_limit = round(max(LOOP_LAG_P99_LIMIT_MS, min(loop_limit, 0.5 * gap_p50)), 2)
    if loop_stat.p99 is not None and loop_stat.p99 > loop_limit:
        reasons.append(f"event-loop lag P99 {loop_stat.p99:.2f} ms > {loop_limit} ms")
    if sched_stat.p95 is not None and sched_stat.p95 > SCHEDULE_LAG_P95_LIMIT_MS:
        reasons.append(f"schedule lag P95 {sched_stat.p95:.2f} ms > {SCHEDULE_LAG_P95_LIMIT_MS} ms")
    merged_share = (sum(1 for r in ok if r.ttft_merged) / len(ok)) if ok else None
    if merged_share is not None and merged_share > TTFT_MERGED_SHARE_LIMIT:
        reasons.append(f"first token read late and merged with later tokens in {merged_share:.1%} of requests")
    if cpu_util is not None and cpu_util > CPU_BUSY_LIMIT:
        reasons.append(f"client CPU {cpu_util:.0%} of one core > {CPU_BUSY_LIMIT:.0%}")
    waits = [r.run_queue_wait_ms for r in ok if r.run_queue_wait_ms is not None]
    wait_stat = make_stat(waits) if waits else None
    if wait_stat is not None and wait_stat.p99 is not None and wait_stat.p99 > RUN_QUEUE_WAIT_P99_LIMIT_MS:
        reasons.append(f"the OS kept the client waiting for a CPU between send and first token: P99 "
                       f"{wait_stat.p99:.2f} ms per request (P50 {wait_stat.p50:.2f}) > {RUN_QUEUE_WAIT_P99_LIMIT_MS} ms")
    return Summary(
        requests=n,
        completed=len(ok),
        errors=n - len(ok),
        errors_by_type=errors_by_type,
        duration_s=duration,
        ttft_ms=make_stat(r.ttft_ms for r in ok),
        itl_ms=make_stat(r.itl_ms for r in ok),
        e2e_ms=make_stat(r.e2e_ms for r in ok),
        chunk_gap_ms=make_stat(gaps),
        output_throughput_tps=out_tok / duration,
        total_throughput_tps=(out_tok + in_tok) / duration,
        request_throughput_rps=len(ok) / duration,
        goodput_rps=(sum(1 for r in records if slo.met(r)) / duration) if slo.any else None,
        error_rate=(n - len(ok)) / n if n else 0.0,
        mean_concurrency=busy / duration,
        saturated=bool(reasons),
        saturation_reason="; ".join(reasons) or None,
        schedule_lag_ms=sched_stat,
        event_loop_lag_ms=loop_stat,
        network_rtt_ms=network_rtt_ms,
        client_cpu_util=cpu_util,
        rx_timestamps="kernel" if kernel_stamps else "clock",
        ttft_merged_share=merged_share,
        error_messages=error_messages,
        client_run_queue_wait_ms=wait_stat,
        client_run_queue_share=run_queue_share,
    )
