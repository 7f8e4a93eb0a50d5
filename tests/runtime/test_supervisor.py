"""Crashed processes come back: the in-container supervisor restarts them; the systemd unit restarts the container."""

import configparser
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fleetcast.config.model import Operations
from fleetcast.contract.telemetry import INSTANCE_ENV_FILE
from runtime.devtools.harness import free_port
from runtime.supervisor import Child, RestartPolicy, Supervisor

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "runtime" / "systemd" / "fleetcast-runtime.service"


def http_ok(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def wait_for(predicate, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_supervisor_restarts_a_crashed_server(tmp_path):
    port = free_port()
    sup = Supervisor(poll_s=0.05)
    child = sup.start(Child("server", [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            cwd=str(tmp_path), policy=RestartPolicy(backoff_base_s=0.1)))
    try:
        assert wait_for(lambda: http_ok(port))
        first = child.pid
        os.kill(first, signal.SIGKILL)  # a crash, not a stop
        assert wait_for(lambda: child.pid != first and http_ok(port))
        assert child.starts == 2 and child.exit_codes == [-signal.SIGKILL]
        assert not sup.gave_up.is_set()
    finally:
        sup.shutdown(timeout_s=5)
    assert not child.running()


def test_a_supervised_server_starts_with_a_whole_descriptor_table(tmp_path):
    """Its event loop never waits for the table to grow (runtime/descriptors.py): the supervisor keeps a
    close-on-exec descriptor in the last slot, the child's table is sized to it at fork and exec keeps it."""
    import resource

    from runtime.descriptors import descriptor_slots, reserve_descriptors

    report = tmp_path / "slots"
    code = ("import os, pathlib, resource, time\n"
            "fds = sorted(int(f) for f in os.listdir('/proc/self/fd'))\n"
            "slots = open('/proc/self/status').read().split('FDSize:')[1].split()[0]\n"
            f"pathlib.Path({str(report)!r}).write_text(f'{{slots}} {{fds[-1]}} {{resource.getrlimit(resource.RLIMIT_NOFILE)[0]}}')\n"
            "time.sleep(30)\n")
    sup = Supervisor(poll_s=0.05)
    room = reserve_descriptors(for_children=True)  # what the supervisor reserved (the call is idempotent)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert room >= min(4096, hard) and descriptor_slots() >= room
    sup.start(Child("server", [sys.executable, "-c", code]))
    try:
        assert wait_for(lambda: report.exists() and report.read_text().count(" ") == 2)
        slots, highest_open, soft = map(int, report.read_text().split())
        assert slots >= room  # whole from the start
        assert highest_open < 64  # the parent's held descriptor did not leak into it (close-on-exec)
        assert soft >= room  # and it may use them
    finally:
        sup.shutdown(timeout_s=5)


def test_supervisor_gives_up_on_a_crash_loop_so_systemd_can_restart_the_container():
    sup = Supervisor(poll_s=0.05)
    child = sup.start(Child("server", [sys.executable, "-c", "import sys; sys.exit(3)"],
                            policy=RestartPolicy(max_restarts=3, window_s=60, backoff_base_s=0.05)))
    try:
        assert sup.gave_up.wait(20)
        assert sup.failed_child is child
        assert child.starts == 4 and child.exit_codes == [3, 3, 3, 3]  # first start + 3 restarts
    finally:
        sup.shutdown(timeout_s=5)


def test_stop_sends_sigterm_then_waits(tmp_path):
    marker, ready = tmp_path / "got-term", tmp_path / "ready"
    script = ("import signal, sys, time, pathlib\n"
              f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(marker)!r}).write_text('x'), sys.exit(0)))\n"
              f"pathlib.Path({str(ready)!r}).write_text('y')\n"
              # Short sleeps: a SIGTERM that came before a long sleep began would run its handler only at its end
              # (docs.python.org/3/library/signal.html, "Execution of Python signal handlers").
              "for _ in range(600): time.sleep(0.1)\n")
    sup = Supervisor(poll_s=0.05)
    sup.start(Child("server", [sys.executable, "-c", script]))
    # The child says when its handler is in place (a fixed head start would race a slow interpreter start).
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready.exists()
    assert sup.stop("server", timeout_s=10) == 0
    assert marker.read_text() == "x"
    sup.shutdown()


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read(UNIT)
    return parser


