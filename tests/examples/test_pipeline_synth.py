"""The CDK Pipelines example's Synth step runs its own commands in a shell with only what CodeBuild's image has.

CodeBuild's standard image brings python3 (with pip and venv) and Node.js with npm; it has no `cdk`, no virtual
environment and no aws_cdk. The step used to run `make synth` and then `cdk synth -a 'python ...'`, neither of
which such a shell can run. Here a copy of the checkout gets the pipeline's own commands, in order, under a PATH of
python3 (the interpreter this venv was made from, which has no aws_cdk), node, npm and npx, and /usr/bin:/bin.

Two commands reach a package registry in CodeBuild, and the tests run with none: they are replaced by what they
would install, from this checkout. `npm ci` by the checkout's node_modules (the same package-lock.json: the
pinned CDK CLI that `npx cdk` then runs), and `.venv/bin/pip install .` by the wheel of this checkout installed
into that venv without its dependencies, which it reaches through a .pth file (tests/examples/conftest.py).
Since that stand-in installs with this interpreter's pip, `python3 -m venv .venv` runs with `--without-pip`, and
the shell's `python3 -m ensurepip --version` checks the pip it would have put there (make_venv below).
Every other command runs as the pipeline writes it.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetcast.node import bin_dir as node_bin_dir

from .conftest import ROOT, install_wheel

EXAMPLE = ROOT / "examples" / "cdk-app" / "pipeline.py"
SYNTH_TIMEOUT_S = 480
JSII_PACKAGE_CACHE = Path(".cache", "aws", "jsii", "package-cache")  # under HOME, on Linux
COPY_IGNORED = (".venv", "node_modules", "cdk.out*", "build", "dist", "*.egg-info", "__pycache__", ".git",
                ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis")


def _synth_commands() -> list[str]:
    """The Synth step's commands as the example writes them (its SYNTH_COMMANDS), read from its source: importing
    it loads aws-cdk-lib, which would tie this test to the one worker that builds CDK apps in process, though
    everything it synthesizes runs in processes of its own (tests/conftest.py)."""
    for node in ast.parse(EXAMPLE.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SYNTH_COMMANDS"]:
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{EXAMPLE} no longer defines SYNTH_COMMANDS")


def _pipeline():
    spec = importlib.util.spec_from_file_location("cdk_app_pipeline_synth", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _clean_path(tmp: Path) -> str:
    """python3, node, npm and npx, then the system's own directories: no cdk and no venv."""
    bin_dir = tmp / "codebuild-bin"
    bin_dir.mkdir()
    base_python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    (bin_dir / "python3").symlink_to(base_python)
    wheel = node_bin_dir()
    if wheel is None:  # a machine with Node.js installed by hand: its own tools
        for tool in ("node", "npm", "npx"):
            found = shutil.which(tool)
            assert found, f"{tool} is not on PATH: the Synth step needs Node.js as CodeBuild has it"
            (bin_dir / tool).symlink_to(found)
    else:
        # The Node.js wheel's own npm/npx launchers do not resolve their modules (fleetcast/node.py): working
        # launchers over its npm's CLI scripts stand in for the ones a CodeBuild image has.
        (bin_dir / "node").symlink_to(wheel / "node")
        npm_bin = wheel.parent / "lib" / "node_modules" / "npm" / "bin"
        for tool, script in (("npm", "npm-cli.js"), ("npx", "npx-cli.js")):
            launcher = bin_dir / tool
            launcher.write_text(f'#!/bin/sh\nexec "{wheel / "node"}" "{npm_bin / script}" "$@"\n')
            launcher.chmod(0o755)
    return os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"])


def _share_the_jsii_package_cache(home: Path) -> None:
    """The shell's fresh HOME reads the jsii package cache of this user's: where the jsii runtime (1.x, the
    `defaultCacheRoot` of its kernel's program.js) keeps aws-cdk-lib, constructs and cdk-nag unpacked, each under
    a digest of its own tarball. A fresh cache cost the step 27 of its 44 s of CPU, unpacking the libraries' 8,000
    files in Node.js. What the claim is about is unchanged: the shell has no cdk and a python3 without aws_cdk,
    and the libraries come from the venv's own install either way."""
    shared = Path.home() / JSII_PACKAGE_CACHE
    shared.mkdir(parents=True, exist_ok=True, mode=0o700)  # the kernel refuses a cache others may write to
    (home / JSII_PACKAGE_CACHE).parent.mkdir(parents=True)
    (home / JSII_PACKAGE_CACHE).symlink_to(shared, target_is_directory=True)


