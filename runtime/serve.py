"""Serving on the instance: start the model server and the gateway, prove they work, drain them.

Ports: the gateway (runtime.gateway) listens on engine.port, the NLB's target and
health-check port; the model server (trtllm-serve or the reference server) listens
on 127.0.0.1:engine.port+1 and is reachable only through the gateway.

Ready means: the server's /health is 200, one real generation through
/v1/completions returns tokens (trtllm-serve's own /health_generate sends a chat
request, which GPT-2 cannot serve), and the gateway's /health (what the NLB
checks) is 200. Only then does the bootstrap complete the launch hook.

Drain (SIGTERM or the terminate hook): the gateway goes first. It answers /health
with 503 at once (the NLB stops sending), refuses new requests, lets in-flight
streams finish (bounded by operations.drain_timeout_s) and exits, which closes its
listener (new connections are refused). The server is stopped only after that, so
no stream loses its tail.

Liveness (while serving): the supervisor probes the server's /health every
`liveness_interval_s`, each probe bounded by `liveness_timeout_s`. A server that
is alive but answers `liveness_failures` probes in a row with nothing (frozen) is
killed and restarted like a crashed one; when restarts do not bring it back the
supervisor gives up and the bootstrap has the group replace the instance. The
gateway meanwhile aborts a stream whose upstream sent nothing for
`upstream_idle_timeout_s` (FLEETCAST_UPSTREAM_IDLE_S): longer than the engine's
worst gap between two tokens of one stream (a step with a full max_num_tokens
prefill chunk, or a wait for a batch slot), far shorter than the old ten minutes.
Readiness (what the gateway's /health reports) is read every second besides, so a
frozen process's model turns not ready within seconds, not at the next liveness probe.

GPU sharing (a pool's `gpu_sharing`): under MPS the engine processes of a GPU are one
supervised group that starts with the GPU's MPS control daemon and restarts together
after a fault in any of them (runtime/mps.py, runtime/supervisor.py, docs/runtime.md).
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetcast.contract.instance_env import Var, default
from fleetcast.contract.serving import LOOPBACK_HOST

from .mps import VISIBLE_DEVICES, MpsDaemon, MpsError
from .supervisor import Child, Group, Liveness, RestartPolicy, Supervisor

log = logging.getLogger("fleetcast.serve")

# PROXY protocol v2 LOCAL command (no addresses): what a health checker without a
# client to speak for sends. The gateway requires a v2 header on every connection.
PPV2_LOCAL = b"\r\n\r\n\x00\r\nQUIT\n" + bytes([0x20, 0x00, 0x00, 0x00])


STATE_POLL_S = 0.5  # how soon a process that exited shows in the per-model readiness file


class ServeError(RuntimeError):
    """The server never became ready (or kept crashing)."""


@dataclass(frozen=True)
class ServerProcess:
    """One engine process: a (model, copy) on its own loopback port (fleetcast.contract.serving)."""

    name: str  # the supervisor's child name
    model_id: str
    copy_index: int
    port: int
    argv: list[str]
    env: dict[str, str] | None = None
    kv_cache_bytes: int | None = None  # its explicit KV budget (runtime/kv_budget.py)
    gpu: int = 0  # the GPU it runs on (every process of an instance shares the first today)
    # Under gpu_sharing: mps: its device-memory limit (its planned share, runtime/kv_budget.py) and SM share.
    mps_mem_limit_bytes: int | None = None
    mps_active_thread_percentage: int | None = None
    kv_tokens_planned: int | None = None  # the KV cache it must come out with, in tokens (checked after start)

    @property
    def what(self) -> str:
        """How errors name it: the model an ABANDON or a log line is about."""
        return f"model {self.model_id} (copy {self.copy_index}, port {self.port})"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def server_name(model_id: str, copy_index: int, single: bool) -> str:
    """The supervisor child of a (model, copy); "server" when the instance serves one process."""
    return "server" if single else f"server:{model_id}#{copy_index}"


@dataclass
class ServeSettings:
    port: int  # gateway, NLB target
    model_name: str
    region: str
    pool: str
    config_json: Path | None = None  # the validated config, for the gateway
    listen_host: str = default(Var.LISTEN_HOST)
    gateway: bool = True
    proxy_protocol: bool = True
    ready_timeout_s: float = 1800.0
    drain_timeout_s: float = 300.0
    server_stop_timeout_s: float = 60.0
    probe_prompt: str = "The quick brown fox"
    probe_tokens: int = 4
    probe_retry_s: float = 1.0  # between the readiness generation's three attempts
    gateway_refresh_s: float = default(Var.GATEWAY_REFRESH_S)  # endpoints, API keys and consumers (docs/gateway.md)
    drain_deadline_file: Path | None = None  # a Spot interruption's deadline for the gateway (runtime/spot.py)
    models_state_file: Path | None = None  # per-model readiness, rewritten when a process comes or goes
    queue_state_file: Path | None = None  # requests waiting in the gateway's fair-admission queues (gateway/fair.py)
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    liveness_interval_s: float = default(Var.LIVENESS_INTERVAL_S)
    liveness_timeout_s: float = default(Var.LIVENESS_TIMEOUT_S)
    liveness_failures: int = default(Var.LIVENESS_FAILURES)
    upstream_idle_timeout_s: float = default(Var.UPSTREAM_IDLE_S)
    # What the per-model readiness file (the gateway's /health) reports is the state now, not the last liveness
    # answer (up to a liveness interval plus a timeout old): each serving process's /health is read this often,
    # and one that does not answer within the timeout is not ready until it answers again. Liveness (the kill)
    # still takes `liveness_failures` probes.
    readiness_interval_s: float = 1.0
    readiness_timeout_s: float = 2.0

    @property
    def server_port(self) -> int:
        return self.port + 1


def http_json(method: str, url: str, body: dict[str, Any] | None = None, timeout_s: float = 30.0) -> tuple[int, object]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def raw_health(host: str, port: int, proxy_protocol: bool, timeout_s: float = 2.0) -> int | None:
    """GET /health over a raw socket, with a PROXY v2 LOCAL header when the listener expects one."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            request = f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
            sock.sendall((PPV2_LOCAL if proxy_protocol else b"") + request)
            head = sock.recv(64).decode(errors="replace")
    except OSError:
        return None
    parts = head.split(" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


class Serving:
    """The engine processes (one per model and copy) and the gateway under one supervisor.

    Processes start one after another, each ready (health + one real generation) before the next
    starts: each has an explicit KV budget, so the order changes no budget, and no two load their
    weights into a GPU at once. Each is supervised on its own: a crash restarts that process while
    the others keep serving.
    """

    def __init__(self, settings: ServeSettings, server_argv: list[str] | None = None,
                 supervisor: Supervisor | None = None, stop: threading.Event | None = None,
                 server_env: dict[str, str] | None = None, servers: list[ServerProcess] | None = None,
                 mps_root: Path | None = None):
        """`mps_root`: the pool shares its GPUs under MPS (runtime/mps.py), with each GPU's control daemon's
        directories under it; every process of a GPU is then an MPS client in that GPU's group."""
        self.s = settings
        self.stop = stop or threading.Event()  # set by SIGTERM: give up waiting for readiness
        self.supervisor = supervisor or Supervisor()
        if servers is None:
            if server_argv is None:
                raise ValueError("Serving needs server_argv or servers")
            # server_env: the backend's (TensorRT-LLM: without the vendored packages)
            servers = [ServerProcess("server", settings.model_name, 0, settings.server_port, server_argv, server_env)]
        if not servers:
            raise ValueError("Serving needs at least one server process")
        self.servers = list(servers)
        self.base = self.servers[0].base  # the first process (gauges, single-model callers)
        self._alive: dict[str, tuple[int | None, bool]] = {}  # per process: (pid probed, answered)
        self._state_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._written: dict[str, Any] | None = None
        self._state_stop = threading.Event()
        self.mps_daemons: dict[int, MpsDaemon] = {}
        if mps_root is not None:
            for gpu in sorted({p.gpu for p in self.servers}):
                daemon = self.mps_daemons[gpu] = MpsDaemon(gpu, mps_root)
                self.supervisor.add_group(Group(
                    self.gpu_group(gpu), before_start=daemon.start, after_stop=daemon.stop,
                    ready=self._child_answers, ready_timeout_s=settings.ready_timeout_s))

    @staticmethod
    def gpu_group(gpu: int) -> str:
        return f"gpu{gpu}"

    def _child_answers(self, child: Child) -> bool:
        """A restarted member of an MPS group answers /health: the next one may start."""
        server = next(p for p in self.servers if p.name == child.name)
        try:
            status, _ = http_json("GET", f"{server.base}/health", timeout_s=self.s.readiness_timeout_s)
        except (OSError, ValueError):
            return False
        return status == 200

    def gateway_argv(self) -> list[str]:
        from .gateway.shared import default_workers

        s = self.s
        argv = [sys.executable, "-m", "runtime.gateway", "--listen", f"{s.listen_host}:{s.port}",
                "--upstream", f"{LOOPBACK_HOST}:{self.servers[0].port}", "--region", s.region, "--pool", s.pool,
                "--proxy-protocol", "required" if s.proxy_protocol else "off", "--refresh-s", f"{s.gateway_refresh_s:g}",
                "--upstream-idle-s", f"{s.upstream_idle_timeout_s:g}", "--workers", str(default_workers()),
                # On an instance the fleet's Auto Scaling groups name the peers (the gateway turns it off in a
                # region without the peer key); the instance role may read them (stacks/gpu_fleet.py).
                "--peer-discovery", "asg"]
        if s.config_json is not None:
            argv += ["--config-json", str(s.config_json)]
        if s.drain_deadline_file is not None:
            argv += ["--drain-deadline-file", str(s.drain_deadline_file)]
        if s.models_state_file is not None:
            argv += ["--models-state", str(s.models_state_file)]
        if s.queue_state_file is not None:
            argv += ["--queue-state", str(s.queue_state_file)]
        return argv

    def server_alive(self, server: ServerProcess | None = None) -> bool:
        """One liveness probe: /health answered 200 within the probe timeout."""
        server = server or self.servers[0]
        try:
            status, _ = http_json("GET", f"{server.base}/health", timeout_s=self.s.liveness_timeout_s)
        except (OSError, ValueError):
            status = None
        self._mark(server, status == 200)
        return status == 200

    def _mark(self, server: ServerProcess, alive: bool) -> None:
        child = self.supervisor.children.get(server.name)
        with self._state_lock:
            # Keyed by pid: a restarted process is not ready on its predecessor's last answer.
            self._alive[server.name] = (child.pid if child is not None else None, alive)
        if self.s.models_state_file is not None:
            self.write_models_state()

    def model_health(self) -> dict[str, dict[str, Any]]:
        """Per model: ready when at least one copy is running and answered its last health check."""
        out: dict[str, dict[str, Any]] = {}
        with self._state_lock:
            alive = dict(self._alive)
        for server in self.servers:
            child = self.supervisor.children.get(server.name)
            up = bool(child is not None and child.running() and alive.get(server.name) == (child.pid, True))
            entry = out.setdefault(server.model_id, {"ready": False, "copies": 0, "ready_copies": 0, "ports": []})
            entry["copies"] += 1
            entry["ready_copies"] += int(up)
            entry["ready"] = entry["ready"] or up
            entry["ports"].append(server.port)
        return out

    def write_models_state(self) -> None:
        """The per-model readiness, atomically, for whoever reports it (the gateway's /health); rewritten
        only when it changed."""
        path = self.s.models_state_file
        assert path is not None
        with self._write_lock:
            health = self.model_health()
            if health == self._written:
                return
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps({"models": health, "updated": time.time()}))
            tmp.replace(path)
            self._written = health

    def _watch_state(self) -> None:
        """A process that exits is not probed (the supervisor restarts it): its model's state changes
        here, within a poll, instead of at the next liveness answer."""
        while not self._state_stop.wait(STATE_POLL_S):
            try:
                self.write_models_state()
            except OSError as exc:
                log.warning("cannot write %s: %s", self.s.models_state_file, exc)

    def _watch_ready(self, server: ServerProcess) -> None:
        """Reads one process's /health every readiness interval, so its model's readiness follows a freeze within
        an interval and a timeout (the liveness probe, which kills, answers only every liveness interval)."""
        while not self._state_stop.wait(self.s.readiness_interval_s):
            child = self.supervisor.children.get(server.name)
            if child is None or not child.running():
                continue  # exited: _watch_state reports it, the supervisor restarts it
            try:
                status, _ = http_json("GET", f"{server.base}/health", timeout_s=self.s.readiness_timeout_s)
            except (OSError, ValueError):
                status = None
            if not self._state_stop.is_set():
                self._mark(server, status == 200)

    def start(self) -> None:
        """Start the first engine process; wait_ready() starts the rest, one after another."""
        self._start_server(self.servers[0])

    def _start_server(self, server: ServerProcess) -> None:
        liveness = Liveness(lambda: self.server_alive(server), interval_s=self.s.liveness_interval_s,
                            failures=self.s.liveness_failures, startup_s=self.s.ready_timeout_s,
                            window_s=self.s.liveness_timeout_s)
        env, group = server.env, None
        unset: tuple[str, ...] = ()
        daemon = self.mps_daemons.get(server.gpu)
        if daemon is not None:
            # An MPS client: its daemon's pipe directory, its limits, and no CUDA_VISIBLE_DEVICES of its own (the
            # daemon's remaps the GPU to device 0 for its clients).
            env = {**(server.env or {}), **daemon.client_env(server.mps_mem_limit_bytes,
                                                            server.mps_active_thread_percentage)}
            unset, group = (VISIBLE_DEVICES,), self.gpu_group(server.gpu)
        try:
            self.supervisor.start(Child(server.name, server.argv, env=env, env_unset=unset, group=group,
                                        policy=self.s.restart, liveness=liveness))
        except MpsError as exc:
            raise ServeError(f"MPS control daemon of GPU {server.gpu}: {exc}") from None

    def _check_alive(self) -> None:
        if self.stop.is_set():
            raise ServeError("stopped (SIGTERM) before the server was ready")
        if self.supervisor.gave_up.is_set():
            child = self.supervisor.failed_child
            server = next((p for p in self.servers if child is not None and p.name == child.name), None)
            what = server.what if server is not None and len(self.servers) > 1 else (child.name if child else "a process")
            raise ServeError(f"{what} kept crashing "
                             f"(exit codes {child.exit_codes[-5:] if child else '?'})")

    def wait_ready(self) -> dict[str, Any]:
        """Block until every engine process is healthy and generated once (started one after another),
        then start the gateway and wait for its health; ServeError (naming the model) on timeout or
        crash loop."""
        deadline = time.monotonic() + self.s.ready_timeout_s
        started = time.monotonic()
        timings: dict[str, Any] = {"models": {}}
        for index, server in enumerate(self.servers):
            if index and server.name not in self.supervisor.children:
                self._start_server(server)
            began = time.monotonic()
            self._wait_healthy(server, deadline)
            text, tokens = self.probe_generation(server)
            self._mark(server, True)
            short = self.check_kv(server)
            if short is not None:
                timings.setdefault("kv_short", {})[server.name] = short
            timings["models"][server.name] = {"model": server.model_id, "ready_s": round(time.monotonic() - began, 3),
                                              "probe_tokens": tokens}
            if index == 0:
                timings["server_healthy_s"] = time.monotonic() - started
                timings["probe_tokens"], timings["probe_text"] = tokens, text
        if self.s.models_state_file is not None:
            self.write_models_state()  # before the gateway starts: its /health reads it
            threading.Thread(target=self._watch_state, name="models-state", daemon=True).start()
            for server in self.servers:
                threading.Thread(target=self._watch_ready, args=(server,), name=f"ready-{server.name}",
                                 daemon=True).start()
        if self.s.gateway:
            if "gateway" not in self.supervisor.children:
                self.supervisor.start(Child("gateway", self.gateway_argv(), policy=self.s.restart))
            while raw_health("127.0.0.1", self.s.port, self.s.proxy_protocol) != 200:
                self._check_alive()
                if time.monotonic() > deadline:
                    raise ServeError(f"gateway /health on port {self.s.port} not 200 within {self.s.ready_timeout_s:.0f} s")
                time.sleep(0.2)
        timings["ready_s"] = time.monotonic() - started
        return timings

    def check_kv(self, server: ServerProcess) -> dict[str, Any] | None:
        """After its first generation, the KV cache a process came out with against its plan, from its iteration
        stats (/metrics, dequeued on read: kvCacheStats maxNumBlocks x tokensPerBlock; TensorRT-LLM's
        cpp/tensorrt_llm/executor/jsonSerialization.cpp, KvCacheStats). A process short by more than a block (the
        engine rounds to blocks) is named in the log and in the returned record: TensorRT-LLM took
        free_gpu_memory_fraction x free memory, not max_tokens, so something else held what it was planned."""
        planned = server.kv_tokens_planned
        if planned is None:
            return None
        try:
            status, stats = http_json("GET", f"{server.base}/metrics", timeout_s=10.0)
        except (OSError, ValueError):
            status, stats = None, None
        kv = next((st.get("kvCacheStats") for st in reversed(stats) if isinstance(st, dict)
                   and isinstance(st.get("kvCacheStats"), dict)), None) if status == 200 and isinstance(stats, list) else None
        if not kv or not kv.get("maxNumBlocks") or not kv.get("tokensPerBlock"):
            log.warning("%s: its KV cache could not be checked against its plan (no iteration stats on /metrics)",
                        server.what)
            return None
        block = int(kv["tokensPerBlock"])
        tokens = int(kv["maxNumBlocks"]) * block
        if tokens >= planned - block:
            log.info("%s: KV cache of %d tokens, planned %d", server.what, tokens, planned)
            return None
        log.error("%s: its KV cache came out at %d tokens, %d short of the %d planned (max_tokens): TensorRT-LLM "
                  "takes min(max_tokens, free_gpu_memory_fraction x the memory free when it starts), and that memory "
                  "was held by something else", server.what, tokens, planned - tokens, planned)
        return {"model": server.model_id, "copy": server.copy_index, "planned_tokens": planned, "tokens": tokens}

    def _wait_healthy(self, server: ServerProcess, deadline: float) -> None:
        status = None
        while True:
            self._check_alive()
            try:
                status, _ = http_json("GET", f"{server.base}/health", timeout_s=2.0)
            except OSError:
                status = None
            if status == 200:
                return
            if time.monotonic() > deadline:
                name = "server" if len(self.servers) == 1 else server.what
                raise ServeError(f"{name} /health not 200 within {self.s.ready_timeout_s:.0f} s (last: {status})")
            time.sleep(0.2)

    def probe_generation(self, server: ServerProcess | None = None) -> tuple[str, int]:
        """One real completion: proves weights, tokenizer and the generation loop, not just the HTTP server."""
        server = server or self.servers[0]
        body = {"model": server.model_id, "prompt": self.s.probe_prompt, "max_tokens": self.s.probe_tokens,
                "temperature": 0, "stream": False}
        last = None
        for attempt in range(3):
            if attempt:
                time.sleep(self.s.probe_retry_s)  # not after the last: its failure is reported at once
            try:
                status, reply = http_json("POST", f"{server.base}/v1/completions", body, timeout_s=120.0)
            except OSError as exc:
                last = str(exc)
                continue
            if status == 200 and isinstance(reply, dict):
                choices = reply.get("choices") or [{}]
                usage = reply.get("usage") or {}
                tokens = int(usage.get("completion_tokens") or 0)
                if tokens >= 1:
                    return str(choices[0].get("text", "")), tokens
                last = f"no tokens generated: {reply}"
            else:
                last = f"HTTP {status}: {str(reply)[:300]}"
        where = "" if len(self.servers) == 1 else f"{server.what}: "
        raise ServeError(f"{where}probe generation through /v1/completions failed: {last}")

    def drain(self, budget_s: float | None = None) -> dict[str, Any]:
        """Gateway first (health 503, finish in-flight, close), then the server. `budget_s`: a Spot
        interruption's time left, which the gateway also read from its deadline file."""
        started = time.monotonic()
        self._state_stop.set()
        report: dict[str, Any] = {}
        window = self.s.drain_timeout_s if budget_s is None else min(self.s.drain_timeout_s, max(0.0, budget_s))
        if self.s.gateway and "gateway" in self.supervisor.children:
            # The gateway bounds in-flight requests by the same drain timeout; a small margin covers its exit.
            report["gateway_exit"] = self.supervisor.stop("gateway", window + 15.0)
        else:
            report["gateway_exit"] = None
        # Every engine process at once (each finishes what it holds within the same bound), one SIGTERM each:
        # a second one makes trtllm-serve's uvicorn exit without finishing.
        timeout = self.s.server_stop_timeout_s + (0 if self.s.gateway else self.s.drain_timeout_s)
        started_servers = [p for p in self.servers if p.name in self.supervisor.children]
        exits: dict[str, int | None] = {}

        def stop(name: str) -> None:
            exits[name] = self.supervisor.stop(name, timeout)

        threads = [threading.Thread(target=stop, args=(p.name,), name=f"stop-{p.name}") for p in started_servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        report["server_exit"] = exits.get(self.servers[0].name)
        if len(self.servers) > 1:
            report["server_exits"] = exits
        self.supervisor.shutdown(timeout_s=10)
        report["drain_s"] = time.monotonic() - started
        return report

    def server_stats(self) -> dict[str, Any] | None:
        """Latest iteration stats of the instance's engine processes (trtllm-serve's /metrics, dequeued on
        read): requests active and queued summed over them, KV utilization the fullest one's (the one
        that refuses work first). Queued adds the requests waiting in the gateway's fair-admission queues:
        with fair admission an engine's own queue stays short, and what waits for it waits there."""
        from .gateway.fair import read_queue_state

        per = [stats for server in self.servers if (stats := self.process_stats(server))]
        at_gateway = read_queue_state(self.s.queue_state_file) if self.s.queue_state_file is not None else None
        if not per:
            return None
        out: dict[str, Any] = {}
        for key in ("active", "queued"):
            if any(key in st for st in per):
                out[key] = sum(st.get(key, 0.0) for st in per)
        if at_gateway is not None:
            out["queued"] = out.get("queued", 0.0) + at_gateway
        if any("kv_util" in st for st in per):
            out["kv_util"] = max(st["kv_util"] for st in per if "kv_util" in st)
        return out

    def process_stats(self, server: ServerProcess) -> dict[str, Any] | None:
        try:
            status, stats = http_json("GET", f"{server.base}/metrics", timeout_s=5.0)
        except OSError:
            return None
        if status != 200 or not isinstance(stats, list) or not stats:
            return None
        last = stats[-1] if isinstance(stats[-1], dict) else {}
        out = {}
        if "numActiveRequests" in last:
            out["active"] = float(last["numActiveRequests"])
        if "numQueuedRequests" in last:
            out["queued"] = float(last["numQueuedRequests"])
        kv = last.get("kvCacheStats") or {}
        if kv.get("maxNumBlocks"):
            out["kv_util"] = 100.0 * float(kv.get("usedNumBlocks", 0)) / float(kv["maxNumBlocks"])
        return out
