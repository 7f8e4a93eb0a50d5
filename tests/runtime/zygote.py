"""A fork server for the reference servers the tests start themselves (tests/runtime/reference_helpers.ServerProcess).

Every `python -m runtime.reference.server` pays about 3 s of CPU to import PyTorch before it serves (measured with
TEST_CPU_LOG's FILE.processes, tests/cpu_by_process). Here one process per test worker imports PyTorch and the
server's modules once, and forks a process per server started: the fork runs `runtime.reference.server` as
`__main__` with the argv, environment, working directory and standard streams of the launcher that asked for it,
and exits through the interpreter's normal shutdown with the server's own exit status. The launcher (`zygote.py run
SOCKET -- -m MODULE ARGS`) stands where the server's process would: the test's Popen is it; it passes on every signal
a test sends (SIGTERM, SIGUSR2, ...) and exits as the server did (its code, or the signal that ended it); when the
launcher is killed (SIGKILL cannot be passed on) the server kills itself as soon as its launcher's socket closes.

A server forked here starts its engine process (runtime/reference/proxy.py: `python -m runtime.reference.worker`) as a
fork of itself where it can (_local_child): its child, in its session and group, with no PyTorch to import again.

The launcher serves where nothing looks at the server's pid itself (its /proc entries, SIGSTOP). The servers the
product's supervisor starts are read through their pid (runtime/supervisor.py sums the /proc CPU and I/O of the
child's session for liveness; tests find engines by their /proc cmdline, read their environ, freeze them with
SIGSTOP): in the processes that tests/runtime/conftest.py's `forked_engines` reaches, subprocess.Popen asks for
those as forks that stand where the started process would be, with no launcher (forking_popen, _stand_in).
TEST_NO_ZYGOTE=1 starts every server with its own interpreter again.

The CPU the forks use is reaped here, not by the test process: cpu_s() is this process's own CPU and that of the
forks it reaped, and tests/conftest.py adds it to each test's children_s, so TEST_CPU_LOG counts it."""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import struct
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the launcher runs this file per server: nothing it does not need
    from collections.abc import Callable
    from typing import NoReturn

_HEADER = struct.Struct("!I")
_PEER = struct.Struct("3i")  # SO_PEERCRED's struct ucred: pid, uid, gid (unix(7))
SIGNAL_TRACE_VAR = "TEST_ZYGOTE_SIGNAL_TRACE"  # set: the launcher says on stderr what it did with each signal
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
              signal.SIGCONT, signal.SIGWINCH)


# ---------------------------------------------------------------- the launcher (no heavy imports: it runs per server)


def launch(path: str, argv: list[str]) -> int:
    """Ask the fork server at `path` for a process running `argv` (["-m", MODULE, ...]) as this one would; wait for
    it and end as it ended."""
    fork: list[int] = []  # its pid, once the fork server says it
    pending: list[int] = []  # signals that came before that, passed on then
    trace = SIGNAL_TRACE_VAR in os.environ  # a test that waits on a signal's effect reads where each went

    def forward(signum: int, _frame: object) -> None:
        if fork:
            os.kill(fork[0], signum)
        else:
            pending.append(signum)
        if trace:
            print(f"zygote launcher: signal {signum} {f'passed to {fork[0]}' if fork else 'held'}", file=sys.stderr,
                  flush=True)

    for sig in _FORWARDED:  # from the start: a signal sent at once must not end the launcher alone
        signal.signal(sig, forward)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    payload = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    socket.send_fds(conn, [_HEADER.pack(len(payload)) + payload], [0, 1, 2])
    replies = conn.makefile("r")
    first = replies.readline().split()
    if len(first) != 2 or first[0] != "pid":
        print(f"zygote: no process started for {argv}: {first}", file=sys.stderr)
        return 70
    fork.append(int(first[1]))
    for signum in pending:
        os.kill(fork[0], signum)
        if trace:
            print(f"zygote launcher: held signal {signum} passed to {fork[0]}", file=sys.stderr, flush=True)
    end = replies.readline().split()  # PEP 475: a forwarded signal does not interrupt the read
    if len(end) != 2:
        print(f"zygote: the fork server went away while {argv} ran", file=sys.stderr)
        return 70
    kind, value = end[0], int(end[1])
    if kind == "signal":
        signal.signal(value, signal.SIG_DFL)
        os.kill(os.getpid(), value)
        return 128 + value
    return value


# ---------------------------------------------------------------- the fork server


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    (size,) = _HEADER.unpack(data[:_HEADER.size])
    body = data[_HEADER.size:]
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("launcher closed before its request was whole")
        body += chunk
    return json.loads(body), list(fds)


def _watch_launcher(conn: socket.socket) -> None:
    """In the fork: the launcher sends nothing after its request, so the read ends only when it is gone.

    It blocks every signal first: the kernel hands a signal sent to the process to any thread that does not block it
    (signal(7), "Signal mask and pending signals"), and CPython runs the handler on the main thread only, which a
    signal taken by this thread does not wake (docs.python.org/3/library/signal.html, "Signals and threads"): a
    program asleep would sleep on, which the process it stands for, without this thread, does not."""
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        conn.recv(1)
    finally:
        os.kill(os.getpid(), signal.SIGKILL)


