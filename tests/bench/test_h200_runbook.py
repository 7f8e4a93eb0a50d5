"""bench/H200_RUNS.md's device calls, checked here so that they run the first time: each fits the `run` tool's
limits (a command of at most 2,000 characters, 600 s per call: /work/.library/device/README.md, "Limits"), parses
as bash, and hands the scripts arguments their parsers accept, each run's --deadline-s inside its `timeout`."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "bench" / "H200_RUNS.md"
COMMAND_LIMIT = 2000  # characters in one `run` command
CALL_LIMIT_S = 600  # one command's run
STUB = """#!/bin/sh
echo "$(basename "$0") $*" >> "$CALLS"
case "$(basename "$0")" in
  timeout) shift; exec "$@" ;;
esac
exit 0
"""


def calls() -> dict[str, str]:
    text = RUNBOOK.read_text()
    found = re.findall(r"\n    (python3 -m pip install -q --no-index --no-deps --no-compile .*)\n", text)
    mps, fault = found
    assert mps.count("mps") == 3  # the runbook's call 2 is call 1 with these three replaced
    return {"mps": mps, "time_slicing": mps.replace("mps", "time_slicing"), "fault": fault}


def load(path: Path):
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["mps", "time_slicing", "fault"])
def test_each_device_call_fits_the_limits_and_its_arguments_parse(name, tmp_path):
    command = calls()[name]
    assert len(command) <= COMMAND_LIMIT
    assert "$OUT/" in command and "--target /tmp/site .whl/*.whl" in command  # carry: [".whl"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("python3", "timeout", "nvidia-smi", "tar"):
        (bin_dir / tool).write_text(STUB)
        (bin_dir / tool).chmod(0o755)
    record = tmp_path / "calls.txt"
    work = tmp_path / "w"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(record), "OUT": str(tmp_path / "out"), "HOME": str(tmp_path)}
    done = subprocess.run(["bash", "-c", command.replace("W=/tmp/h200", f"W={work}")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = record.read_text().splitlines()
    timeouts = [line.split() for line in lines if line.startswith("timeout ")]
    assert timeouts and sum(float(t[1]) for t in timeouts) <= CALL_LIMIT_S - 30  # pip, nvidia-smi, tar in the rest
    tars = [line for line in lines if line.startswith("tar ")]
    assert len(tars) == 1 and f"{tmp_path / 'out'}/h200-{name}.tar.gz" in tars[0]  # one file back, no folders
    for t in timeouts:
        script, argv = Path(t[3]), t[4:]
        module = load(ROOT / script)
        args = module.parse_args(argv)
        assert args.deadline_s is not None and args.deadline_s <= float(t[1]) - 10
        assert Path(args.out).parent == work and args.device == "cuda"
        if script.name == "h200_sharing.py":
            assert args.gpu_sharing == ("time_slicing" if name == "time_slicing" else "mps")
            assert args.repeats >= 3 and args.levels == [64, 16, 1]
    if name != "fault":
        runs = [module.parse_args(t[4:]) for t in timeouts]
        assert {r.order for r in runs} == {"xl-first", "medium-first"}
        assert {r.solo for r in runs} == {"xl", "medium"}  # each model measured alone once per mode
