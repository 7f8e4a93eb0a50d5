"""Every entry point ends on a closed pipe and on Ctrl-C as Unix tools do: exit 141 / 130, no traceback.

Python ignores SIGPIPE and raises BrokenPipeError at the next write instead; the Python documentation's
"Note on SIGPIPE" (docs.python.org/3/library/signal.html) says to catch it in the entry point and point
stdout at /dev/null before exiting. 141 and 130 are the shell's statuses for a process ended by SIGPIPE
(13) and SIGINT (2): 128 + the signal number.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fleetcast.contract.entry import run_quietly
from fleetcast.contract.errors import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED
from tests.signals import default_sigint

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "plan" / "seed"


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "AWS_EC2_METADATA_DISABLED": "true"}


def test_the_statuses_are_the_shells_for_those_signals():
    assert EXIT_BROKEN_PIPE == 128 + signal.SIGPIPE == 141
    assert EXIT_INTERRUPTED == 128 + signal.SIGINT == 130


@pytest.mark.parametrize("argv", [
    ["config", "schema"],
    ["config", "show", "config/fleet.yaml"],
    ["config", "docs"],
    ["plan", "--results", str(SEED / "results"), "--traffic", str(SEED / "traffic-seoul.yaml"), "--config",
     "config/fleet.yaml", "--ttft-p99-ms", "300", "--itl-p99-ms", "40"],
])
def test_fleetcast_into_a_closed_pipe_exits_141_without_a_word(argv):
    # The reader is gone before the first write, as with `fleetcast ... | head -0`: whatever the command writes fails.
    proc = subprocess.Popen([sys.executable, "-m", "scripts.cli", *argv], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141
    assert err == b""


def test_ctrl_c_ends_an_entry_point_with_130_and_no_traceback():
    code = ("import sys, time\n"
            "from fleetcast.contract.entry import run_quietly\n"
            "def main():\n"
            "    print('ready', flush=True)\n"
            # Short sleeps: a SIGINT that came before one long sleep began would raise only at its end (the handler
            # runs at a later bytecode: docs.python.org/3/library/signal.html, "Execution of Python signal handlers").
            "    for _ in range(1200): time.sleep(0.1)\n"
            "sys.exit(run_quietly(main))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=default_sigint)
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err == b""


def test_in_process_the_status_is_returned_and_other_errors_still_raise():
    def interrupted():
        raise KeyboardInterrupt

    def broken():
        raise BrokenPipeError

    assert run_quietly(interrupted) == 130 and run_quietly(broken) == 141 and run_quietly(lambda: 3) == 3
    with pytest.raises(ValueError):
        run_quietly(lambda: int("x"))


def _main_block_calls(path: Path) -> list[str]:
    """The source of the `if __name__ == "__main__":` block of a module, or [] if it has none."""
    tree = ast.parse(path.read_text())
    return [ast.unparse(node) for node in tree.body if isinstance(node, ast.If)
            and ast.unparse(node.test) == "__name__ == '__main__'"]


ENTRY_POINTS = [p for p in sorted([ROOT / "app.py", ROOT / "runtime" / "demo.py", *(ROOT / "scripts").glob("*.py")])
                if _main_block_calls(p)]


@pytest.mark.parametrize("path", ENTRY_POINTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_entry_point_runs_its_main_through_the_one_guard(path):
    """`make demo`, `make bench-scaling`, `make synth` (cdk runs app.py), the other make targets' scripts, and
    `fleetcast` itself (pyproject's console script calls scripts/cli.py's main, installed as fleetcast_cli.cli, which wraps its work)."""
    if path.name == "cli.py":  # main() itself is guarded: pyproject's console script calls it directly
        assert "run_quietly(lambda: _main(argv))" in path.read_text()
    else:
        assert all("run_quietly(" in block for block in _main_block_calls(path))
