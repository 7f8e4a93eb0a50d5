"""Per-request CloudWatch embedded-metric-format (EMF) records, one JSON line each on stdout.

The instance's log agent ships stdout to CloudWatch Logs, which extracts the
metrics: raw per-request values, so fleet-wide P99s are computed by CloudWatch
rather than averaged from per-instance percentiles. Names, namespace and
dimensions come from fleetcast.contract.telemetry, shared with the alarms and
`fleetcast usage`.

Writing happens on a separate thread: a slow log pipe must never stall the
event loop that is streaming tokens.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TextIO

from fleetcast.contract import telemetry as t

# The traffic-shape directive: `ShapedRequests` (= 1) under fleetcast.contract.telemetry's shape dimension sets
# (one per bucket dimension, and in flight per model when the request named one). A metric of its own: the
# bucket dimensions must not multiply the latency and token metrics, and no member is named by two directives.
_SHAPE_DIMENSIONS = [list(d) for d in t.SHAPE_DIMENSION_SETS]
_SHAPE_MODEL_DIMENSIONS = [list(d) for d in t.SHAPE_MODEL_DIMENSION_SETS]
_SHAPE_METRICS = [{"Name": t.SHAPED_REQUESTS, "Unit": t.unit(t.SHAPED_REQUESTS)}]


def _dimensions(consumer: str | None, model: str | None) -> list[list[str]]:
    dims = [[t.DIM_FLEET, t.DIM_POOL]]
    if consumer:
        dims.append([t.DIM_FLEET, t.DIM_POOL, t.DIM_CONSUMER])
        if model:
            # [Fleet, Pool, Model] as well: a per-model P99 (the stacks' per-model SLO alarms) cannot be summed up
            # from per-consumer percentiles.
            dims += [[t.DIM_FLEET, t.DIM_POOL, t.DIM_CONSUMER, t.DIM_MODEL], [t.DIM_FLEET, t.DIM_POOL, t.DIM_MODEL]]
    return dims


def _directives(consumer: str | None, model: str | None, names: Iterable[str], shaped: bool,
                by_model: bool = False) -> list[dict[str, Any]]:
    directives: list[dict[str, Any]] = [{
        "Namespace": t.NAMESPACE,
        "Dimensions": _dimensions(consumer, model),
        "Metrics": [{"Name": name, "Unit": t.unit(name)} for name in names],
    }]
    if shaped:
        directives.append({"Namespace": t.NAMESPACE, "Dimensions": _SHAPE_MODEL_DIMENSIONS if model and by_model else _SHAPE_DIMENSIONS,
                           "Metrics": _SHAPE_METRICS})
    return directives


def _members(fleet: str, pool: str, consumer: str | None, values: dict[str, float],
             properties: dict[str, Any] | None, shape: dict[str, str] | None, model: str | None) -> dict[str, Any]:
    """The record's top-level members but `_aws`: dimension values, metric values, properties."""
    record: dict[str, Any] = {t.DIM_FLEET: fleet, t.DIM_POOL: pool}
    if consumer:
        record[t.DIM_CONSUMER] = consumer
        if model:
            record[t.DIM_MODEL] = model
        if shape:
            record.update(shape)
            record[t.SHAPED_REQUESTS] = 1
    record.update(values)
    if properties:
        record.update(properties)  # searchable in Logs Insights, not metrics
    return record


def emf_record(fleet: str, pool: str, consumer: str | None, values: dict[str, float],
               properties: dict[str, Any] | None = None, timestamp_ms: int | None = None,
               shape: dict[str, str] | None = None, model: str | None = None,
               by_model: bool = False) -> dict[str, Any]:
    """One EMF record. Per-consumer dimensions only when the consumer is known; per (consumer, model)
    as well when the request named a model of the config (never an arbitrary client string).

    `shape` ({bucket dimension: label}, all three of fleetcast.contract.telemetry's) adds the traffic-shape
    directive and its `ShapedRequests` = 1 member; it needs a consumer. `by_model` (a fleet of several models,
    telemetry.metered_per_model) adds the shape's per-model in-flight set.
    """
    record = _members(fleet, pool, consumer, values, properties, shape, model)
    record["_aws"] = {
        "Timestamp": timestamp_ms if timestamp_ms is not None else int(time.time() * 1000),
        "CloudWatchMetrics": _directives(consumer, model, values, bool(shape and consumer), by_model),
    }
    return record


