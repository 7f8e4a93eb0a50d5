#!/bin/bash
# Host side of the serving unit: log in to ECR when the image lives there, pull it.
# Bounded retries; a non-zero exit fails the unit start and systemd retries it.
set -euo pipefail
: "${FLEETCAST_IMAGE:?FLEETCAST_IMAGE is not set in /etc/fleetcast/env}"
: "${FLEETCAST_REGION:?FLEETCAST_REGION is not set in /etc/fleetcast/env}"
registry="${FLEETCAST_IMAGE%%/*}"
if [[ "$registry" =~ ^[0-9]{12}\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com$ ]]; then
  aws ecr get-login-password --region "${BASH_REMATCH[1]}" \
    | docker login --username AWS --password-stdin "$registry"
fi
for attempt in 1 2 3 4 5; do
  if docker pull --quiet "$FLEETCAST_IMAGE"; then
    exit 0
  fi
  sleep $((attempt * 10))
done
echo "fleetcast: cannot pull $FLEETCAST_IMAGE" >&2
exit 1
