"""Helpers for the reference-backend tests: build a tiny artifact, run the server as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from runtime.devtools.harness import free_port

from .zygote import reference_servers

ROOT = Path(__file__).resolve().parents[2]

# The modules that start reference servers with ServerProcess run on one pytest-xdist worker, so one fork server
# (PyTorch imported once, about 3 s of CPU) serves them all in a run; they also build artifacts in the worker, so
# it is the worker of the in-process engine tests (tests/runtime/test_reference_engine.py), which has PyTorch too.
ONE_FORK_SERVER = pytest.mark.xdist_group("torch-in-process")


def http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


class ServerProcess:
    """`python -m runtime.reference.server` on a loopback port, waited on until /health is 200. Forked from this
    worker's fork server, which has PyTorch imported (tests/runtime/zygote.py), unless TEST_NO_ZYGOTE=1."""

    def __init__(self, artifact: Path, *extra: str, log_path: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "runtime.reference.server", "--artifact", str(artifact),
               "--host", "127.0.0.1", "--port", str(self.port), "--threads", "1", *extra]
        self.log_path = log_path
        self._log = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
        self._zygote = zygote = reference_servers()
        # The server's engine process is a fork of the server itself (tests/runtime/zygote.py, _local_child).
        self.proc = subprocess.Popen(zygote.command(cmd) if zygote else cmd, cwd=ROOT, stdout=self._log,
                                     stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()}")
            if http_status(self.base + "/health") == 200:
                return
            time.sleep(0.05)
        raise TimeoutError(f"server not healthy after {timeout}s: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path and self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self._zygote is not None:  # the server itself gone too, as when it was this process
            self._zygote.wait_reaped(self.proc.pid)
        if self._log is not subprocess.DEVNULL:
            self._log.close()
