"""Where an instance's engine processes listen: one home for the runtime that starts them and the gateway
that routes to them.

One process per (model, copy) of the pool's `serves`, each on its own loopback port, numbered from
PROCESS_PORT_BASE in `serves` order (copies of a model together), so the runtime and the gateway derive
the same ports from the same validated config without telling each other. The base is the port the single
engine process has always had (the gateway's default 8000 + 1): a one-model fleet keeps its layout.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

LOOPBACK_HOST = "127.0.0.1"
PROCESS_PORT_BASE = 8001
# Most engine processes on one instance (the sum of copies a pool serves); keeps the port range small
# enough that it cannot reach an ephemeral range or another well-known service.
MAX_PROCESSES = 64


class _Model(Protocol):
    id: str


class _Served(Protocol):
    """What process_slots reads of a `fleetcast.config.model.ServedModel`."""

    model: _Model
    copies: int


@dataclass(frozen=True)
class ProcessSlot:
    model_id: str
    copy_index: int
    port: int

    @property
    def address(self) -> str:
        return f"{LOOPBACK_HOST}:{self.port}"

    @property
    def name(self) -> str:
        """A label for logs, units and metrics: `<model>#<copy>`."""
        return f"{self.model_id}#{self.copy_index}"


def process_slots(served: Iterable[_Served], base: int = PROCESS_PORT_BASE) -> tuple[ProcessSlot, ...]:
    """The instance's engine processes in start order, each with its loopback port."""
    slots: list[ProcessSlot] = []
    for entry in served:
        for copy_index in range(entry.copies):
            slots.append(ProcessSlot(entry.model.id, copy_index, base + len(slots)))
    if len(slots) > MAX_PROCESSES:
        raise ValueError(f"{len(slots)} engine processes on one instance; at most {MAX_PROCESSES}")
    return tuple(slots)


def port_range(process_count: int, base: int = PROCESS_PORT_BASE) -> range:
    """The loopback ports `process_count` processes take (the validator keeps the gateway's port out of it)."""
    return range(base, base + process_count)
