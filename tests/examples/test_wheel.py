"""The built wheel, installed on its own, embeds in a team's app that has its own `stacks/` package.

The wheel is built from this checkout (`pip wheel --no-deps`), installed into a fresh virtual environment
that reaches the already-installed dependencies (aws-cdk-lib, cdk-nag, pydantic, ...) through a .pth file,
as /work/wt/setup.sh's light venvs do, but never this repository: the team's app imports the construct API by
its product name (`fleetcast_cdk`) next to its own `stacks` package, and synthesizes with cdk-nag on. Before
the product names, the wheel installed a top-level `stacks` and the app failed with
`ModuleNotFoundError: No module named 'stacks.fleet'` (issue 32).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fleetcast.contract.packaging import CONSOLE_SCRIPT, WHEEL_DATA_DIRS, WHEEL_PACKAGES
from stacks.runtime_bundle import SERVING, bundle_files
from tests.stacks.synthesized import default_fleet

from . import conftest
from .conftest import install_wheel

ROOT = Path(__file__).resolve().parents[2]
SYNTH_TIMEOUT_S = 420

TEAM_STACKS = '''\
"""The team's own stacks package: the name a CDK app commonly gives its stacks."""
'''
TEAM_ALERTS = '''\
from aws_cdk import Stack, aws_kms as kms, aws_sns as sns


class AlertsStack(Stack):
    def __init__(self, scope, construct_id, **kwargs):
        super().__init__(scope, construct_id, **kwargs)
        key = kms.Key(self, "Key", enable_key_rotation=True)
        sns.Topic(self, "Alerts", master_key=key, enforce_ssl=True)
'''
TEAM_APP = '''\
import sys

from aws_cdk import App, Environment

from fleetcast.config import load_config
from fleetcast_cdk import nag
from fleetcast_cdk.fleet import add_fleet
from stacks.alerts import AlertsStack

import fleetcast, fleetcast_cdk, stacks
print(json.dumps({"fleetcast": fleetcast.__file__, "fleetcast_cdk": fleetcast_cdk.__file__,
                  "stacks": stacks.__file__}), file=sys.stderr)

