"""Compatibility import path for the error hierarchy, whose one home is `fleetcast.contract.errors`."""

from fleetcast.contract.errors import AwsError, FleetcastError, InstanceFailure, UserError

__all__ = ["AwsError", "FleetcastError", "InstanceFailure", "UserError"]
