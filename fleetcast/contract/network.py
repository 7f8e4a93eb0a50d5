"""The VPC endpoints a provider region's isolated subnets need (`network.egress: none`).

One list: stacks/network.py creates exactly these interface endpoints (plus the S3 gateway endpoint,
which has no hourly charge), and the planner prices exactly as many (fleetcast/plan/inputs.py).
Values are the service part of each endpoint's name, `com.amazonaws.<region>.<service>`.
"""

from __future__ import annotations

# What an instance reaches with no internet egress: image pulls (ECR api+dkr,
# layers from S3), Session Manager (SSM, SSMMessages, EC2Messages), logs and
# metrics, its lifecycle hook (Auto Scaling), STS for role sessions, EC2 for
# DescribeVpcEndpointConnections (consumer identity), Secrets Manager (API keys).
# Keys are the endpoints' construct ids (their logical ids derive from them).
PROVIDER_INTERFACE_ENDPOINTS: dict[str, str] = {
    "EcrApi": "ecr.api",
    "EcrDocker": "ecr.dkr",
    "Ssm": "ssm",
    "SsmMessages": "ssmmessages",
    "Ec2Messages": "ec2messages",
    "Logs": "logs",
    "Monitoring": "monitoring",
    "AutoScaling": "autoscaling",
    "Sts": "sts",
    "Ec2": "ec2",
    "SecretsManager": "secretsmanager",
}
