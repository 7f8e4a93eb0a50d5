#!/usr/bin/env python3
"""A stand-in for nvidia-cuda-mps-control, for tests only (never installed by the product).

It behaves like the real daemon where the runtime depends on it (NVIDIA MPS documentation, "Appendix: Tools and
Interface Reference", nvidia-cuda-mps-control; "Appendix: Environment Variables", CUDA_MPS_PIPE_DIRECTORY and
CUDA_MPS_LOG_DIRECTORY):
- `-d` starts the daemon in the background: the command returns at once, the daemon lives on in its own session
  and writes its PID to nvidia-cuda-mps-control.pid in CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps), where
  it also creates its control endpoint; it logs to control.log in CUDA_MPS_LOG_DIRECTORY;
- without arguments it is the control client: it reads commands from stdin and sends them to the daemon of
  CUDA_MPS_PIPE_DIRECTORY; `quit` ends the daemon, which removes its PID file.
Each call appends its argv and environment's MPS variables to $FAKE_MPS_CALLS (one JSON line) when set.
"""

import json
import os
import socket
import sys
import time

PIPE = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
LOGS = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
PID_FILE = os.path.join(PIPE, "nvidia-cuda-mps-control.pid")
CONTROL = os.path.join(PIPE, "control")


def record() -> None:
    calls = os.environ.get("FAKE_MPS_CALLS")
    if calls:
        env = {k: v for k, v in os.environ.items() if k.startswith("CUDA_")}
        with open(calls, "a") as out:
            out.write(json.dumps({"argv": sys.argv[1:], "env": env, "pid": os.getpid()}) + "\n")


def daemon() -> None:
    os.makedirs(PIPE, exist_ok=True)
    os.makedirs(LOGS, exist_ok=True)
    if os.path.exists(CONTROL):
        os.unlink(CONTROL)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(CONTROL)
    server.listen(4)
    with open(PID_FILE + ".tmp", "w") as out:
        out.write(str(os.getpid()))
    os.replace(PID_FILE + ".tmp", PID_FILE)
    log = open(os.path.join(LOGS, "control.log"), "a")  # noqa: SIM115 - for the daemon's life
    log.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] Control daemon started\n")
    log.flush()
    while True:
        conn, _ = server.accept()
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                part = conn.recv(4096)
                if not part:
                    break
                data += part
            for line in data.decode().splitlines():
                log.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] Accepting connection... {line}\n")
                log.flush()
                if line.strip() == "quit":
                    os.unlink(PID_FILE)
                    os.unlink(CONTROL)
                    log.write("Exit\n")
                    log.close()
                    os._exit(0)


def main() -> int:
    record()
    if sys.argv[1:] == ["-d"]:
        if os.fork():
            deadline = time.monotonic() + 10
            while not os.path.exists(PID_FILE) and time.monotonic() < deadline:
                time.sleep(0.01)
            return 0 if os.path.exists(PID_FILE) else 1
        os.setsid()
        if os.fork():
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        daemon()
        return 0
    if sys.argv[1:]:
        print(f"fake nvidia-cuda-mps-control: unsupported arguments {sys.argv[1:]}", file=sys.stderr)
        return 2
    commands = sys.stdin.read()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(CONTROL)
            client.sendall(commands.encode() if commands.endswith("\n") else (commands + "\n").encode())
    except OSError as exc:
        print(f"Cannot find MPS control daemon process ({exc})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
