"""The gateway's garbage-collection schedule (runtime/gateway/collector.py)."""

from __future__ import annotations

import asyncio
import gc
import weakref

from runtime.gateway.__main__ import build_parser
from runtime.gateway.collector import GC_PERIOD_S, Collector


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_older_generations_wait_for_the_timer_and_cycles_are_still_freed():
    async def body():
        before = gc.get_threshold()
        collector = Collector(period_s=0.05)
        collector.start()
        try:
            young, older, oldest = gc.get_threshold()
            assert young == before[0] and older > 10**8 and oldest > 10**8  # no automatic older collection
            node = _Node()
            gone = weakref.ref(node)
            del node
            for _ in range(200):  # bounded: the timer fires every 50 ms
                if gone() is None and collector.collections:
                    break
                await asyncio.sleep(0.01)
            assert gone() is None and collector.collections >= 1
        finally:
            collector.stop()
        assert gc.get_threshold() == before  # CPython's schedule back

    asyncio.run(body())


def test_period_zero_leaves_cpythons_schedule():
    async def body():
        before = gc.get_threshold()
        collector = Collector(period_s=0)
        collector.start()
        assert gc.get_threshold() == before
        collector.stop()

    asyncio.run(body())


def test_the_period_is_a_gateway_flag_with_a_default():
    args = ["--listen", "127.0.0.1:8000", "--upstream", "127.0.0.1:8001", "--region", "r", "--pool", "p"]
    assert build_parser().parse_args(args).gc_period_s == GC_PERIOD_S
    assert build_parser().parse_args([*args, "--gc-period-s", "0"]).gc_period_s == 0
