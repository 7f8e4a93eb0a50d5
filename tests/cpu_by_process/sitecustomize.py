"""TEST_CPU_LOG's per-process half: on PYTHONPATH (tests/conftest.py puts it there when TEST_CPU_LOG is set), every
Python process the tests start, and the ones those start, append one JSON line at exit to TEST_PROCESS_CPU_LOG: its
program (`-m` module or script), the test that was running (pytest's PYTEST_CURRENT_TEST, inherited), and its own
CPU (user + system). os._exit skips atexit, so it writes the line first: the reference engine process ends that way
(runtime/reference/worker.py), and so do the forks of tests/runtime/zygote.py. Processes killed (SIGKILL, an
unhandled SIGTERM) write nothing; their CPU is still in the test's children_s once reaped.

Python imports `sitecustomize` once at startup, before the program; nothing here runs unless the variable is set."""

import os

if os.environ.get("TEST_PROCESS_CPU_LOG"):
    import atexit
    import json
    import resource
    import sys

    def _program() -> str:
        # During startup a `-m` run's sys.argv[0] is "-m" and the module is not known yet; at exit runpy has set
        # sys.argv[0] to the module's file.
        if not sys.argv or not sys.argv[0]:
            return "-c"
        return os.path.relpath(sys.argv[0]) if os.path.isabs(sys.argv[0]) else sys.argv[0]

    def _log_cpu() -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        line = json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0],
                           "program": _program(), "pid": os.getpid(), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
                           "torch": "torch" in sys.modules})
        try:
            with open(os.environ["TEST_PROCESS_CPU_LOG"], "a") as log:  # one short line per append
                log.write(line + "\n")
        except OSError:
            pass  # a process in a sandboxed directory or a clean environment: its line is lost, not its exit

    atexit.register(_log_cpu)
    _exit = os._exit

    def _exit_logged(code: int) -> None:
        _log_cpu()
        _exit(code)

    os._exit = _exit_logged  # type: ignore[assignment]