class EmfLines:
    """emf_record as one JSON line, at less cost per request on the gateway's event loop.

    The `CloudWatchMetrics` directives are the bulk of a record's bytes and depend only on whether the
    consumer and the model are known (dimension names, not values), which metrics it carries and whether
    it is shaped: each combination is encoded once and reused (measured: about half the cost of encoding
    the whole record each time).
    """

    MAX_CACHED = 4096  # metric sets x 6 combinations: far fewer on any fleet; a bound all the same

    def __init__(self, fleet: str, pool: str, by_model: bool = False):
        self.fleet, self.pool, self.by_model = fleet, pool, by_model
        self._directives: dict[tuple[Any, ...], str] = {}

    def line(self, consumer: str | None, values: dict[str, float], properties: dict[str, Any] | None = None,
             timestamp_ms: int | None = None, shape: dict[str, str] | None = None, model: str | None = None) -> str:
        shaped = bool(shape and consumer)
        key = (bool(consumer), bool(consumer and model), shaped, *values)
        directives = self._directives.get(key)
        if directives is None:
            if len(self._directives) >= self.MAX_CACHED:
                self._directives.clear()
            directives = self._directives[key] = json.dumps(_directives(consumer, model, values, shaped, self.by_model),
                                                            separators=(",", ":"))
        members = json.dumps(_members(self.fleet, self.pool, consumer, values, properties, shape, model),
                             separators=(",", ":"))
        stamp = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
        return f'{members[:-1]},"_aws":{{"Timestamp":{stamp},"CloudWatchMetrics":{directives}}}}}'


class MetricsSink:
    """Collects records from the event loop; a daemon thread writes them as JSON lines in batches.

    The loop only appends to a list (no lock, no thread wake-up per request):
    waking a writer thread for every record costs the loop a GIL hand-off,
    measurable as added latency on every other stream.
    """

    def __init__(self, fleet: str, pool: str, stream: TextIO | None = None,
                 on_record: Callable[[dict[str, Any]], None] | None = None, flush_s: float = 0.2,
                 write_lock: AbstractContextManager[Any] | None = None, by_model: bool = False):
        """`write_lock`: held around each batch when several processes share the stream (gateway workers),
        so their lines never interleave mid-record. `by_model`: the fleet is metered per model
        (fleetcast.contract.telemetry.metered_per_model)."""
        self.fleet, self.pool, self.by_model = fleet, pool, by_model
        self._write_lock = write_lock if write_lock is not None else nullcontext()
        self._stream = stream if stream is not None else sys.stdout
        self._on_record = on_record  # tests observe records directly
        self._lines = EmfLines(fleet, pool, by_model)
        self._pending: list[str] = []
        self._flush_s = flush_s
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._write_loop, name="emf-writer", daemon=True)
        self._thread.start()

    def emit(self, consumer: str | None, values: dict[str, float], properties: dict[str, Any] | None = None,
             timestamp_ms: int | None = None, shape: dict[str, str] | None = None, model: str | None = None) -> None:
        if self._on_record:
            self._on_record(emf_record(self.fleet, self.pool, consumer, values, properties, timestamp_ms, shape, model,
                                       self.by_model))
        self._pending.append(self._lines.line(consumer, values, properties, timestamp_ms, shape, model))

    def _flush(self) -> None:
        # Swapping the list is atomic under the GIL: the loop never waits for the writer.
        lines, self._pending = self._pending, []
        if not lines:
            return
        try:
            with self._write_lock:
                self._stream.write("\n".join(lines) + "\n")
                self._stream.flush()
        except (OSError, ValueError):
            pass  # a closed log pipe loses metrics, never requests

    def _write_loop(self) -> None:
        while not self._closed.wait(self._flush_s):
            self._flush()
        self._flush()

    def close(self, timeout: float = 5.0) -> None:
        """Write what is pending (called on drain before exit)."""
        self._closed.set()
        self._thread.join(timeout)
