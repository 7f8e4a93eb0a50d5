"""The engine cache under S3 faults and late holders: every failure is retried, reported or cleaned up.

S3 here is moto behind runtime.devtools.fakes.FaultyS3, a loopback proxy that answers 503,
truncates or stalls chosen requests at the HTTP level. The real boto3 client and its transfer
layer meet those failures, so what reaches the cache is what an instance sees:
- upload_file: boto3/s3/transfer.py S3Transfer.upload_file catches the ClientError (after
  botocore's own retries) and raises boto3.exceptions.S3UploadFailedError;
- download_file: s3transfer/download.py GetObjectTask retries the errors of
  s3transfer/utils.py S3_RETRYABLE_DOWNLOAD_ERRORS (socket errors, ReadTimeoutError,
  IncompleteReadError, ResponseStreamingError) num_download_attempts times, then raises
  s3transfer's RetriesExceededError, which boto3/s3/transfer.py S3Transfer.download_file
  re-raises as boto3.exceptions.RetriesExceededError.
(boto3 1.44 / s3transfer 0.19 as installed.)
"""

import json
import time

import boto3
import pytest
from boto3.exceptions import RetriesExceededError, S3UploadFailedError

from runtime.devtools.fakes import FaultyS3
from runtime.engine_cache import BuildFailed, CacheSettings, EngineCache, StorageUnavailable, s3_client
from tests.runtime.cache_worker import client, fake_build, inputs

FAST = CacheSettings(poll_s=0.1, lock_ttl_s=30, lock_refresh_s=0.5, wait_timeout_s=60, s3_retry_deadline_s=20,
                     s3_backoff_base_s=0.05, s3_backoff_max_s=0.1, s3_stall_timeout_s=1.0)
# For the tests whose proxy stalls a GET until it is stopped: no stall ends on its own, so a short
# bound cannot turn a stall into a success; a healthy GET slower than it (a loaded machine) is one
# more retry of an idempotent read within the deadline. Nothing here writes through that client.
STALL = CacheSettings(**{**FAST.__dict__, "s3_stall_timeout_s": 0.25})


@pytest.fixture
def proxy(aws):
    p = FaultyS3(aws.moto_url).start()
    yield p
    p.stop()


def product_client(url: str, settings: CacheSettings):
    """The client exactly as the bootstrap makes it (engine_cache.s3_client), pointed at the proxy."""
    session = boto3.Session(region_name="ap-northeast-2", aws_access_key_id="testing",
                            aws_secret_access_key="testing")
    import os

    os.environ["AWS_ENDPOINT_URL_S3"] = url
    try:
        return s3_client(session, settings)
    finally:
        del os.environ["AWS_ENDPOINT_URL_S3"]


def faulty_cache(aws, proxy, holder="i-faulty", settings=FAST, **changes) -> EngineCache:
    return EngineCache(product_client(proxy.url, settings), aws.bucket, inputs(**changes), holder=holder,
                       settings=settings)


def never_build(workdir):
    raise AssertionError("build must not run")


def test_the_fake_fails_the_way_boto3s_transfer_layer_does(aws, proxy, tmp_path):
    """The stand-in is only worth something if boto3 raises its own wrapper types through it."""
    s3 = client(proxy.url)
    src = tmp_path / "f"
    src.write_bytes(b"x" * 300_000)
    # Every attempt but the last (standard mode: botocore/retries/standard.py DEFAULT_MAX_ATTEMPTS) meets
    # ServiceUnavailable, whose backoff starts at 50 ms, not SlowDown's 1 s; the one upload_file gives up on is S3's
    # throttling 503, whose code the wrapper must carry.
    from botocore.retries.standard import DEFAULT_MAX_ATTEMPTS

    assert s3.meta.config.retries == {"mode": "standard"}
    proxy.add("PUT", "/engines/", "503-unavailable", times=DEFAULT_MAX_ATTEMPTS - 1)
    proxy.add("PUT", "/engines/", "503")
    with pytest.raises(S3UploadFailedError, match="SlowDown"):
        s3.upload_file(str(src), aws.bucket, "engines/x/a")
    proxy.clear()
    s3.upload_file(str(src), aws.bucket, "engines/x/a")
    proxy.add("GET", "/engines/", "truncate")
    with pytest.raises(RetriesExceededError):
        s3.download_file(aws.bucket, "engines/x/a", str(tmp_path / "g"))


