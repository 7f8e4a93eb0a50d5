"""Keeps the serving processes (model server, gateway) running inside the container.

Two layers of restart, on purpose:
- this supervisor restarts a child that exits on its own (a crashed server comes
  back in seconds, without reloading the container or re-running the engine
  cache), with exponential backoff;
- a child with a liveness probe that stops answering (alive, frozen: a hung GPU,
  a deadlocked executor, SIGSTOP) is killed after `failures` probes in a row fail
  and then restarted like a crashed one, so "frozen" becomes "exited". A child
  still starting (it has not answered yet) is given `startup_s` only while it
  works at it: a probe it does not answer, and across which (at least `window_s`
  from just before the probe) it used no CPU and did no I/O, counts as a failure,
  so a restart that freezes before its first answer is killed after the same
  `failures` probes as a settled child that freezes (the evidence is taken over
  each probe's own window, not against the previous probe, which would let a
  freeze between two probes cost one probe more);
- children of one group (the engine processes of one GPU shared under MPS) fall and rise together: when
  one exits (crashed, or killed as frozen), the others are killed too, the group's `before_start` runs
  (the MPS control daemon is started again if it died) and every member is started again in its order,
  all loading at once (their KV budgets need no order). An MPS fault is reported to every client of the GPU, and the
  MPS server accepts no new client until all of them have exited (NVIDIA MPS documentation, "Memory
  Protection and Error Containment"): restarting only the one that died would crash-loop it. The group's
  `after_stop` runs when its last member is stopped on purpose (the daemon's quit);
- if a child keeps crashing or freezing (more than `max_restarts` within
  `window_s`), the supervisor gives up. The runtime then marks the instance
  unhealthy so the group replaces it (runtime/bootstrap.py), or, if that call
  fails, exits non-zero so systemd (runtime/systemd/fleetcast-runtime.service,
  Restart=on-failure) restarts the whole container.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from fleetcast.contract.instance_env import Var, default
from runtime.descriptors import reserve_descriptors

log = logging.getLogger("fleetcast.supervisor")


@dataclass
class RestartPolicy:
    max_restarts: int = default(Var.MAX_RESTARTS)
    window_s: float = 300.0
    backoff_base_s: float = default(Var.RESTART_BACKOFF_S)
    backoff_max_s: float = 30.0


@dataclass
class Liveness:
    """A bounded health probe of a running child.

    `probe()` returns True when the child answered; it must bound its own wait
    (a frozen server accepts connections and never replies). After a (re)start the
    child has `startup_s` to answer once (loading an engine takes a while); from then
    on `failures` consecutive failed probes, `interval_s` apart, count as frozen.
    """

    probe: Callable[[], bool]
    interval_s: float = 10.0
    failures: int = 3
    startup_s: float = 1800.0
    # The work a starting child has done so far (pid -> a counter that grows while it works, None when it
    # cannot be read); unchanged across a failed probe's window means it is not starting, it is stuck.
    progress: Callable[[int], object] | None = None
    # The least span over which a starting child's work is compared: from just before a probe to at least
    # this long after. The probe's own timeout: a probe refused at once (nothing listening yet) is judged
    # over as long a span as one that timed out on a frozen listener.
    window_s: float = 5.0

    def __post_init__(self) -> None:
        if self.progress is None:
            self.progress = session_work


def _proc_fields(pid: str) -> tuple[int, int] | None:
    """(session id, CPU time) of one process, None when it is gone. CPU time in nanoseconds from
    /proc/PID/schedstat (exact: a process that ran a few milliseconds between two probes shows it), else in
    clock ticks from /proc/PID/stat (proc(5): fields 14-17, utime, stime, cutime, cstime)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 3 of proc(5)
    session = int(fields[3])  # field 6
    try:
        with open(f"/proc/{pid}/schedstat") as handle:
            return session, int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return session, sum(int(f) for f in fields[11:15])


def _io_chars(pid: str) -> int:
    """Bytes read and written (rchar + wchar, /proc/PID/io), 0 when not readable."""
    try:
        with open(f"/proc/{pid}/io") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return 0
    return sum(int(line.split()[1]) for line in lines if line.startswith(("rchar:", "wchar:")))


def session_work(sid: int) -> tuple[int, int] | None:
    """CPU time and I/O bytes of every process in session `sid` (a child is started in its own session, so
    its workers are counted with it). None where /proc does not exist: no verdict without evidence."""
    if not os.path.isdir("/proc"):
        return None
    ticks = chars = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        fields = _proc_fields(pid)
        if fields is not None and fields[0] == sid:
            ticks += fields[1]
            chars += _io_chars(pid)
    return ticks, chars


