"""Keeps the serving processes (model server, gateway) running inside the container.

Two layers of restart, on purpose:
- this supervisor restarts a child that exits on its own (a crashed server comes
  back in seconds, without reloading the container or re-running the engine
  cache), with exponential backoff;
- if a child keeps crashing (more than `max_restarts` within `window_s`), the
  supervisor gives up and the runtime exits non-zero, so systemd
  (runtime/systemd/fleetcast-runtime.service, Restart=on-failure) restarts the
  whole container, and the ASG health check replaces the instance if that fails too.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

log = logging.getLogger("fleetcast.supervisor")


@dataclass
class RestartPolicy:
    max_restarts: int = 5
    window_s: float = 300.0
    backoff_base_s: float = 1.0
    backoff_max_s: float = 30.0


@dataclass
class Child:
    """One supervised process."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    proc: subprocess.Popen | None = None
    starts: int = 0
    restarts: deque = field(default_factory=deque)
    exit_codes: list = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Supervisor:
    """Starts children, restarts the ones that die, stops them in a given order."""

    def __init__(self, poll_s: float = 0.2, on_give_up: Callable[[Child], None] | None = None):
        self.children: dict[str, Child] = {}
        self.poll_s = poll_s
        self.on_give_up = on_give_up
        self.gave_up = threading.Event()
        self.failed_child: Child | None = None
        self._stopping: set[str] = set()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _spawn(self, child: Child) -> None:
        env = dict(os.environ)
        env.update(child.env or {})
        # Own process group: a signal to the child reaches its workers too, and a
        # Ctrl-C aimed at the runtime does not hit the server before drain says so.
        child.proc = subprocess.Popen(list(child.argv), env=env, cwd=child.cwd, start_new_session=True)
        child.starts += 1
        log.info("started %s (pid %d): %s", child.name, child.proc.pid, " ".join(child.argv))

    def start(self, child: Child) -> Child:
        with self._lock:
            self.children[child.name] = child
            self._spawn(child)
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)
            self._thread.start()
        return child

    def _watch(self) -> None:
        pending: dict[str, float] = {}  # child -> monotonic time of its next start
        while not self._stop.wait(self.poll_s):
            with self._lock:
                for child in list(self.children.values()):
                    if child.name in self._stopping or child.proc is None:
                        continue
                    code = child.proc.poll()
                    if code is None:
                        continue
                    if child.name not in pending:
                        child.exit_codes.append(code)
                        now = time.monotonic()
                        while child.restarts and now - child.restarts[0] > child.policy.window_s:
                            child.restarts.popleft()
                        if len(child.restarts) >= child.policy.max_restarts:
                            log.error("%s exited %s; %d restarts within %.0f s: giving up", child.name, code,
                                      len(child.restarts), child.policy.window_s)
                            self._stopping.add(child.name)
                            self.failed_child = child
                            self.gave_up.set()
                            if self.on_give_up:
                                self.on_give_up(child)
                            continue
                        delay = min(child.policy.backoff_max_s, child.policy.backoff_base_s * 2 ** len(child.restarts))
                        log.warning("%s exited with %s; restarting in %.1f s", child.name, code, delay)
                        pending[child.name] = now + delay
                    elif time.monotonic() >= pending[child.name]:
                        del pending[child.name]
                        child.restarts.append(time.monotonic())
                        self._spawn(child)

    def send_signal(self, name: str, sig: int = signal.SIGTERM) -> None:
        """Send a signal to a child without ending supervision (e.g. to start its drain)."""
        child = self.children[name]
        with self._lock:
            self._stopping.add(name)
            if child.running():
                os.killpg(child.proc.pid, sig)

    def wait(self, name: str, timeout_s: float) -> int | None:
        child = self.children[name]
        if child.proc is None:
            return None
        try:
            return child.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, name: str, timeout_s: float = 30.0, sig: int = signal.SIGTERM) -> int | None:
        """Signal, wait up to `timeout_s`, then SIGKILL; returns the exit code."""
        child = self.children.get(name)
        if child is None or child.proc is None:
            return None
        self.send_signal(name, sig)
        code = self.wait(name, timeout_s)
        if code is None and child.running():
            log.error("%s did not stop within %.0f s; killing it", name, timeout_s)
            os.killpg(child.proc.pid, signal.SIGKILL)
            code = child.proc.wait(timeout=10)
        return code

    def shutdown(self, timeout_s: float = 30.0) -> None:
        for name in reversed(list(self.children)):
            self.stop(name, timeout_s)
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