app = App()
cfg = load_config("fleet.yaml")
AlertsStack(app, "team-alerts", env=Environment(account=cfg.provider.account, region=cfg.regions[0].region))
add_fleet(app, cfg, report=lambda line: print(line, file=sys.stderr))
nag.enable(app)
app.synth()
'''


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; returns its python."""
    env = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    install_wheel(python, wheel)
    return python


def test_the_wheel_installs_only_product_named_top_level_packages(wheel):
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        top_level = set(whl.read(next(n for n in names if n.endswith(".dist-info/top_level.txt"))).decode().split())
        entry_points = whl.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert top_level == {"fleetcast", *WHEEL_PACKAGES.values()}
    assert not top_level & {"stacks", "runtime", "scripts"}
    assert f"{CONSOLE_SCRIPT} = {WHEEL_PACKAGES['scripts']}.cli:main" in entry_points
    # What an instance bundle and the image build read from the installed packages travels in the wheel.
    runtime = WHEEL_PACKAGES["runtime"]
    for rel in bundle_files(SERVING):
        shipped = rel.as_posix().replace("runtime/", f"{runtime}/", 1) if rel.parts[0] == "runtime" else rel.as_posix()
        assert shipped in names, f"{rel} is not in the wheel"
    assert f"{WHEEL_DATA_DIRS['docker'].replace('.', '/')}/Dockerfile" in names


@pytest.mark.parametrize("installed,isolation", [
    ({"setuptools": "84.2.1"}, ["--no-build-isolation"]),  # bdist_wheel is setuptools' own from 70.1
    ({"setuptools": "70.0.0", "wheel": "0.43.0"}, ["--no-build-isolation"]),
    ({"setuptools": "70.0.0"}, []),  # neither its own bdist_wheel nor the wheel package
    ({"setuptools": "65.5.0", "wheel": "0.43.0"}, []),  # below pyproject's setuptools>=68
    ({}, []),
])
def test_the_shared_wheel_builds_in_this_interpreter_only_when_it_has_the_build_requirements(
        monkeypatch, installed, isolation):
    import importlib.metadata

    def version(name: str) -> str:
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert conftest._build_isolation() == isolation


def test_the_dev_extra_lets_the_shared_wheel_build_without_isolation(monkeypatch):
    """A venv made by `make test` (the dev extra) holds what [build-system] requires at every version the extra
    allows, so the shared wheel builds in it: its lowest allowed setuptools, without the `wheel` package."""
    import importlib.metadata
    import tomllib

    from packaging.requirements import Requirement

    dev = {Requirement(r).name: Requirement(r) for r in
           tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]}
    [floor] = [spec.version for spec in dev["setuptools"].specifier if spec.operator == ">="]

    def version(name: str) -> str:
        if name != "setuptools":
            raise importlib.metadata.PackageNotFoundError(name)
        return floor

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert conftest._build_isolation() == ["--no-build-isolation"]


def test_pyproject_names_the_console_script_from_the_packaging_table():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {CONSOLE_SCRIPT: f"{WHEEL_PACKAGES['scripts']}.cli:main"}


def test_the_installed_console_script_runs_its_subcommands(installed, tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text((ROOT / "config" / "fleet.yaml").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    script = installed.parent / CONSOLE_SCRIPT
    helped = subprocess.run([str(script), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=60)
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert all(word in helped.stdout for word in ("config", "deploy", "plan", "bench"))
    validated = subprocess.run([str(script), "config", "validate", str(fleet)], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=120)
    assert validated.returncode == 0, validated.stderr[-2000:]


def test_a_team_app_with_its_own_stacks_package_synthesizes_against_the_wheel(installed, tmp_path):
    team = tmp_path / "team-app"
    (team / "stacks").mkdir(parents=True)
    (team / "stacks" / "__init__.py").write_text(TEAM_STACKS)
    (team / "stacks" / "alerts.py").write_text(TEAM_ALERTS)
    (team / "app.py").write_text("import json\n" + TEAM_APP)
    (team / "fleet.yaml").write_text((ROOT / "config" / "fleet.yaml").read_text())
    outdir = tmp_path / "cdk.out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "CDK_"))}
    env |= {"CDK_OUTDIR": str(outdir), "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION":
            os.environ.get("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", ""),
            # CDK's built-in CloudFormation validation off: it cannot fail a synthesis, only report warnings, and
            # the Fleetcast templates here are compared with the default fleet's, whose report the gates read
            # (tests/stacks/synthesized.py). Its engine was 9 of this test's 17 s of CPU.
            "CDK_VALIDATION": "false"}
    done = subprocess.run([str(installed), "app.py"], cwd=team, env=env, capture_output=True, text=True,
                          timeout=SYNTH_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    where = json.loads(next(line for line in done.stderr.splitlines() if line.startswith('{"fleetcast"')))
    site = str(installed.parent.parent)
    assert where["fleetcast"].startswith(site) and where["fleetcast_cdk"].startswith(site)  # the wheel's
    assert where["stacks"] == str(team / "stacks" / "__init__.py")  # the team's own
    assert not any(str(ROOT) in p for p in where.values())

    # The same templates as the repository's own synthesis, asset hashes included: the runtime bundle and the
    # image build context staged from the installed packages hold what the repository's hold.
    ours = default_fleet()
    for name in ours.stacks:
        theirs = json.loads((outdir / f"{name}.template.json").read_text())
        assert theirs == ours.template_json(name), f"{name} differs when synthesized from the wheel"
    assert (outdir / "team-alerts.template.json").is_file()
    bundle = next(outdir.glob(".fleetcast-bundles/runtime"))
    assert (bundle / "runtime" / "bootstrap.py").is_file() and (bundle / "runtime" / "host").is_dir()
