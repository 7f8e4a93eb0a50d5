"""runtime/devtools/harness.py: how the runtime tests read a runtime process's stdout, and the stand-in S3 answering
racing conditional writes as S3 does."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from runtime.devtools.harness import RuntimeProcess


def test_a_record_still_in_the_pipe_when_the_test_looks_is_waited_for_not_missed():
    """The process has written its record (and, as in the frozen-server test, made the AWS call after it, which the
    test saw), but the thread that reads its stdout has not read the line yet, as a loaded machine schedules it:
    `metric_values` waits for the first record instead of returning none."""
    record = json.dumps({"_aws": {}, "ServerUnrecoverable": 1.0})
    proc = subprocess.Popen([sys.executable, "-c", f"import time; print({record!r}, flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        rp = RuntimeProcess(proc=proc, started=time.monotonic())
        rp.pump = threading.Thread(target=rp._pump, daemon=True)
        late = threading.Timer(0.5, rp.pump.start)  # the reader runs late
        late.start()
        assert rp.metric_values("ServerUnrecoverable") == [1.0]
        assert rp.emf(lambda r: "Other" in r, wait_s=0.2) == []  # what never comes ends the wait at its bound
    finally:
        proc.kill()
        proc.wait(30)
        late.join(5)


def test_the_stand_in_s3_answers_racing_conditional_writes_as_s3_does_one_wins_the_rest_get_412(aws, monkeypatch):
    """S3 checks If-None-Match / If-Match during the write (docs.aws.amazon.com/AmazonS3/latest/userguide/
    conditional-writes.html): of writers racing on one key, one succeeds. moto checks, then writes; with the check
    held open (a slow lookup, as a loaded machine schedules it) every writer passed it and each "took" the engine
    cache's build lock (a CI run built the engine twice). The harness's server makes the pair atomic."""
    from botocore.exceptions import ClientError
    from moto.s3.models import S3Backend

    key = "locks/race.json"
    lookup = S3Backend.get_object

    def slow_lookup(self, bucket_name, key_name, *args, **kwargs):
        found = lookup(self, bucket_name, key_name, *args, **kwargs)
        if key_name == key:
            time.sleep(0.05)  # between the check's lookup and the write
        return found

    monkeypatch.setattr(S3Backend, "get_object", slow_lookup)

    def race(writers: int, **condition) -> list[str]:
        start = threading.Barrier(writers)
        answers: list[str] = []

        def write(n: int) -> None:
            s3 = aws.s3()
            start.wait(30)
            try:
                # A body of its own per race too: S3's ETag is the content's, so a writer that wrote the same bytes
                # again would leave the ETag the others' If-Match names.
                s3.put_object(Bucket=aws.bucket, Key=key, Body=f"{condition} writer {n}".encode(), **condition)
                answers.append("200")
            except ClientError as exc:
                answers.append(exc.response["Error"]["Code"])

        threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return sorted(answers)

    assert race(6, IfNoneMatch="*") == ["200"] + ["PreconditionFailed"] * 5
    etag = aws.s3().head_object(Bucket=aws.bucket, Key=key)["ETag"]
    assert race(6, IfMatch=etag) == ["200"] + ["PreconditionFailed"] * 5