@pytest.mark.parametrize("action, code, first_backoff_s", [("503", "SlowDown", 1.0),
                                                          ("503-unavailable", "ServiceUnavailable", 0.05)])
def test_botocore_backs_off_from_each_503_the_fake_sends_as_the_tests_assume(action, code, first_backoff_s):
    """The fake's two 503s, through botocore's own standard-mode backoff (botocore/retries/standard.py,
    ExponentialBackoff with the ThrottlingErrorDetector that register_retry_handler gives it): the first retry
    waits up to 1 s after a throttling code and up to 50 ms after any other, which is why the tests of what
    happens after botocore's retries use "503-unavailable"."""
    from botocore.retries import standard

    from runtime.devtools.fakes import _503

    assert _503[action][0] == code
    context = standard.RetryContext(attempt_number=1, operation_model=None, parsed_response={"Error": {"Code": code}},
                                    http_response=None)
    backoff = standard.ExponentialBackoff(random=lambda: 1.0,  # the upper end of the jitter
                                          throttling_detector=standard.ThrottlingErrorDetector(
                                              standard.RetryEventAdapter()))
    assert backoff.delay_amount(context) == first_backoff_s


def test_uploads_answering_503_are_retried_until_they_go_through(aws, proxy, tmp_path):
    # botocore retries a 503 three times (standard mode) before upload_file gives up: fail four
    # requests, so the cache's own retry has to act on S3UploadFailedError. The first three are
    # ServiceUnavailable (botocore backs off from 50 ms), the fourth, the one upload_file gives up
    # on, is SlowDown (S3's throttling 503): the cache retries on the throttling code without
    # this test waiting out botocore's 1 s-base throttling backoff (nothing retries after it).
    proxy.add("PUT", "/builds/", "503-unavailable", times=3)
    proxy.add("PUT", "/builds/", "503", times=1)
    res = faulty_cache(aws, proxy).obtain(tmp_path / "a", fake_build(tmp_path / "n", 0))
    assert res.outcome == "built"
    assert [action for _, _, action in proxy.injected] == ["503-unavailable"] * 3 + ["503"]
    assert len({key for _, key, _ in proxy.injected}) == 1  # one upload_file call met all four
    assert aws.keys("locks/") == []


def test_uploads_that_keep_failing_end_as_storage_unavailable_and_free_the_lock(aws, proxy, tmp_path):
    proxy.add("PUT", "/builds/", "503-unavailable")
    settings = CacheSettings(**{**FAST.__dict__, "s3_retry_deadline_s": 0.5})
    with pytest.raises(StorageUnavailable, match="S3UploadFailedError"):
        faulty_cache(aws, proxy, settings=settings).obtain(tmp_path / "a", fake_build(tmp_path / "n", 0))
    assert aws.keys("locks/") == [] and aws.keys("failures/") == []  # not the build's fault


@pytest.mark.parametrize("action", ["truncate", "stall"])
def test_downloads_that_break_or_stall_are_retried_then_succeed(aws, proxy, tmp_path, action):
    built = EngineCache(client(aws.moto_url), aws.bucket, inputs(), holder="i-builder", settings=FAST)
    built.obtain(tmp_path / "b", fake_build(tmp_path / "n", 0))
    # s3transfer alone would absorb 5 broken reads of one GET (num_download_attempts); 6 exceed that.
    proxy.add("GET", "/builds/", action, times=6)
    started = time.monotonic()
    res = faulty_cache(aws, proxy, settings=STALL).obtain(tmp_path / "a", never_build)
    assert res.outcome == "hit"
    assert len(proxy.injected) == 6
    if action == "stall":
        # six stalls of 0.25 s (s3_stall_timeout_s) plus backoff; the default would be 6 x 5 x 60 s
        assert time.monotonic() - started < 120


def test_a_download_that_stays_stalled_is_reported_within_the_deadline(aws, proxy, tmp_path):
    EngineCache(client(aws.moto_url), aws.bucket, inputs(), settings=FAST).obtain(tmp_path / "b",
                                                                                   fake_build(tmp_path / "n", 0))
    proxy.add("GET", "/builds/", "stall")
    settings = CacheSettings(**{**STALL.__dict__, "s3_retry_deadline_s": 0.5})
    started = time.monotonic()
    with pytest.raises(StorageUnavailable, match="stalled"):
        faulty_cache(aws, proxy, settings=settings).obtain(tmp_path / "a", never_build)
    assert time.monotonic() - started < 60  # the stall bound is 0.25 s; generous for a loaded machine