def _become(conn: socket.socket, request: dict, fds: list[int]) -> int:
    """In the fork: take the launcher's streams, environment and directory, and run its module as __main__."""
    import threading

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    path = _sys_path(request["env"].get("PYTHONPATH"))
    if isinstance(path, str):  # sys.path was made from the fork server's
        raise SystemExit(f"zygote: PYTHONPATH {request['env'].get('PYTHONPATH')!r}: {path}; start this process with "
                         "its own interpreter")
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[:] = _path_at_start[:] = path
    # What forked_site/sitecustomize.py does at a process's start where `forked_engines` reaches; any fork starts
    # the engine process of a reference server (runtime/reference/proxy.py) as a fork of itself (_local_child).
    import subprocess

    engines = request["env"].get(ENGINE_SOCKET_VAR, "")
    subprocess.Popen = forking_popen(engines, ENGINE_MODULES if engines else frozenset())  # type: ignore[assignment,misc]
    if request.get("stand_in"):
        _stand_in(request)
        try:  # once its /proc entries are its own, as Popen returns once exec has succeeded
            conn.sendall(f"pid {os.getpid()}\n".encode())
        except OSError:
            pass
    if request.get("session"):
        conn.close()  # its starter learns of the exit from this server, as a parent from waitpid
    else:  # a launcher, or a starter reading its output: gone, its process has no one to answer
        # Started with every signal blocked, which it inherits (pthread_sigmask(3)), so none reaches it before its
        # own call; the main thread's mask is back as it was before the program runs.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            threading.Thread(target=_watch_launcher, args=(conn,), daemon=True, name="zygote-launcher").start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    _run(request["argv"])
    return 0


def _run(argv: list[str]) -> None:
    """`-m MODULE ARG...` or `SCRIPT ARG...` as `python` runs them: sys.argv, sys.path[0], the code as __main__."""
    import runpy

    if argv[0] == "-m":
        sys.argv = argv[1:]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    if argv[0].startswith("-") or not os.path.isfile(argv[0]):
        raise SystemExit(f"zygote: only `-m MODULE` or a script runs here, not {argv}")
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")


_path_at_start: list[str] = []  # in a fork: the sys.path its program started with (exec_in_place starts another)


def _entries(pythonpath: str | None) -> list[str]:
    return [os.path.abspath(entry) for entry in (pythonpath or "").split(os.pathsep) if entry]


def _top_level_here(entry: str) -> set[str]:
    """The top-level modules imported here that a search of `entry` finds (a package, a .py or an extension)."""
    found = set()
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if "." in name or not where:
            continue
        for candidate in (os.path.join(entry, name, "__init__.py"), os.path.join(entry, name + ".py")):
            if os.path.exists(candidate):
                found.add(name)
        if os.path.dirname(os.path.abspath(where)) == entry:
            found.add(name)
    return found


def _sys_path(pythonpath: str | None) -> list[str] | str:
    """sys.path of a new interpreter started with PYTHONPATH `pythonpath` from here, when every module imported here
    is the one it would import; else why not. What PYTHONPATH adds goes after sys.path[0], as site.py puts it: an
    entry only this process has must have given it no module (but sitecustomize, which runs at a start), and an entry
    only the new one has must hold none of the modules imported here, unless it is where they came from."""
    mine, theirs = _entries(os.environ.get("PYTHONPATH")), _entries(pythonpath)
    if mine == theirs:
        return list(sys.path)
    for entry in set(mine) - set(theirs):
        if _top_level_here(entry) - {"sitecustomize", "__main__"}:
            return f"its modules {sorted(_top_level_here(entry))} came from {entry}"
    for entry in set(theirs) - set(mine):
        for name in _top_level_here(entry) - {"sitecustomize", "__main__"}:
            where = getattr(sys.modules[name], "__file__", "") or ""
            if not os.path.abspath(where).startswith(entry + os.sep):
                return f"{entry} holds another {name} than the one imported here"
    rest = [entry for entry in sys.path[1:] if entry not in mine]
    return [sys.path[0], *theirs, *rest]


# A process the product itself starts (runtime/supervisor.py: `python -m MODULE` in a session of its own) is read
# through its pid: the supervisor sums the CPU and I/O of the child's session from /proc to tell a starting server
# from a stuck one, tests find an engine by its /proc cmdline and read its /proc environ, freeze it with SIGSTOP and
# signal its process group. Its fork here stands where that process would: its own session (setsid, as
# start_new_session), the command line and environment in /proc that exec would have given it, the starter's
# descriptor limit and table size; its exit is reported to the starter (ForkedPopen), which reaps nothing.
# /proc/PID/cmdline and environ are read from the process's argument and environment areas (proc(5)), which a fork
# shares the addresses of: this server starts with room in both (ROOM_ARG, ROOM_ENV), and a fork writes its own there.
ROOM_ARG = "--room="
ROOM_ENV = "ZYGOTE_ROOM"
_ROOM_BYTES = {"arg": 8192, "env": 65536}
_areas: dict[str, tuple[int, int]] = {}


def _proc_areas() -> dict[str, tuple[int, int]]:
    """This process's argument and environment areas (proc(5), /proc/PID/stat fields 48-51: arg_start, arg_end,
    env_start, env_end)."""
    with open("/proc/self/stat") as handle:
        stat = handle.read()
    fields = stat[stat.rindex(")") + 2:].split()  # fields[0] is field 3, state
    return {"arg": (int(fields[45]), int(fields[46])), "env": (int(fields[47]), int(fields[48]))}


