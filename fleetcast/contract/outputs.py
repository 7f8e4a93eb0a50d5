"""Stack output keys: the stacks write exactly these keys and the CLIs read exactly these keys."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from .errors import UserError


class ProviderOutput(StrEnum):
    """Outputs of `<fleet>-provider-<region>`."""

    MODEL_BUCKET = "ModelBucketName"
    IMAGE_REPOSITORY = "ImageRepositoryUri"
    IMAGE_MIRROR_PROJECT = "ImageMirrorProject"
    CONFIG_PARAMETER = "ConfigParameterName"
    NOTIFICATION_TOPIC = "NotificationTopicArn"
    INSTANCE_LOG_GROUP = "InstanceLogGroupName"
    ENDPOINT_SERVICE_NAME = "EndpointServiceName"
    ENDPOINT_SERVICE_ID = "EndpointServiceId"


# Written only while the region is held at zero instances ("true"; fleetcast/contract/capacity_hold.py).
CAPACITY_HELD = "CapacityHeld"


class ConsumerOutput(StrEnum):
    """Outputs of `<fleet>-consumer-<consumer>`."""

    ENDPOINT_ID = "EndpointId"
    ENDPOINT_DNS_ENTRIES = "EndpointDnsEntries"
    # Only for a consumer with a failover_region whose service name is published.
    FAILOVER_ENDPOINT_DNS_ENTRIES = "FailoverEndpointDnsEntries"
    # With the failover endpoint and no TLS listener in either region: the private DNS name that answers with the
    # home endpoint while its probe passes and with the failover endpoint when it fails (stacks/consumer_failover.py).
    FAILOVER_RECORD_NAME = "FailoverRecordName"
    BENCH_RESULTS_BUCKET = "BenchResultsBucketName"


def require_output(outputs: Mapping[str, str], key: StrEnum, stack: str, hint: str = "") -> str:
    """The value of one output by its exact key, or a UserError naming the stack, the key and what it has."""
    value = outputs.get(key.value)
    if value:
        return value
    have = ", ".join(sorted(outputs)) or "none"
    raise UserError(f"stack {stack} has no output {key.value} (outputs: {have})" + (f"; {hint}" if hint else ""))
