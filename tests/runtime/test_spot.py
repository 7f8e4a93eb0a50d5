"""Spot interruption on the instance (runtime/spot.py): the IMDSv2 notice, the drain inside it, the metrics,
and an interrupted engine build that lets go of its lock.

Source for the IMDS items: Amazon EC2 User Guide, "Spot Instance interruption notices" (instance-action:
`{"action": "terminate"|"stop"|"hibernate", "time": "...Z"}`, absent = HTTP 404 until EC2 decides; check every
5 s) and "EC2 instance rebalance recommendations" (events/recommendations/rebalance: `{"noticeTime": "...Z"}`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from fleetcast.contract import telemetry
from runtime import spot
from runtime.devtools.fakes import FakeImds
from runtime.devtools.harness import free_port
from runtime.gateway import ppv2
from runtime.lifecycle import Imds
from tests.gateway.conftest import ROOT, VOICE_VPCE, fleet_config, run
from tests.gateway.fakes import Client, FakeModelServer, one_request


@pytest.fixture
def imds():
    fake = FakeImds().start()
    yield fake
    fake.stop()


# ---------------------------------------------------------------- the notice


def test_no_notice_is_a_404_and_the_notice_document_gives_the_deadline(imds):
    client = Imds(imds.url)
    assert client.get(spot.INSTANCE_ACTION) is None  # 404: EC2 has not decided to interrupt
    imds.spot_instance_action = {"action": "terminate", "time": "2026-12-01T08:22:00Z"}
    notice = spot.parse_instance_action(client.get(spot.INSTANCE_ACTION), now=0.0)
    assert notice.kind == "instance-action" and notice.action == "terminate"
    assert notice.at_epoch == 1796113320.0  # 2026-12-01T08:22:00Z
    assert notice.deadline_epoch(reserve_s=10) == notice.at_epoch - 10


def test_an_unreadable_notice_still_counts_with_the_two_minute_default():
    notice = spot.parse_instance_action("garbled", now=1000.0)
    assert notice is not None and notice.deadline_epoch(reserve_s=0) == 1000.0 + spot.NOTICE_S


def test_the_watcher_sees_the_notice_once_and_the_rebalance_only_when_asked(imds):
    seen: list[spot.Notice] = []
    imds.rebalance_recommendation = {"noticeTime": "2026-12-01T08:20:00Z"}
    watcher = spot.SpotWatcher(Imds(imds.url), seen.append, poll_s=0.05)
    assert watcher.check() is None  # the recommendation alone is ignored without drain_on_rebalance
    watcher.drain_on_rebalance = True
    assert watcher.check().kind == "rebalance" and watcher.check().deadline_epoch() is None
    watcher.drain_on_rebalance = False
    watcher.start()
    deadline = time.monotonic() + 30  # polls counted, not a window timed: a busy machine only polls later
    while imds.spot_polls < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seen == [] and imds.spot_polls >= 2
    imds.interrupt(in_s=120)
    watcher._thread.join(timeout=10)
    assert [n.kind for n in seen] == ["instance-action"]
    watcher.stop()


def test_only_spot_instances_are_watched(imds):
    assert spot.is_spot_instance(Imds(imds.url)) is False
    imds.instance_life_cycle = "spot"
    assert spot.is_spot_instance(Imds(imds.url)) is True


def test_the_drain_budget_is_the_notice_less_the_runtimes_exit_reserve_and_is_its_deadline():
    # The NLB stops new flows after its unhealthy threshold but keeps the open ones (fleetcast/contract/nlb.py):
    # a request in flight at the notice has until the gateway's own deadline.
    assert spot.safe_request_seconds() == 120 - 10
    assert spot.safe_request_seconds(notice_s=30, reserve_s=5) == 25
    notice = spot.Notice("instance-action", "terminate", 1120.0, 1000.0)
    assert 1000.0 + spot.safe_request_seconds() == notice.deadline_epoch()


def test_the_nlb_keeps_a_draining_targets_streams_longer_than_any_spot_drain():
    # A Spot drain ends at the notice's deadline, and the gateway never drains longer than drain_timeout_s,
    # which is the unhealthy draining interval: the stream the drain keeps is never reset by the NLB.
    from fleetcast.contract import nlb

    attributes = nlb.unhealthy_drain_attributes(300)
    assert attributes[nlb.UNHEALTHY_CONNECTION_TERMINATION] == "false"
    assert spot.drain_budget_s(None, 300.0) <= int(attributes[nlb.UNHEALTHY_DRAINING_INTERVAL])


def test_the_gateway_budget_is_the_deadline_or_the_scale_in_timeout(tmp_path):
    path = tmp_path / "deadline.json"
    assert spot.drain_budget_s(None, 300.0) == 300.0
    assert spot.drain_budget_s(path, 300.0) == 300.0  # no notice written: a plain scale-in
    spot.write_deadline(path, spot.Notice("instance-action", "terminate", 1120.0, 1000.0), reserve_s=10)
    assert spot.drain_budget_s(path, 300.0, now=1000.0) == 110.0
    assert spot.drain_budget_s(path, 60.0, now=1000.0) == 60.0
    assert spot.drain_budget_s(path, 300.0, now=2000.0) == 0.0


# ---------------------------------------------------------------- the drain, loopback


TOKEN_S = 0.02  # the fake server's time per token
# From the notice to the deadline (compressed from 120 s less the reserve). The drain lasts this long
# (the LONG streams are cut at the deadline), so it is most of the test's run time; 2.5 s is still
# over 3x what the SHORT streams need after the notice, and 16x less than the LONG ones.
BUDGET_S = 2.5
SHORT = [10 + k for k in range(24)]  # 10..33 tokens: at most 0.7 s, far inside the budget
LONG = [2000] * 8  # 40 s: cannot fit


def test_32_streams_in_flight_at_the_notice_none_cut_whose_remaining_tokens_fit(tmp_path, imds):
    """The real gateway process behind a fake model server; the IMDS fake posts the instance-action document;
    the watcher, the deadline file and SIGTERM are what the bootstrap uses (runtime/bootstrap.py)."""
    from scripts.bench_gateway import FakeEc2Endpoints

    config = tmp_path / "fleet.json"
    cfg = fleet_config(voice_limits={"max_concurrency": 64, "requests_per_minute": 100000})
    config.write_text(json.dumps(cfg.model_dump(mode="json")))
    deadline_file = tmp_path / "spot-drain-deadline.json"
    imds.instance_life_cycle = "spot"
    port = free_port()

    async def body():
        upstream = await FakeModelServer(token_delay_s=TOKEN_S).start()
        ec2 = FakeEc2Endpoints([(VOICE_VPCE, "444455556666")])
        env = {**os.environ, "AWS_ENDPOINT_URL_EC2": f"http://127.0.0.1:{await ec2.start()}",
               "AWS_MAX_ATTEMPTS": "1", "PYTHONPATH": str(ROOT)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runtime.gateway", "--listen", f"127.0.0.1:{port}",
            "--upstream", f"127.0.0.1:{upstream.port}", "--config-json", str(config),
            "--region", "ap-northeast-2", "--pool", "l40s", "--service-id", "vpce-svc-0a1b2c3d4e5f60718",
            "--drain-deadline-file", str(deadline_file),
            cwd=str(ROOT), env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        clients: list[Client] = []
        try:
            for _ in range(400):
                try:
                    if (await one_request(port, "GET", "/health", header=ppv2.LOCAL_HEADER)).status == 200:
                        break
                except OSError:
                    pass
                await asyncio.sleep(0.05)
            lengths = SHORT + LONG
            heads = []
            for n in lengths:
                c = await Client(port, VOICE_VPCE).connect()
                await c.send("POST", "/v1/completions", {"model": "gpt2-xl", "prompt": "a", "max_tokens": n,
                                                         "stream": True})
                clients.append(c)
            for c in clients:
                status, headers = await c.read_head()
                assert status == 200
                heads.append(headers)
            assert upstream.active == 32  # every stream is in flight at T

            # T: EC2 posts the notice; the watcher (real IMDSv2 client) sees it within its poll.
            noticed = asyncio.Event()
            loop = asyncio.get_running_loop()
            watcher = spot.SpotWatcher(Imds(imds.url), lambda n: loop.call_soon_threadsafe(noticed.set), poll_s=0.1)
            watcher.start()
            imds.spot_instance_action = {"action": "terminate",
                                         "time": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                               time.gmtime(time.time() + BUDGET_S + 1 + 1))}
            await asyncio.wait_for(noticed.wait(), 10)
            spot.write_deadline(deadline_file, watcher.notice, reserve_s=1.0)
            budget = watcher.notice.deadline_epoch(1.0) - time.time()
            assert BUDGET_S - 1.5 <= budget <= BUDGET_S + 1.5
            proc.send_signal(signal.SIGTERM)  # what Serving.drain does next
            started = time.monotonic()
            await asyncio.sleep(0.2)
            health = await one_request(port, "GET", "/health", header=ppv2.LOCAL_HEADER)
            assert health.status == 503  # the NLB stops sending at once

            bodies = await asyncio.gather(*(c.read_body(h) for c, h in zip(clients, heads)),
                                          return_exceptions=True)
            code = await asyncio.wait_for(proc.wait(), 60)
            elapsed = time.monotonic() - started
            watcher.stop()
            return lengths, bodies, code, elapsed
        finally:
            for c in clients:
                await c.close()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await upstream.stop()

    lengths, bodies, code, elapsed = run(body(), timeout=120)
    completed = [n for n, b in zip(lengths, bodies)
                 if isinstance(b, bytes) and b.count(b'"text"') == n and b.endswith(b"data: [DONE]\n\n")]
    assert sorted(completed) == sorted(SHORT)  # none cut whose remaining tokens fit the notice
    assert code == 0
    assert elapsed < BUDGET_S + 15  # ended by the deadline, not the 300 s scale-in timeout nor the 40 s streams
    outcome = spot.read_outcome(deadline_file)
    assert outcome["in_flight"] == 32 and outcome["cut"] == len(LONG)
    assert 0 < outcome["budget_s"] <= BUDGET_S + 1.5


def test_without_a_deadline_file_sigterm_is_a_plain_scale_in_drain(tmp_path):
    assert spot.drain_budget_s(tmp_path / "absent.json", 300.0) == 300.0
    spot.write_outcome(tmp_path / "absent.json", in_flight=3, cut=0, budget_s=300.0)
    assert not spot.outcome_path(tmp_path / "absent.json").exists()


# ---------------------------------------------------------------- bootstrap: metrics and the build lock


def _bootstrap(tmp_path, imds, records):
    import boto3

    from runtime.bootstrap import Bootstrap, InstanceEnv

    env = InstanceEnv.from_environ({
        "FLEETCAST_FLEET": "fleetcast", "FLEETCAST_REGION": "ap-northeast-2", "FLEETCAST_POOL": "l40s",
        "FLEETCAST_BUCKET": "b", "FLEETCAST_CONFIG_FILE": "/dev/null", "FLEETCAST_LOCAL_ROOT": str(tmp_path),
        "FLEETCAST_TERMINATE_POLL_S": "0.05",
    })

    class Stream:
        def write(self, line):
            records.extend(json.loads(x) for x in line.splitlines() if x.strip())

        def flush(self):
            pass

    from runtime.metrics import Emf

    boot = Bootstrap(env, session=boto3.Session(region_name="ap-northeast-2"), imds=Imds(imds.url))
    boot.emf = Emf("fleetcast", "l40s", "i-0123456789abcdef0", Stream())
    return boot


def test_the_interruption_and_the_drain_outcome_are_published(tmp_path, imds):
    records: list[dict] = []
    imds.instance_life_cycle = "spot"
    boot = _bootstrap(tmp_path, imds, records)
    boot._phase = "serving"
    notice = spot.Notice("instance-action", "terminate", time.time() + 120, time.time())
    boot._on_spot_notice(notice)
    assert boot._stop.is_set() and boot.stop_reason == "spot-instance-action"
    assert json.loads(boot._spot_deadline_file.read_text())["deadline_epoch"] == notice.at_epoch - 10
    spot.write_outcome(boot._spot_deadline_file, in_flight=32, cut=3, budget_s=100.0)
    report = boot._spot_outcome(notice)
    assert report["cut"] == 3
    values = {k: r[k] for r in records for k in (telemetry.SPOT_INTERRUPTION, telemetry.SPOT_DRAIN_COMPLETED,
                                                   telemetry.SPOT_DRAIN_CUT) if k in r}
    assert values == {telemetry.SPOT_INTERRUPTION: 1.0, telemetry.SPOT_DRAIN_COMPLETED: 0.0,
                      telemetry.SPOT_DRAIN_CUT: 3.0}
    assert all(r["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Fleet", "Pool"]] for r in records)


def test_a_drain_that_cut_nothing_is_completed(tmp_path, imds):
    records: list[dict] = []
    boot = _bootstrap(tmp_path, imds, records)
    boot._phase = "serving"
    notice = spot.Notice("instance-action", "terminate", time.time() + 120, time.time())
    boot._on_spot_notice(notice)
    spot.write_outcome(boot._spot_deadline_file, in_flight=32, cut=0, budget_s=100.0)
    boot._spot_outcome(notice)
    assert [r[telemetry.SPOT_DRAIN_COMPLETED] for r in records if telemetry.SPOT_DRAIN_COMPLETED in r] == [1.0]
    assert not [r for r in records if telemetry.SPOT_DRAIN_CUT in r]


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_an_interrupted_engine_build_releases_the_cache_lock_and_records_no_failure(tmp_path, imds, aws):
    from runtime.engine_cache import CacheError, CacheSettings, EngineCache
    from tests.runtime.cache_worker import client, inputs

    records: list[dict] = []
    imds.instance_life_cycle = "spot"
    boot = _bootstrap(tmp_path, imds, records)
    settings = CacheSettings(poll_s=0.1, lock_ttl_s=600, lock_refresh_s=0.5, wait_timeout_s=60,
                             s3_retry_deadline_s=5, s3_backoff_base_s=0.05)
    cache = EngineCache(client(aws.moto_url), aws.bucket, inputs(), holder="i-spot", settings=settings)
    building = threading.Event()

    def build(workdir: Path) -> Path:
        building.set()
        time.sleep(60)  # a long trtllm-build; the notice's signal interrupts it
        raise AssertionError("the build was not interrupted")

    previous = signal.getsignal(signal.SIGUSR1)
    try:
        boot._watch_spot()  # a Spot instance: the watcher runs from launch on, the build phase included
        assert boot.spot_watcher is not None

        def post_notice():
            building.wait(10)
            assert aws.keys("locks/")  # the lock is held while the build runs
            imds.interrupt(in_s=120)

        threading.Thread(target=post_notice, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(CacheError, match="Spot interruption") as raised:
            cache.obtain(tmp_path / "engines", boot._interruptible_build(build))
        assert isinstance(raised.value, spot.SpotInterrupted)
        assert time.monotonic() - started < 30
    finally:
        signal.signal(signal.SIGUSR1, previous)
        if boot.spot_watcher:
            boot.spot_watcher.stop()
    assert aws.keys("locks/") == []  # released at once, not after lock_ttl_s = 600 s
    assert aws.keys("failures/") == []  # an interruption is not a build failure (no circuit-breaker count)
    assert [r for r in records if telemetry.SPOT_INTERRUPTION in r][0]["phase"] == "preparing"


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_a_build_that_missed_the_notices_first_signal_is_stopped_by_the_next(tmp_path, imds):
    """A signal that lands just before the build's blocking read of its step's output runs its handler only once
    that read returns (runtime/bootstrap.py, _signal_build, names the source): the notice's signal is sent again
    until the build has stopped. Here the handler lets the first one go, as that race would, and the build, blocked
    in a read nobody answers, still stops, once. On the old code the read waited for the 30 s safety write."""
    imds.instance_life_cycle = "spot"
    boot = _bootstrap(tmp_path, imds, [])
    handled: list[bool] = []
    interrupt = boot._interrupt_build

    def first_missed(signum: int, frame: object) -> None:
        handled.append(bool(handled))
        if len(handled) > 1:
            interrupt(signum, frame)

    boot._interrupt_build = first_missed  # type: ignore[method-assign]
    reading, written = os.pipe()
    building = threading.Event()
    safety = threading.Timer(30, lambda: os.write(written, b"x"))

    def build(workdir: Path) -> Path:
        building.set()
        os.read(reading, 1)  # a step's output that does not come
        raise AssertionError("the build was not interrupted")

    previous = signal.getsignal(signal.SIGUSR1)
    try:
        boot._watch_spot()
        threading.Thread(target=lambda: (building.wait(10), imds.interrupt(in_s=120)), daemon=True).start()
        safety.start()
        with pytest.raises(Exception, match="Spot interruption"):
            boot._interruptible_build(build)(tmp_path)
    finally:
        safety.cancel()
        signal.signal(signal.SIGUSR1, previous)
        if boot.spot_watcher:
            boot.spot_watcher.stop()
        os.close(reading)
        os.close(written)
    assert len(handled) >= 2 and boot._build_stopped.is_set()


def test_a_notice_seen_before_the_build_starts_stops_it_at_once_and_outside_a_build_nothing_is_raised(
        tmp_path, imds, aws):
    from runtime.engine_cache import CacheError, CacheSettings, EngineCache
    from tests.runtime.cache_worker import client, inputs

    boot = _bootstrap(tmp_path, imds, [])
    boot.spot_watcher = spot.SpotWatcher(Imds(imds.url), lambda n: None)
    boot.spot_watcher.notice = spot.Notice("instance-action", "terminate", time.time() + 120, time.time())
    boot._interrupt_build(signal.SIGUSR1, None)  # not in a build (waiting for a lock, downloading): no raise
    cache = EngineCache(client(aws.moto_url), aws.bucket, inputs(), holder="i-late",
                        settings=CacheSettings(poll_s=0.1, lock_ttl_s=600, s3_retry_deadline_s=5,
                                               s3_backoff_base_s=0.05))

    def build(workdir: Path) -> Path:
        raise AssertionError("a build must not start after the notice")

    with pytest.raises(CacheError, match="Spot interruption"):
        cache.obtain(tmp_path / "engines", boot._interruptible_build(build))
    assert aws.keys("locks/") == [] and aws.keys("failures/") == []