def _area_bytes(request: dict) -> dict[str, bytes]:
    return {"arg": b"".join(os.fsencode(a) + b"\0" for a in [request["exe"], *request["argv"]]),
            "env": b"".join(os.fsencode(f"{k}={v}") + b"\0" for k, v in request["env"].items())}


def _refusal(request: dict) -> str | None:
    """Why a process the product starts cannot be this server's fork (its starter then starts it itself)."""
    if not request.get("stand_in"):
        return None  # a launcher's: refused in the fork, which says so on the launcher's stderr
    if request.get("exe") != sys.executable:
        return "another interpreter"
    path = _sys_path(request["env"].get("PYTHONPATH"))
    if isinstance(path, str):
        return f"another PYTHONPATH: {path}"
    for name, data in _area_bytes(request).items():
        start, end = _areas.get(name, (0, 0))
        if len(data) > end - start:
            return f"no room for its {name} area"
    return None


def _stand_in(request: dict) -> None:
    """In the fork of a process the product starts: what exec in a new session would have given it."""
    import resource

    if request["session"]:
        os.setsid()
    _write_areas(_area_bytes(request))
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or request["nofile"] <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (request["nofile"], hard))
    # The table a child of the starter begins with (runtime/descriptors.py); the kernel sizes it in powers of two.
    highest = min(request["fd_slots"], resource.getrlimit(resource.RLIMIT_NOFILE)[0]) - 1
    if highest >= _fd_slots():
        os.dup2(0, highest)
        os.close(highest)


def _write_areas(areas: dict[str, bytes]) -> None:
    import ctypes

    for name, data in areas.items():
        start, end = _areas[name]
        ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)


def _fd_slots() -> int:
    """The size of this process's descriptor table (proc(5), FDSize in /proc/PID/status)."""
    with open("/proc/self/status") as handle:
        return int(handle.read().split("FDSize:")[1].split()[0])


def serve(path: str, preimport: list[str], cpu_file: str) -> tuple[socket.socket, dict, list[int]] | None:
    """Import `preimport`, then fork a process per request until the parent (the test worker) is gone. Returns in
    a fork only, with what that fork is to become."""
    import importlib
    import resource
    import select

    os.environ.pop(ROOM_ENV, None)
    _areas.update(_proc_areas())
    for name in preimport:
        importlib.import_module(name)
    _share_aws_models()
    # What the forks inherit is never garbage: frozen, no collection in a fork walks it (each walk writes to the
    # collector's header of every object, and the kernel copies the page), and _end_as_main lists the fork's own.
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    parent = os.getppid()
    running: dict[int, tuple[socket.socket, int]] = {}  # fork -> its launcher's connection and pid
    reaped = 0.0

    def account() -> None:
        own = resource.getrusage(resource.RUSAGE_SELF)
        tmp = f"{cpu_file}.tmp"
        with open(tmp, "w") as out:
            json.dump({"cpu_s": round(own.ru_utime + own.ru_stime + reaped, 3),
                       "launchers": sorted(launcher for _, launcher in running.values())}, out)
        os.replace(tmp, cpu_file)

    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))  # Zygote.stop: end as below
    account()
    print("ready", flush=True)
    while os.getppid() == parent and not stopping:
        readable, _, _ = select.select([listener], [], [], 0.1)
        if readable:
            conn, _ = listener.accept()
            try:
                request, fds = _receive(conn)
            except (OSError, ValueError):
                conn.close()
                continue
            refusal = _refusal(request)
            if refusal is not None:
                for fd in fds:
                    os.close(fd)
                try:
                    conn.sendall(f"refused {refusal}\n".encode())
                except OSError:
                    pass
                conn.close()
                continue
            launcher, _uid, _gid = _PEER.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER.size))
            pid = os.fork()
            if pid == 0:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the program's own, as exec would leave it
                listener.close()
                for other, _ in running.values():
                    other.close()
                return conn, request, fds
            for fd in fds:
                os.close(fd)
            running[pid] = conn, launcher
            account()
            if not request.get("stand_in"):  # a stand-in says its pid itself
                try:
                    conn.sendall(f"pid {pid}\n".encode())
                except OSError:
                    os.kill(pid, signal.SIGKILL)
        while running:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            reaped += usage.ru_utime + usage.ru_stime
            conn, _ = running.pop(pid)
            account()  # before the launcher hears of the exit, so the test that waits on it sees the CPU
            end = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                   else f"exit {os.waitstatus_to_exitcode(status)}")
            try:
                conn.sendall(f"{end}\n".encode())
            except OSError:
                pass
            conn.close()
    _end_forks(running)
    return None


def _end_forks(running: dict[int, tuple[socket.socket, int]]) -> None:
    """The fork server's end (its test worker gone, or Zygote.stop): every fork still running is killed with its
    process group where it leads one (a server the product started in a session of its own, with the engine process
    it forked), and reaped. Without this a test that failed mid-way left its servers running, orphaned, for good."""
    import time

    for pid in running:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:  # no group of that id (a launcher's fork shares this server's), or already gone
                pass
    deadline = time.monotonic() + 10
    while running and time.monotonic() < deadline:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.01)
            continue
        conn, _ = running.pop(pid, (None, 0))
        if conn is not None:
            conn.close()