def test_a_failing_lock_release_neither_hides_the_error_nor_keeps_others_waiting(aws, proxy, tmp_path):
    """The build fails while S3 refuses deletes: the build failure is what surfaces, and the lock
    is marked released so a waiter with an hour-long lock lifetime takes over at once."""
    proxy.add("DELETE", "/locks/", "503-unavailable")
    settings = CacheSettings(**{**FAST.__dict__, "lock_release_deadline_s": 0.5})

    def broken(workdir):
        raise RuntimeError("trtllm-build exited 1: out of memory")

    with pytest.raises(BuildFailed, match="out of memory"):
        faulty_cache(aws, proxy, settings=settings).obtain(tmp_path / "a", broken)
    assert any(i[0] == "DELETE" for i in proxy.injected)  # the release did meet the outage
    waiter = EngineCache(client(aws.moto_url), aws.bucket, inputs(), holder="i-waiter",
                         settings=CacheSettings(**{**FAST.__dict__, "lock_ttl_s": 3600}))
    assert waiter.try_lock("b2") is not None


def builds(aws, key: str) -> set[str]:
    return {k.split("/builds/")[1].split("/")[0] for k in aws.keys(f"engines/{key}/builds/")}


def test_a_late_holder_discards_its_upload_and_serves_the_entry_that_took_over(aws, tmp_path):
    """Instance A froze mid-build past its lock's lifetime (no refresh: lock_refresh_s is an hour);
    B took the lock over, built and published. When A resumes it must not upload a build that
    nobody references: it finds its lock gone, deletes what it uploaded and serves B's entry."""
    frozen = CacheSettings(**{**FAST.__dict__, "lock_refresh_s": 3600})
    a = EngineCache(client(aws.moto_url), aws.bucket, inputs(), holder="i-a", settings=frozen)
    b = EngineCache(client(aws.moto_url), aws.bucket, inputs(), holder="i-b",
                    settings=CacheSettings(**{**FAST.__dict__, "lock_ttl_s": 0.0}))  # A's lock is stale to B
    taken_over = {}
    plain = fake_build(tmp_path / "n", 0)

    def a_build(workdir):
        taken_over["b"] = b.obtain(tmp_path / "b", plain)  # while A is "frozen"
        return plain(workdir)

    res = a.obtain(tmp_path / "a", a_build)
    assert taken_over["b"].outcome == "built"
    assert res.outcome == "hit" and "lock-lost" in res.events
    assert res.manifest.extra["build_id"] == taken_over["b"].manifest.extra["build_id"]
    assert builds(aws, a.key) == {taken_over["b"].manifest.extra["build_id"]}
    lock = aws.keys("locks/")
    assert lock == [] or json.loads(aws.s3().get_object(Bucket=aws.bucket, Key=lock[0])["Body"].read())[
        "holder"] != "i-a"


def test_a_build_that_loses_the_publish_race_deletes_its_upload(aws, tmp_path):
    a = EngineCache(client(aws.moto_url), aws.bucket, inputs(), holder="i-a", settings=FAST)
    other = EngineCache(client(aws.moto_url), aws.bucket, inputs(), holder="i-other", settings=FAST)
    plain = fake_build(tmp_path / "n", 0)
    published = {}

    def a_build(workdir):
        artifact = plain(tmp_path / "other-work")
        published["m"] = other.publish(artifact, "20260101T000000Z-other", 0.0, None)
        return plain(workdir)

    res = a.obtain(tmp_path / "a", a_build)
    assert res.outcome == "hit" and res.manifest.extra["build_id"] == "20260101T000000Z-other"
    assert builds(aws, a.key) == {"20260101T000000Z-other"}


