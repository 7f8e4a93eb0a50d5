"""The reference server runs its engine in a process of its own (runtime/reference/worker.py, proxy.py), as
trtllm-serve does: its OpenAI server (tensorrt_llm/serve/openai_server.py) drives a GenerationExecutorProxy
(tensorrt_llm/executor/proxy.py, NVIDIA/TensorRT-LLM 1.1/1.2 line, stored index id 3493716097) that starts the
executor's worker_main in processes of its own and exchanges requests (and CancellingRequest, abort_request) and
results with them over IPC queues; the worker sends each batch of responses as one message (handle_for_ipc_batched,
"Perform the IPC in batch explicitly", one result_queue.put(rsp_batch); stored index id 1131391427), and the proxy's
dispatch thread wakes the event loop once for all of them (_SyncQueue.notify_many).

What these pin: one message per delivery point whatever the batch; cancellations flow back; the engine process is in
the server's session and process group (runtime/supervisor.py reads a starting server's progress as its session's
CPU and kills a frozen server's group), never imports PyTorch into the HTTP process, ends with it on SIGTERM and
when it is killed, and a dead engine process ends the server with exit 1 (so it is restarted)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest

from runtime.reference import protocol as p
from runtime.reference.proxy import EngineProxy
from runtime.reference.worker import EngineHost
from tests.optional import needs_torch

from .reference_helpers import ONE_FORK_SERVER, ROOT, ServerProcess, http_status


class FakeSeq:
    def __init__(self, rid: int, cached: int = 0) -> None:
        self.sink, self.cached_tokens = rid, cached


class FakeEngine:
    def __init__(self) -> None:
        self.cancelled: list[int] = []
        self.stopped = False

    def cancel(self, seq) -> None:
        self.cancelled.append(seq.sink)

    def pop_stats(self) -> list[dict]:
        return [{"iter": 1, "iterLatencyMS": 1.5}]

    def stop(self) -> None:
        self.stopped = True


def host_on(channel: socket.socket) -> EngineHost:
    host = EngineHost.__new__(EngineHost)  # the channel's end only: no model
    host.channel, host._live, host._stopping, host.memory = channel, {}, False, {}
    import threading

    host._send_lock = threading.Lock()
    return host


def test_a_delivery_point_of_16_sequences_is_one_message_and_each_stream_gets_its_token():
    engine_end, http_end = socket.socketpair()
    host = host_on(engine_end)
    seqs = [FakeSeq(rid, cached=64 * (rid % 2)) for rid in range(1, 17)]
    host._live = {s.sink: s for s in seqs}
    host._deliver([(s, 100 + s.sink, "length" if s.sink == 16 else None) for s in seqs])

    async def run() -> tuple[list[tuple], int, list[int]]:
        proxy = EngineProxy(argparse_namespace())
        proxy._loop = asyncio.get_running_loop()
        http_end.setblocking(False)
        proxy._sock = http_end
        sinks = {}
        for s in seqs:
            sinks[s.sink] = asyncio.Queue()
            proxy._sinks[s.sink] = remote(s.sink, sinks[s.sink])
        messages = []
        original = proxy._dispatch

        def counted(at, events):
            messages.append(len(events))
            original(at, events)

        proxy._dispatch = counted  # type: ignore[method-assign]
        proxy._readable()
        got = [sinks[s.sink].get_nowait()[:2] for s in seqs]
        return got, messages, [proxy._sinks[s.sink].cached_tokens for s in seqs[:2]]

    got, messages, cached = asyncio.run(run())
    assert messages == [16]  # one message, all 16 tokens
    assert got == [(100 + rid, "length" if rid == 16 else None) for rid in range(1, 17)]
    assert cached == [64, 0]
    assert 16 not in host._live and 15 in host._live  # a finished sequence is forgotten, a running one is not


def test_cancellations_stats_and_stop_flow_back_to_the_engine_process():
    engine_end, http_end = socket.socketpair()
    host = host_on(engine_end)
    host.engine = engine = FakeEngine()  # type: ignore[assignment]
    host._live = {7: FakeSeq(7)}
    for message in [(p.CANCEL, 7), (p.CANCEL, 8), (p.STATS, 41), (p.STOP,)]:
        http_end.sendall(p.frame(message))
    assert host.serve(p.Frames()) == 0
    assert engine.cancelled == [7] and engine.stopped  # an id the engine no longer runs is ignored
    replies = p.Frames().feed(http_end.recv(1 << 16))
    assert replies == [(p.REPLY, 41, [{"iter": 1, "iterLatencyMS": 1.5}]), (p.STOPPED,)]


def test_an_http_process_gone_with_events_unread_ends_the_engine_process_as_one_gone_cleanly(caplog):
    """Linux resets the peer of a unix stream socket closed with data still in its receive queue (net/unix/af_unix.c,
    unix_release_sock: `skpair->sk_err = ECONNRESET` where the queue is not empty), so the engine's read raises
    ConnectionResetError instead of returning the end of file, and the process ended with a traceback; a
    full-suite run's server log had one after a test stopped its server mid-stream."""
    engine_end, http_end = socket.socketpair()
    host = host_on(engine_end)
    host.engine = FakeEngine()  # type: ignore[assignment]
    host._deliver([(FakeSeq(1), 100, None)])  # an event the HTTP process never reads
    http_end.close()
    with pytest.raises(ConnectionResetError):  # the kernel's behaviour, on a pair of our own
        _closed_with_unread_data().recv(1)
    with caplog.at_level("ERROR"):
        assert host.serve(p.Frames()) == 1
    assert "the HTTP process is gone" in caplog.text


