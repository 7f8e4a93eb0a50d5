"""fleetcast/contract/packaging.py: the module the tools run the `fleetcast` CLI as, in a checkout and installed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from fleetcast.contract.packaging import WHEEL_PACKAGES, cli_module


def test_the_cli_runs_under_its_installed_name_where_there_is_one_else_the_checkouts():
    installed = importlib.util.find_spec(WHEEL_PACKAGES["scripts"]) is not None
    assert cli_module() == ("fleetcast_cli.cli" if installed else "scripts.cli")
    # What `fleetcast deploy` and `bench accuracy` run is a CLI that answers (not the checkout's name in a wheel).
    proc = subprocess.run([sys.executable, "-m", cli_module(), "--version"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("fleetcast"), proc.stderr
