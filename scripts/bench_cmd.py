"""`fleetcast bench run|report|collect`: the CLI lives in fleetcast.bench.cli (bench
instances run it from the runtime bundle, which does not carry scripts/)."""

from fleetcast.bench.cli import register

__all__ = ["register"]
