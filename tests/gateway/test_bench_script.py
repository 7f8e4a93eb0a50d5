"""`make bench-gateway` (scripts/bench_gateway.py): its floor, its CPU figure and its table; running it is a
benchmark, not a test."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from scripts import bench_gateway


def test_the_relay_floor_carries_a_streamed_request_byte_for_byte():
    """The floor mode must be a working proxy, or its figures say nothing: one request through it
    gets every token the timed upstream sends, on a kept-alive connection, twice."""
    async def body():
        upstream = await asyncio.start_server(lambda r, w: bench_gateway.timed_upstream(r, w, 0.001, 0.0),
                                              "127.0.0.1", 0)
        up_port = upstream.sockets[0].getsockname()[1]
        relay_port = bench_gateway.free_port()
        relay = asyncio.ensure_future(bench_gateway.raw_relay(relay_port, up_port, warm=2))
        try:
            for _ in range(100):  # bounded: until the relay listens
                try:
                    samples = await bench_gateway._client_samples(relay_port, None, 2, 2, 5, "m")
                    break
                except OSError:
                    await asyncio.sleep(0.02)
            assert len(samples) == 4 and all(s.tokens == 5 for s in samples)
            assert [s.new_connection for s in samples].count(True) == 2
        finally:
            relay.cancel()
            upstream.close()
    asyncio.run(body())


def test_proxy_cpu_counts_the_process_and_its_children():
    """The CPU-per-request figure reads proc(5) utime + stime of the proxy and its worker processes."""
    burn = ("import os, sys, time\n"
            "def spin():\n"
            "    t = time.process_time()\n"
            "    while time.process_time() - t < 0.3: pass\n"
            "if os.fork() == 0:\n"  # one write(2) a line: the two processes share the pipe
            "    spin(); os.write(1, b'child\\n'); time.sleep(5); os._exit(0)\n"
            "spin(); os.write(1, b'parent\\n'); time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    try:
        assert sorted(proc.stdout.readline().strip() for _ in range(2)) == ["child", "parent"]
        stats = bench_gateway.process_stats(proc.pid)
        assert stats.cpu_s >= 0.55  # 0.3 s each, less a clock tick or two
        assert stats.minor_faults > 0 and stats.runq_wait_s >= 0
    finally:
        proc.kill()
        proc.wait()


def _level(ttft: float, kept: float, itl: float) -> dict:
    return {"ttft_p99": ttft, "ttft_kept_p99": kept, "itl_p99": itl, "cpu_ms_per_request": 1.0, "cpu_busy": 0.1}


def test_the_table_shows_what_each_mode_adds_over_direct():
    results = {"gateway_loop": "uvloop", "proxy_cpus": [0, 1], "config": {"tokens": 24, "token_interval_ms": 8.0},
               "levels": {128: {"direct": _level(20, 18, 9), "gateway": _level(21, 18.5, 9.2),
                                "aiohttp": _level(40, 30, 12), "relay": _level(20.5, 18, 9)}}}
    lines = bench_gateway.summary(results)
    assert "pinned to 2 cores" in lines[0]
    assert "aiohttp proxy peer" in lines[1] and "byte relay (floor)" in lines[1]
    assert lines[3] == "| 128 | +1.00 | +0.50 | +0.20 | 1.000 (10%) | +20.00 / +12.00 | +3.00 | +0.50 / +0.00 | +0.00 |"


def test_the_gc_log_counts_only_collections_after_the_startup_freeze(tmp_path):
    """scripts/gc_log.py, behind `bench_gateway --gc-log`: a collection before gc.freeze() is startup, not
    a pause a stream would feel; one after it is logged with what it freed."""
    import os

    from scripts.gc_log import summary

    (tmp_path / "freezer.py").write_text(
        "import gc\n"
        "class Node:\n"
        "    def __init__(self):\n"
        "        self.me = self\n"
        "for _ in range(50): Node()\n"
        "gc.collect()\n"  # before the freeze: startup, not logged
        "gc.freeze()\n"
        "Node(); Node()\n"
        "gc.collect()\n")
    log = tmp_path / "gc.log"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-m", "scripts.gc_log", str(log), "-m", "freezer"], check=True, cwd=root,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), root])})
    rows = [line.split(",") for line in log.read_text().splitlines()]
    freed = [int(f) for _, _, _, f in rows if int(f)]
    assert len(freed) == 1 and 2 <= freed[0] < 50  # the 2 nodes after the freeze, not the 50 before it
    gens = summary(str(log))
    assert gens["gen2"]["freed"] == freed[0] and sum(r["collections"] for r in gens.values()) == len(rows)


def test_connections_open_all_at_once_or_as_a_seeded_poisson_process():
    """--opens-per-s: 0 is the burst of a cold client pool; a rate spreads the opens, the same for every
    mode of a run (seeded), at about that rate (the mean gap of 2,000 exponential gaps is within 10%)."""
    assert bench_gateway.arrival_offsets(3, 0.0, 7) == [0.0, 0.0, 0.0]
    offsets = bench_gateway.arrival_offsets(2000, 1000.0, 7)
    assert offsets == bench_gateway.arrival_offsets(2000, 1000.0, 7)
    assert offsets == sorted(offsets) and offsets[0] > 0
    assert 0.9e-3 < offsets[-1] / len(offsets) < 1.1e-3


def test_the_request_s_way_in_is_timed_apart_from_the_server_s_own_wait():
    """Each sample says when the upstream had read its request (`reach_ms`): a slow first request is then
    either slow on its way in (a proxy, a wake-up) or slow at the server, never a guess."""
    async def body():
        upstream = await asyncio.start_server(lambda r, w: bench_gateway.timed_upstream(r, w, 0.05, 0.0),
                                              "127.0.0.1", 0)
        try:
            samples = await bench_gateway._client_samples(upstream.sockets[0].getsockname()[1], None, 1, 2, 2, "m")
        finally:
            upstream.close()
        for s in samples:
            assert 0 < s.reach_ms < s.ttft_ms and s.ttft_ms >= 50  # the server's 50 ms come after the way in
    asyncio.run(body())


def test_steal_reads_the_named_cores_of_proc_stat(tmp_path):
    """proc(5): the 8th value after a cpuN name is steal, in clock ticks (USER_HZ); the all-cores line is not a core."""
    import os

    stat = tmp_path / "stat"
    stat.write_text("cpu  9 9 9 9 9 9 9 900 0 0\n"
                    "cpu0 1 2 3 4 5 6 7 30 0 0\n"
                    "cpu1 1 2 3 4 5 6 7 50 0 0\n"
                    "cpu2 1 2 3 4 5 6 7 70 0 0\nintr 5\n")
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    assert bench_gateway.steal_ms({0, 1}, str(stat)) == 80 * tick_ms
    assert bench_gateway.steal_ms(set(), str(stat)) == 0.0
    assert bench_gateway.steal_ms({0}) >= 0.0  # the real file parses


@pytest.mark.parametrize("rate", ["-5", "nan", "inf"])
def test_a_rate_of_opens_that_is_no_rate_is_refused_by_name(rate):
    result = subprocess.run([sys.executable, "-m", "scripts.bench_gateway", "--opens-per-s", rate],
                            capture_output=True, text=True)
    assert result.returncode == 2 and f"--opens-per-s {rate}" in result.stderr and "Traceback" not in result.stderr


def test_trace_hops_time_each_hop_of_a_first_request_through_the_relay(tmp_path, monkeypatch):
    """--trace-hops: the client, the relay and the upstream stamp a first request's hops; joined by port,
    each comes after the one before it (accept, then read, then the upstream's read)."""
    monkeypatch.setenv(bench_gateway.HOPS_ENV, str(tmp_path))

    async def body():
        upstream = await asyncio.start_server(lambda r, w: bench_gateway.timed_upstream(r, w, 0.001, 0.0),
                                              "127.0.0.1", 0)
        relay_port = bench_gateway.free_port()
        relay = asyncio.ensure_future(bench_gateway.raw_relay(relay_port, upstream.sockets[0].getsockname()[1],
                                                              warm=3))
        try:
            for _ in range(100):  # bounded: until the relay listens
                try:
                    await bench_gateway._client_samples(relay_port, None, 3, 2, 2, "m")
                    break
                except OSError:
                    await asyncio.sleep(0.02)
        finally:
            relay.cancel()
            upstream.close()
    asyncio.run(body())
    for f in bench_gateway._hop_files.values():
        f.flush()  # type: ignore[attr-defined]
    hops = bench_gateway.hops_summary(tmp_path)
    assert set(hops) == {"accept_p50", "accept_max", "read_p50", "read_max", "upstream_p50", "upstream_max"}
    assert hops["read_max"] <= hops["upstream_max"] and hops["read_p50"] <= hops["upstream_p50"]


def test_hops_join_a_first_request_by_its_ports(tmp_path):
    """S client port sent; A client port accepted; R client port, upstream-side port, read; U upstream-side port
    read by the upstream (an earlier read on a reused port is not this request's)."""
    (tmp_path / "hops-1").write_text("S 5001 1000000\nS 5002 1000000\n")
    (tmp_path / "hops-2").write_text("A 5001 1500000\nR 5001 7001 3000000\nA 5002 2000000\nR 5002 7002 2000000\n")
    (tmp_path / "hops-3").write_text("U 7001 500000\nU 7001 4000000\nU 7002 12000000\n")
    assert bench_gateway.hops_summary(tmp_path) == {
        "accept_p50": 0.75, "accept_max": 1.0, "read_p50": 1.5, "read_max": 2.0,
        "upstream_p50": 7.0, "upstream_max": 11.0}


def test_the_accept_probe_joins_every_connection_to_its_own_acceptance():
    """bench/accept_probe.py (the kernel's part of a first request's way in): client ports come back in later
    bursts, so each connection is joined to its port's acceptance nearest its send; every one is counted."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run([sys.executable, "bench/accept_probe.py", "--workers", "2", "--burst", "8", "--rounds", "3"],
                            capture_output=True, text=True, cwd=root, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "3 bursts of 8: 24 of 24 accepted" in result.stdout


def test_a_level_run_again_is_kept_beside_the_first_pass():
    levels: dict = {}
    for c in (16, 32, 16, 128, 16):
        levels[bench_gateway.level_key(levels, c)] = c
    assert list(levels) == [16, 32, "16#2", 128, "16#3"]


def test_the_tcp_counters_of_a_level_are_read_from_both_proc_tables(tmp_path):
    """proc(5): /proc/net/snmp and /proc/net/netstat, a header line then a value line per group."""
    snmp, netstat = tmp_path / "snmp", tmp_path / "netstat"
    snmp.write_text("Tcp: RtoAlgorithm RetransSegs InErrs\nTcp: 1 7 0\n")
    netstat.write_text("TcpExt: SyncookiesSent TCPLossProbes ListenDrops\nTcpExt: 0 3 2\n"
                       "IpExt: InNoRoutes\nIpExt: 0\n")
    assert bench_gateway.tcp_counters((str(snmp), str(netstat))) == {
        "Tcp:RetransSegs": 7, "TcpExt:TCPLossProbes": 3, "TcpExt:ListenDrops": 2}
    assert bench_gateway.tcp_counters((str(tmp_path / "absent"),)) == {}


def test_a_level_s_progress_line_notes_only_what_was_measured():
    base = {"requests": 48, "ttft_p50": 16.0, "ttft_p99": 17.0, "ttft_new_max": 17.5, "connect_max": 1.0,
            "reach_new_p50": 0.2, "reach_new_max": 0.9, "itl_p50": 8.0, "itl_p99": 9.0, "tcp": {}}
    direct = bench_gateway.progress_line(16, "direct", base)
    assert direct.endswith("ITL p50  8.000 p99  9.000 ms") and "in 0.200/0.900" in direct
    proxied = bench_gateway.progress_line(16, "gateway", {
        **base, "cpu_ms_per_request": 1.2, "cpu_busy": 0.07, "proxy_steal_ms": 10.0, "proxy_runq_wait_ms": 0.5,
        "proxy_minor_faults": 30, "tcp": {"TCPLossProbes": 2, "DelayedACKs": 40}})
    assert proxied.endswith("  CPU 1.200 ms/req, cores 7% busy, 10 ms stolen, waited 0.5 ms for a core, "
                            "30 page faults, TCPLossProbes +2")  # delayed ACKs move all the time: not noted
