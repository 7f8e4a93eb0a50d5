"""Readiness is proven by a real generation, not by /health alone; a broken server never gets the launch hook."""

import sys
import threading
import time

import pytest

from runtime.devtools.harness import free_port_pair
from runtime.serve import ServeError, ServeSettings, Serving
from runtime.supervisor import RestartPolicy

# A server whose /health says 200 while generation is broken (e.g. garbage engine, wrong tokenizer).
HEALTHY_BUT_BROKEN = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code); self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_GET(self): self._send(200, {})
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send(200, {"choices": [{"text": ""}], "usage": {"completion_tokens": 0}})
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def settings(port, **kw):
    return ServeSettings(port=port, model_name="m", region="r", pool="p", gateway=False, ready_timeout_s=20,
                         restart=RestartPolicy(max_restarts=2, backoff_base_s=0.05), **kw)


def test_health_without_a_real_generation_is_not_ready():
    port = free_port_pair()
    # The pause between the probe's attempts is the product's 1 s; nothing here needs it (every
    # attempt gets the same empty answer).
    serving = Serving(settings(port, probe_retry_s=0.05), [sys.executable, "-c", HEALTHY_BUT_BROKEN, str(port + 1)])
    serving.start()
    try:
        with pytest.raises(ServeError, match="no tokens generated"):
            serving.wait_ready()
    finally:
        serving.drain()


def test_a_crash_looping_server_is_reported_not_waited_out():
    port = free_port_pair()
    serving = Serving(settings(port), [sys.executable, "-c", "import sys; sys.exit(7)"])
    serving.supervisor.poll_s = 0.05
    serving.start()
    started = time.monotonic()
    try:
        with pytest.raises(ServeError, match=r"kept crashing \(exit codes \[7, 7, 7\]\)"):
            serving.wait_ready()
        assert time.monotonic() - started < 10
    finally:
        serving.drain()


def test_sigterm_during_startup_stops_the_wait():
    port = free_port_pair()
    stop = threading.Event()
    serving = Serving(settings(port), [sys.executable, "-c", "import time; time.sleep(60)"], stop=stop)
    serving.start()
    threading.Timer(0.3, stop.set).start()
    try:
        with pytest.raises(ServeError, match="SIGTERM"):
            serving.wait_ready()
    finally:
        serving.drain()


def test_the_gateway_is_started_with_the_upstream_idle_timeout_of_the_instance_env():
    from runtime.bootstrap import InstanceEnv

    base = {"FLEETCAST_FLEET": "f", "FLEETCAST_REGION": "r", "FLEETCAST_POOL": "p", "FLEETCAST_BUCKET": "b",
            "FLEETCAST_CONFIG_FILE": "/dev/null"}
    env = InstanceEnv.from_environ({**base, "FLEETCAST_UPSTREAM_IDLE_S": "45"})
    assert env.upstream_idle_s == 45.0
    assert InstanceEnv.from_environ(base).upstream_idle_s < 600  # not the old ten minutes
    argv = Serving(ServeSettings(port=9000, model_name="m", region="r", pool="p",
                                 upstream_idle_timeout_s=env.upstream_idle_s), ["server"]).gateway_argv()
    assert argv[argv.index("--upstream-idle-s") + 1] == "45"
    from fleetcast.contract.errors import UserError

    with pytest.raises(UserError, match="FLEETCAST_UPSTREAM_IDLE_S"):
        InstanceEnv.from_environ({**base, "FLEETCAST_UPSTREAM_IDLE_S": "0"})


# A server that generates, and freezes (every request then hangs, the process stays alive) when its file appears.
FREEZES_ON_FILE = """
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
freeze = sys.argv[2]
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, code, body):
        while os.path.exists(freeze):
            time.sleep(3600)
        data = json.dumps(body).encode()
        self.send_response(code); self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_GET(self): self._send(200, {})
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send(200, {"choices": [{"text": " x"}], "usage": {"completion_tokens": 1}})
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_the_readiness_file_reports_a_freeze_now_not_the_last_liveness_answer(tmp_path):
    """issue 32 §3: /health (the gateway reads this file) kept answering 200 for about 14 s of a freeze, the
    last liveness answer (every 10 s, 5 s timeout). Here liveness never probes again (an hour apart): only the
    readiness reads can turn the model not ready, and they must, while the process is still alive."""
    import json

    port = free_port_pair()
    state = tmp_path / "models-ready.json"
    serving = Serving(settings(port, models_state_file=state, liveness_interval_s=3600, readiness_interval_s=0.05,
                               readiness_timeout_s=0.5),
                      [sys.executable, "-c", FREEZES_ON_FILE, str(port + 1), str(tmp_path / "freeze")])

    def ready() -> bool:
        return json.loads(state.read_text())["models"]["m"]["ready"]

    serving.start()
    try:
        serving.wait_ready()
        assert ready()
        (tmp_path / "freeze").touch()
        deadline = time.monotonic() + 60  # a bound on the wait, not the verdict
        while ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not ready()
        assert serving.supervisor.children["server"].running() and serving.supervisor.children["server"].starts == 1
        (tmp_path / "freeze").unlink()
        deadline = time.monotonic() + 60
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready()  # it answers again: ready again, without a restart
    finally:
        (tmp_path / "freeze").unlink(missing_ok=True)
        serving.drain()


def test_queued_requests_count_those_waiting_in_the_gateways_fair_admission_queues(tmp_path, monkeypatch):
    """With fair admission an engine's own queue stays short: what waits for it waits at the gateway, which writes
    the count to --queue-state (runtime/gateway/fair.py); the QueuedRequests gauge adds it."""
    from runtime.gateway.fair import QUEUE_STATE_STALE_S, write_queue_state

    state = tmp_path / "gateway-queue.json"
    serving = Serving(ServeSettings(port=9000, model_name="m", region="r", pool="p", queue_state_file=state),
                      ["server"])
    argv = serving.gateway_argv()
    assert argv[argv.index("--queue-state") + 1] == str(state)
    monkeypatch.setattr(serving, "process_stats", lambda server: {"active": 8.0, "queued": 1.0})
    assert serving.server_stats() == {"active": 8.0, "queued": 1.0}  # no file yet: the engine's own queue
    write_queue_state(state, 5)
    assert serving.server_stats() == {"active": 8.0, "queued": 6.0}
    write_queue_state(state, 5, now=time.time() - QUEUE_STATE_STALE_S - 1)  # a gateway that stopped writing
    assert serving.server_stats() == {"active": 8.0, "queued": 1.0}