def test_a_replaced_corrupt_build_is_deleted(aws, tmp_path):
    s3 = client(aws.moto_url)
    first = EngineCache(s3, aws.bucket, inputs(), settings=FAST).obtain(tmp_path / "a", fake_build(tmp_path / "n", 0))
    prefix = first.manifest.extra["artifact_prefix"]
    s3.put_object(Bucket=aws.bucket, Key=prefix + "engine/rank0.engine", Body=b"bit rot")
    second = EngineCache(s3, aws.bucket, inputs(), holder="i-2", settings=FAST)
    res = second.obtain(tmp_path / "b", fake_build(tmp_path / "n", 0))
    assert res.outcome == "built"
    assert builds(aws, second.key) == {res.manifest.extra["build_id"]}
    assert aws.keys(prefix) == []


# ---------------------------------------------------------------- conditional writes' ambiguous answers


def test_s3s_own_reference_says_a_409_on_a_conditional_put_is_retried_not_a_verdict():
    """PutObject's IfMatch and IfNoneMatch, in the S3 model botocore ships (botocore/data/s3/2006-03-01/
    service-2.json, the API reference's text): a conflicting operation during the upload answers 409
    ConditionalRequestConflict, and the caller retries (for IfMatch, after fetching the ETag). `put_if_at` rests on
    it; 412 is the answer that the condition failed."""
    import botocore.session

    members = botocore.session.get_session().get_service_model("s3").operation_model("PutObject").input_shape.members
    for header, advice in (("IfMatch", "fetch the object's ETag and retry"), ("IfNoneMatch", "retry the upload")):
        doc = members[header].documentation
        assert "409 ConditionalRequestConflict" in doc and advice in doc and "412 Precondition Failed" in doc


class AnswersOnce:
    """A boto3 S3 client whose next conditional PutObject on `key` gets one of S3's ambiguous answers, as botocore
    raises them: "conflict", a 409 ConditionalRequestConflict (ClientError with S3's code and status), the write not
    made; "lost", the write made and its answer lost to a read timeout (botocore's ReadTimeoutError, which the cache
    sends again). `meanwhile` runs first: another writer's write, overlapping this one."""

    def __init__(self, real, key: str, answer: str, times: int = 1, meanwhile=None):
        self.real, self.key, self.answer, self.left, self.meanwhile = real, key, answer, times, meanwhile
        self.answered = 0

    def __getattr__(self, name):
        return getattr(self.real, name)

    def put_object(self, **kwargs):
        conditional = "IfMatch" in kwargs or "IfNoneMatch" in kwargs
        if kwargs.get("Key") != self.key or not conditional or self.left == 0:
            return self.real.put_object(**kwargs)
        self.left -= 1
        self.answered += 1
        if self.meanwhile is not None:
            self.meanwhile()
        if self.answer == "lost":
            from botocore.exceptions import ReadTimeoutError

            self.real.put_object(**kwargs)
            raise ReadTimeoutError(endpoint_url="http://s3")
        from botocore.exceptions import ClientError

        raise ClientError({"Error": {"Code": "ConditionalRequestConflict",
                                     "Message": "The conditional request cannot succeed due to a conflicting "
                                                "operation against this resource."},
                           "ResponseMetadata": {"HTTPStatusCode": 409}}, "PutObject")


def lock_body(aws, key: str) -> dict:
    return json.loads(aws.s3().get_object(Bucket=aws.bucket, Key=key)["Body"].read())


@pytest.mark.parametrize("answer", ["conflict", "lost"])
def test_a_lock_refresh_that_meets_an_ambiguous_answer_keeps_a_lock_that_is_still_ours(aws, answer):
    """A 409 while the lock is still at our ETag is retried (S3's reference above); a refresh whose answer was lost
    meets its own write when sent again (412) and knows it by its body. Either way the holder keeps its lock instead
    of discarding a build that nobody took over."""
    s3 = client(aws.moto_url)
    c = EngineCache(s3, aws.bucket, inputs(), holder="i-a", settings=FAST)
    lock = c.try_lock("b1")
    assert lock is not None
    c.s3 = c.store.s3 = AnswersOnce(s3, c.lock_key, answer)
    assert c.refresh_lock(lock) and not lock.lost and c.s3.answered == 1
    assert lock_body(aws, c.lock_key) == lock.body  # the refreshed body is the one in S3, under the ETag we hold
    assert c.refresh_lock(lock)


