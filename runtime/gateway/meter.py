"""Token metering on the response path: usage and timing from SSE events as they pass.

trtllm-serve reports token usage in a final SSE event (`choices: []`,
`usage: {...}`) only when the request asked for it with
`stream_options.include_usage`. The gateway always asks (see `prepare_body`)
and, when the client had not asked, drops that event so the client sees
exactly the stream it requested.

Events are forwarded whole as soon as they are complete; the meter never
holds back a complete event.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from fleetcast.contract import telemetry as t
from fleetcast.contract.isolation import INFERENCE_PATHS as INFERENCE_PATHS  # re-exported: the paths metered

from .metrics import MetricsSink


@dataclass
class Prepared:
    body: bytes
    stream: bool
    strip_usage: bool


def prepare_body(body: bytes, data: dict[str, Any], extra: dict[str, Any] | None = None) -> Prepared:
    """Make a streaming request report usage, add `extra` fields; returns the (possibly rewritten) body.

    `data` is `body` already parsed and checked (`http.parse_json_body`): every inference
    body is, before it may reach the model server. The body changes only when it must, and then,
    where the fields to add are all new, by writing them in after the opening brace rather than
    re-encoding the whole body (a long prompt took longer to re-encode than to parse).
    """
    stream = data.get("stream") is True
    options = data.get("stream_options")
    strip = stream and not (isinstance(options, dict) and options.get("include_usage") is True)
    if not strip and not extra:
        return Prepared(body, stream, False)
    added = dict(extra or {})
    if strip:
        if options is None and "stream_options" not in data:
            added["stream_options"] = {"include_usage": True}
        else:  # the caller's own stream_options, include_usage set on top
            merged = dict(options) if isinstance(options, dict) else {}
            merged["include_usage"] = True
            return Prepared(json.dumps({**data, **added, "stream_options": merged}, separators=(",", ":")).encode(),
                            stream, strip)
    return Prepared(_with_fields(body, data, added), stream, strip)


_JSON_SPACE = b" \t\r\n"


def _with_fields(body: bytes, data: dict[str, Any], added: dict[str, Any]) -> bytes:
    """`body` with the `added` members, which `data` (its parse) lacks, written in after its opening brace.

    Only for a body that json.loads read as UTF-8 (it also reads UTF-16 and UTF-32, RFC 8259 8.1's
    older encodings, where a byte-level splice would corrupt it): those starting with "{" and a
    non-zero byte. Anything else is re-encoded.
    """
    if body[:1] != b"{" or body[1:2] == b"\x00" or any(key in data for key in added):
        return json.dumps({**data, **added}, separators=(",", ":")).encode()
    members = json.dumps(added, separators=(",", ":")).encode()[1:-1]
    rest = body[1:]
    comma = b"" if rest.lstrip(_JSON_SPACE)[:1] == b"}" else b","
    return b"{" + members + comma + rest


def _has_content(choices: Any) -> bool:
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and (delta.get("content") or delta.get("reasoning_content")
                                        or delta.get("tool_calls")):
            return True
    return False


class SseMeter:
    """Splits an SSE byte stream into events; records timing and usage; may drop the usage-only event."""

    def __init__(self, strip_usage: bool):
        self.strip_usage = strip_usage
        self._tail = b""
        self.first_content_at: float | None = None
        self.last_content_at: float | None = None
        self.content_events = 0
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error_event = False

    def feed(self, data: bytes, now: float) -> bytes:
        """Bytes to forward now: every event completed by `data`, minus a stripped usage event."""
        buf = self._tail + data if self._tail else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        if b"\n\n" not in buf:
            self._tail = buf
            return b""
        parts = buf.split(b"\n\n")
        self._tail = parts.pop()
        if not self.strip_usage:
            for event in parts:
                self._observe(event, now)
            return buf[: len(buf) - len(self._tail)]
        kept = [event for event in parts if self._observe(event, now)]
        if len(kept) == len(parts):  # nothing dropped (every token event): the bytes as they came
            return buf[: len(buf) - len(self._tail)]
        return b"".join(event + b"\n\n" for event in kept)

    def flush(self) -> bytes:
        """Whatever is left when the stream ends (an unterminated last event)."""
        tail, self._tail = self._tail, b""
        return tail

    def _observe(self, event: bytes, now: float) -> bool:
        """Record what the event says; False if it must not reach the client."""
        if self.first_content_at is not None and b"[DONE]" not in event and b'"error"' not in event \
                and (b'"usage"' not in event or b'"usage":null' in event or b'"usage": null' in event):
            # Fast path, measured: once content flows, a token event needs no JSON parse to be
            # timed and counted. Usage, error and [DONE] events still are parsed.
            self.last_content_at = now
            self.content_events += 1
            return True
        data = None
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                piece = line[5:].lstrip(b" ")
                data = piece if data is None else data + b"\n" + piece
        if data is None:
            return True
        if data == b"[DONE]":
            self.done = True
            return True
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return True
        if not isinstance(obj, dict):
            return True
        if "error" in obj:
            self.error_event = True
        choices = obj.get("choices")
        if _has_content(choices):
            if self.first_content_at is None:
                self.first_content_at = now
            self.last_content_at = now
            self.content_events += 1
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
            if self.strip_usage and not choices:
                return False
        return True


def usage_from_body(body: bytes) -> dict[str, Any] | None:
    """Usage of a non-streaming response."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):  # the server's own answer; never let it break the record
        return None
    usage = obj.get("usage") if isinstance(obj, dict) else None
    return usage if isinstance(usage, dict) else None


