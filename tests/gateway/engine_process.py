"""A fake engine (fakes.FakeModelServer) as a process of its own, for tests that run every part of a fleet as
separate processes: `python -m tests.gateway.engine_process TOKEN_DELAY_S` prints its port, serves until killed."""

from __future__ import annotations

import asyncio
import sys

from .fakes import FakeModelServer


async def main(token_delay_s: float) -> None:
    server = await FakeModelServer(token_delay_s).start()
    print(server.port, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1])))
