"""The small slice of HTTP/1.1 the gateway needs, over asyncio streams.

The gateway speaks to two known parties: OpenAI-compatible clients and the
local trtllm-serve (or the reference backend). That lets it be a plain
streaming proxy that copies bytes as they arrive instead of a web framework
that buffers and re-encodes: each upstream read becomes one client write.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024
# Deeper than any OpenAI request (a tool's JSON Schema nests a few dozen levels at most), far below
# what makes a recursive parser overflow: CPython's json raises RecursionError near 1000 levels.
MAX_JSON_DEPTH = 128
# CPython's default integer string conversion limit (sys.int_info.default_max_str_digits): the model
# server's own parser refuses longer integers, so one that long never reaches it.
MAX_INT_DIGITS = 4300
READ_SIZE = 64 * 1024
BODY_TIMEOUT_S = 30.0  # default: the whole request body must arrive within this (python -m runtime.gateway --body-timeout-s)

# Hop-by-hop headers (RFC 9110 7.6.1) and the ones the gateway rewrites itself.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
    "proxy-authenticate", "proxy-authorization", "content-length", "expect",
})

REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 408: "Request Timeout", 411: "Length Required", 413: "Content Too Large",
    429: "Too Many Requests", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
    502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout",
}


class HttpError(Exception):
    """A request the gateway cannot read; answered with `status` and the connection closed."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Request:
    method: str
    target: str
    version: str
    # Name, value, name, value, ... as sent: one flat tuple of strings, which the first collection that walks it
    # stops tracking (CPython untracks a tuple that holds only untracked objects: Modules/gcmodule.c
    # untrack_tuples), so a waiting request keeps one object less for every young collection to walk
    # (runtime/heap.py). A list stays tracked; a tuple of (name, value) pairs often outlived the heap test's full
    # collection tracked (tests/gateway/test_heap_under_flood.py).
    headers: tuple[str, ...]
    lower: dict[str, str] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def keep_alive(self) -> bool:
        conn = self.lower.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in conn
        return "close" not in conn

    @property
    def chunked(self) -> bool:
        return "chunked" in self.lower.get("transfer-encoding", "").lower()


def parse_head(head: bytes) -> Request:
    """Request line and headers (the bytes up to and including the blank line)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise HttpError(400, "undecodable request head") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, "malformed request line")
    headers: list[str] = []
    lower: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, "malformed header line")
        value = value.strip()
        headers.append(name)
        headers.append(value)
        key = name.lower()
        lower[key] = f"{lower[key]}, {value}" if key in lower else value
    return Request(parts[0], parts[1], parts[2], tuple(headers), lower)


_DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() also accepts '²' and other digits int() refuses


def body_length(lower: dict[str, str]) -> int:
    raw = lower.get("content-length")
    if raw is None:
        return 0
    if not _DIGITS.fullmatch(raw):
        raise HttpError(400, "malformed Content-Length: expected ASCII digits")
    digits = raw.lstrip("0")
    if len(digits) > len(str(MAX_BODY_BYTES)) or int(digits or "0") > MAX_BODY_BYTES:
        raise HttpError(413, f"request body over {MAX_BODY_BYTES} bytes")
    return int(digits or "0")


class BadBody(ValueError):
    """An inference body the gateway refuses with 400 before anything reaches the model server."""

    def __init__(self, message: str, code: str = "invalid_json"):
        super().__init__(message)
        self.code = code


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# Depth counts nesting, not the kind of bracket: map both kinds to [ ], drop every other byte.
_AS_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
_STEP = [0] * 256  # +1 for an opening bracket, -1 for a closing one
_STEP[ord("[")], _STEP[ord("]")] = 1, -1
# The number hooks' pre-scan sees the body through one translate: a digit reads as '1', e/E as 'e', a sign
# as 's', anything else as ' '. Three substring searches then find an integer longer than MAX_INT_DIGITS and
# an exponent of three digits or more ([0-9][eE][+-]?[0-9]{3}, which can overflow to inf): C loops over the
# body, measured several times faster than the two regular-expression searches on a 16 KB prompt.
_NUMBER_SHAPE = bytes((ord("1") if chr(b).isascii() and chr(b).isdigit() else ord("e") if b in b"eE"
                       else ord("s") if b in b"+-" else ord(" ")) for b in range(256))
_LONG_INT = b"1" * (MAX_INT_DIGITS + 1)
_BIG_EXPONENTS = (b"1e111", b"1es111")


def json_depth_over(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when arrays/objects nest deeper than `limit`, found without a recursive parse.

    Strings are blanked first (brackets in a prompt do not count) and every byte but the
    brackets dropped. Each replace pass removes the innermost empty pairs, exactly one level
    (lists of objects and the like vanish in the first), then a running sum over what is
    left gives the deepest remaining level. Every step is a C loop over at most the body once:
    measured at most ~1.5 s for a hostile 32 MiB body on the 2-core dev VM, less than
    json.loads takes for the same bytes.
    """
    if body.count(b"[") + body.count(b"{") <= limit:  # fast path: too few brackets to nest that deep
        return False
    brackets = _STRING.sub(b'""', body).translate(_AS_SQUARE, _NOT_BRACKETS)
    passes = min(3, limit)  # each pass takes one level off; the rest is counted below
    for _ in range(passes):
        brackets = brackets.replace(b"[]", b"")
    if brackets.count(b"[") <= limit - passes:
        return False
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > limit - passes


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise BadBody(f"an integer in the request body has {len(text.lstrip('-'))} digits; "
                      f"at most {MAX_INT_DIGITS} are accepted", "integer_too_long")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadBody(f"the number {text[:40]} in the request body is out of range", "number_out_of_range")
    return value