def tokens(usage: dict[str, Any] | None) -> tuple[int, int]:
    """(input, output) tokens from an OpenAI usage object."""
    if not usage:
        return 0, 0
    def as_int(value: Any) -> int:
        return value if isinstance(value, int) and value >= 0 else 0
    return as_int(usage.get("prompt_tokens")), as_int(usage.get("completion_tokens"))


@dataclass
class Exchange:
    """One request's bookkeeping, for the metric record."""

    started: float
    consumer: str | None = None
    model: str | None = None  # the config model or adapter id it was routed to; None: not routed
    arrived_ms: int | None = None  # wall clock at arrival: the record's timestamp (its own minute); None: now
    in_flight: int = 0  # requests in flight on this instance at admission, this one included; 0: not admitted
    status: int = 0
    error: bool = False
    client_gone: bool = False
    meter: SseMeter | None = None
    usage: dict[str, Any] | None = None
    ended: float | None = None
    props: dict[str, Any] = field(default_factory=dict)
    trace: dict[str, Any] | None = None  # its TTFT stamps, with the test switch on only (runtime/ttft_trace.py)


def record(metrics: MetricsSink, ex: Exchange, path: str) -> None:
    """Emit the one metric record of a finished (or refused) inference request."""
    end = ex.ended or time.perf_counter()
    meter = ex.meter
    usage = meter.usage if meter else ex.usage
    input_tokens, output_tokens = tokens(usage)
    props: dict[str, Any] = {"path": path, "status": ex.status, **ex.props}
    if usage is None and meter and meter.content_events:
        output_tokens = meter.content_events  # stream ended before its usage event: count what was sent
        props["usage_source"] = "content_events"
    if ex.client_gone:
        props["client_disconnected"] = True
    values: dict[str, float] = {t.REQUESTS: 1, t.THROTTLED: 0, t.ERRORS: 1 if ex.error else 0,
                                t.INPUT_TOKENS: input_tokens, t.OUTPUT_TOKENS: output_tokens}
    if ex.props.get("stream_cut"):
        values[t.STREAMS_CUT] = 1
    if meter and meter.first_content_at is not None and meter.last_content_at is not None:  # set together
        values[t.TTFT_MS] = round((meter.first_content_at - ex.started) * 1000, 3)
        values[t.E2E_MS] = round((meter.last_content_at - ex.started) * 1000, 3)
        if output_tokens > 1:
            values[t.ITL_MS] = round((meter.last_content_at - meter.first_content_at) * 1000
                                     / (output_tokens - 1), 3)
    elif not meter and ex.status and ex.status < 400:
        values[t.E2E_MS] = round((end - ex.started) * 1000, 3)
    # Traffic shape of an admitted request: three bucket labels, each a bisect over a dozen bounds
    # (docs/gateway.md, Traffic shape).
    shape = None
    if ex.in_flight:
        shape = {t.DIM_IN_FLIGHT: t.in_flight_label(ex.in_flight), t.DIM_INPUT_BUCKET: t.token_label(input_tokens),
                 t.DIM_OUTPUT_BUCKET: t.token_label(output_tokens)}
    metrics.emit(ex.consumer, values, props, ex.arrived_ms, shape, model=ex.model)
