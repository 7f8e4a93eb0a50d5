"""For tests that interrupt a child with Ctrl-C (SIGINT).

A shell starts a background job (`make test &`) with SIGINT ignored, and an ignored disposition survives fork
and exec (signal(7): "During an execve(2), the dispositions of handled signals are reset to the default; the
dispositions of ignored signals are left unchanged"). Python then installs no KeyboardInterrupt handler in the
child (docs.python.org/3/library/signal.html: SIGINT is translated into KeyboardInterrupt only "if the parent
process has not changed it"), so the test's Ctrl-C would reach a child that cannot hear it. Each such child
starts with the default disposition instead, as it would at a terminal.
"""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """`preexec_fn` for a child a test sends SIGINT: run in the child between fork and exec."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
