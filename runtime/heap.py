"""The startup heap of a serving process, kept out of the garbage collector's way.

CPython's collector walks every tracked object in a full (generation 2) collection, in whichever thread allocates
when the counts say so, holding the interpreter lock throughout: every other thread of the process stops with it.
What a serving process loads at startup (PyTorch and the model in the reference engine's process, aiohttp in its
HTTP process, botocore's service models in the gateway) lives as long as the process, so each full collection walks
it again for nothing: 167k objects in the reference engine's process, 35k in its HTTP process, whose full
collections took 185-590 ms and 26-70 ms on the development VM. A pause there is a stall of every stream the
process serves. gc.freeze() (docs.python.org/3/library/gc.html#gc.freeze: "Freeze all the objects tracked by the
garbage collector; move them to a permanent generation and ignore them in all the future collections") takes them
out of every later collection, which then walks only what serving created since.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect what startup left as garbage (so it is not frozen for ever), then freeze every object still tracked;
    the number frozen. Call once startup is done, before serving."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
