"""A stand-in for CloudWatch Logs' embedded-metric-format extraction: EMF records -> PutMetricData.

It follows the EMF specification (Amazon CloudWatch User Guide, "Specification: Embedded metric
format"): every MetricDirective of `_aws.CloudWatchMetrics` yields, for each of its dimension sets,
one datapoint per metric it names, with the dimension values read from the record's root members
and the record's `_aws.Timestamp`. CloudWatch stores standard-resolution metrics per minute, so
the datapoints are sent per (metric, dimensions, minute), the way a log agent batches them:

- a statistic set when all values in the group are equal (CloudWatch still answers percentiles for
  a statistic set whose Min equals its Max: GetMetricStatistics, "CloudWatch needs raw data points
  to calculate percentile statistics");
- otherwise Values/Counts (at most 150 distinct values per datum: PutMetricData reference).

Requests carry at most 1000 metrics (PutMetricData: "no more than 1000 different metrics") and
stay under its 1 MB limit.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

MAX_DATA_PER_CALL = 1000
MAX_VALUES_PER_DATUM = 150


def extract(records: list[dict[str, Any]]) -> dict[tuple, list[float]]:
    """(namespace, metric, unit, dims, minute epoch s) -> values, as EMF extraction files them."""
    out: dict[tuple, list[float]] = defaultdict(list)
    for record in records:
        meta = record["_aws"]
        minute = int(meta["Timestamp"] // 60000) * 60
        for directive in meta["CloudWatchMetrics"]:
            for dim_set in directive["Dimensions"]:
                assert len(dim_set) <= 30, "EMF: a dimension set holds at most 30 dimensions"
                dims = tuple((name, str(record[name])) for name in dim_set)
                for metric in directive["Metrics"]:
                    value = record[metric["Name"]]
                    values = value if isinstance(value, list) else [value]
                    out[(directive["Namespace"], metric["Name"], metric.get("Unit", "None"), dims, minute)] += values
    return out


def _datums(key: tuple, values: list[float]) -> list[dict[str, Any]]:
    _, name, unit, dims, minute = key
    base = {"MetricName": name, "Unit": unit, "Timestamp": datetime.fromtimestamp(minute, UTC),
            "Dimensions": [{"Name": k, "Value": v} for k, v in dims]}
    if min(values) == max(values):
        return [{**base, "StatisticValues": {"SampleCount": len(values), "Sum": float(sum(values)),
                                             "Minimum": float(values[0]), "Maximum": float(values[0])}}]
    counts: dict[float, int] = defaultdict(int)
    for v in values:
        counts[float(v)] += 1
    items = sorted(counts.items())
    return [{**base, "Values": [v for v, _ in items[i:i + MAX_VALUES_PER_DATUM]],
             "Counts": [float(c) for _, c in items[i:i + MAX_VALUES_PER_DATUM]]}
            for i in range(0, len(items), MAX_VALUES_PER_DATUM)]


def ship(records: list[dict[str, Any]], cloudwatch) -> int:
    """Put the records' metrics into CloudWatch; returns the number of PutMetricData calls."""
    return _put(extract(records).items(), cloudwatch)


def _put(series: Iterable[tuple[tuple, list[float]]], cloudwatch) -> int:
    by_namespace: dict[str, list[dict]] = defaultdict(list)
    for key, values in series:
        by_namespace[key[0]] += _datums(key, values)
    calls = 0
    for namespace, data in by_namespace.items():
        for i in range(0, len(data), MAX_DATA_PER_CALL):
            cloudwatch.put_metric_data(Namespace=namespace, MetricData=data[i:i + MAX_DATA_PER_CALL])
            calls += 1
    return calls


