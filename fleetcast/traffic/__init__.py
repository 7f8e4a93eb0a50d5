"""Traffic from production: `fleetcast traffic export` builds a traffic profile from the gateways' metrics."""

from .export import collect, export, profile_document

__all__ = ["collect", "export", "profile_document"]