# The AWS services the forked processes call (gateways: EC2, Secrets Manager, SSM, Auto Scaling; the runtime: S3, SSM,
# Auto Scaling, CloudWatch, EC2), whose models a fork would otherwise parse again from botocore's JSON files.
AWS_SERVICES = ("ec2", "secretsmanager", "ssm", "autoscaling", "s3", "cloudwatch", "sts")


def share_aws_loader() -> bool:
    """Every botocore session made in this process from now on (and in its forks) reads the service models through
    one loader. botocore makes a loader per session (botocore/session.py: the `data_loader` component,
    `create_loader(data_path)`), which caches what it has read (botocore/loaders.py, instance_cache), so a new session
    parses each model's JSON again: 0.15 s of CPU per client, two to five clients per process started, or per CLI
    command a test runs in its own process (each builds its own session: fleetcast/aws_session.py). A loader is what
    the session asks for its data, the same files read the same way; a session given AWS_DATA_PATH (a search path of
    its own) still gets a loader of its own. False where botocore is missing."""
    try:
        import botocore.loaders
        import botocore.session
    except ImportError:
        return False
    if getattr(botocore.session.create_loader, "shared_by_tests", False):
        return True
    shared = botocore.loaders.create_loader()
    make_loader = botocore.session.create_loader

    def create_loader(search_path_string: str | None = None) -> botocore.loaders.Loader:
        return shared if not search_path_string else make_loader(search_path_string)

    create_loader.shared_by_tests = True  # type: ignore[attr-defined]
    botocore.session.create_loader = create_loader  # type: ignore[assignment]
    return True


def _share_aws_models() -> None:
    """share_aws_loader, the loader here holding the models of AWS_SERVICES for every fork."""
    if not share_aws_loader():
        return
    import botocore.session

    session = botocore.session.get_session()
    for service in AWS_SERVICES:  # no call is made: a client reads its models and the endpoint rules when it is made
        session.create_client(service, region_name="us-east-1", aws_access_key_id="warm", aws_secret_access_key="warm")


def _end_as_main(run: Callable[[], object]) -> NoReturn:
    """In a fork: run the module, then end as the interpreter ends a program (Py_FinalizeEx, Py_RunMain): the exit
    status of SystemExit, an uncaught exception printed with status 1, an uncaught KeyboardInterrupt as death by
    SIGINT; non-daemon threads joined, atexit handlers run (logging's shutdown, weakref.finalize, TEST_CPU_LOG's
    line), buffered files written. What it leaves out is the teardown of the modules and objects, nearly all of them
    the fork server's, shared with it page by page: tearing them down writes to every page (reference counts, the
    collector's headers), and the kernel copies each one. With PyTorch imported that cost 0.8-0.9 s of CPU per fork
    (0.3 s with the heap frozen), against 0.01 s for this end (measured in a fork of the fork server that exits at
    once), and every server, gateway, runtime and CLI a test starts is such a fork."""
    import atexit
    import io
    import posix  # its _exit, not os._exit, which TEST_CPU_LOG's sitecustomize wraps to write a second line
    import threading
    import traceback

    code, interrupted = 0, False
    try:
        run()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:  # noqa: BLE001 - the interpreter's own handling of an uncaught exception
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # as Py_FinalizeEx, before atexit
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    atexit._run_exitfuncs()
    # Files this fork opened and never closed are written when finalization frees them; the heap the fork server
    # froze before forking (serve) is not the collector's to list, so this walks the fork's own objects only.
    for obj in gc.get_objects():
        if isinstance(obj, (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)):
            try:
                if not obj.closed:
                    obj.flush()
            except (OSError, ValueError):
                pass
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:  # Py_RunMain's exit_sigint(): the status a shell reads as Ctrl-C
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 128 + signal.SIGINT
    posix._exit(code)


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"] and len(argv) > 3 and argv[2] == "--":
        return launch(argv[1], argv[3:])
    if argv[:1] == ["serve"] and len(argv) >= 3:
        # Started as a script, sys.path[0] is this directory: the repository root stands there instead.
        sys.path[0] = str(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        fork = serve(argv[1], [name for name in argv[3:] if not name.startswith(ROOM_ARG)], argv[2])
        if fork is None:
            return 0
        # What the fork runs finds this module (exec_in_place, _areas) under its own name, not as a second copy.
        sys.modules.setdefault("tests.runtime.zygote", sys.modules[__name__])
        _end_as_main(lambda: _become(*fork))
    print("usage: zygote.py serve SOCKET CPU_FILE [MODULE ...] | zygote.py run SOCKET -- -m MODULE [ARG ...]",
          file=sys.stderr)
    return 2


# ---------------------------------------------------------------- the test side: one fork server per test worker


class Zygote:
    """A fork server started by this process, stopped at its exit (or when this process is gone)."""

    def __init__(self, preimport: tuple[str, ...]):
        import subprocess
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="fleetcast-zygote-")
        self.socket = os.path.join(self.dir, "socket")
        self.cpu_file = os.path.join(self.dir, "cpu")
        room = {ROOM_ENV: "." * _ROOM_BYTES["env"]}  # where its forks write their own (see _stand_in)
        self.proc = subprocess.Popen([sys.executable, "-u", os.path.abspath(__file__), "serve", self.socket,
                                      self.cpu_file, *preimport, ROOM_ARG + "." * _ROOM_BYTES["arg"]],
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                     env={**os.environ, **room})
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()  # bounded by the imports; the process's exit ends it too
        if ready.strip() != "ready":
            self.proc.wait()
            raise RuntimeError(f"the fork server did not start (exit {self.proc.returncode})")

    def command(self, argv: list[str]) -> list[str]:
        """The launcher's argv for `argv` (an interpreter, then `-m MODULE ...`)."""
        # -S: the launcher needs the standard library alone, not site's .pth files (the editable install's finder)
        return [sys.executable, "-S", os.path.abspath(__file__), "run", self.socket, "--", *argv[1:]]

    def _state(self) -> dict:
        try:
            with open(self.cpu_file) as f:
                return dict(json.load(f))
        except (OSError, ValueError):
            return {}

    def cpu_s(self) -> float:
        return float(self._state().get("cpu_s", 0.0))

    def wait_reaped(self, launcher: int, timeout_s: float = 30.0) -> None:
        """Until the fork of the launcher `launcher` has ended and been reaped (its CPU counted): a killed launcher's
        fork ends a moment after it, when it sees the launcher's socket close."""
        import time

        deadline = time.monotonic() + timeout_s
        while launcher in self._state().get("launchers", ()) and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> None:
        import shutil

        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------- the product's starts of those servers, forked

