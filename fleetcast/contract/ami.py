"""The GPU fleets' machine image: the DLAMI and its public SSM parameter (the stacks resolve it at deploy
time for `ami: {id: latest}`; `fleetcast ami pin` reads it once per region, fleetcast/ami.py).

AWS documents the parameter name as
`/aws/service/deeplearning/ami/$architecture/$ami_type/latest/ami-id`, where
ami_type is the DLAMI's name without the words "deep", "learning" and "ami"
("Finding the ID of a DLAMI", AWS Deep Learning AMIs developer guide).
"""

from __future__ import annotations

# The DLAMI the fleets run: open-source NVIDIA kernel driver (which the L40S/L4/RTX PRO 6000
# instance families need), containerd and the NVIDIA container toolkit, nothing else.
DLAMI_NAME = "Deep Learning Base OSS Nvidia Driver GPU AMI (Amazon Linux 2023)"
DLAMI_ARCHITECTURE = "x86_64"
DLAMI_SSM_PARAMETER = (
    f"/aws/service/deeplearning/ami/{DLAMI_ARCHITECTURE}/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id"
)
LATEST = "latest"  # `ami.id` that follows the parameter instead of a pinned id
