"""The launch template's user data: small, static, and free of the ASG's own name.

User data only does what must happen on the host before the serving container
exists: write the instance environment file, fetch the runtime bundle from the
region bucket, install the shipped systemd unit(s) and start them. Everything
else (config, GPU detection, engine cache, serving, drain) is `runtime.bootstrap`
inside the container, started and restarted by systemd.

The Auto Scaling group name is deliberately not an input: the instance reads it
from its IMDSv2 instance tags (the launch template enables metadata tags), since
interpolating the ASG name into its own launch template is a CloudFormation cycle.

Pure Python, no CDK import: the stack calls `render_user_data` with plain strings
or CDK token strings (`${Token[...]}`), which CloudFormation resolves later.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from fleetcast.contract.instance_env import ENV_FILE_DELIMITER, HOST_REQUIRED, KNOWN, PREFIX, Var
from fleetcast.contract.telemetry import INSTANCE_ENV_FILE, LAUNCH_HOOK

# Keys the stack must pass for a serving instance; the runtime refuses to start without them.
REQUIRED_KEYS = HOST_REQUIRED
INSTALL_DIR = "/opt/fleetcast"
SYSTEMD_DIR = "/etc/systemd/system"

_KEY = re.compile(rf"^{PREFIX}[A-Z0-9_]{{1,64}}$")
# One env file is read by bash (`source`), by systemd (EnvironmentFile=) and by
# `docker run --env-file` (which takes values literally, no quote processing).
# The only format all three read the same way is KEY=value, unquoted, with no
# shell-special characters, so values are restricted rather than escaped.
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9._:/@+=,%-]*$")
_CDK_TOKEN = re.compile(r"\$\{Token\[[A-Za-z0-9._-]+\]\}")
# The shell function that gives a launch up (pull-image.sh sources the same file from the bundle; user data
# runs before the bundle exists, so it carries the function itself).
ABANDON_LAUNCH_SH = Path(__file__).resolve().parent / "host" / "abandon-launch.sh"
# Bundle download: a missing object (S3 404, NoSuchKey) will not appear by retrying; anything else (the
# gateway endpoint or the role still settling at first boot) gets DOWNLOAD_ATTEMPTS tries, then the same end.
DOWNLOAD_ATTEMPTS = 4


def _check_env(env: Mapping[str, str], required: tuple[str, ...] = REQUIRED_KEYS) -> None:
    missing = [key for key in required if not env.get(key)]
    if missing:
        raise ValueError(f"user data env is missing required key(s): {', '.join(missing)}")
    for key, value in env.items():
        if not _KEY.match(key) or key not in KNOWN:
            raise ValueError(f"user data env key {key!r} is not an instance variable "
                             "(fleetcast/contract/instance_env.py defines every one)")
        if not isinstance(value, str):
            raise ValueError(f"user data env {key} must be a string, got {type(value).__name__}")
        if not _SAFE_VALUE.match(_CDK_TOKEN.sub("", value)):
            raise ValueError(
                f"user data env {key}={value!r} has characters outside [A-Za-z0-9._:/@+=,%-]; "
                "the env file is read literally by docker --env-file, so values cannot be quoted"
            )
    bundle = env.get(Var.RUNTIME_BUNDLE)
    if bundle is not None and not _CDK_TOKEN.search(bundle) and not bundle.startswith("s3://"):
        raise ValueError(f"{Var.RUNTIME_BUNDLE.value} must be an s3:// URI of the runtime bundle zip")


def render_env_file(env: Mapping[str, str], required: tuple[str, ...] = REQUIRED_KEYS) -> str:
    """The /etc/fleetcast/env content: KEY=value lines, sorted for a stable template diff.
    `required` is the fleet's key set unless another instance kind (the bench probe) passes its own."""
    _check_env(env, required)
    return "".join(f"{key}={env[key]}\n" for key in sorted(env))


def env_file_preamble(env: Mapping[str, str], required: tuple[str, ...] = REQUIRED_KEYS) -> str:
    """The bash lines every fleetcast user data starts with: write /etc/fleetcast/env, then export it.

    The env file is the instance's one source of its settings (systemd units and
    docker read it too), so the shell exports the very file they will read.
    """
    env_file = render_env_file(env, required)
    return f"""mkdir -p "$(dirname {INSTANCE_ENV_FILE})" /var/lib/fleetcast
cat > {INSTANCE_ENV_FILE} <<'{ENV_FILE_DELIMITER}'
{env_file}{ENV_FILE_DELIMITER}
chmod 0644 {INSTANCE_ENV_FILE}
set -a; . {INSTANCE_ENV_FILE}; set +a
"""


def render_user_data(env: Mapping[str, str]) -> str:
    """Bash user data for the launch template.

    Bounded retries on the bundle download (the S3 gateway endpoint or IAM may still be settling at first
    boot), none for an object that is not there. When the host cannot get the bundle it abandons its own
    launch (the launch hook, ABANDON) at once: otherwise the instance would hold its slot in Pending:Wait for
    the hook's whole timeout while the group launches nothing in its place.
    """
    abandon = "\n".join(line for line in ABANDON_LAUNCH_SH.read_text().splitlines() if not line.startswith("#"))
    return f"""#!/bin/bash
# Fleetcast instance bootstrap (host side). Serving runs in a container under systemd.
set -euo pipefail
umask 022
{env_file_preamble(env)}
{abandon}
bundle=/var/lib/fleetcast/runtime-bundle.zip
attempt=1
until output=$(aws s3 cp --only-show-errors --region "$FLEETCAST_REGION" "$FLEETCAST_RUNTIME_BUNDLE" "$bundle" 2>&1); do
  echo "$output" >&2
  if grep -qE '\\(404\\)|NoSuchKey|does not exist' <<<"$output" || [ "$attempt" -ge {DOWNLOAD_ATTEMPTS} ]; then
    echo "fleetcast: cannot download $FLEETCAST_RUNTIME_BUNDLE (attempt $attempt); abandoning this launch" >&2
    abandon_launch {LAUNCH_HOOK}
    exit 1
  fi
  sleep $((attempt * 5))
  attempt=$((attempt + 1))
done

rm -rf {INSTALL_DIR}.new
mkdir -p {INSTALL_DIR}.new
python3 -m zipfile -e "$bundle" {INSTALL_DIR}.new
rm -rf {INSTALL_DIR}
mv {INSTALL_DIR}.new {INSTALL_DIR}
chmod -R a+rX {INSTALL_DIR}
chmod 0755 {INSTALL_DIR}/runtime/host/*.sh

units=""
for unit in {INSTALL_DIR}/runtime/systemd/*.service; do
  install -m 0644 "$unit" {SYSTEMD_DIR}/
  units="$units $(basename "$unit")"
done
systemctl daemon-reload
# --no-block: cloud-init need not wait for the image pull (ExecStartPre); systemd carries on.
systemctl enable --now --no-block $units
"""