# In a process whose subprocess.Popen is forking_popen(SOCKET) (the test worker under tests/conftest.py's
# `forked_engines`; tests/runtime/forked_site/sitecustomize.py installs it in the processes started from there, and
# _become in a fork that starts others), these modules are forks of the fork server (see _stand_in): the runtime the
# tests start, the servers, gateways and builds it starts, and the CLI that bench scripts start as load clients.
ENGINE_SOCKET_VAR = "TEST_ENGINE_FORK_SERVER"
ENGINE_MODULES = frozenset({"runtime.bootstrap", "runtime.reference.server", "runtime.gateway",
                            "runtime.reference.build", "scripts.cli", "scripts.bench_step", "scripts.bench_fairness"})
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forked_site")


# Python scripts forked as `python SCRIPT ARG...` where `forked_engines` reaches: the bench scripts that start the
# servers (bench/h200_sharing.py), and the TensorRT-LLM tools' stand-ins (tests/runtime/fake_trtllm.py writes them as
# executables of this interpreter), whose trtllm-serve then becomes the reference server in place (exec_in_place).
_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
_TOOL_MARK = "from tests.runtime.fake_trtllm import main"


def _script(args, env) -> list[str] | None:
    """[SCRIPT, ARG...] as exec would run `args` (a bench script after this interpreter, or a TensorRT-LLM stand-in
    found on the PATH of `env`, its #! line this interpreter), or None."""
    args = [str(a) for a in args]
    if len(args) >= 2 and args[0] == sys.executable and args[1].endswith(".py"):
        path = os.path.abspath(args[1])
        return [path, *args[2:]] if os.path.dirname(path) == _BENCH and os.path.isfile(path) else None
    if os.sep in args[0]:
        found = args[0]
    else:  # as Popen's exec searches: each directory of the child's PATH, the name joined as it stands
        dirs = ((env if env is not None else os.environ).get("PATH") or os.defpath).split(os.pathsep)
        found = next((os.path.join(d, args[0]) for d in dirs if os.access(os.path.join(d, args[0]), os.X_OK)), "")
    try:
        with open(found) as handle:
            head = handle.read(4096)
    except (OSError, UnicodeDecodeError):
        return None
    return [found, *args[1:]] if head.startswith(f"#!{sys.executable}\n") and _TOOL_MARK in head else None


def exec_in_place(argv: list[str]) -> None:
    """In a fork of the fork server (a TensorRT-LLM stand-in that would exec `python -m MODULE ...`): become it as
    exec would, without a new interpreter: its /proc command line, signal dispositions reset, its module run as
    __main__ here. Returns only where that cannot be (not a fork, or no room): the caller then execs."""
    if not _areas or argv[:1] != [sys.executable] or argv[1:2] != ["-m"]:
        return
    areas = _area_bytes({"exe": argv[0], "argv": argv[1:], "env": dict(os.environ)})
    if any(len(data) > _areas[name][1] - _areas[name][0] for name, data in areas.items()):
        return
    _write_areas(areas)
    sys.path[:] = _path_at_start
    for sig in signal.valid_signals():
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    _run(argv[1:])
    raise SystemExit(0)


def _without_site(pythonpath: str) -> str:
    return os.pathsep.join(entry for entry in pythonpath.split(os.pathsep) if entry != SITE_DIR)