def test_systemd_unit_restarts_the_container_on_failure_and_never_gives_up():
    unit = _unit()
    service = unit["Service"]
    assert service["Restart"] == "on-failure"
    assert 1 <= int(service["RestartSec"]) <= 60
    assert unit["Unit"]["StartLimitIntervalSec"] == "0"  # no start-rate limit: systemd keeps retrying
    assert service["EnvironmentFile"] == INSTANCE_ENV_FILE
    assert "docker.service" in unit["Unit"]["Requires"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_systemd_unit_gives_drain_enough_time():
    service = _unit()["Service"]
    longest_drain = Operations.model_fields["drain_timeout_s"].metadata
    max_drain = max(getattr(m, "le", 0) or 0 for m in longest_drain)
    stop_time = int(service["ExecStop"].split("--time")[1].split()[0])
    assert stop_time > max_drain  # docker stop waits out the longest allowed drain
    assert int(service["TimeoutStopSec"]) > stop_time


def test_container_command_runs_the_bootstrap_on_the_gpu_with_host_networking():
    service = _unit()["Service"]
    script = REPO / service["ExecStart"].replace("/opt/fleetcast/", "")
    pre = [line.split("=", 1)[1].lstrip("-") for line in UNIT.read_text().splitlines() if line.startswith("ExecStartPre=")]
    assert "/opt/fleetcast/runtime/host/pull-image.sh" in pre  # ECR login + pull on the host, before the container
    text = script.read_text()
    assert os.access(script, os.X_OK)
    for needle in ("--gpus all", "--network host", "--env-file /etc/fleetcast/env", "--log-driver awslogs",
                   "awslogs-group=\"$FLEETCAST_LOG_GROUP\"", "python3 -m runtime.bootstrap", "exec "):
        assert needle in text, needle
    assert "X-aws-ec2-metadata-token" in text  # IMDSv2 only


@pytest.mark.parametrize("script", ["pull-image.sh", "run-container.sh"])
def test_host_scripts_are_valid_bash(script):
    import subprocess

    subprocess.run(["bash", "-n", str(REPO / "runtime" / "host" / script)], check=True)


def test_a_group_falls_and_rises_together_with_its_start_and_stop_hooks():
    """One member exits: the others are killed, before_start runs again (the MPS daemon, where it died), every member
    starts again in its order; after_stop runs once, when the last member is stopped on purpose."""
    import sys as _sys
    import time as _time

    from runtime.supervisor import Child, Group, RestartPolicy, Supervisor

    calls: list[str] = []
    sup = Supervisor(poll_s=0.02)
    sup.add_group(Group("gpu0", before_start=lambda: calls.append("start"), after_stop=lambda: calls.append("stop")))
    sleeper = [_sys.executable, "-c", "import time; time.sleep(3600)"]
    children = [sup.start(Child(name, sleeper, group="gpu0", policy=RestartPolicy(backoff_base_s=0.01)))
                for name in ("a", "b", "c")]
    try:
        assert calls == ["start"]  # once, before the first member
        first = [c.pid for c in children]
        os.kill(first[1], signal.SIGKILL)  # b dies: a and c, alive, go with it
        deadline = _time.monotonic() + 60
        # Until every member runs again and the restart recorded itself (just after the last one's start).
        while not (all(c.pid != p and c.running() for c, p in zip(children, first)) and sup.groups["gpu0"].restarts) \
                and _time.monotonic() < deadline:
            _time.sleep(0.02)
        assert all(c.pid != p and c.running() for c, p in zip(children, first))
        assert calls == ["start", "start"] and sup.groups["gpu0"].restarts == 1
        assert [c.spawned_at for c in children] == sorted(c.spawned_at for c in children)  # in order
        assert children[1].exit_codes == [-signal.SIGKILL] and children[0].exit_codes == []
    finally:
        sup.shutdown(timeout_s=5)
    assert calls == ["start", "start", "stop"]
