#!/bin/bash
# Host side of the serving unit: run runtime.bootstrap in the serving image.
# Host networking: the gateway's port is the NLB target, and IMDSv2 answers with
# a hop limit of 1. Container logs go to CloudWatch Logs through the awslogs
# driver (EMF metric lines included), one stream per instance.
set -euo pipefail
imds=http://169.254.169.254
token=$(curl -sf -X PUT "$imds/latest/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 300")
instance_id=$(curl -sf -H "X-aws-ec2-metadata-token: $token" "$imds/latest/meta-data/instance-id")
exec /usr/bin/docker run --name fleetcast-runtime --rm \
  --gpus all --network host --ipc host --ulimit memlock=-1 --ulimit stack=67108864 \
  --env-file /etc/fleetcast/env \
  --env PYTHONPATH=/opt/fleetcast:/usr/local/lib/fleetcast-deps \
  --env PYTHONUNBUFFERED=1 \
  --volume /opt/fleetcast:/opt/fleetcast:ro \
  --volume /var/lib/fleetcast:/var/lib/fleetcast \
  --workdir /opt/fleetcast \
  --stop-timeout 3660 \
  --log-driver awslogs \
  --log-opt awslogs-region="$FLEETCAST_REGION" \
  --log-opt awslogs-group="$FLEETCAST_LOG_GROUP" \
  --log-opt awslogs-stream="$FLEETCAST_POOL/$instance_id" \
  "$FLEETCAST_IMAGE" \
  python3 -m runtime.bootstrap