@dataclass
class Group:
    """Children that share one fate (see the module's docstring), in their start order."""

    name: str
    members: list[str] = field(default_factory=list)
    before_start: Callable[[], None] | None = None  # before the first member starts, and before each restart
    after_stop: Callable[[], None] | None = None  # after the last member is stopped on purpose
    ready: Callable[[Child], bool] | None = None  # a restarted member answers (how long a restart took)
    ready_timeout_s: float = 1800.0
    started: bool = False
    restarts: int = 0  # times the whole group was restarted
    last_fault: float | None = None  # monotonic time of the exit that started the last restart
    last_restart_s: float | None = None  # from that exit to every member answering again


@dataclass
class Child:
    """One supervised process."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    env_unset: Sequence[str] = ()  # inherited variables it must not see (an MPS client: CUDA_VISIBLE_DEVICES)
    group: str | None = None
    cwd: str | None = None
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    liveness: Liveness | None = None
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    restarts: deque[float] = field(default_factory=deque)  # monotonic start times within the window
    exit_codes: list[int] = field(default_factory=list)
    unresponsive: int = 0  # times it was killed for not answering its liveness probe
    spawned_at: float = 0.0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Supervisor:
    """Starts children, restarts the ones that die, stops them in a given order."""

    def __init__(self, poll_s: float = 0.2, on_give_up: Callable[[Child], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], bool] | None = None):
        """`clock` and `sleep` (waits, True when the supervisor stops meanwhile) time the liveness probes;
        tests pass fake ones to count probes instead of reading a wall clock."""
        # Every server started from here begins with a whole descriptor table (and the raised soft limit):
        # growing it later, with its threads running, would stall its event loop (runtime/descriptors.py).
        reserve_descriptors(for_children=True)
        self.children: dict[str, Child] = {}
        self.poll_s = poll_s
        self.on_give_up = on_give_up
        self.gave_up = threading.Event()
        self.failed_child: Child | None = None
        self._stopping: set[str] = set()
        self.groups: dict[str, Group] = {}
        self._held: set[str] = set()  # members of a group being restarted: neither watched nor probed
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.clock = clock
        self.sleep = sleep if sleep is not None else self._stop.wait

    def _spawn(self, child: Child) -> None:
        env = dict(os.environ)
        env.update(child.env or {})
        for name in child.env_unset:
            env.pop(name, None)
        # Own process group: a signal to the child reaches its workers too, and a
        # Ctrl-C aimed at the runtime does not hit the server before drain says so.
        child.proc = subprocess.Popen(list(child.argv), env=env, cwd=child.cwd, start_new_session=True)
        child.starts += 1
        child.spawned_at = self.clock()
        log.info("started %s (pid %d): %s", child.name, child.proc.pid, " ".join(child.argv))

    def add_group(self, group: Group) -> Group:
        self.groups[group.name] = group
        return group

    def start(self, child: Child) -> Child:
        with self._lock:
            group = self.groups.get(child.group) if child.group is not None else None
            if group is not None:
                if child.name not in group.members:
                    group.members.append(child.name)
                if not group.started:
                    if group.before_start is not None:
                        group.before_start()  # the MPS daemon before the GPU's first engine process
                    group.started = True
            self.children[child.name] = child
            self._spawn(child)
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)
            self._thread.start()
        if child.liveness is not None:
            # Own thread: a probe waits up to its timeout, which must not delay restarts of others.
            threading.Thread(target=self._probe_loop, args=(child,), name=f"liveness-{child.name}",
                             daemon=True).start()
        return child

    def _probe_loop(self, child: Child) -> None:
        live = child.liveness
        assert live is not None
        answered_pid: int | None = None  # the process that has answered once since its start
        failed = 0
        while not self.sleep(live.interval_s):
            with self._lock:
                if child.name in self._stopping:
                    return  # stopped on purpose, or given up on
                if child.name in self._held:
                    answered_pid, failed = None, 0
                    continue  # its group is being restarted
                proc = child.proc
                if proc is None or proc.poll() is not None:
                    failed = 0
                    continue  # exited: the watch loop restarts it
                pid, since = proc.pid, child.spawned_at
            starting = answered_pid != pid and self.clock() - since < live.startup_s
            before = live.progress(pid) if starting and live.progress is not None else None
            began = self.clock()
            ok = False
            try:
                ok = bool(live.probe())
            except Exception as exc:  # noqa: BLE001 - a probe that raises is a failed probe
                log.debug("liveness probe of %s raised %s", child.name, exc)
            if ok:
                if answered_pid != pid:
                    log.info("%s (pid %d) answers its liveness probe", child.name, pid)
                answered_pid, failed = pid, 0
                continue
            if starting:
                rest = live.window_s - (self.clock() - began)
                if rest > 0 and self.sleep(rest):
                    return
                after = live.progress(pid) if live.progress is not None else None
                if before is None or after is None or after != before:
                    failed = 0
                    continue  # still starting, and working at it
                # Starting, but nothing done across this probe's window: judged like a settled child.
            failed += 1
            if failed < live.failures:
                log.warning("%s (pid %d) did not answer its liveness probe (%d of %d)", child.name, pid, failed,
                            live.failures)
                continue
            failed = 0
            with self._lock:
                if child.proc is None or child.proc.pid != pid or child.name in self._stopping:
                    continue
                log.error("%s (pid %d) is alive but did not answer %d liveness probes in a row; killing it "
                          "so it is restarted", child.name, pid, live.failures)
                child.unresponsive += 1
                try:
                    os.killpg(pid, signal.SIGKILL)  # SIGTERM would wait on a process that is not running
                except ProcessLookupError:
                    pass

    def _watch(self) -> None:
        pending: dict[str, float] = {}  # child -> monotonic time of its next start
        while not self._stop.wait(self.poll_s):
            with self._lock:
                for child in list(self.children.values()):
                    if child.name in self._stopping or child.name in self._held or child.proc is None:
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
                        group = self.groups.get(child.group) if child.group is not None else None
                        if group is not None:
                            child.restarts.append(now)
                            self._restart_group(group, child, code, delay)
                            continue
                        log.warning("%s exited with %s; restarting in %.1f s", child.name, code, delay)
                        pending[child.name] = now + delay
                    elif time.monotonic() >= pending[child.name]:
                        del pending[child.name]
                        child.restarts.append(time.monotonic())
                        self._spawn(child)

    def _restart_group(self, group: Group, failed: Child, code: int, delay: float) -> None:
        """Holds every member and restarts them together on a thread of their own (called with the lock held)."""
        members = [self.children[m] for m in group.members if m in self.children and m not in self._stopping]
        self._held.update(c.name for c in members)
        group.last_fault = time.monotonic()
        log.error("%s exited with %s; restarting every process of %s together in %.1f s: %s", failed.name, code,
                  group.name, delay, ", ".join(c.name for c in members))
        threading.Thread(target=self._run_group_restart, args=(group, members, delay), name=f"restart-{group.name}",
                         daemon=True).start()

    def _run_group_restart(self, group: Group, members: list[Child], delay: float) -> None:
        try:
            if self._stop.wait(delay):
                return
            for child in members:  # what is still alive of the group: frozen by the fault or not, it goes
                if child.running() and child.proc is not None:
                    try:
                        os.killpg(child.proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for child in members:
                if child.proc is not None:
                    try:
                        child.proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        log.error("%s (pid %d) outlived SIGKILL for 30 s", child.name, child.proc.pid)
            with self._lock:
                if self._stop.is_set() or any(c.name in self._stopping for c in members):
                    return  # a drain began meanwhile: nothing to start again, the daemon stays stopped
            if group.before_start is not None:
                group.before_start()  # the daemon again, where it died with its clients
            for child in members:  # in their order, each started once the one before it is (not ready): a
                with self._lock:  # restart's downtime is one load, not the sum of all (the budgets need no order)
                    if child.name in self._stopping or self._stop.is_set():
                        return
                    self._spawn(child)
            deadline = time.monotonic() + group.ready_timeout_s
            for child in members:  # for the record: how long the GPU's models were down
                while group.ready is not None and not group.ready(child):
                    if not child.running() or time.monotonic() > deadline or self._stop.wait(self.poll_s):
                        break  # the next watch pass sees it exit (or the liveness probe finds it stuck)
            group.restarts += 1
            if group.last_fault is not None:
                group.last_restart_s = time.monotonic() - group.last_fault
            log.info("%s restarted: every process answers again %.1f s after the fault", group.name,
                     group.last_restart_s or 0.0)
        except Exception as exc:  # noqa: BLE001 - a failed restart is a failure of the group's first member
            log.error("restarting %s failed: %s", group.name, exc)
            with self._lock:
                first = members[0] if members else None
                if first is not None:
                    self._stopping.update(c.name for c in members)
                    self.failed_child = first
                    self.gave_up.set()
            if self.on_give_up and members:
                self.on_give_up(members[0])
        finally:
            with self._lock:
                self._held.difference_update(c.name for c in members)

    def send_signal(self, name: str, sig: int = signal.SIGTERM) -> None:
        """Send a signal to a child without ending supervision (e.g. to start its drain)."""
        child = self.children[name]
        with self._lock:
            self._stopping.add(name)
            if child.proc is not None and child.running():
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
        self._group_stopped(child)
        return code

    def _group_stopped(self, child: Child) -> None:
        """After a member stopped on purpose: the group's after_stop once the last one is down."""
        group = self.groups.get(child.group) if child.group is not None else None
        if group is None:
            return
        with self._lock:
            if not group.started:
                return
            rest = [self.children[m] for m in group.members if m in self.children]
            if any(c.running() for c in rest) or not all(c.name in self._stopping for c in rest):
                return
            group.started = False
        if group.after_stop is not None:
            try:
                group.after_stop()  # the MPS daemon after the GPU's last engine process
            except Exception as exc:  # noqa: BLE001 - a daemon that will not quit must not stop the drain
                log.error("stopping %s: %s", group.name, exc)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        for name in reversed(list(self.children)):
            self.stop(name, timeout_s)
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
