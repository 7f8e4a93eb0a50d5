#!/bin/bash
# Host side of the serving unit: log in to ECR when the image lives there, pull it.
# Bounded retries on transient failures; a non-zero exit fails the unit start and systemd retries it.
# An image its registry does not have (no such tag or digest: the region is not staged) is not
# transient: the instance abandons its launch at once (launch hook, ABANDON) rather than sit in
# Pending:Wait for the hook's whole timeout; the group replaces it once the image exists.
set -euo pipefail
: "${FLEETCAST_IMAGE:?FLEETCAST_IMAGE is not set in /etc/fleetcast/env}"
: "${FLEETCAST_REGION:?FLEETCAST_REGION is not set in /etc/fleetcast/env}"
# The runtime bundle this script ships in (/opt/fleetcast): the hook's name comes from its one home.
bundle="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
registry="${FLEETCAST_IMAGE%%/*}"
if [[ "$registry" =~ ^[0-9]{12}\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com$ ]]; then
  aws ecr get-login-password --region "${BASH_REMATCH[1]}" \
    | docker login --username AWS --password-stdin "$registry"
fi

# shellcheck source=abandon-launch.sh
. "$bundle/runtime/host/abandon-launch.sh"

for attempt in 1 2 3 4 5; do
  if output=$(docker pull --quiet "$FLEETCAST_IMAGE" 2>&1); then
    exit 0
  fi
  echo "$output" >&2
  # Registry errors MANIFEST_UNKNOWN ("manifest unknown": no such tag or digest) and NAME_UNKNOWN (no
  # such repository), OCI distribution-spec, spec.md "Errors"; docker relays the registry's message.
  if grep -qiE 'manifest unknown|name unknown' <<<"$output"; then
    echo "fleetcast: $FLEETCAST_IMAGE is not in its registry: the serving image is not staged in" \
      "$FLEETCAST_REGION (fleetcast stage image); abandoning this launch" >&2
    abandon_launch "$(PYTHONPATH="$bundle" python3 -c 'from fleetcast.contract.telemetry import LAUNCH_HOOK; print(LAUNCH_HOOK)')"
    exit 1
  fi
  sleep $((attempt * 10))
done
echo "fleetcast: cannot pull $FLEETCAST_IMAGE" >&2
exit 1
