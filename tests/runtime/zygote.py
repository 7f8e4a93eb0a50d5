"""A fork server for the reference servers the tests start themselves (tests/runtime/reference_helpers.ServerProcess).

Every `python -m runtime.reference.server` pays about 3 s of CPU to import PyTorch before it serves (measured with
TEST_CPU_LOG's FILE.processes, tests/cpu_by_process). Here one process per test worker imports PyTorch and the
server's modules once, and forks a process per server started: the fork runs `runtime.reference.server` as
`__main__` with the argv, environment, working directory and standard streams of the launcher that asked for it,
and exits through the interpreter's normal shutdown with the server's own exit status. The launcher (`zygote.py run
SOCKET -- -m MODULE ARGS`) stands where the server's process would: the test's Popen is it; it passes on every signal
a test sends (SIGTERM, SIGUSR2, ...) and exits as the server did (its code, or the signal that ended it); when the
launcher is killed (SIGKILL cannot be passed on) the server kills itself as soon as its launcher's socket closes.

Only where nothing looks at the server's pid itself (its /proc entries, SIGSTOP): the processes a supervisor starts
(runtime/supervisor.py reads the child's /proc/PID/schedstat and io for liveness; tests freeze engines with SIGSTOP)
are started as the product starts them. TEST_NO_ZYGOTE=1 starts every server with its own interpreter again.

The CPU the forks use is reaped here, not by the test process: cpu_s() is this process's own CPU and that of the
forks it reaped, and tests/conftest.py adds it to each test's children_s, so TEST_CPU_LOG counts it."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

_HEADER = struct.Struct("!I")
_PEER = struct.Struct("3i")  # SO_PEERCRED's struct ucred: pid, uid, gid (unix(7))
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
              signal.SIGCONT, signal.SIGWINCH)


# ---------------------------------------------------------------- the launcher (no heavy imports: it runs per server)


def launch(path: str, argv: list[str]) -> int:
    """Ask the fork server at `path` for a process running `argv` (["-m", MODULE, ...]) as this one would; wait for
    it and end as it ended."""
    fork: list[int] = []  # its pid, once the fork server says it
    pending: list[int] = []  # signals that came before that, passed on then

    def forward(signum: int, _frame: object) -> None:
        if fork:
            os.kill(fork[0], signum)
        else:
            pending.append(signum)

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
    """In the fork: the launcher sends nothing after its request, so the read ends only when it is gone."""
    try:
        conn.recv(1)
    finally:
        os.kill(os.getpid(), signal.SIGKILL)


def _become(conn: socket.socket, request: dict, fds: list[int]) -> int:
    """In the fork: take the launcher's streams, environment and directory, and run its module as __main__."""
    import runpy
    import threading

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    if request["env"].get("PYTHONPATH") != os.environ.get("PYTHONPATH"):  # sys.path was made from this one
        raise SystemExit(f"zygote: PYTHONPATH {request['env'].get('PYTHONPATH')!r} is not the fork server's "
                         f"{os.environ.get('PYTHONPATH')!r}; start this process with its own interpreter")
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[0] = os.getcwd()  # as `python -m` sets it
    threading.Thread(target=_watch_launcher, args=(conn,), daemon=True, name="zygote-launcher").start()
    flag, module, *args = request["argv"]
    if flag != "-m":
        raise SystemExit(f"zygote: only `-m MODULE` runs here, not {request['argv']}")
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


def serve(path: str, preimport: list[str], cpu_file: str) -> tuple[socket.socket, dict, list[int]] | None:
    """Import `preimport`, then fork a process per request until the parent (the test worker) is gone. Returns in
    a fork only, with what that fork is to become."""
    import importlib
    import resource
    import select

    for name in preimport:
        importlib.import_module(name)
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

    account()
    print("ready", flush=True)
    while os.getppid() == parent:
        readable, _, _ = select.select([listener], [], [], 0.1)
        if readable:
            conn, _ = listener.accept()
            try:
                request, fds = _receive(conn)
            except (OSError, ValueError):
                conn.close()
                continue
            launcher, _uid, _gid = _PEER.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER.size))
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other, _ in running.values():
                    other.close()
                return conn, request, fds
            for fd in fds:
                os.close(fd)
            running[pid] = conn, launcher
            account()
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
    return None


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"] and len(argv) > 3 and argv[2] == "--":
        return launch(argv[1], argv[3:])
    if argv[:1] == ["serve"] and len(argv) >= 3:
        # Started as a script, sys.path[0] is this directory: the repository root stands there instead.
        sys.path[0] = str(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        fork = serve(argv[1], argv[3:], argv[2])
        if fork is None:
            return 0
        return _become(*fork)  # SystemExit from the module ends this fork as it would end the server
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
        self.proc = subprocess.Popen([sys.executable, "-u", os.path.abspath(__file__), "serve", self.socket,
                                      self.cpu_file, *preimport], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     text=True)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()  # bounded by the imports; the process's exit ends it too
        if ready.strip() != "ready":
            self.proc.wait()
            raise RuntimeError(f"the fork server did not start (exit {self.proc.returncode})")

    def command(self, argv: list[str]) -> list[str]:
        """The launcher's argv for `argv` (an interpreter, then `-m MODULE ...`)."""
        return [sys.executable, os.path.abspath(__file__), "run", self.socket, "--", *argv[1:]]

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


# The server's HTTP process and its engine process (runtime.reference.worker, started through this fork server where
# ServerProcess sets runtime.reference.protocol.WORKER_LAUNCHER_ENV) both come from here.
REFERENCE_SERVER_IMPORTS = ("torch", "runtime.reference.server", "runtime.reference.worker", "runtime.reference.engine")
_servers: Zygote | None = None


def reference_servers() -> Zygote | None:
    """This worker's fork server for reference servers, started on first use; None under TEST_NO_ZYGOTE=1."""
    global _servers
    if os.environ.get("TEST_NO_ZYGOTE") == "1":
        return None
    if _servers is None:
        import atexit

        _servers = Zygote(REFERENCE_SERVER_IMPORTS)
        atexit.register(_servers.stop)
    return _servers


def cpu_s() -> float:
    """CPU used by this worker's fork server and the processes it forked and reaped, so far."""
    return _servers.cpu_s() if _servers is not None else 0.0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
