"""The S3 engine cache: build once per key, never serve a broken entry, stop rebuilding when builds keep failing."""

import json
import multiprocessing
import threading
import time
from pathlib import Path

import pytest
from botocore.exceptions import EndpointConnectionError

from runtime.devtools.harness import free_port
from runtime.engine_cache import (
    BuildFailed,
    CacheSettings,
    CircuitOpen,
    EngineCache,
    StorageUnavailable,
    WaitTimeout,
)
from tests.runtime import cache_worker
from tests.runtime.cache_worker import client, fake_build, inputs

FAST = CacheSettings(poll_s=0.1, lock_ttl_s=30, lock_refresh_s=0.5, wait_timeout_s=60, s3_retry_deadline_s=5,
                     s3_backoff_base_s=0.05)


def cache(aws, holder="i-test", settings=FAST, **changes) -> EngineCache:
    return EngineCache(client(aws.moto_url), aws.bucket, inputs(**changes), holder=holder, settings=settings)


def never_build(workdir):
    raise AssertionError("build must not run")


def count(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_cache_key_changes_with_every_input_and_reads_well():
    base = inputs()
    assert base.key.startswith("gpt2-tiny-fp16-sm89-")
    for change in [dict(revision="r2"), dict(precision="int8_wo"), dict(kv_cache_dtype="int8"),
                   dict(max_batch_size=16), dict(max_num_tokens=2048), dict(max_input_len=64),
                   dict(builder_version="2"), dict(compute_capability="9.0"), dict(calibration="s3://x/c#512")]:
        assert inputs(**change).key != base.key, change
    assert inputs().key == base.key  # stable


def test_cache_hit_skips_the_build_and_a_warm_disk_skips_the_download(aws, tmp_path):
    counter = tmp_path / "builds.txt"
    first = cache(aws).obtain(tmp_path / "a", fake_build(counter, 0))
    assert first.outcome == "built" and count(counter) == 1
    hit = cache(aws, holder="i-2").obtain(tmp_path / "b", never_build)
    assert hit.outcome == "hit"
    assert hit.manifest.extra["build_id"] == first.manifest.extra["build_id"]
    local = cache(aws, holder="i-2").obtain(tmp_path / "b", never_build)
    assert local.outcome == "local"


def test_a_tampered_local_copy_is_discarded_and_fetched_again(aws, tmp_path):
    cache(aws).obtain(tmp_path / "a", fake_build(tmp_path / "n", 0))
    c = cache(aws)
    engine = tmp_path / "a" / c.key / "engine" / "rank0.engine"
    engine.write_bytes(b"bit rot")
    res = c.obtain(tmp_path / "a", never_build)
    assert res.outcome == "hit"
    assert engine.stat().st_size == 256 * 1024


def test_stale_lock_is_taken_over_by_exactly_one_waiter(aws):
    c = cache(aws, settings=CacheSettings(**{**FAST.__dict__, "lock_ttl_s": 5}))
    dead = {"key": c.key, "holder": "i-dead", "build_id": "x", "heartbeat_at": time.time() - 3600, "ttl_s": 5}
    client(aws.moto_url).put_object(Bucket=aws.bucket, Key=c.lock_key, Body=json.dumps(dead).encode())
    winners, barrier = [], threading.Barrier(6)

    def waiter(i):
        mine = cache(aws, holder=f"i-{i}", settings=CacheSettings(**{**FAST.__dict__, "lock_ttl_s": 5}))
        barrier.wait()
        lock = mine.try_lock(f"b{i}")
        if lock is not None:
            winners.append(i)

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(winners) == 1
    body = json.loads(client(aws.moto_url).get_object(Bucket=aws.bucket, Key=c.lock_key)["Body"].read())
    assert body["holder"] == f"i-{winners[0]}"


def test_a_live_lock_is_respected_and_waiting_is_bounded(aws, tmp_path):
    holder = cache(aws, holder="i-builder")
    lock = holder.try_lock("b1")
    assert lock is not None
    # A few polls (0.1 s apart) of a lock whose holder is alive, then the bound: it is what is checked, not its length.
    waiter = cache(aws, holder="i-waiter", settings=CacheSettings(**{**FAST.__dict__, "wait_timeout_s": 0.3}))
    assert waiter.try_lock("b2") is None  # fresh heartbeat: not stale
    with pytest.raises(WaitTimeout):
        waiter.obtain(tmp_path / "w", never_build)
    holder.release_lock(lock)
    assert aws.keys("locks/") == []


def test_stale_lock_of_a_dead_builder_does_not_block_a_new_instance(aws, tmp_path):
    c = cache(aws, settings=CacheSettings(**{**FAST.__dict__, "lock_ttl_s": 2}))
    dead = {"key": c.key, "holder": "i-dead", "build_id": "x", "heartbeat_at": time.time() - 60}
    client(aws.moto_url).put_object(Bucket=aws.bucket, Key=c.lock_key, Body=json.dumps(dead).encode())
    res = c.obtain(tmp_path / "a", fake_build(tmp_path / "n", 0))
    assert res.outcome == "built"


@pytest.mark.parametrize("damage", ["flip a byte", "delete a file", "garble the manifest"])
def test_corrupt_entry_is_rebuilt_never_served(aws, tmp_path, damage):
    s3 = client(aws.moto_url)
    first = cache(aws).obtain(tmp_path / "a", fake_build(tmp_path / "n", 0))
    prefix = first.manifest.extra["artifact_prefix"]
    c = cache(aws, holder="i-2")
    if damage == "flip a byte":
        s3.put_object(Bucket=aws.bucket, Key=prefix + "engine/rank0.engine", Body=b"\0" * (256 * 1024))
    elif damage == "delete a file":
        s3.delete_object(Bucket=aws.bucket, Key=prefix + "engine/rank0.engine")
    else:
        s3.put_object(Bucket=aws.bucket, Key=c.manifest_key, Body=b"{not json")
    counter = tmp_path / "rebuilds"
    res = c.obtain(tmp_path / "b", fake_build(counter, 0))
    assert res.outcome == "built" and count(counter) == 1
    assert res.manifest.extra["build_id"] != first.manifest.extra["build_id"]
    if damage != "garble the manifest":
        assert "corrupt" in res.events
    served = (tmp_path / "b" / c.key / "engine" / "rank0.engine").read_bytes()
    assert served != b"\0" * (256 * 1024)
    # The replacement is what the next instance gets.
    again = cache(aws, holder="i-3").obtain(tmp_path / "c", never_build)
    assert again.outcome == "hit" and again.manifest.extra["build_id"] == res.manifest.extra["build_id"]


def test_repeated_build_failures_trip_the_breaker(aws, tmp_path):
    attempts = []

    def failing(workdir):
        attempts.append(1)
        raise RuntimeError("trtllm-build exited 1: out of memory")

    for i in range(3):
        with pytest.raises(BuildFailed, match="out of memory"):
            cache(aws, holder=f"i-{i}").obtain(tmp_path / f"d{i}", failing)
    assert len(aws.keys("failures/")) == 3 and len(attempts) == 3
    marker = json.loads(client(aws.moto_url).get_object(Bucket=aws.bucket, Key=aws.keys("failures/")[-1])["Body"].read())
    assert "out of memory" in marker["error"] and marker["holder"] == "i-2"
    started = time.monotonic()
    with pytest.raises(CircuitOpen, match="failed 3 time") as err:
        cache(aws, holder="i-9").obtain(tmp_path / "d9", failing)
    assert time.monotonic() - started < 30  # at once: no lock, no wait, no build (a loaded machine may be slow)
    assert len(attempts) == 3
    assert f"failures/{inputs().key}/" in str(err.value)  # says what to delete once fixed
    assert aws.keys("locks/") == []


def test_a_successful_build_clears_old_failure_markers(aws, tmp_path):
    with pytest.raises(BuildFailed):
        cache(aws).obtain(tmp_path / "a", lambda w: (_ for _ in ()).throw(RuntimeError("flaky")))
    assert len(aws.keys("failures/")) == 1
    cache(aws).obtain(tmp_path / "b", fake_build(tmp_path / "n", 0))
    assert aws.keys("failures/") == []


class Flaky:
    """An S3 client that drops the first `failures` calls, like a network blip."""

    def __init__(self, real, failures):
        self.real, self.left, self.calls = real, failures, 0

    def __getattr__(self, name):
        method = getattr(self.real, name)

        def call(*args, **kwargs):
            self.calls += 1
            if self.left > 0:
                self.left -= 1
                raise EndpointConnectionError(endpoint_url="http://s3")
            return method(*args, **kwargs)

        return call


def test_transient_s3_errors_are_retried(aws, tmp_path):
    flaky = Flaky(client(aws.moto_url), failures=3)
    c = EngineCache(flaky, aws.bucket, inputs(), settings=FAST)
    res = c.obtain(tmp_path / "a", fake_build(tmp_path / "n", 0))
    assert res.outcome == "built" and flaky.calls > 3


def test_s3_outage_is_retried_with_backoff_then_reported(tmp_path):
    dead = client(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    sleeps = []
    settings = CacheSettings(**{**FAST.__dict__, "s3_retry_deadline_s": 1.0})
    c = EngineCache(dead, "fleetcast-nowhere", inputs(), settings=settings,
                    sleep=lambda s: (sleeps.append(s), time.sleep(s)))
    with pytest.raises(StorageUnavailable, match="failed for 1 s"):
        c.obtain(tmp_path / "a", never_build)
    assert len(sleeps) >= 2 and max(sleeps) > min(sleeps)  # retried, backing off


@pytest.mark.timeout(150)
@pytest.mark.usefixtures("forked_engines")  # the reference build, a fork: not an interpreter importing PyTorch
def test_concurrent_cold_starts_build_exactly_once(aws, tmp_path):
    """Four instances start together on an empty cache (real processes, the real reference build of
    random GPT-2 weights): one builds, the others wait on the lock and download the same entry."""
    counter = tmp_path / "builds.txt"
    # Forks of multiprocessing's fork server, which imports what an instance's start does once (a spawned
    # interpreter imported boto3, the config model and the backends again: 1.5 s of CPU each); started in this
    # test, it has `forked_engines`' environment, so the reference build is a fork too.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.runtime.cache_worker", "fleetcast.config", "runtime.backends"])
    procs = [ctx.Process(target=cache_worker.cold_start, args=(
        aws.moto_url, aws.bucket, str(tmp_path / f"disk{i}"), str(counter), 0, f"i-{i}",
        str(tmp_path / f"result{i}.json"), True)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    results = [json.loads((tmp_path / f"result{i}.json").read_text()) for i in range(4)]
    assert count(counter) == 1
    assert sorted(r["outcome"] for r in results) == ["built", "hit", "hit", "hit"]
    assert len({r["build_id"] for r in results}) == 1  # everyone serves the same build
    assert len([k for k in aws.keys("engines/") if k.endswith("manifest.json")]) == 1
    assert aws.keys("locks/") == []  # released
    names = {f["path"] for f in results[0]["files"]}
    assert {"config.json", "tokenizer.json"} <= names and any(n.startswith("model.") for n in names)
    for i in range(4):  # every instance holds the verified files on its own disk
        engine = next((tmp_path / f"disk{i}").iterdir())
        assert (engine / "config.json").is_file()


class Recording:
    """Records the S3 calls an EngineCache makes, in order."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __getattr__(self, name):
        method = getattr(self.real, name)

        def call(*args, **kwargs):
            self.calls.append((name, kwargs.get("Key") or (args[2] if len(args) > 2 else None)))
            return method(*args, **kwargs)

        return call


def test_the_manifest_is_written_after_every_artifact_file(aws, tmp_path):
    rec = Recording(client(aws.moto_url))
    c = EngineCache(rec, aws.bucket, inputs(), settings=FAST)
    c.obtain(tmp_path / "a", fake_build(tmp_path / "n", 0))
    writes = [(op, key) for op, key in rec.calls if op in ("upload_file", "put_object") and key.startswith("engines/")]
    assert [key for _, key in writes][-1] == c.manifest_key
    assert len([1 for op, _ in writes if op == "upload_file"]) == 2  # config.json + rank0.engine, before it
    assert all("/builds/" in key for _, key in writes[:-1])  # under the build's own prefix


def test_a_long_build_keeps_its_lock_fresh_so_nobody_takes_it_over(aws, tmp_path):
    short = CacheSettings(**{**FAST.__dict__, "lock_ttl_s": 1.0, "lock_refresh_s": 0.2, "poll_s": 0.1})
    counter = tmp_path / "builds"
    results = {}

    def instance(name, delay):
        time.sleep(delay)
        results[name] = cache(aws, holder=name, settings=short).obtain(tmp_path / name, fake_build(counter, 2.0))

    threads = [threading.Thread(target=instance, args=("i-builder", 0)),
               threading.Thread(target=instance, args=("i-waiter", 0.5))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # 2 s build, 1 s TTL: unrefreshed, the lock is stale to the waiter (there from 0.5 s, polling
    # every 0.1 s) from about 1.1 s on, so a second of polls would have taken it over; only the
    # refreshes kept the waiter out.
    assert count(counter) == 1
    assert results["i-builder"].outcome == "built" and results["i-waiter"].outcome == "hit"


def test_inputs_not_staged_are_not_a_build_failure_but_count_toward_the_breaker(aws, tmp_path):
    """Issue 25: a staged input that is not there after the whole wait (a mistaken calibration.dataset, a revision
    never staged) was retried by every new instance, each waiting 30 minutes: a relaunch loop. Now each such
    wait leaves a marker; at operations.build_failure_limit the next instance abandons at once naming it, and
    once the input is staged the breaker clears itself."""
    from runtime.staged import StagingMissing

    missing = "models/gpt2-tiny/r1/manifest.json"
    waits = []

    def unstaged(workdir):
        waits.append(1)
        raise StagingMissing(f"s3://bucket/{missing} is missing after waiting 1800 s", missing_key=missing)

    for i in range(3):
        with pytest.raises(StagingMissing):
            cache(aws, holder=f"i-{i}").obtain(tmp_path / f"a{i}", unstaged)
        assert aws.keys("locks/") == []  # lock released every time
    assert len(aws.keys("failures/")) == 3 and len(waits) == 3
    marker = json.loads(client(aws.moto_url).get_object(Bucket=aws.bucket, Key=aws.keys("failures/")[-1])["Body"].read())
    assert marker["missing"] == missing and "StagingMissing" in marker["error"]

    with pytest.raises(CircuitOpen, match="missing after waiting") as err:
        cache(aws, holder="i-8").obtain(tmp_path / "a8", unstaged)
    assert len(waits) == 3 and f"clears itself once s3://{aws.bucket}/{missing} is staged" in str(err.value)

    # `fleetcast stage model` puts the manifest there: the next instance clears the staging markers and builds.
    client(aws.moto_url).put_object(Bucket=aws.bucket, Key=missing, Body=b'{"files": []}')

    counter = tmp_path / "builds.txt"
    res = cache(aws, holder="i-9").obtain(tmp_path / "a9", fake_build(counter, 0))
    assert res.outcome == "built" and count(counter) == 1 and aws.keys("failures/") == []


def test_engines_of_other_configs_are_pruned_from_local_disk(aws, tmp_path):
    old = cache(aws, max_batch_size=4)
    old.obtain(tmp_path / "disk", fake_build(tmp_path / "n", 0))
    (tmp_path / "disk" / ".build-20260101T000000Z-dead").mkdir()  # left by a killed build
    new = cache(aws)
    new.obtain(tmp_path / "disk", fake_build(tmp_path / "n", 0))
    assert sorted(new.prune_local(tmp_path / "disk")) == sorted([old.key, ".build-20260101T000000Z-dead"])
    assert [p.name for p in (tmp_path / "disk").iterdir()] == [new.key]
