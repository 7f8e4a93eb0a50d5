"""Replies name the model the consumer asked for, not the server's own name for it.

trtllm-serve calls the model it serves by its model directory's name (OpenAIServer sets
`self.model = model_dir.name`, tensorrt_llm/serve/openai_server.py): here that is `engine` or the
cache artifact's directory, the same for every model. The `model` member of an inference reply, the
JSON body and every SSE event, is rewritten to the id the consumer sent (a model's or an adapter's),
as OpenAI answers with the model of the request.

Only a real `"model"` member can match: inside a JSON string every quote is escaped, so `"model"`
with both quotes bare, then a colon, is a key.
"""

from __future__ import annotations

import json
import re

_MEMBER = re.compile(rb'"model"\s*:\s*"(?:[^"\\]|\\.)*"')
_KEY = b'"model"'
# A JSON body is held back until its model member has passed (trtllm-serve writes it among the
# first members); one that has none by then is let through as it is.
HOLD_LIMIT = 64 * 1024


class ModelName:
    """Rewrites the `model` members of one reply to `model_id`.

    `events`: the reply is SSE, fed complete events (runtime/gateway/meter.SseMeter.feed), each
    rewritten on its own; otherwise a JSON body, fed as it arrives, whose first model member is
    rewritten (its length changes, so the reply goes out without the server's Content-Length).
    """

    __slots__ = ("member", "events", "held", "passed", "seen")

    def __init__(self, model_id: str, *, events: bool):
        self.member = _KEY + b":" + json.dumps(model_id).encode()
        self.events = events
        self.held = b""
        self.passed = False
        self.seen: bytes | None = None  # the server's member as it wrote it first

    def _swap(self, match: re.Match[bytes]) -> bytes:
        if self.seen is None:
            self.seen = match.group(0)
        return self.member

    def feed(self, data: bytes) -> bytes:
        """What to send now of `data`."""
        if self.events:
            if _KEY not in data:
                return data
            if self.seen is not None:
                # Fast path: the server writes its member the same way in every event, and a replace costs a
                # fifth of the expression on a token event (timeit, development VM); the expression runs only
                # where another form is left.
                out = data.replace(self.seen, self.member)
                if out.count(_KEY) == out.count(self.member):
                    return out
            return _MEMBER.sub(self._swap, data)
        if self.passed:
            return data
        held = self.held + data
        renamed, found = _MEMBER.subn(self._swap, held, count=1)
        if found or len(held) > HOLD_LIMIT:
            self.passed, self.held = True, b""
            return renamed
        self.held = held
        return b""

    def flush(self) -> bytes:
        """What is still held at the body's end (a body without a model member)."""
        held, self.held = self.held, b""
        return held