def forking_popen(path: str, modules: frozenset[str] = ENGINE_MODULES) -> type:
    """A subprocess.Popen that asks the fork server at `path` for `[sys.executable, "-m", MODULE, ...]` of `modules`
    started with only env, cwd, start_new_session, text and stdout/stderr captured (runtime/supervisor.py's call
    of a server, runtime/backends.py's subprocess.run of a reference build), and starts everything else (and what
    the fork server refuses) itself. Its pid is the fork's; poll() and wait() read the exit that the fork server
    reports, communicate() the captured streams; signals go to the fork."""
    import io
    import locale
    import select
    import subprocess
    import threading

    base = subprocess.Popen
    streams = ("stdout", "stderr")

    class ForkedPopen(base):  # type: ignore[valid-type,misc]
        def __init__(self, args, *rest, **kwargs):
            self._forked = False
            self._local = False
            self._conn: socket.socket | None = None
            started = self._ask(args, kwargs) if not rest and self._routed(args, kwargs) else None
            if started is None:
                self._local = not rest and _forks_locally(args, kwargs)
                super().__init__(args, *rest, **kwargs)
                return
            self._forked = True
            self._conn, self.pid, pipes, self._pending = started
            self.args, self.returncode, self.stdin = args, None, None
            self._text = bool(kwargs.get("text"))
            for name in streams:  # owned by this object, closed as Popen closes its own (__exit__, communicate)
                raw = open(pipes[name], "rb") if name in pipes else None  # noqa: SIM115
                setattr(self, name, io.TextIOWrapper(raw) if raw is not None and self._text else raw)
            self._captured: dict[str, bytearray] = {name: bytearray() for name in pipes}
            self._child_created = False  # nothing of this process's for Popen.__del__ to reap
            self._end_lock = threading.Lock()

        def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                           creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, *rest):
            if not self._local:
                return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                                              startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite,
                                              errread, errwrite, *rest)
            pipes = (p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
            for stream in (sys.stdout, sys.stderr):  # the fork's copies of their buffers would be written twice
                try:
                    stream.flush()
                except (AttributeError, OSError, ValueError):
                    pass
            # As Popen returns once exec has succeeded: once the fork's /proc entries and streams are its own (it
            # closes its end of this pipe with the rest of the parent's descriptors).
            started, done = os.pipe()
            pid = os.fork()
            if pid == 0:
                _local_child(list(args), cwd, env, pipes, pass_fds)
            os.close(done)
            try:
                while os.read(started, 64):
                    pass
            finally:
                os.close(started)
            self.pid = pid
            self._child_created = True  # a child of this process: Popen's own waitpid, poll, kill and signals
            self._close_pipe_fds(*pipes)
            return None

        @staticmethod
        def _routed(args, kwargs) -> bool:
            def stream(name: str) -> bool:  # what a fork can be given: a descriptor, its own pipe, /dev/null
                value = kwargs.get(name)
                return (value is None or value in (subprocess.PIPE, subprocess.DEVNULL) or hasattr(value, "fileno")
                        or (isinstance(value, int) and value >= 0) or (name == "stderr" and value == subprocess.STDOUT))

            return (isinstance(args, (list, tuple)) and len(args) >= 2
                    and ((len(args) >= 3 and args[1] == "-m" and args[2] in modules)
                         or (bool(modules) and _script(args, kwargs.get("env")) is not None))
                    and {k for k, v in kwargs.items() if v is not None} <= {"env", "cwd", "start_new_session", "text",
                                                                             *streams}
                    and all(stream(name) for name in streams))

        @staticmethod
        def _child_fds(kwargs, pipes: dict[str, tuple[int, int]], opened: list[int]) -> list[int]:
            """The fork's descriptors 0, 1 and 2, as Popen would give them its child."""
            fds = [0]
            for fd, name in ((1, "stdout"), (2, "stderr")):
                value = kwargs.get(name)
                if name in pipes:
                    fd = pipes[name][1]
                elif value == subprocess.DEVNULL:
                    fd = os.open(os.devnull, os.O_WRONLY)
                    opened.append(fd)
                elif value == subprocess.STDOUT:
                    fd = fds[1]
                elif hasattr(value, "fileno"):
                    fd = value.fileno()
                elif isinstance(value, int) and value >= 0:
                    fd = value
                fds.append(fd)
            return fds

        @staticmethod
        def _ask(args, kwargs) -> tuple[socket.socket, int, dict[str, int], bytes] | None:
            import resource

            env = {str(k): str(v) for k, v in (kwargs.get("env") if kwargs.get("env") is not None
                                               else os.environ).items()}
            if "PYTHONPATH" in env:  # this hook's own directory: not part of what the server sees
                env["PYTHONPATH"] = _without_site(env["PYTHONPATH"])
                if not env["PYTHONPATH"]:
                    del env["PYTHONPATH"]
            script = _script(args, kwargs.get("env"))
            argv = [str(a) for a in (script if script is not None else args[1:])]
            request = {"exe": sys.executable if script is not None else str(args[0]), "argv": argv, "env": env,
                       "cwd": os.path.abspath(kwargs.get("cwd") or os.getcwd()), "stand_in": True,
                       "session": bool(kwargs.get("start_new_session")),
                       "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0], "fd_slots": _fd_slots()}
            payload = json.dumps(request).encode()
            pipes = {name: os.pipe() for name in streams if kwargs.get(name) == subprocess.PIPE}
            opened: list[int] = []
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            reply = b""
            try:
                conn.connect(path)
                socket.send_fds(conn, [_HEADER.pack(len(payload)) + payload],
                                ForkedPopen._child_fds(kwargs, pipes, opened))
                while b"\n" not in reply:
                    chunk = conn.recv(256)
                    if not chunk:
                        break
                    reply += chunk
            except OSError:
                pass
            for fd in [write for _, write in pipes.values()] + opened:
                os.close(fd)
            line, _, rest = reply.partition(b"\n")  # what follows: its exit, if it came as quickly
            first = line.decode().split()
            if len(first) != 2 or first[0] != "pid":  # refused, or the fork server is gone: started here
                conn.close()
                for read, _ in pipes.values():
                    os.close(read)
                return None
            return conn, int(first[1]), {name: read for name, (read, _) in pipes.items()}, rest

        def _end(self, timeout: float | None) -> int | None:
            """The exit status once the fork server reports it within `timeout` seconds (None: no bound)."""
            if self.returncode is not None or self._conn is None:
                return self.returncode
            if not self._pending.endswith(b"\n"):
                readable, _, _ = select.select([self._conn], [], [], timeout)
                if not readable:
                    return None
                chunk = self._conn.recv(256)
                self._pending += chunk
                if chunk and not self._pending.endswith(b"\n"):
                    return None
            end = self._pending.decode().split()
            self._conn.close()
            self._conn = None
            if len(end) == 2 and end[0] == "signal":
                self.returncode = -int(end[1])
            elif len(end) == 2 and end[0] == "exit":
                self.returncode = int(end[1])
            else:  # the fork server went away first: its forks went with its worker
                self.returncode = -signal.SIGKILL
            return self.returncode

        def _internal_poll(self, *args, **kwargs):
            if not self._forked:
                return super()._internal_poll(*args, **kwargs)
            if not self._end_lock.acquire(blocking=False):
                return None  # another thread is waiting for it, as Popen.poll's own lock says
            try:
                return self._end(0.0)
            finally:
                self._end_lock.release()

        def _wait(self, timeout):
            if not self._forked:
                return super()._wait(timeout)
            import time

            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if self._end_lock.acquire(timeout=-1 if left is None else left):
                    try:
                        code = self._end(left)
                    finally:
                        self._end_lock.release()
                    if code is not None:
                        return code
                if deadline is not None and time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(self.args, timeout)

        def communicate(self, input=None, timeout=None):
            if not self._forked:
                return super().communicate(input, timeout)
            import time

            deadline = None if timeout is None else time.monotonic() + timeout
            reading = {stream.fileno(): name for name in self._captured
                       if (stream := getattr(self, name)) is not None and not stream.closed}
            while reading:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                ready, _, _ = select.select(list(reading), [], [], left)
                for fd in ready:
                    data = os.read(fd, 1 << 16)
                    if data:
                        self._captured[reading[fd]] += data
                    else:
                        getattr(self, reading.pop(fd)).close()
            self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
            out, err = (self._decoded(name) if name in self._captured else None for name in streams)
            return out, err

        def _decoded(self, name: str) -> bytes | str:
            data = bytes(self._captured[name])
            if not self._text:
                return data
            return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")

    return ForkedPopen


# ---------------------------------------------------------------- a stand-in's own children, forked where it runs

# A reference server's HTTP process starts its engine process (runtime/reference/proxy.py) as `python -m
# runtime.reference.worker` with the channel on its standard input, in its own session and process group, as its child:
# the supervisor counts the session's CPU while the server loads, a frozen server's group is killed, and the worker
# dies with its parent (PR_SET_PDEATHSIG, prctl(2), follows the parent; the channel's end of file too). Started from
# the fork server, the worker could have none of these (a process cannot join another session, setsid(2)); started
# with exec, it imports PyTorch again (~3 s of CPU). In a stand-in, which has the module and PyTorch imported, it is a
# fork of the stand-in itself, made as Popen's child would be (_local_child), and Popen's own waitpid, poll, kill and
# send_signal act on it. The HTTP process has run no PyTorch operation (its engine is the other process), so the fork
# starts with no OpenMP pool or CUDA context to inherit; its other threads (an idle executor's) do not come with it.


def _local_modules() -> frozenset[str]:
    protocol = sys.modules.get("runtime.reference.protocol")  # imported with the worker, when it is
    return frozenset({protocol.WORKER_MODULE}) if protocol is not None else frozenset()


def _forks_locally(args, kwargs) -> bool:
    """`[sys.executable, "-m", MODULE]` of an imported engine module, started by a fork of the fork server (which has
    room for its /proc cmdline and environ) with only its streams, env and cwd given, and this sys.path."""
    if not (_areas and isinstance(args, (list, tuple)) and len(args) == 3 and args[0] == sys.executable
            and args[1] == "-m" and args[2] in _local_modules() and args[2] in sys.modules
            and set(kwargs) <= {"stdin", "stdout", "stderr", "env", "cwd"}):
        return False
    env = os.environ if kwargs.get("env") is None else kwargs["env"]
    if env.get("PYTHONPATH") != os.environ.get("PYTHONPATH"):
        return False
    areas = _area_bytes({"exe": args[0], "argv": list(args[1:]), "env": env})
    return all(len(data) <= _areas[name][1] - _areas[name][0] for name, data in areas.items())


def _local_child(argv: list[str], cwd, env, pipes: tuple[int, ...], keep) -> None:
    """In the fork: become `argv` as exec would have made it, run its module as __main__, and end with its status
    (os._exit: the parent's atexit handlers and buffers are not this process's)."""
    import traceback

    code = 1
    try:
        _become_local(argv, cwd, env, pipes, keep)
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception: print it, status 1
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        os._exit(code)


def _become_local(argv: list[str], cwd, env, pipes: tuple[int, ...], keep) -> None:
    import gc
    import logging
    import runpy
    import warnings

    # The parent's objects stay alive on the stack this fork never returns to; a collection of its garbage could
    # still close descriptors whose numbers are this process's own by then.
    gc.freeze()
    p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite = pipes
    for fd in (p2cwrite, c2pread, errread):  # the parent's ends, as _posixsubprocess's child_exec closes them
        if fd != -1:
            os.close(fd)
    if c2pwrite == 0:
        c2pwrite = os.dup(c2pwrite)
    while errwrite in (0, 1):
        errwrite = os.dup(errwrite)
    for target, fd in ((0, p2cread), (1, c2pwrite), (2, errwrite)):
        if fd == target:
            os.set_inheritable(fd, True)
        elif fd != -1:
            os.dup2(fd, target)
    # exec resets caught signals to their defaults; the event loop's wakeup descriptor is the parent's (closed below).
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        try:
            caught = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        if callable(caught):
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    if env is not None:
        os.environ.clear()
        os.environ.update({os.fsdecode(k): os.fsdecode(v) for k, v in env.items()})
    if cwd is not None:
        os.chdir(cwd)
    _write_areas(_area_bytes({"exe": argv[0], "argv": argv[1:], "env": dict(os.environ)}))
    root = logging.getLogger()  # a new interpreter's: no handlers yet, WARNING
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    # close_fds: the parent's listening socket and its end of the channel must not live on here (the channel's end
    # of file is how the worker learns that its parent is gone); the parent's wait for this start ends here too.
    low = 3
    for fd in sorted({int(fd) for fd in keep if int(fd) >= 3}):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
    module = argv[2]
    sys.argv = [module]
    sys.path[0] = os.getcwd()  # as `python -m` sets it
    with warnings.catch_warnings():  # the module was imported before it runs as __main__, on purpose
        warnings.filterwarnings("ignore", message=r".*found in sys\.modules", category=RuntimeWarning)
        runpy.run_module(module, run_name="__main__", alter_sys=True)


# What the forks run, imported once: the server's HTTP process and its engine process (runtime.reference.worker, a
# fork of the server's fork), gateways, the runtime and the CLI.
REFERENCE_SERVER_IMPORTS = ("torch", "safetensors.torch", "runtime.reference.server", "runtime.reference.worker",
                            "runtime.reference.engine", "runtime.reference.build", "runtime.reference.model",
                            "runtime.gateway.__main__", "runtime.bootstrap", "scripts.cli", "boto3")
_zygotes: dict[tuple[str, ...], Zygote] = {}


def _zygote(imports: tuple[str, ...]) -> Zygote | None:
    """This worker's fork server with `imports` loaded, started on first use; None under TEST_NO_ZYGOTE=1."""
    if os.environ.get("TEST_NO_ZYGOTE") == "1":
        return None
    if imports not in _zygotes:
        import atexit

        _zygotes[imports] = zygote = Zygote(imports)
        atexit.register(zygote.stop)
    return _zygotes[imports]


def reference_servers() -> Zygote | None:
    """This worker's fork server for reference servers."""
    return _zygote(REFERENCE_SERVER_IMPORTS)


# The gateway side of a fleet on loopback (tests/gateway, the bench scripts they run): gateways, the fake engines
# and the bench's timed engines, forked from a server without PyTorch. Each `python -m runtime.gateway` paid 0.9 s of
# CPU to import the config model (pydantic builds its schemas at import) and the rest; a fork of this server, about
# 0.05 s beside its launcher's start. Its launchers stand where the process would (a child of the test that signals
# and waits on it, its exit status); what looks at the process's own pid (/proc, its children) starts it itself.
GATEWAY_IMPORTS = ("boto3", "runtime.gateway.__main__", "runtime.gateway.identity", "runtime.gateway.server",
                   "runtime.gateway.spill", "runtime.gateway.discovery", "runtime.gateway.fair", "runtime.gateway.reload",
                   "runtime.gateway.salting", "runtime.gateway.routing", "runtime.gateway.admission",
                   "runtime.gateway.limits", "runtime.gateway.metrics", "runtime.spot", "runtime.lifecycle",
                   "fleetcast.config", "fleetcast.config.rules", "fleetcast.config.catalog", "fleetcast.contract.spill",
                   "fleetcast.contract.isolation", "tests.gateway.engine_process", "scripts.bench_balance",
                   "scripts.bench_overflow_replay")
GATEWAY_MODULES = frozenset({"runtime.gateway", "tests.gateway.engine_process", "scripts.bench_balance"})


def gateway_processes() -> Zygote | None:
    """This worker's fork server for the gateway side."""
    return _zygote(GATEWAY_IMPORTS)


def launched(args: tuple, zygote: Zygote) -> tuple:
    """`args` of a process start, as the launcher of its fork when it is `[sys.executable, "-m", MODULE, ...]` of
    one of GATEWAY_MODULES (the whole command line otherwise, unchanged)."""
    if len(args) >= 3 and args[0] == sys.executable and args[1] == "-m" and args[2] in GATEWAY_MODULES:
        return tuple(zygote.command([str(a) for a in args]))
    return args


def servers() -> list[Zygote]:
    return list(_zygotes.values())


def cpu_s() -> float:
    """CPU used by this worker's fork servers and the processes they forked and reaped, so far."""
    return sum(z.cpu_s() for z in servers())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
