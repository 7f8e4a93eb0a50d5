"""The `fleetcast` CLI run in the test's own process: `scripts.cli.main`, the function the installed script calls,
with its output captured. A Python start costs a CLI test 1-2 s of CPU, which dozens of calls per module add up
to; tests of the script itself (entry point, exit codes, signals, no traceback) start it as a process."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import subprocess
from collections.abc import Iterator, Mapping
from unittest import mock

from scripts import cli

_build_parser = cli.build_parser


@functools.cache
def _parser() -> argparse.ArgumentParser:
    return _build_parser()


@contextlib.contextmanager
def one_parser() -> Iterator[None]:
    """`fleetcast`'s argument parser built once per test process, not at every call: building it (eleven subcommands'
    options) is 30 ms of CPU, and the property tests call the CLI hundreds of times. Parsing leaves a parser as it
    was (argparse copies defaults into each namespace), and no subcommand's options depend on the environment. The
    handler functions are bound when it is built: a test that replaces one (none does; they patch what a handler
    calls) would call the CLI without this."""
    with mock.patch.object(cli, "build_parser", _parser):
        yield


def run_cli(*argv: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """(returncode, stdout, stderr) as `subprocess.run(["fleetcast", *argv])` would give them; `env` adds to
    the environment for the call only."""
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, dict(env or {})), one_parser(), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(argv))
        except SystemExit as exit_:  # argparse's own exits (--help, a usage error)
            code = exit_.code if isinstance(exit_.code, int) else 1
    return subprocess.CompletedProcess(["fleetcast", *argv], code, out.getvalue(), err.getvalue())
