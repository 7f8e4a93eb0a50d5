"""How every entry point ends on Ctrl-C and on a closed pipe: as Unix tools do, quietly.

`fleetcast ... | head` closes the pipe under the writer; Python then raises BrokenPipeError
at the next write (it ignores SIGPIPE, so the process is not killed as a C tool would be).
The Python documentation's "Note on SIGPIPE" (library/signal.html) prescribes catching it
in the entry point and pointing stdout at /dev/null, so the interpreter's final flush does
not raise again; restoring SIG_DFL instead would also kill the servers and clients that
write to sockets. The exit status is the shell's for a process ended by that signal:
128 + SIGPIPE (13) = 141, 128 + SIGINT (2) = 130.

Used by the `fleetcast` CLI (scripts/cli.py), the CDK app (app.py, run by `cdk synth`) and the
`make` entry points (runtime/demo.py, scripts/bench_scaling.py). Standard library only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from .errors import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED


def run_quietly(main: Callable[[], int | None]) -> int:
    """main()'s exit status; Ctrl-C gives 130 and a closed stdout 141, without a traceback or a message.

    stdout is flushed here, inside the guard: a pipe closed after the last write would otherwise raise
    at interpreter exit, where nothing can catch it."""
    try:
        code = main()
        sys.stdout.flush()
        return int(code or 0)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE


def _silence_stdout() -> None:
    out = sys.stdout
    if out is not sys.__stdout__ or out is None:
        return  # replaced by a caller (a test capturing output): the process's stdout is not ours to close; or none
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
    except (OSError, ValueError):
        pass  # stdout is not a file: nothing is flushed into it at exit
