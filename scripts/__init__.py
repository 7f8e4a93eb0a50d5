"""Thin command-line entry points over the fleetcast library (`fleetcast ...`)."""