# A venv, a wheel install and a whole `npx cdk synth` of the pipeline in subprocesses: about a minute on a quiet
# 2-core machine, over five on one loaded five times over. The suite's 300 s guard is for hangs, not for load.
@pytest.mark.timeout(1200)
def test_the_synth_step_commands_run_in_a_codebuild_like_shell(wheel, tmp_path):
    commands = _synth_commands()

    work = tmp_path / "checkout"
    shutil.copytree(ROOT, work, ignore=shutil.ignore_patterns(*COPY_IGNORED), symlinks=True)
    path = _clean_path(tmp_path)
    home = tmp_path / "home"
    _share_the_jsii_package_cache(home)
    env = {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8",
           "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": os.environ.get(
               "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", ""),
           # V8's background pool as every test's node has it (tests/conftest.py): how V8 compiles, not what runs
           "NODE_OPTIONS": os.environ.get("NODE_OPTIONS", ""),
           # CDK's built-in CloudFormation validation off (`cdk synth --no-validation`'s variable): it cannot fail a
           # synthesis, only add warnings to the validation report (tests/stacks/synthesized.py), and this app's
           # report is read where it is synthesized in process (tests/examples/test_cdk_app.py, with it on). Its
           # engine was 9 of the step's 35 s of CPU.
           "CDK_VALIDATION": "false"}
    # The shell is what the claim is about: no cdk, and a python3 without aws_cdk.
    assert shutil.which("cdk", path=path) is None
    probe = subprocess.run(["python3", "-c", "import aws_cdk"], env=env, capture_output=True, timeout=60)
    assert probe.returncode != 0, "the base interpreter has aws_cdk: the shell would not be CodeBuild's"

    def npm_ci() -> None:
        shutil.copytree(ROOT / "node_modules", work / "node_modules", symlinks=True)

    def pip_install() -> None:
        install_wheel(work / ".venv" / "bin" / "python", wheel)

    def make_venv() -> None:
        # `python3 -m venv .venv` puts pip into the venv with ensurepip, which installs its bundled pip wheel and
        # compiles it: 8 of the step's seconds of CPU, for a pip the stand-in for `.venv/bin/pip install .` never
        # runs (it installs with this interpreter's pip, `--python` the venv's). So the same command, in the same
        # shell, without that pip, and that shell's ensurepip asked for the pip it would have installed: a python3
        # without ensurepip (Debian's without python3-venv) still fails here, as `python3 -m venv .venv` would.
        for argv in (["python3", "-m", "venv", "--without-pip", ".venv"], ["python3", "-m", "ensurepip", "--version"]):
            done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"{argv}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        assert (work / ".venv" / "bin" / "python").exists()

    registry_free = {"npm ci": npm_ci, "python3 -m venv .venv": make_venv, ".venv/bin/pip install .": pip_install}
    assert set(registry_free) <= set(commands), "the pipeline no longer runs a command this test stands in for"
    for command in commands:
        if command in registry_free:
            registry_free[command]()
            continue
        done = subprocess.run(["bash", "-e", "-c", command], cwd=work, env=env, capture_output=True, text=True,
                              timeout=SYNTH_TIMEOUT_S)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"

    manifest = json.loads((work / "cdk.out" / "manifest.json").read_text())
    assert "fleetcast-pipeline" in manifest["artifacts"]
    # The commands run here are the ones the synthesized pipeline's Synth project runs (CDK Pipelines' ShellStep
    # writes them into its CodeBuild project's buildspec, phases.build.commands).
    template = json.loads((work / "cdk.out" / "fleetcast-pipeline.template.json").read_text())
    [synth] = [json.loads(r["Properties"]["Source"]["BuildSpec"]) for logical_id, r in template["Resources"].items()
               if r["Type"] == "AWS::CodeBuild::Project" and "BuildSynth" in logical_id]
    assert synth["phases"]["build"]["commands"] == commands


@pytest.mark.parametrize("account", ["123456789012", "210987654321"])
def test_the_pipelines_acknowledgments_follow_its_account(account, tmp_path):
    """Replacing the example account id, as the example asks, still synthesizes with cdk-nag on: the
    acknowledgments name the account's log groups, roles and cross-region replication buckets."""
    from aws_cdk import App

    pipeline = _pipeline()
    # CDK's built-in CloudFormation validation off: it never fails a synthesis, and this pipeline's report is read
    # in tests/examples/test_cdk_app.py (tests/stacks/synthesized.py says why it runs only where read)
    app = App(outdir=str(tmp_path), builtin_cloud_formation_validation=False)
    stack = pipeline.build(app, account=account)
    app.synth()  # raises on any unacknowledged cdk-nag finding
    template = (tmp_path / "fleetcast-pipeline.template.json").read_text()
    assert account in template and pipeline.PIPELINE_ACCOUNT not in template
    assert stack.account == account
