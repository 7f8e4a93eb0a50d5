"""First-deploy order: a provider region's fleets held at zero instances until its model and image are staged.

Instances that launch before `fleetcast stage` filled the region cannot pull their image or find their
weights; each would sit in its launch hook until the timeout. So `fleetcast deploy` synthesizes a
provider stack that is new (or still held) and not yet staged with `-c hold_capacity=<regions>`: every
Auto Scaling group of that region gets MinSize = MaxSize = 0 (DesiredCapacity 0 where the config fixes
one), no warm pool, scaling policies or scheduled actions, so nothing can launch. The stack says so in its
`CapacityHeld` output. Once `fleetcast stage status` finds the model and image staged there, the
`capacity` step deploys the stack again without the hold, which applies the configured sizes.

Pure Python (no CDK import): the stacks read the context, the deploy CLI writes it; both take it from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .context import Context, arg
from .errors import EXIT_USAGE, UserError
from .outputs import CAPACITY_HELD

HOLD_CONTEXT = Context.HOLD_CAPACITY.value
HELD_OUTPUT = CAPACITY_HELD


def parse_held_regions(value: object) -> frozenset[str]:
    """The regions a `-c hold_capacity=a,b` context value names (empty when unset)."""
    if value is None or value == "":
        return frozenset()
    if isinstance(value, (list, tuple)):
        items: Iterable[str] = (str(v) for v in value)
    else:
        items = str(value).split(",")
    return frozenset(item.strip() for item in items if item.strip())


def check_held_regions(value: object, regions: Sequence[str]) -> frozenset[str]:
    """The held regions of a context value, each one of the config's (a typo must not silently hold nothing)."""
    held = parse_held_regions(value)
    unknown = sorted(held - set(regions))
    if unknown:
        raise UserError(f"-c {HOLD_CONTEXT}: {', '.join(unknown)} is not a region of the config "
                        f"(regions: {', '.join(regions)})", EXIT_USAGE)
    return held


def hold_context_args(regions: Iterable[str]) -> list[str]:
    """`cdk` arguments holding `regions` at zero; none when no region is held."""
    regions = sorted(set(regions))
    return arg(Context.HOLD_CAPACITY, ",".join(regions)) if regions else []
