"""How a packing's processes share the GPU, as the planner sees it (issue 33 §3; docs/plan.md, "GPU sharing in the
plan").

A co-located curve holds only for the mode it was measured under (bench results `packing.gpu_sharing`): the planner
never mixes modes. A pool plans under its `gpu_sharing` (the pool `--write-config` would write: the one of the
instance's family, else the region's first), or under `fleetcast plan --gpu-sharing MODE` for every pool (a what-if).
Every model's curve in a packing says what backs it: measured (MPS), measured (time slicing), measured (one
process), synthetic, or estimated (from solo curves, by the mode's estimator in fleetcast/plan/estimate.py).
"""

from __future__ import annotations

from typing import Any

from fleetcast.config.model import GpuSharing

TIME_SLICING = GpuSharing.TIME_SLICING.value
MPS = GpuSharing.MPS.value
MODES = (TIME_SLICING, MPS)
MODE_WORDS = {TIME_SLICING: "time slicing", MPS: "MPS"}

# What backs a model's figures in a packing of several processes, per mode.
MEASURED = {TIME_SLICING: "measured (time slicing)", MPS: "measured (MPS)"}
ESTIMATED = {TIME_SLICING: "estimated (solo curves)", MPS: "estimated (solo curves, MPS)"}


def is_measured_shared(source: str) -> bool:
    """A co-located curve measured under one of the modes."""
    return source in MEASURED.values()


def is_estimated(source: str) -> bool:
    return source in ESTIMATED.values()


def pool_sharing(cfg: Any, region: str, instance_type: str, override: str | None = None) -> str:
    """The mode a packing on `instance_type` in `region` plans under: `override` (plan --gpu-sharing), else the
    gpu_sharing of the pool --write-config would write (the region's pool of that instance family, else its
    first), else time slicing (a region the config does not hold, a config without pools there)."""
    if override is not None:
        return override
    regions = [r for r in getattr(cfg, "regions", ()) if r.region == region]
    pools = list(regions[0].pools) if regions else []
    if not pools:
        return TIME_SLICING
    family = instance_type.split(".", 1)[0]
    pool = next((p for p in pools if p.family == family), pools[0])
    return str(pool.gpu_sharing.value)


def sharing_notes(winner: Any, curves: list[Any], mps_estimator: str | None) -> list[str]:
    """What the report says about the choice's curves: the co-located curves left out because they were measured
    under the other mode, and `mps_estimator` (the MPS estimator's calibration and error, estimate.py) wherever an
    MPS packing was estimated. (How wide a repeated curve's spread was is one of its curve notes:
    inputs.load_candidates.)"""
    notes = []
    other = sorted({MODE_WORDS[c.sharing or TIME_SLICING] for c in curves if c.colocated
                    and c.instance_type == winner.instance_type and (c.sharing or TIME_SLICING) != winner.sharing})
    if other and winner.processes > 1:
        notes.append(f"co-located curves measured under {', '.join(other)} on {winner.instance_type} were not used: "
                     f"this pool shares its GPU by {MODE_WORDS[winner.sharing]}, and a curve holds only for the mode "
                     "it was measured under")
    if mps_estimator:
        notes.append(mps_estimator)
    return notes


def spread_json(curve: Any) -> list[dict[str, Any]]:
    """plan.json's spread of a curve: per repeated level, its repeats and each metric's lowest and highest figure."""
    return [{"concurrency": p.concurrency, "repeats": p.spread.repeats,
             "ranges": {name: {"lowest": lo, "highest": hi} for name, lo, hi in p.spread.ranges}}
            for p in curve.points if p.spread is not None]