class ShippedOnDemand:
    """The records' metrics put into CloudWatch (moto) series by series, each just before the first GetMetricData
    call that asks for it (its metric name and dimension set), through the callers that `caller` wraps.

    Each answer is the one that shipping every series first gives: moto's GetMetricData answers a query from the
    datapoints of the query's metric name and exact dimension set alone (moto/cloudwatch/models.py,
    CloudWatchBackend.get_metric_data; without dimensions, from the metric name's). But it scans every datapoint of
    the window for each query and period, and the series no export asks for (the pool's and the latency ones, kept
    for the alarms and dashboards) are two thirds of them: shipped first, they tripled what every query scanned."""

    def __init__(self, records: list[dict[str, Any]], cloudwatch) -> None:
        self.cloudwatch = cloudwatch
        self.pending: dict[tuple[str, frozenset], list[tuple[tuple, list[float]]]] = defaultdict(list)
        for key, values in extract(records).items():
            self.pending[(key[1], frozenset(key[3]))].append((key, values))

    def caller(self, call):
        """`call(region, **GetMetricData params)`, shipping first what its queries name that is not there yet."""
        def wrapped(region: str, **params):
            if region == self.cloudwatch.meta.region_name:  # the records' region; others hold none
                todo: list[tuple[tuple, list[float]]] = []
                for query in params["MetricDataQueries"]:
                    metric = query["MetricStat"]["Metric"]
                    dims = frozenset((d["Name"], d["Value"]) for d in metric.get("Dimensions", ()))
                    named = [want for want in self.pending if want[0] == metric["MetricName"]] if not dims else \
                        [(metric["MetricName"], dims)]
                    for want in named:
                        todo += self.pending.pop(want, [])
                if todo:
                    _put(todo, self.cloudwatch)
            return call(region, **params)
        return wrapped


def raw_series(records: list[dict[str, Any]]) -> dict[tuple, list[tuple[int, list[float]]]]:
    """(metric, dimension set) -> [(minute, values)] of the records: what with_percentiles answers from."""
    raw: dict[tuple, list[tuple[int, list[float]]]] = defaultdict(list)
    for (_, name, _, dims, minute), vs in extract(records).items():
        raw[(name, frozenset(dims))].append((minute, vs))
    return raw


def _extended(stat: str) -> bool:
    return stat.startswith("p") or stat.startswith("TC(")


def with_percentiles(call, records: list[dict[str, Any]] | dict[tuple, list]):
    """moto answers no percentile statistic (its GetMetricData knows Sum, Average, Minimum, Maximum and
    SampleCount only); this wraps a GetMetricData caller so that `pNN` queries are answered from the
    records' raw values the way CloudWatch does for raw data (nearest rank over the period's values),
    and `TC(a:b)` as the count of values v with a < v <= b (CloudWatch User Guide, "CloudWatch statistics
    definitions": TM(150:1000) removes the points "lower than or equal to 150, or higher than 1000"; TC counts
    what is left), and everything else goes to moto. `records` may be their raw_series(), for a caller
    wrapping many."""
    # Indexed by metric and dimension set: each query reads its own series, not every key.
    raw = records if isinstance(records, dict) else raw_series(records)

    def answer(query: dict, start: datetime, end: datetime) -> dict:
        stat = query["MetricStat"]
        want = frozenset((d["Name"], d["Value"]) for d in stat["Metric"]["Dimensions"])
        lo, hi = start.timestamp(), end.timestamp()
        values = sorted(v for minute, vs in raw.get((stat["Metric"]["MetricName"], want), ())
                        if lo <= minute < hi for v in vs)
        if not values:
            return {"Id": query["Id"], "Values": [], "Timestamps": []}
        if stat["Stat"].startswith("TC("):
            # A bound left empty is open on that side (aws-cdk-lib aws-cloudwatch/lib/private/statistic.ts,
            # parsePairStatistic: either side of "TC(a:b)" may be empty, not both).
            low, high = (float(x) if x else (-math.inf, math.inf)[i] for i, x in enumerate(stat["Stat"][3:-1].split(":")))
            return {"Id": query["Id"], "Values": [float(sum(1 for v in values if low < v <= high))],
                    "Timestamps": [start]}
        q = float(stat["Stat"][1:]) / 100
        rank = max(1, -(-int(q * len(values) * 1000) // 1000))
        return {"Id": query["Id"], "Values": [values[rank - 1]], "Timestamps": [start]}

    def wrapped(region: str, **params):
        queries = params["MetricDataQueries"]
        mine = [q for q in queries if _extended(q["MetricStat"]["Stat"])]
        rest = [q for q in queries if not _extended(q["MetricStat"]["Stat"])]
        page = call(region, **{**params, "MetricDataQueries": rest}) if rest else {"MetricDataResults": []}
        page = dict(page)
        page["MetricDataResults"] = list(page["MetricDataResults"]) + [
            answer(q, params["StartTime"], params["EndTime"]) for q in mine]
        return page
    return wrapped