def _closed_with_unread_data() -> socket.socket:
    """One end of a pair whose other end was closed with what this end sent unread."""
    mine, theirs = socket.socketpair()
    mine.sendall(b"x")
    theirs.close()
    return mine


def test_messages_that_came_with_start_are_served_once_the_engine_has_loaded():
    """A /metrics read while the engine loads may reach the engine process in the same read as START."""
    engine_end, http_end = socket.socketpair()
    host = host_on(engine_end)
    host.engine = FakeEngine()  # type: ignore[assignment]
    assert host.serve(p.Frames(), [(p.STATS, 3), (p.STOP,)]) == 0
    assert p.Frames().feed(http_end.recv(1 << 16)) == [(p.REPLY, 3, [{"iter": 1, "iterLatencyMS": 1.5}]), (p.STOPPED,)]


def test_frames_split_anywhere_come_out_whole_and_in_order():
    messages = [(p.EVENTS, 1.5, [(1, 2, None, 0)] * 40), (p.REPLY, 3, {"a": 1}), (p.STOPPED,)]
    data = b"".join(p.frame(m) for m in messages)
    frames, out = p.Frames(), []
    for i in range(0, len(data), 7):
        out += frames.feed(data[i:i + 7])
    assert out == messages


def test_requests_are_checked_in_the_http_process_with_the_engines_own_rule():
    proxy = EngineProxy(argparse_namespace())
    proxy.info = {"vocab_size": 512, "max_seq_len": 32}
    with pytest.raises(ValueError, match="^max_tokens: .*exceeds the max sequence length 32"):
        proxy.submit([1] * 20, p.SamplingParams(max_tokens=13), None, None)
    with pytest.raises(ValueError, match="^prompt: token id 512"):
        proxy.submit([1, 512], p.SamplingParams(), None, None)


def argparse_namespace():
    import argparse

    return argparse.Namespace()


def remote(rid, sink):
    from runtime.reference.proxy import RemoteSequence

    return RemoteSequence(rid, sink)


# ---------------------------------------------------------------- the processes


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    from runtime.reference.build import build_artifact

    out = tmp_path_factory.mktemp("ref") / "artifact"
    build_artifact(out, size="tiny", seed=5)
    return out


def proc_status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def session_and_group(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[3]), int(fields[2])  # session (field 6), process group (field 5), proc(5)


def gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if proc_status(pid).get("State", "").startswith("Z"):
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def direct_server(artifact, tmp_path) -> Iterator[tuple[subprocess.Popen, str, int]]:
    """The server started as the runtime starts it (no fork server): its own interpreter, its own session."""
    from runtime.devtools.harness import free_port

    port = free_port()
    env = dict(os.environ)
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - the child's
    proc = subprocess.Popen([sys.executable, "-m", "runtime.reference.server", "--artifact", str(artifact), "--port",
                             str(port), "--threads", "1", "--max-batch-size", "2"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while http_status(base + "/health") != 200:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.1)
        with urllib.request.urlopen(base + "/memory", timeout=10) as resp:
            engine_pid = json.loads(resp.read())["engine_pid"]
        yield proc, base, engine_pid
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()


@needs_torch
def test_the_engine_process_is_the_servers_child_in_its_session_without_torch_in_the_http_process(artifact, tmp_path):
    from runtime.supervisor import session_work

    with direct_server(artifact, tmp_path) as (proc, _base, engine_pid):
        assert engine_pid != proc.pid
        assert int(proc_status(engine_pid)["PPid"]) == proc.pid
        assert session_and_group(engine_pid) == session_and_group(proc.pid) == (proc.pid, proc.pid)
        # The supervisor's progress of a starting server is its session's work: the engine process's CPU is in it.
        with open(f"/proc/{engine_pid}/schedstat") as f:
            engine_ns = int(f.read().split()[0])
        work = session_work(proc.pid)
        assert work is not None and work[0] >= engine_ns
        with open(f"/proc/{proc.pid}/maps") as f:
            assert "libtorch" not in f.read()  # the HTTP process never imports PyTorch
        with open(f"/proc/{engine_pid}/maps") as f:
            assert "libtorch" in f.read()
        proc.send_signal(signal.SIGTERM)  # the drain: both processes end, the server with 0
        assert proc.wait(60) == 0
        assert gone(engine_pid)


@needs_torch
def test_a_killed_server_leaves_no_engine_process_behind(artifact, tmp_path):
    with direct_server(artifact, tmp_path) as (proc, _base, engine_pid):
        proc.kill()  # nothing of the server runs: PR_SET_PDEATHSIG and the channel's end of file end the engine
        proc.wait(10)
        assert gone(engine_pid)


@needs_torch
@ONE_FORK_SERVER
def test_a_dead_engine_process_ends_the_server_with_exit_1_so_it_is_restarted(artifact, tmp_path):
    srv = ServerProcess(artifact, log_path=tmp_path / "server.log")
    try:
        srv.wait_healthy()
        with urllib.request.urlopen(srv.base + "/memory", timeout=10) as resp:
            engine_pid = json.loads(resp.read())["engine_pid"]
        os.kill(engine_pid, signal.SIGKILL)
        assert srv.proc.wait(30) == 1
        assert "engine failed" in srv.log()
    finally:
        srv.stop()


@needs_torch
@ONE_FORK_SERVER
def test_a_server_forked_by_the_tests_fork_server_leaves_no_engine_process_behind_either(artifact, tmp_path):
    """tests/runtime/zygote.py forks the engine process too, so its parent is the fork server, which lives on:
    PR_SET_PDEATHSIG cannot fire, and the channel's end of file (the server's end closed with it) ends it."""
    srv = ServerProcess(artifact, log_path=tmp_path / "server.log")
    try:
        srv.wait_healthy()
        with urllib.request.urlopen(srv.base + "/memory", timeout=10) as resp:
            engine_pid = json.loads(resp.read())["engine_pid"]
    finally:
        srv.stop()  # SIGKILL
    assert gone(engine_pid)


@needs_torch
@ONE_FORK_SERVER
def test_both_processes_freeze_their_startup_heap_before_serving(artifact, tmp_path):
    """A full collection walked what startup loaded (PyTorch and the model in the engine process, 167k objects and
    185-590 ms on the development VM; aiohttp in the HTTP process, 35k and 26-70 ms) holding the interpreter lock,
    a stall of every stream (runtime/heap.py). Frozen once loaded, collections walk only what serving created."""
    import re

    srv = ServerProcess(artifact, log_path=tmp_path / "server.log")
    try:
        srv.wait_healthy()
        found = re.search(r"startup heap frozen: (\d+) objects in the engine process, (\d+) here", srv.log())
        assert found is not None, srv.log()
        engine, http = int(found[1]), int(found[2])
        assert engine >= 50_000  # PyTorch's import alone leaves far more tracked
        assert http >= 10_000  # aiohttp and the app
    finally:
        srv.stop()
