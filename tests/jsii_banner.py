"""jsii prints an end-of-life banner for a Node.js major it does not list, unless
JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION names that major (it does not list "1"): the major of the node a
jsii kernel runs on, for the tests that synthesize in process and those that start the CDK CLI."""

from __future__ import annotations

import os
import subprocess


def node_major(path: str | None = None) -> str:
    """The major version of the `node` that `path` (PATH by default) finds first."""
    env = {**os.environ, "PATH": os.environ.get("PATH", "") if path is None else path}
    version = subprocess.run(["node", "--version"], capture_output=True, text=True, env=env).stdout
    return version.strip().lstrip("v").split(".")[0]
