"""runtime/devtools/harness.py: how the runtime tests read a runtime process's stdout."""

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