def _no_constant(name: str) -> Any:
    raise BadBody(f"{name} is not valid JSON (RFC 8259 has no NaN or Infinity)")


def parse_json_body(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or BadBody saying why not, in bounded time and memory.

    Nesting is checked before parsing (the C parser recurses and raises RecursionError deep
    down); integers over MAX_INT_DIGITS and non-finite numbers are refused rather than handed
    to the model server, which answers those with a 500. The number hooks only run when a scan
    of the raw bytes says they may be needed, so the common body parses at the C parser's speed.
    """
    if not body:
        raise BadBody("the request body is empty; send a JSON object", "invalid_body")
    if json_depth_over(body):
        raise BadBody(f"the request body nests arrays/objects deeper than {MAX_JSON_DEPTH} levels", "json_too_deep")
    hooks: dict[str, Any] = {"parse_constant": _no_constant}
    shape = body.translate(_NUMBER_SHAPE)
    if len(body) > MAX_INT_DIGITS and _LONG_INT in shape:
        hooks["parse_int"] = _bounded_int
    if _BIG_EXPONENTS[0] in shape or _BIG_EXPONENTS[1] in shape:
        hooks["parse_float"] = _finite_float
    try:
        data = json.loads(body, **hooks)
    except BadBody:
        raise
    except RecursionError:  # pragma: no cover - the depth check above comes first
        raise BadBody(f"the request body nests deeper than {MAX_JSON_DEPTH} levels", "json_too_deep") from None
    except UnicodeDecodeError:
        raise BadBody("the request body is not valid UTF-8") from None
    except ValueError as exc:  # JSONDecodeError, and an interpreter's own integer-digit limit
        raise BadBody(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadBody(f"the request body must be a JSON object, not {type(data).__name__}", "invalid_body")
    return data


class ChunkedError(ValueError):
    pass


class ChunkedDecoder:
    """Incremental decoder for chunked transfer coding: feed raw bytes, get payload bytes back."""

    _SIZE, _DATA, _CRLF, _TRAILER, _DONE = range(5)

    def __init__(self) -> None:
        self._buf = bytearray()
        self._state = self._SIZE
        self._remaining = 0

    @property
    def done(self) -> bool:
        return self._state == self._DONE

    def feed(self, data: bytes) -> bytes:
        if self._state == self._SIZE and not self._buf:
            # Fast path, measured: a model server's read is one or more whole chunks (one SSE event each);
            # slice their payloads out of `data` without copying it through the buffer. Whatever is not a
            # whole data chunk (a split chunk, the last chunk, a malformed one) goes the general way below.
            pieces, at, end = [], 0, len(data)
            while at < end:
                line_end = data.find(b"\r\n", at, at + 1026)
                if line_end < 0:
                    break
                line = data[at:line_end].split(b";", 1)[0].strip()
                try:
                    size = int(line, 16)
                except ValueError:
                    break
                start = line_end + 2
                if size <= 0 or start + size + 2 > end or data[start + size:start + size + 2] != b"\r\n":
                    break
                pieces.append(data[start:start + size])
                at = start + size + 2
            if at:
                head = pieces[0] if len(pieces) == 1 else b"".join(pieces)
                return head + self.feed(data[at:]) if at < end else head
        buf = self._buf
        buf += data
        out = bytearray()
        while True:
            if self._state == self._DATA:
                take = min(self._remaining, len(buf))
                if not take:
                    break
                out += buf[:take]
                del buf[:take]
                self._remaining -= take
                if not self._remaining:
                    self._state = self._CRLF
            elif self._state == self._SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > 1024:
                        raise ChunkedError("chunk size line too long")
                    break
                line = bytes(buf[:end]).split(b";", 1)[0].strip()
                del buf[: end + 2]
                try:
                    size = int(line, 16)
                except ValueError:
                    raise ChunkedError(f"bad chunk size {line[:20]!r}") from None
                if size < 0:
                    raise ChunkedError("negative chunk size")
                if size:
                    self._state, self._remaining = self._DATA, size
                else:
                    self._state = self._TRAILER
            elif self._state == self._CRLF:
                if len(buf) < 2:
                    break
                if buf[:2] != b"\r\n":
                    raise ChunkedError("chunk not followed by CRLF")
                del buf[:2]
                self._state = self._SIZE
            elif self._state == self._TRAILER:
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise ChunkedError("trailer too long")
                    break
                empty = end == 0
                del buf[: end + 2]
                if empty:
                    self._state = self._DONE
            else:  # done: ignore anything after the last chunk
                buf.clear()
                break
        return bytes(out)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


def openai_error(status: int, message: str, error_type: str, code: str | None,
                 extra_headers: list[tuple[str, str]] | None = None, close: bool = False,
                 param: str | None = None) -> bytes:
    """A complete HTTP response carrying an OpenAI-shaped error body."""
    body = json.dumps({"error": {"message": message, "type": error_type, "param": param, "code": code}}).encode()
    return response_head(status, [("Content-Type", "application/json")] + (extra_headers or []),
                         length=len(body), close=close) + body


def response_head(status: int, headers: list[tuple[str, str]], *, length: int | None = None,
                  chunked: bool = False, close: bool = False, reason: str | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason or REASONS.get(status, 'Status')}"]
    lines += [f"{k}: {v}" for k, v in headers]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    elif length is not None:
        lines.append(f"Content-Length: {length}")
    lines.append("Connection: close" if close else "Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_response_head(raw: bytes) -> tuple[int, list[tuple[str, str]]]:
    """Status and headers of an upstream response head; ValueError when it is not HTTP/1.x."""
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"bad status line {lines[0][:60]!r}")
    headers = []
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise ValueError("bad header line")
            headers.append((name.strip(), value.strip()))
    return int(parts[1]), headers


async def read_body(request: Request, reader: asyncio.StreamReader, timeout_s: float) -> bytes:
    """The whole request body, within `timeout_s`: a head that promises a body and then
    stalls gets 408 and the connection closed, instead of holding it (and whatever it waits for)."""
    if not request.chunked and not body_length(request.lower):
        return b""
    try:
        async with asyncio.timeout(timeout_s):  # one timer, no task per request (unlike wait_for before 3.12)
            return await _receive_body(request, reader)
    except TimeoutError:
        raise HttpError(408, f"the request body did not arrive within {timeout_s:g} s") from None


async def _receive_body(request: Request, reader: asyncio.StreamReader) -> bytes:
    if request.chunked:
        decoder, parts, size = ChunkedDecoder(), [], 0
        while not decoder.done:
            data = await reader.read(READ_SIZE)
            if not data:
                raise HttpError(400, "request body ended early")
            try:
                piece = decoder.feed(data)
            except ChunkedError as exc:
                raise HttpError(400, f"malformed chunked body: {exc}") from None
            size += len(piece)
            if size > MAX_BODY_BYTES:
                raise HttpError(413, f"request body over {MAX_BODY_BYTES} bytes")
            parts.append(piece)
        return b"".join(parts)
    length = body_length(request.lower)
    return await reader.readexactly(length) if length else b""
