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

abandon_launch() {
  local imds=http://169.254.169.254 hook token instance group
  hook=$(PYTHONPATH="$bundle" python3 -c 'from fleetcast.contract.telemetry import LAUNCH_HOOK; print(LAUNCH_HOOK)')
  token=$(curl -sf -X PUT "$imds/latest/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 300") || return 0
  instance=$(curl -sf -H "X-aws-ec2-metadata-token: $token" "$imds/latest/meta-data/instance-id") || return 0
  # The group's name is an instance tag (the launch template enables metadata tags).
  group=$(curl -sf -H "X-aws-ec2-metadata-token: $token" \
    "$imds/latest/meta-data/tags/instance/aws:autoscaling:groupName") || return 0
  # A serving instance restarting its unit has no launch action left: that call fails, harmlessly.
  aws autoscaling complete-lifecycle-action --region "$FLEETCAST_REGION" --lifecycle-hook-name "$hook" \
    --auto-scaling-group-name "$group" --instance-id "$instance" --lifecycle-action-result ABANDON \
    || echo "fleetcast: no launch action to abandon (instance already past its launch)" >&2
}

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
    abandon_launch
    exit 1
  fi
  sleep $((attempt * 10))
done
echo "fleetcast: cannot pull $FLEETCAST_IMAGE" >&2
exit 1
