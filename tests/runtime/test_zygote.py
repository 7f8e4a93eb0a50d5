"""The tests' fork server (tests/runtime/zygote.py) stands in for `python -m MODULE`: the process it forks gets the
launcher's argv, environment, directory and streams, every signal a test sends the launcher, and the launcher ends
as the fork ended; a killed launcher takes its fork with it, and the forks' CPU is counted."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from runtime.devtools.harness import free_port
from tests.optional import needs_torch

from .reference_helpers import ONE_FORK_SERVER, ROOT, http_status
from .zygote import ENGINE_SOCKET_VAR, ROOM_ENV, SIGNAL_TRACE_VAR, Zygote, forking_popen, reference_servers

PROBE = """
import os, signal, sys, time
mode = sys.argv[1]
if mode == "usr2":
    import faulthandler  # the signal test's diagnosis: SIGUSR1 prints every thread's Python stack to stderr
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGUSR2, lambda *_: (print("probe: SIGUSR2 handled", file=sys.stderr, flush=True), sys.exit(3)))
print(os.getpid(), sys.argv[1:], os.getcwd(), os.environ.get("PROBE_WORD"), flush=True)
if mode == "parent":
    print(os.getppid(), flush=True)
if mode in ("usr2", "wait"):
    # Short sleeps, not one of 60 s: CPython runs a Python handler at a later bytecode, after its C handler has set a
    # flag (docs.python.org/3/library/signal.html, "Execution of Python signal handlers"), and a sleep is cut short
    # only by a signal that comes while it sleeps (EINTR, PEP 475). A SIGUSR2 that came after the print and before
    # the sleep began (the test sends it once it reads the line; on a loaded machine the probe is then often not
    # running) ran its handler only when time.sleep(60) ended: exit 3, 60 s late, 4 times in some 40 full-suite runs.
    for _ in range(600):
        time.sleep(0.1)
    sys.exit(9)
if mode == "spin":
    sum(range(3_000_000))
if mode == "leftovers":  # what only the end of the interpreter finishes
    import atexit, threading
    kept = open("unclosed.txt", "w")  # never closed, its line still in the buffer
    kept.write("buffered\\n")
    atexit.register(lambda: open("atexit.txt", "w").write("ran"))
    threading.Thread(target=lambda: (time.sleep(0.3), open("thread.txt", "w").write("joined"))).start()
if mode == "raise":
    raise ValueError("uncaught")
if mode == "interrupt":
    raise KeyboardInterrupt
if mode in ("engine", "orphan"):  # as runtime/reference/proxy.py starts the engine process
    import socket, subprocess
    sys.path.insert(1, os.environ["PROBE_ROOT"])
    import runtime.reference.worker  # imported before, as in the fork server's forks
    def start_engine():
        ours, theirs = socket.socketpair()
        child = subprocess.Popen([sys.executable, "-m", "runtime.reference.worker"], stdin=theirs.fileno())
        theirs.close()
        return ours, child
    ours, engine = start_engine()
    print(engine.pid, flush=True)
    if mode == "orphan":
        time.sleep(60)
        sys.exit(9)
    while not os.path.exists("looked"):  # the test has looked at it (bounded by the test's own wait)
        time.sleep(0.02)
    running = engine.poll()
    ours.close()  # the channel's end before START: the engine process exits 1
    ended = engine.wait(60)
    ours, killed = start_engine()
    killed.kill()
    print(running, ended, killed.wait(60), flush=True)
    sys.exit(0)
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture(scope="module")
def zygote():
    fork_server = Zygote(())
    yield fork_server
    fork_server.stop()


