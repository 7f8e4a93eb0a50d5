"""CloudWatch embedded-metric-format (EMF) records, one JSON line each, on stdout.

The container's awslogs driver ships stdout to the instance log group and
CloudWatch extracts the metrics from the `_aws` envelope, so the runtime needs
no PutMetricData permission and no extra agent. Names come from
fleetcast.contract.telemetry so alarms and dashboards cannot drift from what is sent.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Mapping
from typing import IO, Any

from fleetcast.contract import telemetry


class Emf:
    """Writes EMF records with the fleet/pool (and instance) dimensions of this instance."""

    def __init__(self, fleet: str, pool: str, instance_id: str = "", stream: IO[str] | None = None):
        self.fleet, self.pool, self.instance_id = fleet, pool, instance_id
        self.stream = stream or sys.stdout
        self._lock = threading.Lock()

    def emit(self, values: Mapping[str, float], properties: Mapping[str, object] | None = None,
             per_instance: bool = False) -> dict[str, Any]:
        dims = [[telemetry.DIM_FLEET, telemetry.DIM_POOL]]
        record: dict[str, Any] = {telemetry.DIM_FLEET: self.fleet, telemetry.DIM_POOL: self.pool}
        if per_instance and self.instance_id:
            dims.append([telemetry.DIM_FLEET, telemetry.DIM_POOL, telemetry.DIM_INSTANCE])
            record[telemetry.DIM_INSTANCE] = self.instance_id
        record["_aws"] = {
            "Timestamp": int(time.time() * 1000),
            "CloudWatchMetrics": [{
                "Namespace": telemetry.NAMESPACE,
                "Dimensions": dims,
                "Metrics": [{"Name": name, "Unit": telemetry.unit(name)} for name in values],
            }],
        }
        record.update({k: float(v) for k, v in values.items()})
        for key, value in (properties or {}).items():
            record.setdefault(key, value)
        with self._lock:
            self.stream.write(json.dumps(record, separators=(",", ":")) + "\n")
            self.stream.flush()
        return record

    def count(self, name: str, value: float = 1.0, **properties: object) -> dict[str, Any]:
        return self.emit({name: value}, properties)
