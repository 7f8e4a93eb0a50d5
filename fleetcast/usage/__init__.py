"""Per-consumer usage and cost share from the gateway's CloudWatch metrics (`fleetcast usage`)."""

from .cost import CostReport, attribute, render_cost, sum_check, write_png
from .report import ConsumerUsage, RegionCost, UsageReport, collect, parse_time, render

__all__ = ["ConsumerUsage", "CostReport", "attribute", "render_cost", "sum_check", "write_png", "RegionCost", "UsageReport", "collect", "parse_time", "render"]
