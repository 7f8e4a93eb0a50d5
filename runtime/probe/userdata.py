"""User data of the consumer-side bench probe (an Amazon Linux 2023 instance).

It writes the env file (same format and checks as the fleet's, runtime/userdata.py),
installs Python 3.11 from the AL2023 repositories, unpacks the probe bundle
(fleetcast/, runtime/, wheels/) and the wheels, then starts fleetcast-probe.service,
which runs fleetcast.bench.job. If any of that fails, the ERR trap uploads an error
note next to the results key and scales the probe's group to zero with the
preinstalled AWS CLI: a probe that cannot run never sits idle.

Pure Python, no CDK import; values may be CDK token strings.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleetcast.contract.instance_env import Var

from ..userdata import SYSTEMD_DIR, env_file_preamble

REQUIRED_KEYS = tuple(v.value for v in (Var.REGION, Var.BUCKET, Var.BENCH_KEY, Var.BENCH_GROUP, Var.BENCH_ENDPOINT,
                                          Var.PROBE_BUNDLE))
INSTALL_DIR = "/opt/fleetcast"
DEPS_DIR = "/opt/fleetcast-deps"
UNIT = "fleetcast-probe.service"


def render_probe_user_data(env: Mapping[str, str]) -> str:
    """Bash user data for the probe's launch template; `env` becomes /etc/fleetcast/env."""
    bundle = str(env.get(Var.PROBE_BUNDLE, ""))
    if not (bundle.startswith("s3://") or "${Token[" in bundle):
        raise ValueError(f"{Var.PROBE_BUNDLE.value} must be an s3:// URI of the probe bundle zip")
    return f"""#!/bin/bash
# Fleetcast PrivateLink bench probe bootstrap (consumer side).
set -euo pipefail
umask 022
{env_file_preamble(env, REQUIRED_KEYS)}
give_up() {{
  echo "fleetcast probe: bootstrap failed at line $1" >&2
  printf '{{"error": "probe bootstrap failed at user data line %s", "key": "%s"}}' "$1" "$FLEETCAST_BENCH_KEY" \\
    | aws s3 cp --only-show-errors --region "$FLEETCAST_REGION" - \\
      "s3://$FLEETCAST_BUCKET/${{FLEETCAST_BENCH_KEY%.json}}.error.txt" || true
  aws autoscaling set-desired-capacity --region "$FLEETCAST_REGION" \\
    --auto-scaling-group-name "$FLEETCAST_BENCH_GROUP" --desired-capacity 0 --no-honor-cooldown || true
}}
trap 'give_up $LINENO' ERR

retry() {{
  local attempt
  for attempt in 1 2 3 4 5 6; do
    if "$@"; then return 0; fi
    sleep $((attempt * 10))
  done
  return 1
}}

# Python 3.11 from the AL2023 repositories (served from S3 in the region).
retry dnf install -y -q python3.11

bundle=/var/lib/fleetcast/probe-bundle.zip
retry aws s3 cp --only-show-errors --region "$FLEETCAST_REGION" "$FLEETCAST_PROBE_BUNDLE" "$bundle"
rm -rf {INSTALL_DIR} {DEPS_DIR}
mkdir -p {INSTALL_DIR} {DEPS_DIR}
python3.11 -m zipfile -e "$bundle" {INSTALL_DIR}
# Wheels are zip files laid out for site-packages; unpacking them is what pip would do for these packages.
for wheel in {INSTALL_DIR}/wheels/*.whl; do
  python3.11 -m zipfile -e "$wheel" {DEPS_DIR}
done
chmod -R a+rX {INSTALL_DIR} {DEPS_DIR}
PYTHONPATH={INSTALL_DIR}:{DEPS_DIR} python3.11 -c 'import pydantic, boto3, fleetcast.bench.job, fleetcast.bench.cli'

install -m 0644 {INSTALL_DIR}/runtime/probe/{UNIT} {SYSTEMD_DIR}/
systemctl daemon-reload
systemctl enable --now --no-block {UNIT}
"""
