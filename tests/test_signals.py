"""tests/signals.py: a child the suite interrupts hears Ctrl-C even when the suite itself runs as a background
job, with SIGINT ignored (issue: the Ctrl-C tests failed under `make test &`)."""

from __future__ import annotations

import signal
import subprocess
import sys

from tests.signals import default_sigint

_SAYS_ITS_SIGINT = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"


def _child_hears_sigint(**popen) -> bool:
    out = subprocess.run([sys.executable, "-c", _SAYS_ITS_SIGINT], capture_output=True, text=True, timeout=60,
                         **popen).stdout
    return out.strip() == "True"


def test_a_child_of_a_suite_that_ignores_sigint_gets_the_default_back():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts a background job
    try:
        assert not _child_hears_sigint()  # the disposition a plain child inherits: why the helper exists
        assert _child_hears_sigint(preexec_fn=default_sigint)
    finally:
        signal.signal(signal.SIGINT, before)
