"""The vendored runtime packages: exact, mutually consistent pins, kept away from TensorRT-LLM."""

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from runtime import trtllm, vendor
from tests.runtime import vendored_wheels as wheels

REPO = Path(__file__).resolve().parents[2]


def test_pins_are_exact_and_are_the_recorded_wheels():
    assert {n: v for n, (v, _) in vendor.PINS.items()} == {n: w["version"] for n, w in wheels.WHEELS.items()}
    assert {n: h for n, (_, h) in vendor.PINS.items()} == {n: w["sha256"] for n, w in wheels.WHEELS.items()}
    assert all(line.count("==") == 1 and "--hash=sha256:" in line for line in vendor.requirements().splitlines())
    assert {"--no-deps", "--require-hashes"} <= set(vendor.pip_command(Path("/d"), Path("/r")))


def test_every_declared_requirement_is_met_by_another_pin_or_by_the_image():
    pinned = {canonicalize_name(n): v for n, (v, _) in vendor.PINS.items()}
    for name, wheel in wheels.WHEELS.items():
        for line in wheel["requires"]:
            req = Requirement(line)
            dep = canonicalize_name(req.name)
            if dep in pinned:
                assert req.specifier.contains(pinned[dep], prereleases=True), f"{name} needs {req}, pinned {pinned[dep]}"
            else:
                assert dep in wheels.IMAGE_PROVIDED, f"{name} needs {req}: neither pinned nor in the image"


def test_the_old_float_would_not_have_resolved_consistently():
    """What the issue saw: boto3 1.44 needs s3transfer>=0.19 while the old recipe forced <0.15."""
    boto3 = next(Requirement(r) for r in wheels.WHEELS["boto3"]["requires"] if r.startswith("s3transfer"))
    assert not boto3.specifier.contains("0.14.0")


@pytest.mark.parametrize("name", sorted(wheels.WHEELS))
def test_recorded_metadata_agrees_with_the_installed_distribution(name):
    try:
        installed = metadata.version(name)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{name} is not installed here")
    assert installed == wheels.WHEELS[name]["version"], f"{name} {installed} installed: `make test` installs the pins"
    requires = [r for r in (metadata.requires(name) or []) if "extra ==" not in r]
    assert sorted(str(Requirement(r)) for r in requires) == sorted(str(Requirement(r)) for r in wheels.WHEELS[name]["requires"])


def test_the_test_environment_pins_the_aws_sdk_the_instance_vendors():
    """So the recorded metadata is checked against the installed distribution (above) in every fresh venv, and the
    tests make the instance's AWS calls with the botocore it runs; pip would otherwise take the newest 1.x."""
    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    pins = {canonicalize_name(r.name): str(r.specifier) for r in map(Requirement, dev)}
    for name in ("boto3", "botocore"):
        assert pins[name] == f"=={vendor.PINS[name][0]}", f"pyproject's dev extra pins {name} {pins.get(name)}"


def test_the_vendored_directory_is_one_path_in_image_and_container():
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    run_container = (REPO / "runtime" / "host" / "run-container.sh").read_text()
    assert f"python3 /tmp/fleetcast-vendor.py {vendor.VENDOR_DIR}" in dockerfile
    assert f"ENV {vendor.VENDOR_DIR_ENV}={vendor.VENDOR_DIR}" in dockerfile
    assert f":{vendor.VENDOR_DIR}" in run_container


def test_tensorrt_llm_processes_run_without_the_vendored_packages_and_offline():
    env = trtllm.tool_env({"PYTHONPATH": f"/opt/fleetcast:{vendor.VENDOR_DIR}", "PATH": "/usr/bin",
                           vendor.VENDOR_DIR_ENV: vendor.VENDOR_DIR, "HF_HUB_OFFLINE": "0"})
    assert env["PYTHONPATH"] == "/opt/fleetcast" and env["PATH"] == "/usr/bin"
    assert {k: env[k] for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")} == \
        {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    moved = trtllm.tool_env({"PYTHONPATH": "/srv/deps/", vendor.VENDOR_DIR_ENV: "/srv/deps"})
    assert moved["PYTHONPATH"] == ""  # set, so it also overrides an inherited value