@pytest.fixture
def probe(tmp_path, zygote):
    (tmp_path / "zygote_probe.py").write_text(PROBE)

    def start(*args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(zygote.command([sys.executable, "-m", "zygote_probe", *args]), cwd=tmp_path,
                                env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    return start


def test_the_fork_runs_the_module_with_the_launchers_argv_environment_directory_and_streams(probe, tmp_path):
    proc = probe("exit", "5", PROBE_WORD="hello")
    out, _ = proc.communicate(timeout=60)
    pid, rest = out.split(" ", 1)
    assert proc.returncode == 5
    assert rest.strip() == f"['exit', '5'] {tmp_path} hello"
    assert int(pid) != proc.pid  # a fork, not the launcher


def signal_state(pid: int) -> dict[str, dict[str, str]]:
    """Each thread of `pid`: its state and signal masks (proc(5): SigPnd, ShdPnd, SigBlk, SigIgn, SigCgt) and where
    it waits in the kernel (wchan): what a test that waited in vain for a signal's effect reports."""
    state = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            lines = Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines()
            fields = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
            keep = ("Name", "State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
            state[tid] = {k: fields.get(k, "?") for k in keep}
            state[tid]["wchan"] = Path(f"/proc/{pid}/task/{tid}/wchan").read_text()
    except OSError as exc:
        return {"error": {"reading": str(exc)}}
    return state


def test_the_forks_own_thread_blocks_every_signal_so_each_reaches_the_program_as_without_it(probe):
    """A signal sent to a process goes to any thread that does not block it (signal(7)), and CPython runs its handler
    on the main thread, which a signal taken by another thread does not wake (docs.python.org/3/library/signal.html,
    "Signals and threads"): were the fork's launcher-watching thread, which the process it stands for does not have,
    to take a signal, a program asleep would sleep on. proc(5): SigBlk, the thread's blocked-signal mask in
    hexadecimal."""
    proc = probe("wait")
    try:
        pid = int(proc.stdout.readline().split()[0])
        masks = {int(tid): int(state["SigBlk"], 16) for tid, state in signal_state(pid).items()}
        every = sum(1 << (int(sig) - 1) for sig in signal.valid_signals() if int(sig) not in (signal.SIGKILL, signal.SIGSTOP))
        others = [mask for tid, mask in masks.items() if tid != pid]
        assert others and all(mask & every == every for mask in others), {t: hex(m) for t, m in masks.items()}
        assert masks[pid] == 0  # the program's main thread takes them, as the process it stands for
    finally:
        proc.kill()
        proc.wait(60)


def test_signals_reach_the_fork_and_the_launcher_ends_as_it_did(probe):
    handled = probe("usr2", **{SIGNAL_TRACE_VAR: "1"})
    fork = int(handled.stdout.readline().split()[0])
    handled.send_signal(signal.SIGUSR2)
    try:
        code = handled.wait(60)
    except subprocess.TimeoutExpired:  # say where each waited
        launcher, forked = signal_state(handled.pid), signal_state(fork)
        with contextlib.suppress(ProcessLookupError):
            os.kill(fork, signal.SIGUSR1)  # its Python stacks (faulthandler), written at once from the signal handler
        time.sleep(1)
        handled.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(fork, signal.SIGKILL)
        _, stacks = handled.communicate(timeout=60)
        pytest.fail(f"no end 60 s after SIGUSR2; launcher {launcher}; fork {forked}; the launcher's and the fork's "
                    f"stderr (what the launcher did with the signal, the fork's stacks):\n{stacks}")
    assert code == 3
    default = probe("wait")
    default.stdout.readline()
    default.send_signal(signal.SIGTERM)
    assert default.wait(60) == -signal.SIGTERM


def test_a_killed_launcher_takes_its_fork_with_it(probe, zygote):
    proc = probe("wait")
    fork = int(proc.stdout.readline().split()[0])
    assert Path(f"/proc/{fork}").exists()
    proc.kill()
    assert proc.wait(60) == -signal.SIGKILL
    zygote.wait_reaped(proc.pid, timeout_s=60)  # bounds the wait; the fork server reaps the fork
    assert not Path(f"/proc/{fork}").exists()


def test_a_stopped_fork_server_takes_the_forks_still_running_with_it(tmp_path):
    """A test that fails mid-way leaves the servers it started running; the worker's fork server, stopped at the
    worker's exit, kills them, so none outlives the test run."""
    (tmp_path / "zygote_probe.py").write_text(PROBE)
    fork_server = Zygote(())
    try:
        proc = subprocess.Popen(fork_server.command([sys.executable, "-m", "zygote_probe", "wait"]), cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        fork = int(proc.stdout.readline().split()[0])
        assert Path(f"/proc/{fork}").exists()
    finally:
        fork_server.stop()  # returns once the server has ended, its forks reaped before
    assert not Path(f"/proc/{fork}").exists()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 70 and "the fork server went away" in err


def test_the_forks_cpu_is_counted_before_the_launcher_returns(probe, zygote):
    before = zygote.cpu_s()
    proc = probe("spin", "0")
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert zygote.cpu_s() - before > 0.02  # three million additions, in the fork


def test_the_fork_ends_as_the_interpreter_ends_a_program(probe, tmp_path):
    """Without the teardown of the fork server's heap (zygote._end_as_main), and with all that a program's end does:
    non-daemon threads joined, atexit handlers run, buffered files written, exit status as Python gives it."""
    proc = probe("leftovers", "4")
    proc.communicate(timeout=60)
    assert proc.returncode == 4
    assert (tmp_path / "unclosed.txt").read_text() == "buffered\n"
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    assert (tmp_path / "thread.txt").read_text() == "joined"
    raised = probe("raise")
    _, err = raised.communicate(timeout=60)
    assert raised.returncode == 1 and "ValueError: uncaught" in err and "Traceback" in err
    # Py_RunMain ends a program that KeyboardInterrupt left by SIGINT, so that its caller sees a Ctrl-C.
    interrupted = probe("interrupt")
    _, err = interrupted.communicate(timeout=60)
    assert interrupted.returncode == -signal.SIGINT and "KeyboardInterrupt" in err


@needs_torch
@ONE_FORK_SERVER
def test_a_fork_of_the_fork_server_with_pytorch_ends_without_tearing_its_heap_down(tmp_path):
    """Tearing down the modules a fork shares with the fork server writes to every one of their pages, which the kernel
    then copies: with PyTorch imported, 0.8-0.9 s of CPU per fork, more than most forks use to run (measured: a fork
    that exits at once; 0.01 s without the teardown). CPU, not wall time: what the fork did, not the machine's load."""
    fork_server = reference_servers()
    if fork_server is None:
        pytest.skip("TEST_NO_ZYGOTE=1: no fork server")
    (tmp_path / "zygote_probe.py").write_text(PROBE)
    before = fork_server.cpu_s()
    proc = subprocess.Popen(fork_server.command([sys.executable, "-m", "zygote_probe", "exit", "0"]), cwd=tmp_path,
                            stdout=subprocess.DEVNULL)
    assert proc.wait(60) == 0
    assert fork_server.cpu_s() - before < 0.3


def test_another_pythonpath_is_refused_not_run_with_the_fork_servers(probe, tmp_path):
    shadow = tmp_path / "shadow"  # resource from elsewhere: not the module the fork server imported
    shadow.mkdir()
    (shadow / "resource.py").write_text("")
    proc = probe("exit", "0", PYTHONPATH=str(shadow))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "start this process with its own interpreter" in err


# ---------------------------------------------------------------- processes the product starts (forking_popen)


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])  # proc(5) field 4, ppid


@pytest.fixture
def product_start(tmp_path, zygote):
    """subprocess.Popen as `forked_engines` makes it (tests/runtime/conftest.py), for the probe module."""
    (tmp_path / "zygote_probe.py").write_text(PROBE)
    popen = forking_popen(zygote.socket, frozenset({"zygote_probe"}))

    def start(*args: str, **env: str) -> subprocess.Popen[bytes]:
        # As runtime/supervisor.py starts a server: env, cwd and a session of its own, nothing else.
        return popen([sys.executable, "-m", "zygote_probe", *args], env={**os.environ, **env}, cwd=tmp_path,
                     start_new_session=True)

    return start


def test_a_server_the_supervisor_starts_is_a_fork_with_the_pid_session_and_proc_entries_exec_would_give(
        product_start, zygote):
    proc = product_start("wait", PROBE_WORD="hello")
    try:
        assert _parent(proc.pid) == zygote.proc.pid  # forked there, not started here
        assert os.getsid(proc.pid) == os.getpgid(proc.pid) == proc.pid  # start_new_session
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        assert cmdline == [os.fsencode(a) for a in (sys.executable, "-m", "zygote_probe", "wait")]
        environ = dict(item.split(b"=", 1) for item in Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
                       if item)
        assert environ[b"PROBE_WORD"] == b"hello" and ROOM_ENV.encode() not in environ
        assert proc.poll() is None
        os.killpg(proc.pid, signal.SIGTERM)  # as the supervisor stops it
        assert proc.wait(60) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)


def test_a_build_run_with_its_output_captured_gets_its_output_and_exit_status(tmp_path, zygote, monkeypatch):
    (tmp_path / "zygote_probe.py").write_text(PROBE)
    monkeypatch.setattr(subprocess, "Popen", forking_popen(zygote.socket, frozenset({"zygote_probe"})))
    # As runtime/backends.py runs the reference build.
    done = subprocess.run([sys.executable, "-m", "zygote_probe", "parent", "5"], cwd=tmp_path, capture_output=True,
                          text=True, check=False, timeout=60)
    assert done.returncode == 5
    first, parent = done.stdout.splitlines()
    assert first.split(" ", 1)[1] == f"['parent', '5'] {tmp_path} None"
    assert int(parent) == zygote.proc.pid and done.stderr == ""


def test_what_the_fork_server_cannot_stand_in_for_is_started_here(product_start, tmp_path):
    """A PYTHONPATH whose modules would not be the ones the fork server imported: resource from elsewhere."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "resource.py").write_text("")
    proc = product_start("wait", PYTHONPATH=str(shadow))
    try:
        assert _parent(proc.pid) == os.getpid()
    finally:
        proc.kill()
        proc.wait(60)


def test_another_pythonpath_that_changes_no_imported_module_is_a_fork_with_that_sys_path(product_start, zygote,
                                                                                          tmp_path):
    """As the runtime starts in the container: its vendored packages' directory on PYTHONPATH (empty here)."""
    vendored = tmp_path / "vendored"
    vendored.mkdir()
    (tmp_path / "zygote_probe.py").write_text("import sys; print(sys.path[1])\n")
    proc = product_start(PYTHONPATH=str(vendored))
    assert _parent(proc.pid) == zygote.proc.pid
    assert proc.wait(60) == 0
    popen = forking_popen(zygote.socket, frozenset({"zygote_probe"}))
    with popen([sys.executable, "-m", "zygote_probe"], env={**os.environ, "PYTHONPATH": str(vendored)}, cwd=tmp_path,
               stdout=subprocess.PIPE, text=True) as printed:
        assert printed.communicate(timeout=60)[0].strip() == str(vendored)


def test_a_process_started_with_its_streams_redirected_writes_where_they_point(tmp_path, zygote):
    """As tests start the runtime (stdout a pipe, stderr a log file) and bench scripts their clients (stderr into
    stdout, or /dev/null)."""
    (tmp_path / "zygote_probe.py").write_text(PROBE)
    popen = forking_popen(zygote.socket, frozenset({"zygote_probe"}))
    log = tmp_path / "log"
    with open(log, "ab") as stderr:
        piped = popen([sys.executable, "-m", "zygote_probe", "parent", "0"], cwd=tmp_path, stdout=subprocess.PIPE,
                      stderr=stderr, text=True)
        out, _ = piped.communicate(timeout=60)
    assert int(out.splitlines()[1]) == zygote.proc.pid and piped.returncode == 0
    combined = popen([sys.executable, "-m", "zygote_probe", "exit", "3"], cwd=tmp_path, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT)
    out, err = combined.communicate(timeout=60)
    assert combined.returncode == 3 and out.split(b" ", 1)[1].startswith(b"['exit', '3']") and err is None
    silent = popen([sys.executable, "-m", "zygote_probe", "exit", "4"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    assert silent.wait(60) == 4 and log.read_bytes() == b""


# ---------------------------------------------------------------- what a stand-in starts itself (the engine process)


def _cmdline(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")


def _await_health(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """Until the forked server answers /health with 200 (bounded: 120 s); it must still be running then."""
    for _ in range(1200):
        if http_status(f"http://127.0.0.1:{port}/health") == 200 or proc.poll() is not None:
            break
        time.sleep(0.1)
    assert proc.poll() is None, log.read_text()


def _gone(pid: int, timeout_s: float = 60.0) -> bool:
    """Ended: no /proc entry, or a zombie its new parent has not reaped (bounded by `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat[stat.rindex(")") + 2] in "ZX":
            return True
        time.sleep(0.05)
    return False


ENGINE_ARGV = [os.fsencode(a) for a in (sys.executable, "-m", "runtime.reference.worker")]


@pytest.fixture
def stand_in(tmp_path, zygote):
    """The probe as the supervisor starts a server (a stand-in of the fork server), its output read here; what it
    starts with subprocess.Popen goes through forking_popen, as forked_site/sitecustomize.py makes it there."""
    (tmp_path / "zygote_probe.py").write_text(PROBE)
    popen = forking_popen(zygote.socket, frozenset({"zygote_probe"}))

    def start(*args: str) -> subprocess.Popen[str]:
        return popen([sys.executable, "-m", "zygote_probe", *args], env={**os.environ, ENGINE_SOCKET_VAR: zygote.socket,
                     "PROBE_WORD": "engine", "PROBE_ROOT": str(ROOT)}, cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE, text=True)

    return start


def test_the_engine_process_a_stand_in_starts_is_its_child_in_its_session_and_group_and_its_exit_status_is_read(
        stand_in, zygote, tmp_path):
    proc = stand_in("engine")
    try:
        proc.stdout.readline()  # the probe's own line
        engine = int(proc.stdout.readline())
        assert _parent(engine) == proc.pid  # a fork of the stand-in, not of the fork server, nor exec'd from there
        assert os.getsid(engine) == os.getpgid(engine) == proc.pid  # the server's session and process group
        assert _cmdline(engine) == ENGINE_ARGV  # as exec would show it: not the server's own
        environ = Path(f"/proc/{engine}/environ").read_bytes().split(b"\0")
        assert b"PROBE_WORD=engine" in environ and not any(item.startswith(ROOM_ENV.encode()) for item in environ)
        (tmp_path / "looked").touch()
        # Running (poll), then its status once the channel closed before START (1: worker.main), and a kill's.
        assert proc.stdout.readline().split() == ["None", "1", str(-signal.SIGKILL)]
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)


def test_the_engine_process_dies_with_the_stand_in_that_started_it(stand_in, zygote):
    proc = stand_in("orphan")
    proc.stdout.readline()
    engine = int(proc.stdout.readline())
    assert _parent(engine) == proc.pid
    proc.kill()  # SIGKILL: nothing of the server's own runs; PR_SET_PDEATHSIG and the channel's end remain
    assert proc.wait(60) == -signal.SIGKILL
    assert _gone(engine)


@needs_torch
@ONE_FORK_SERVER  # the fork server with PyTorch that the modules starting reference servers share
def test_the_engine_process_of_a_reference_server_the_supervisor_starts_costs_a_fork_not_a_pytorch_import(tmp_path):
    """runtime/reference/proxy.py's start of `python -m runtime.reference.worker`, in a server forked as
    `forked_engines` forks them: the engine loads the model having imported nothing (a new interpreter spends about
    2.5 s of CPU importing PyTorch alone), and is the server's child in its session and process group."""
    from runtime.reference.build import build_artifact

    fork_server = reference_servers()
    if fork_server is None:
        pytest.skip("TEST_NO_ZYGOTE=1: servers are started as the product starts them")
    build_artifact(tmp_path / "artifact", size="tiny", seed=0)
    popen = forking_popen(fork_server.socket)
    port = free_port()
    with open(tmp_path / "log", "wb") as log:
        proc = popen([sys.executable, "-m", "runtime.reference.server", "--artifact", str(tmp_path / "artifact"),
                      "--host", "127.0.0.1", "--port", str(port), "--threads", "1"],
                     env={**os.environ, ENGINE_SOCKET_VAR: fork_server.socket}, cwd=ROOT, start_new_session=True,
                     stdout=log, stderr=subprocess.STDOUT)
    try:
        assert _parent(proc.pid) == fork_server.proc.pid
        _await_health(proc, port, tmp_path / "log")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/memory", timeout=30) as reply:
            engine = int(json.load(reply)["engine_pid"])
        assert _parent(engine) == proc.pid and os.getsid(engine) == os.getpgid(engine) == proc.pid
        assert _cmdline(engine) == ENGINE_ARGV
        fields = Path(f"/proc/{engine}/stat").read_text().rsplit(")", 1)[1].split()
        cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # proc(5): utime, stime
        assert cpu_s < 1.0, f"the engine process used {cpu_s:.2f} s of CPU by its load: an interpreter of its own?"
        os.killpg(proc.pid, signal.SIGTERM)  # as the supervisor stops a server: the drain stops the engine
        assert proc.wait(60) == 0, (tmp_path / "log").read_text()
        assert _gone(engine)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(60)


@needs_torch
@ONE_FORK_SERVER
def test_the_engine_process_of_a_server_the_tests_start_is_a_fork_of_that_server(tmp_path):
    """ServerProcess's server (a fork behind the launcher) starts its engine process as a fork of itself, as a server
    the supervisor starts does: its child, with the command line exec would show, not another launcher's fork of the
    fork server (a launcher is a new interpreter of its own, and the engine then is not the server's child)."""
    from runtime.reference.build import build_artifact

    from .reference_helpers import ServerProcess

    fork_server = reference_servers()
    if fork_server is None:
        pytest.skip("TEST_NO_ZYGOTE=1: servers are started as the product starts them")
    build_artifact(tmp_path / "artifact", size="tiny", seed=0)
    server = ServerProcess(tmp_path / "artifact", log_path=tmp_path / "log")
    try:
        server.wait_healthy(120)
        with urllib.request.urlopen(f"{server.base}/memory", timeout=30) as reply:
            engine = int(json.load(reply)["engine_pid"])
        http = _parent(engine)
        assert _parent(http) == fork_server.proc.pid and _cmdline(engine) == ENGINE_ARGV
        fields = Path(f"/proc/{engine}/stat").read_text().rsplit(")", 1)[1].split()
        cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # proc(5): utime, stime
        assert cpu_s < 1.0, f"the engine process used {cpu_s:.2f} s of CPU by its load: an interpreter of its own?"
    finally:
        server.stop()
    assert _gone(engine)


def _import_time_environment_reads(source: str) -> list[int]:
    """Lines of `source` that read os.environ or os.getenv as the module is imported: anywhere but inside a function's
    body (a class body, a decorator and a default value run at import)."""
    import ast

    found: list[int] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for part in (*getattr(node, "decorator_list", ()), *node.args.defaults, *node.args.kw_defaults):
                if part is not None:
                    visit(part)
            return
        if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb")
                and isinstance(node.value, ast.Name) and node.value.id == "os"):
            found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def test_no_module_a_fork_runs_reads_the_environment_as_it_is_imported():
    """A fork takes its starter's environment after the fork server imported the product: a value read from the
    environment while a module was imported is the fork server's, not the process's (runtime/trtllm.py's examples
    directory and build step timeout were, and the runtime's trtllm-build ran the fork server's examples)."""
    readers = {f"{path.relative_to(ROOT)}:{line}" for package in ("runtime", "fleetcast", "scripts")
               for path in sorted((ROOT / package).rglob("*.py"))
               for line in _import_time_environment_reads(path.read_text())}
    assert not readers


@needs_torch
@ONE_FORK_SERVER
def test_the_trtllm_serve_stand_in_becomes_the_reference_server_in_place(tmp_path):
    """tests/runtime/fake_trtllm.py's trtllm-serve, started as the supervisor starts it (found on PATH, its own
    session), is a fork of the fork server that becomes the reference server as exec would make it (zygote.
    exec_in_place): its pid, the server's command line in /proc, its engine process a fork of it, and no interpreter
    importing PyTorch."""
    from runtime.reference.build import build_artifact

    from . import fake_trtllm

    fork_server = reference_servers()
    if fork_server is None:
        pytest.skip("TEST_NO_ZYGOTE=1: servers are started as the product starts them")
    build_artifact(tmp_path / "engine", size="tiny", seed=0)
    bin_dir, _ = fake_trtllm.install(tmp_path / "trtllm")
    port = free_port()
    popen = forking_popen(fork_server.socket)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", ENGINE_SOCKET_VAR: fork_server.socket,
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}  # as the runtime
    with open(tmp_path / "log", "wb") as log:
        proc = popen(["trtllm-serve", str(tmp_path / "engine"), "--host", "127.0.0.1", "--port", str(port),
                      "--backend", "tensorrt"], env=env, cwd=tmp_path, start_new_session=True, stdout=log,
                     stderr=subprocess.STDOUT)
    try:
        assert _parent(proc.pid) == fork_server.proc.pid
        _await_health(proc, port, tmp_path / "log")
        assert _cmdline(proc.pid)[1:4] == [b"-m", b"runtime.reference.server", b"--artifact"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/memory", timeout=30) as reply:
            engine = int(json.load(reply)["engine_pid"])
        assert _parent(engine) == proc.pid and _cmdline(engine) == ENGINE_ARGV
        fields = Path(f"/proc/{engine}/stat").read_text().rsplit(")", 1)[1].split()
        cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # proc(5): utime, stime
        assert cpu_s < 1.0, f"the engine process used {cpu_s:.2f} s of CPU by its load: an interpreter of its own?"
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 0, (tmp_path / "log").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(60)
