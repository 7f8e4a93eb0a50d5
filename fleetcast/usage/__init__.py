"""Per-consumer usage and cost share from the gateway's CloudWatch metrics (`fleetcast usage`)."""

from .report import ConsumerUsage, RegionCost, UsageReport, collect, parse_time, render

__all__ = ["ConsumerUsage", "RegionCost", "UsageReport", "collect", "parse_time", "render"]
