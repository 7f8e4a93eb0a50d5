# Sourced by bash (user data, pull-image.sh): abandon_launch HOOK completes this instance's launch lifecycle
# action with ABANDON, so the group terminates it and launches a replacement now, not after the hook's timeout.
# For what the host cannot get (the runtime bundle, the serving image). Needs FLEETCAST_REGION, IMDSv2 and
# instance metadata tags (the launch template enables both); the group's name is the aws:autoscaling:groupName
# tag. Outside a launch (a serving instance restarting its unit) there is no action left: harmless.
abandon_launch() {
  local hook="$1" imds=http://169.254.169.254 token instance group
  token=$(curl -sf -X PUT "$imds/latest/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 300") || return 0
  instance=$(curl -sf -H "X-aws-ec2-metadata-token: $token" "$imds/latest/meta-data/instance-id") || return 0
  group=$(curl -sf -H "X-aws-ec2-metadata-token: $token" \
    "$imds/latest/meta-data/tags/instance/aws:autoscaling:groupName") || return 0
  aws autoscaling complete-lifecycle-action --region "$FLEETCAST_REGION" --lifecycle-hook-name "$hook" \
    --auto-scaling-group-name "$group" --instance-id "$instance" --lifecycle-action-result ABANDON \
    || echo "fleetcast: no launch action to abandon (instance already past its launch)" >&2
}