def test_a_409_after_another_writer_moved_the_lock_on_is_a_loss(aws):
    s3 = client(aws.moto_url)
    c = EngineCache(s3, aws.bucket, inputs(), holder="i-a", settings=FAST)
    lock = c.try_lock("b1")
    taker = json.dumps({"holder": "i-b", "heartbeat_at": time.time()}).encode()
    c.s3 = c.store.s3 = AnswersOnce(s3, c.lock_key, "conflict",
                                    meanwhile=lambda: s3.put_object(Bucket=aws.bucket, Key=c.lock_key, Body=taker))
    assert not c.refresh_lock(lock) and lock.lost
    assert lock_body(aws, c.lock_key)["holder"] == "i-b"


@pytest.mark.parametrize("answer", ["conflict", "lost"])
def test_a_manifest_write_that_meets_an_ambiguous_answer_still_publishes_this_build(aws, tmp_path, answer):
    s3 = client(aws.moto_url)
    c = EngineCache(s3, aws.bucket, inputs(), holder="i-a", settings=FAST)
    c.s3 = c.store.s3 = AnswersOnce(s3, c.manifest_key, answer)
    res = c.obtain(tmp_path / "a", fake_build(tmp_path / "n", 0))
    assert res.outcome == "built" and c.s3.answered == 1
    assert (tmp_path / "n").read_text().count("\n") == 1  # built once, not discarded and built again
    assert builds(aws, c.key) == {res.manifest.extra["build_id"]}
    assert aws.keys("locks/") == []


def test_conflicts_that_never_end_are_bounded_a_waiter_keeps_waiting_a_write_reports_s3_unavailable(aws):
    s3 = client(aws.moto_url)
    slept = []
    c = EngineCache(s3, aws.bucket, inputs(), holder="i-a", settings=FAST, sleep=slept.append)
    c.s3 = c.store.s3 = AnswersOnce(s3, c.lock_key, "conflict", times=1000)
    assert c.try_lock("b1") is None  # others are writing the lock: back to the wait loop, which polls again
    assert 1 < c.s3.answered <= 10 and len(slept) == c.s3.answered - 1  # bounded, backing off between tries
    assert slept[-1] > slept[0]
    with pytest.raises(StorageUnavailable, match=f"{c.lock_key}.*409 ConditionalRequestConflict"):
        c.put_if_at(c.lock_key, b"{}", None)


def test_a_create_in_a_bucket_that_is_not_there_is_an_error_not_contention(aws):
    """S3 answers a 404 to an If-Match write whose key is gone (someone released or replaced it); to a create
    (If-None-Match) a 404 can only be NoSuchBucket, which must surface as the error it is."""
    from botocore.exceptions import ClientError

    c = EngineCache(client(aws.moto_url), f"{aws.bucket}-missing", inputs(), holder="i-a", settings=FAST)
    with pytest.raises(ClientError, match="NoSuchBucket"):
        c.try_lock("b1")


def test_a_release_finds_the_lock_a_late_refresh_moved_on_and_still_deletes_it(aws):
    """The build ended while a refresh was in flight: the release holds the ETag before it, the lock has the
    refresh's. The lock still names this holder and build, so it is deleted, not left for waiters to wait out."""
    from runtime.engine_cache import _Lock

    c = EngineCache(client(aws.moto_url), aws.bucket, inputs(), holder="i-a", settings=FAST)
    lock = c.try_lock("b1")
    before_the_refresh = _Lock(etag=lock.etag, body=dict(lock.body))
    assert c.refresh_lock(lock)
    c.release_lock(before_the_refresh)
    assert aws.keys("locks/") == []


def test_a_release_leaves_a_lock_that_another_instance_took_over(aws):
    from runtime.engine_cache import _Lock

    a = EngineCache(client(aws.moto_url), aws.bucket, inputs(), holder="i-a", settings=FAST)
    lock = a.try_lock("b1")
    stale = _Lock(etag=lock.etag, body=dict(lock.body))
    b = EngineCache(client(aws.moto_url), aws.bucket, inputs(), holder="i-b",
                    settings=CacheSettings(**{**FAST.__dict__, "lock_ttl_s": 0.0}))  # a's lock is stale to b
    time.sleep(0.01)
    assert b.try_lock("b2") is not None
    a.release_lock(stale)
    assert lock_body(aws, a.lock_key)["holder"] == "i-b"
