"""Fleetcast: private TensorRT-LLM fleets on AWS from one config file."""

__version__ = "0.1.0"
