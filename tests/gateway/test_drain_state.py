"""Drain's bookkeeping: in-flight count, the bounded wait, and the 503 for requests cut before their head."""

from __future__ import annotations

import asyncio

from runtime.gateway.drain import Drain

from .conftest import run


class Writer:
    def __init__(self):
        self.sent = b""

    def write(self, data: bytes) -> None:
        self.sent += data


def test_wait_returns_true_once_the_last_request_leaves_and_false_at_the_timeout():
    async def body():
        drain = Drain(timeout_s=30.0)
        assert drain.enter() == 1 and drain.enter() == 2  # the in-flight count, this request included
        waiting = asyncio.ensure_future(drain.wait())
        await asyncio.sleep(0)
        assert drain.draining
        drain.leave()
        await asyncio.sleep(0.01)
        assert not waiting.done()
        drain.leave()
        assert await waiting is True
        stuck = Drain(timeout_s=0.05)
        stuck.enter()
        assert await stuck.wait() is False and stuck.active == 1
    run(body())


def test_a_request_without_its_response_head_at_close_gets_a_retryable_503_once():
    drain = Drain(timeout_s=1.0)
    answered, cut, gone = Writer(), Writer(), Writer()
    for writer in (answered, cut, gone):
        drain.started_upstream(writer)
    assert drain.head_arrived(answered)
    drain.forget(gone)
    assert drain.unstarted == 1
    drain.cut_unstarted()
    assert cut.sent.startswith(b"HTTP/1.1 503 ") and b'"code": "draining"' in cut.sent
    assert answered.sent == gone.sent == b""
    assert not drain.head_arrived(cut)  # its head, if it still comes, must not be relayed after the 503
    assert drain.unstarted == 0
